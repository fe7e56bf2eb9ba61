//! Cross-memory attach as the local ranks agreed on it: their pids and
//! the thresholds from which collectives, blocks and single-reader
//! transfers read a peer's tensor (`remote.rs`) instead of copying through
//! shared memory.
#![forbid(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::arena::{ArenaInfo, PeerArena};
use super::{remote, Segment};
use crate::config::{log_at, LogLevel};

/// Cross-memory attach agreed by every local rank (`remote.rs`).
pub struct Attach {
    /// Process id of each local rank.
    pub pids: Vec<i32>,
    /// Smallest collective (bytes per rank) that reads peers' buffers
    /// directly.
    pub min_bytes: usize,
    /// Point-to-point messages of more than this many bytes are read from
    /// the sender's tensor (or staged) even below `min_bytes`, and so are
    /// gather / scatter blocks where collectives do not read
    /// (`block_min` then): [`SINGLE_READER_MIN`] unless set.
    pub single_min: usize,
    /// Smallest all_reduce that reads peers' buffers directly: `min_bytes`
    /// where it was set, else from the host (`reads::all_reduce_attach_min`);
    /// the largest of the local ranks'.
    pub all_reduce_min: usize,
    /// Smallest reduce_scatter (bytes of its input) that reads peers'
    /// buffers directly: `min_bytes`, except with many ranks of few
    /// threads (`reads::reduce_scatter_attach_min`); the largest of the
    /// local ranks'.
    pub reduce_scatter_min: usize,
    /// Smallest reduce that reads peers' buffers directly: `min_bytes`,
    /// except with shared tensors on at most [`BLOCK_SLOT_RANKS`] local
    /// ranks (`reads::SHARED_FEW_RANKS_REDUCE_READ_MIN`); the largest of the
    /// local ranks'.
    pub reduce_min: usize,
    /// Smallest all_gather (bytes per rank) that reads peers' buffers
    /// directly: `min_bytes`, except with shared tensors on a crowded host
    /// (`reads::crowded`: `reads::SHARED_CROWDED_ALL_GATHER_READ_MIN`); the largest of the
    /// local ranks'.
    pub all_gather_min: usize,
    /// all_to_all / gather / scatter blocks over this many bytes are read
    /// from the sender's tensor, smaller ones that fit its slots copied
    /// through them: the largest setting of the local ranks, else
    /// [`BLOCK_READ_MIN`] (at least `single_min`) where collectives read
    /// and the host has at most [`BLOCK_SLOT_RANKS`] local ranks
    /// ([`PAIR_FAST_BLOCK_READ_MIN`] with 2),
    /// `single_min` otherwise; with shared tensors (set by `connect`)
    /// `reads::SHARED_BLOCK_READ_MIN` with more local ranks, else
    /// [`SINGLE_READER_MIN`].
    pub block_min: usize,
    /// The same for scatter's blocks: `block_min`, except with more than
    /// [`MANY_SLOW_RANKS`] local ranks where no collective reads
    /// ([`SLOW_MANY_SCATTER_BLOCK_READ_MIN`] unless set).
    pub scatter_block_min: usize,
    /// The same for gather's blocks: `block_min`, except with more than
    /// [`MANY_SLOW_RANKS`] local ranks where no collective reads
    /// ([`SLOW_MANY_GATHER_BLOCK_READ_MIN`] unless set).
    pub gather_block_min: usize,
    /// Smallest broadcast that reads the root's tensor (`usize::MAX`:
    /// never, the default: the pipelined copies through the root's shared
    /// memory were as fast or faster at every size measured).
    pub broadcast_min: usize,
    /// Each local rank's shared tensor arena, mapped here (`arena.rs`;
    /// None: it has none, or it could not be mapped, and its tensors are
    /// read through the kernel).
    pub arenas: Vec<Option<PeerArena>>,
    /// The value peers read through our pid at setup (kept alive with us).
    _canary: Box<u64>,
}

/// The arena local rank `pid` published in `seg`, mapped; None when it has
/// none or it cannot be mapped (logged: its tensors are read through the
/// kernel instead).
fn peer_arena(seg: &Segment, pid: i32) -> Option<PeerArena> {
    let [base, len, fd, canary] = seg.arena_info().map(|w| w.load(Ordering::Acquire));
    if base == 0 {
        return None;
    }
    PeerArena::open(pid, ArenaInfo { base, len, fd, canary })
        .inspect_err(|e| log_at!(LogLevel::Info, "cannot map the shared tensors of process {pid} ({e}); reading them through the kernel"))
        .ok()
}

