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
use crate::tuning::reads::{agreed_blocks, BlockReads, NO_COLLECTIVE_READS};

/// Cross-memory attach agreed by every local rank (`remote.rs`).
pub struct Attach {
    /// Process id of each local rank.
    pub pids: Vec<i32>,
    /// Smallest collective (bytes per rank) that reads peers' buffers
    /// directly. This and the thresholds below are the largest the local
    /// ranks published, each chosen by `tuning::reads` where left to it.
    pub min_bytes: usize,
    /// Point-to-point messages of more than this many bytes are read from
    /// the sender's tensor (or staged) even below `min_bytes`, and so are
    /// gather / scatter blocks where collectives do not read.
    pub single_min: usize,
    /// Smallest all_reduce that reads peers' buffers directly.
    pub all_reduce_min: usize,
    /// Smallest reduce_scatter (bytes of its input) that reads peers'
    /// buffers directly.
    pub reduce_scatter_min: usize,
    /// Smallest reduce that reads peers' buffers directly.
    pub reduce_min: usize,
    /// Smallest all_gather (bytes per rank) that reads peers' buffers
    /// directly.
    pub all_gather_min: usize,
    /// all_to_all / gather / scatter blocks over this many bytes are read
    /// from the sender's tensor, smaller ones that fit its slots copied
    /// through them (`tuning::reads::agreed_blocks`).
    pub block_min: usize,
    /// The same for scatter's blocks.
    pub scatter_block_min: usize,
    /// The same for gather's blocks.
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
        let BlockReads { block_min, scatter_block_min, gather_block_min } =
            agreed_blocks(largest(Segment::block_min), min_bytes, single_min, segs.len());
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
    /// `tuning::reads`), where only those of blocks read directly do.
    /// (all_to_all always runs them: `Window::attach_blocks`.)
    pub fn all_blocks(&self) -> bool {
        self.min_bytes < NO_COLLECTIVE_READS
    }
}