/// Blocks from this size are read by their one reader: smaller ones cost
/// more in the system call and page pinning than the copy saves
/// (`docs/decisions/0004`).
pub const SINGLE_READER_MIN: usize = 256 << 10;

/// all_to_all / gather / scatter blocks up to this size go through the
/// senders' input slots where reads are fast (when they fit one: a slot
/// holds 2 MiB with 8 threads a rank, 1 MiB with 4; with 2 local ranks a
/// block may fill both, `collectives::shm::attach::block_max`) and the host
/// has at most [`BLOCK_SLOT_RANKS`] local ranks: there the threads' copies
/// through the slots beat the kernel's reads. With more ranks, every rank
/// copying twice at once is slower, and blocks over `single_min` are read
/// (`docs/decisions/0004`).
pub const BLOCK_READ_MIN: usize = 2 << 20;
/// The most local ranks for which [`BLOCK_READ_MIN`] applies.
pub const BLOCK_SLOT_RANKS: usize = 4;
/// [`BLOCK_READ_MIN`] for a host with 2 local ranks where reads are fast:
/// blocks up to 4 MiB go through the sender's two input slots (2 MiB each
/// with 8 threads a rank, one block filling both), taken together, which
/// beats the kernel's reads and writes (`docs/decisions/0004`).
pub const PAIR_FAST_BLOCK_READ_MIN: usize = 4 << 20;
/// Scatter blocks over this size are read where no collective reads (one
/// thread a rank, reads slower than copies) and the host has more than
/// [`MANY_SLOW_RANKS`] local ranks: through the root's slots its one thread
/// copies every block, where reads spread them over the receivers
/// (`docs/decisions/0004`).
pub const SLOW_MANY_SCATTER_BLOCK_READ_MIN: usize = 16 << 10;
/// See [`SLOW_MANY_SCATTER_BLOCK_READ_MIN`].
pub const MANY_SLOW_RANKS: usize = 8;
/// Gather blocks over this size are pushed into the root's buffer by their
/// senders (`RUSTCCL_SHM_GATHER_PUSH`; read by the root where it takes no
/// pushes) under the same conditions as [`SLOW_MANY_SCATTER_BLOCK_READ_MIN`]:
/// as messages through the rings the root's one thread copies every block.
/// Smaller blocks gain nothing: many senders writing into one process
/// through the kernel at once contend (`docs/decisions/0004`).
pub const SLOW_MANY_GATHER_BLOCK_READ_MIN: usize = 64 << 10;

/// Whose blocks a block threshold is for: all_to_all's, gather's or
/// scatter's (`Attach::gather_block_min`, `Attach::scatter_block_min`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockOp {
    AllToAll,
    Gather,
    Scatter,
}

impl BlockOp {
    /// The collective's name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            BlockOp::AllToAll => "all_to_all",
            BlockOp::Gather => "gather",
            BlockOp::Scatter => "scatter",
        }
    }
}

/// Where a transfer of `len` bytes shared between a reader and a writer
/// is cut (the reader takes the bytes before, the writer those from
/// there): half, rounded up to a cache line, at most `len`. A 2-rank
/// broadcast and a split send cut here.
pub fn split_point(len: usize) -> usize {
    split_at(len, 2)
}

/// Where a transfer of `len` bytes is cut so that the part after it is
/// the last 1 / `share` (at least 2): rounded up to a cache line, at most
/// `len`; [`split_point`] with 2. A scatter root's share of a split block
/// and a gather root's share of a pushed one (`collectives::shm::blocks`)
/// start here.
pub fn split_at(len: usize, share: usize) -> usize {
    let share = share.max(2);
    (len / share * (share - 1)).div_ceil(64).saturating_mul(64).min(len)
}

/// A collective threshold this large (1 TiB) means that no collective
/// reads peers' tensors: where reads are slow, the host's rule.
pub const NO_COLLECTIVE_READS: usize = 1 << 40;

impl Attach {
    /// The thresholds every local rank applies, from what each published
    /// in its segment (`segs`, by local index): every rank must pick the
    /// same algorithms, so the largest any rank was given (or measured)
    /// applies to all; the block threshold left to the host follows from
    /// the agreed ones.
    pub(super) fn agreed(pids: Vec<i32>, segs: &[Arc<Segment>], canary: Box<u64>, me: usize) -> Attach {
        let largest =
            |f: fn(&Segment) -> &AtomicU64| segs.iter().map(|s| f(s).load(Ordering::Relaxed) as usize).max().unwrap_or(usize::MAX);
        let (min_bytes, single_min) = (largest(Segment::attach_min), largest(Segment::single_min));
        let block_set = largest(Segment::block_min);
        let block_min = match block_set {
            0 if min_bytes < NO_COLLECTIVE_READS && segs.len() == 2 => PAIR_FAST_BLOCK_READ_MIN.max(single_min),
            0 if min_bytes < NO_COLLECTIVE_READS && segs.len() <= BLOCK_SLOT_RANKS => BLOCK_READ_MIN.max(single_min),
            // Where no collective reads (one thread a rank, reads slower
            // than copies: `reads::host_attach_min`), blocks over `single_min`
            // are read all the same (or a gather's pushed): that spreads
            // a gather's or scatter's copies over every rank, where shared
            // memory leaves them all to the root (`docs/decisions/0004`).
            0 => single_min,
            set => set,
        };
        let slow_many = block_set == 0 && min_bytes >= NO_COLLECTIVE_READS && segs.len() > MANY_SLOW_RANKS;
        let scatter_block_min = if slow_many { SLOW_MANY_SCATTER_BLOCK_READ_MIN.min(block_min) } else { block_min };
        let gather_block_min = if slow_many { SLOW_MANY_GATHER_BLOCK_READ_MIN.min(block_min) } else { block_min };
        let arenas = segs.iter().zip(&pids).enumerate().map(|(i, (s, &pid))| (i != me).then(|| peer_arena(s, pid)).flatten()).collect();
        Attach {
            arenas,
            pids,
            min_bytes,
            all_reduce_min: largest(Segment::all_reduce_min),
            reduce_scatter_min: largest(Segment::reduce_scatter_min),
            reduce_min: largest(Segment::reduce_min),
            all_gather_min: largest(Segment::all_gather_min),
            single_min,
            block_min,
            scatter_block_min,
            gather_block_min,
            broadcast_min: largest(Segment::broadcast_min),
            _canary: canary,
        }
    }

    /// Copies `dst.len()` bytes at `addr` of local rank `peer`'s memory
    /// into `dst`: out of its arena where they lie there, else through the
    /// kernel.
    pub fn read(&self, peer: usize, addr: u64, dst: &mut [u8]) -> io::Result<()> {
        if self.arenas[peer].as_ref().is_some_and(|a| a.read(addr, dst)) {
            return Ok(());
        }
        remote::read(self.pids[peer], addr, dst)
    }

    /// Copies `src` to `addr` of local rank `peer`'s memory, through the
    /// kernel: only into a buffer the peer posted for this rank to fill.
    pub fn write(&self, peer: usize, addr: u64, src: &[u8]) -> io::Result<()> {
        remote::write(self.pids[peer], addr, src)
    }

    /// Whether some local rank's tensors lie in a shared arena mapped here
    /// (read with a plain copy instead of through the kernel).
    pub fn any_arena(&self) -> bool {
        self.arenas.iter().any(Option::is_some)
    }

    /// The `len` bytes at `addr` of local rank `peer`'s memory, when they
    /// lie in its arena (see `PeerArena::slice` for how long they may be
    /// looked at).
    pub fn peek(&self, peer: usize, addr: u64, len: usize) -> Option<&[u8]> {
        self.arenas[peer].as_ref()?.slice(addr, len)
    }

    /// Whether a single-reader transfer of `len` bytes is read directly.
    pub fn single_reader(&self, len: usize) -> bool {
        len >= self.min_bytes || len > self.single_min
    }

    /// Whether an `op` block of `len` bytes is read from the sender's
    /// tensor (else through its slot, when it fits).
    pub fn block_read(&self, op: BlockOp, len: usize) -> bool {
        let min = match op {
            BlockOp::Scatter => self.scatter_block_min,
            BlockOp::Gather => self.gather_block_min,
            BlockOp::AllToAll => self.block_min,
        };
        len >= self.min_bytes || len > min
    }

    /// Whether every gather and scatter runs the single-copy algorithms
    /// (`collectives::shm::attach`, whose blocks up to `block_min` go
    /// through the senders' slots): unless no collective reads
    /// (`min_bytes` from [`NO_COLLECTIVE_READS`]: where reads are slow,
    /// `reads::host_attach_min`), where only those of blocks read directly do.
    /// (all_to_all always runs them: `Window::attach_blocks`.)
    pub fn all_blocks(&self) -> bool {
        self.min_bytes < NO_COLLECTIVE_READS
    }
}
