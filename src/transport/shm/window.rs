//! A window onto the shared areas of every local rank's segment, for the
//! shared-memory algorithms in `collectives` (which see only this: areas,
//! byte offsets and phases, never a pointer).
//!
//! Vocabulary: each rank publishes a monotonically increasing *phase* in its
//! segment; all ranks run the same steps, so phases agree at every step.
//! An algorithm writes its own areas only after every peer reached the
//! phase at which it stopped reading them, and reads a peer's areas only
//! after the peer published the phase at which it finished writing them,
//! or (a block streamed through the input area, `collectives::shm::blocks`)
//! a chunk of them once the block flag after it holds the operation's
//! number ([`Window::set_block_flag`], [`Window::wait_block_flag`]).
//! The window checks bounds; the phase protocol is the algorithm's promise
//! (breaking it gives wrong bytes, never an access outside the mapping).
//! One deliberate exception: the failure bit of a header's first word
//! (`collectives::shm::attach::FAILED`) is set while slower peers may
//! still read that header: every other bit keeps its value, so they read
//! the same decisions whichever bytes they get, and the bit itself is read
//! only after a later phase.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{BlockOp, ShmLocal, Workers};
use crate::error::{Error, Result};
use crate::transport::frame;
use crate::types::{DType, Rank, ReduceOp};

/// Blocks until every local rank's phase is at least `target` (with the
/// transport's deadline, interrupt and dead-peer checks).
pub trait PhaseWait {
    fn wait_phase(&mut self, target: u64) -> Result<()>;
    /// Wire sequence number of the current operation.
    fn seq(&self) -> u32;
    /// What the current operation is, as every rank describes it.
    fn what(&self) -> frame::What;
    /// A protocol error with `peer` (ranks disagree about the operation).
    fn mismatch(&self, peer: Rank, detail: String) -> Error;
    /// The error of a disagreement found before any data moved, when every
    /// local rank finds it alike ([`Window::verify`]): the group stays
    /// usable where it can.
    fn disagree(&self, peer: Rank, detail: String) -> Error;
    /// Blocks until `ready()`, which local rank `peer` makes true within
    /// this operation (its block flags), with the checks of `wait_phase`.
    fn wait_until(&mut self, peer: usize, ready: &dyn Fn() -> bool) -> Result<()>;
}

/// One of the shared areas of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// One of the two one-round slots (`small_capacity` bytes each): an
    /// operation that starts at phase `p` uses slot `p % 2`, so the slots
    /// alternate between one-step operations (see [`Window::small_slot`]).
    Small(usize),
    /// Input slot `c` (`slot_capacity` bytes each, one per local rank).
    Input(usize),
    /// All input slots as one area (`inputs_capacity` bytes).
    Inputs,
    /// The output slot (`slot_capacity` bytes).
    Output,
}

/// What a rank announces before it publishes anything of an operation, so
/// that ranks that disagree fail instead of mixing data.
#[derive(Debug, Clone, Copy)]
pub struct Desc {
    pub name: &'static str,
    pub dtype: DType,
    pub op: ReduceOp,
    pub len: usize,
    /// The root (local index) of a rooted collective: ranks that name
    /// different roots would read from different ranks' areas.
    pub root: Option<usize>,
}

/// Bits of the announced length word that hold the length; the root + 1
/// (0: none) sits above them.
const LEN_BITS: u32 = 48;

fn length_word(d: &Desc) -> u64 {
    d.len as u64 | (d.root.map_or(0, |r| r as u64 + 1) << LEN_BITS)
}

/// seq (32 bits) | the collective's kind (8) | dtype (8) | reduce op (8).
/// The dtype is the caller's (`what`), also where the algorithm moves
/// bytes, so that `float32` against `int32` of one length fails too.
fn descriptor(seq: u32, what: frame::What, d: &Desc) -> u64 {
    let dtype = if what.dtype != 0 { what.dtype } else { frame::dtype_code(d.dtype) };
    (seq as u64) << 32 | (what.kind as u64) << 16 | (dtype as u64) << 8 | d.op as u64
}

/// An announced operation in torch's words: `all_reduce(SUM) of 40 bytes
/// of float32`, `broadcast of 40 bytes of int32`.
fn desc_text(name: &str, word: u64, len: u64) -> String {
    let (code, op) = ((word >> 8) as u8, ReduceOp::from_i32((word & 0xff) as i32));
    match op {
        Some(op) if matches!(name, "all_reduce" | "reduce" | "reduce_scatter") => {
            format!("{name}({}) of {len} bytes of {}", op.name(), frame::dtype_name(code))
        }
        _ => format!("{name} of {len} bytes of {}", frame::dtype_name(code)),
    }
}

/// A failed read of a peer's buffer, or write into one it posted
/// (cross-memory attach): which local peer, and why. Turned into an error naming the peer by [`Window::failed`].
#[derive(Debug)]
pub struct AttachError {
    pub peer: usize,
    pub detail: String,
}

/// The local ranks' shared areas (cheap to clone, `Sync`: worker threads
/// share it).
#[derive(Clone)]
pub struct Window {
    local: Arc<ShmLocal>,
}

impl Window {
    pub fn new(local: Arc<ShmLocal>) -> Window {
        Window { local }
    }

    /// Local ranks (global numbers, ascending).
    pub fn ranks(&self) -> &[Rank] {
        &self.local.ranks
    }

    /// This rank's index among `ranks`.
    pub fn me(&self) -> usize {
        self.local.me
    }

    pub fn workers(&self) -> &Workers {
        &self.local.workers
    }

    /// The threads for a root's solo phase of `bytes` (`ShmLocal::root_workers`)
    /// when it has more pieces than this rank's own threads; else those:
    /// a larger pool only adds wake-ups where each piece has a thread
    /// already.
    pub fn solo_workers(&self, bytes: usize) -> &Workers {
        let own = &self.local.workers;
        if bytes / own.min_piece() > own.threads() {
            self.local.root_workers()
        } else {
            own
        }
    }

    /// The threads for all_to_all's block copies (`ShmLocal::all_to_all_workers`).
    pub fn all_to_all_workers(&self) -> &Workers {
        &self.local.all_to_all_workers
    }

    /// The worker threads with the smaller pieces of the reducing
    /// algorithms' copies.
    pub fn reduce_workers(&self) -> &Workers {
        &self.local.reduce_workers
    }

    /// The worker threads with the pieces of a reduction (`ShmLocal::sum_workers`).
    pub fn sum_workers(&self) -> &Workers {
        &self.local.sum_workers
    }

    /// Bytes of each small slot (the one-step operations' limit).
    pub fn small_capacity(&self) -> usize {
        self.local.mine().layout.small
    }

    /// Largest all-reduce to run in one round (<= `small_capacity`).
    pub fn one_round_max(&self) -> usize {
        self.local.one_round_max.min(self.small_capacity())
    }

    /// Whether `op`'s `count` blocks of `block` bytes each (a gather's one,
    /// a scatter's root's all) go through a small slot in one step: where
    /// they fit, if they are small (`ShmLocal::one_round_block_max`) or
    /// the single-copy algorithm would take them otherwise (its headers
    /// cost more than the second copy does); not where the rings would,
    /// which let a receiver copy a message out while its sender writes it.
    pub fn one_round_blocks(&self, op: BlockOp, block: usize, count: usize) -> bool {
        block * count <= self.small_capacity() && (block <= self.local.one_round_block_max || self.attach_blocks(op, Some(block)))
    }

    pub fn slot_capacity(&self) -> usize {
        self.local.mine().layout.seg
    }

    pub fn inputs_capacity(&self) -> usize {
        let l = self.local.mine().layout;
        l.n * l.seg
    }

    /// Offset of `area`, after checking that `off..off+len` lies inside it.
    fn at(&self, area: Area, off: usize, len: usize) -> usize {
        let l = self.local.mine().layout;
        let (base, cap) = match area {
            Area::Small(h) => {
                assert!(h < 2, "small slot {h} of 2");
                (l.small_off + h * l.small, l.small)
            }
            Area::Input(c) => {
                assert!(c < l.n, "input slot {c} of {}", l.n);
                (l.in_off + c * l.seg, l.seg)
            }
            Area::Inputs => (l.in_off, l.n * l.seg),
            Area::Output => (l.out_off, l.seg),
        };
        assert!(off + len <= cap, "{area:?}: {off}+{len} beyond {cap} bytes");
        base + off
    }

    /// Copies `src` into this rank's `area` at `off`.
    pub fn put(&self, area: Area, off: usize, src: &[u8]) {
        let at = self.at(area, off, src.len());
        // SAFETY: in bounds (checked); by the phase protocol no peer reads
        // this range until we publish the phase after this write (or set
        // the block flag after it, for a streamed chunk).
        unsafe { self.local.mine().write(at, src) }
    }

    /// Copies each of `blocks` (c, data) into this rank's input slot c from
    /// its start, cut into `wk`'s pieces and split among its threads.
    pub fn put_inputs<'a>(&self, wk: &Workers, blocks: impl IntoIterator<Item = (usize, &'a [u8])>) {
        self.put_all(wk, blocks.into_iter().map(|(c, data)| (Area::Input(c), 0, data)));
    }

    /// Copies each of `blocks` (area, offset, data) into this rank's
    /// areas, cut into `wk`'s pieces and split among its threads.
    pub fn put_all<'a>(&self, wk: &Workers, blocks: impl IntoIterator<Item = (Area, usize, &'a [u8])>) {
        let mut puts = Vec::new();
        for (area, at, data) in blocks {
            puts.extend(wk.ranges(data.len()).into_iter().map(|r| (area, at + r.start, &data[r])));
        }
        let bytes = puts.iter().map(|(_, _, piece)| piece.len()).sum();
        let Ok(()) = wk.for_each(puts, bytes, |(area, off, piece)| {
            self.put(area, off, piece);
            Ok::<(), std::convert::Infallible>(())
        });
    }

    /// Bytes of a block in the input area that one block flag covers.
    pub const BLOCK_CHUNK: usize = super::segment::BLOCK_CHUNK;

    /// Stores `seq` in this rank's block flag `k` once the chunk it covers
    /// is written ([`Window::put`]): a peer that finds `seq` there may read
    /// that chunk ([`Window::wait_block_flag`]).
    pub fn set_block_flag(&self, k: usize, seq: u64) {
        self.local.mine().block_flag(k).store(seq, Ordering::Release);
    }

    /// Waits, spinning then yielding, until local rank `peer`'s block flag
    /// `k` holds `seq` (then what it covers may be read); false when it
    /// did not within `RUSTCCL_SHM_BLOCK_WAIT_US`, for the caller to wait
    /// with the transport's checks ([`PhaseWait::wait_until`],
    /// [`Window::block_flag_is`]).
    pub fn wait_block_flag(&self, peer: usize, k: usize, seq: u64) -> bool {
        let flag = self.local.segs[peer].block_flag(k);
        super::stage::wait_ready(flag, seq, self.local.block_wait, &|| Err(String::new())).is_ok()
    }

    /// Whether local rank `peer`'s block flag `k` holds `seq`.
    pub fn block_flag_is(&self, peer: usize, k: usize, seq: u64) -> bool {
        self.local.segs[peer].block_flag(k).load(Ordering::Acquire) == seq
    }

    /// Copies `dst.len()` bytes of local rank `peer`'s `area` at `off`.
    pub fn get(&self, peer: usize, area: Area, off: usize, dst: &mut [u8]) {
        let at = self.at(area, off, dst.len());
        // SAFETY: in bounds (checked); by the phase protocol the peer
        // published this range (or flagged this streamed chunk) and
        // rewrites it only after we publish.
        unsafe { self.local.segs[peer].read(at, dst) }
    }

    /// Calls `f` with a view of `len` bytes of local rank `peer`'s `area`
    /// at `off` (the view cannot outlive the call).
    pub fn with<R>(&self, peer: usize, area: Area, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let at = self.at(area, off, len);
        // SAFETY: as in `get`, for the duration of `f`.
        f(unsafe { self.local.segs[peer].view(at, len) })
    }

    /// Smallest all_reduce (bytes per rank) that reads peers' buffers
    /// directly (`Attach::all_reduce_min`); None when the ranks cannot.
    pub fn all_reduce_attach_min(&self) -> Option<usize> {
        self.local.attach.as_ref().map(|a| a.all_reduce_min)
    }

    /// Smallest reduce_scatter (bytes of its input) that reads peers'
    /// buffers directly (`Attach::reduce_scatter_min`); None when the
    /// ranks cannot.
    pub fn reduce_scatter_attach_min(&self) -> Option<usize> {
        self.local.attach.as_ref().map(|a| a.reduce_scatter_min)
    }

    /// Smallest all_gather (bytes per rank) that reads peers' buffers
    /// directly (`Attach::all_gather_min`); None when the ranks cannot.
    pub fn all_gather_attach_min(&self) -> Option<usize> {
        self.local.attach.as_ref().map(|a| a.all_gather_min)
    }

    /// Smallest reduce (bytes per rank) that reads the peers' buffers
    /// directly (`Attach::reduce_min`); None when the ranks cannot.
    pub fn reduce_attach_min(&self) -> Option<usize> {
        self.local.attach.as_ref().map(|a| a.reduce_min)
    }

    /// Smallest broadcast that reads the root's tensor directly; None:
    /// never (the default, or attach is off).
    pub fn broadcast_attach_min(&self) -> Option<usize> {
        self.local.attach.as_ref().map(|a| a.broadcast_min).filter(|&m| m != usize::MAX)
    }

    /// Whether all_to_all, gather and scatter run the single-copy
    /// algorithms (`collectives::shm::attach`) for blocks of `block` bytes
    /// (None: all_to_all, whose blocks differ between ranks) rather than
    /// the point-to-point rings: gathers and scatters always where reads
    /// are fast, else only for blocks read directly (`Attach::all_blocks`);
    /// all_to_all wherever ranks can read each other, its small blocks
    /// through the senders' slots. Where reads are slow (one thread a
    /// rank) all_to_all's single copy still beats a message a block
    /// through the rings at large sizes; small gathers and scatters keep
    /// the rings there, because the single copy's one step is a barrier
    /// over every rank, where the rings let each pair go on
    /// (`docs/decisions/0004`).
    pub fn attach_blocks(&self, op: BlockOp, block: Option<usize>) -> bool {
        self.local.attach.as_ref().is_some_and(|a| match block {
            None => true,
            Some(b) => a.all_blocks() || a.block_read(op, b),
        })
    }

    /// Whether an `op` block of `len` bytes is read from the sender's
    /// tensor rather than copied through its slot (`Attach::block_min`,
    /// `Attach::gather_block_min`, `Attach::scatter_block_min`; true when
    /// attach is off).
    pub fn block_read(&self, op: BlockOp, len: usize) -> bool {
        self.local.attach.as_ref().is_none_or(|a| a.block_read(op, len))
    }

    /// Entries in this rank's table of posted buffers.
    pub fn table_entries(&self) -> usize {
        super::Layout::table_entries(self.local.mine().layout.n)
    }

    /// Lets peers read `span` as table entry `entry` (from the next publish
    /// on, until this rank publishes that they are done).
    pub fn post(&self, entry: usize, span: &[u8]) {
        assert!(entry < self.table_entries(), "table entry {entry} of {}", self.table_entries());
        let l = self.local.mine().layout;
        let mut rec = [0u8; 16];
        rec[..8].copy_from_slice(&(span.as_ptr() as u64).to_ne_bytes());
        rec[8..].copy_from_slice(&(span.len() as u64).to_ne_bytes());
        // SAFETY: in bounds (asserted above, the table lies inside the
        // mapping); peers read the table only after our next publish.
        unsafe { self.local.mine().write(l.table_off + entry * 16, &rec) }
    }

    /// Copies `dst.len()` bytes at `off` of the buffer local rank `peer`
    /// posted as `entry` straight out of the peer's memory. The peer must
    /// have published the phase after its post and must keep the buffer
    /// unchanged until this rank publishes that it is done.
    pub fn pull(&self, peer: usize, entry: usize, off: usize, dst: &mut [u8]) -> std::result::Result<(), AttachError> {
        let (a, addr) = self.posted(peer, entry, off, dst.len(), "reads")?;
        a.read(peer, addr, dst)
            .map_err(|e| AttachError { peer, detail: format!("reading the peer's buffer (process {}) failed: {e}", a.pids[peer]) })
    }

    /// Cross-memory attach and the address of bytes `off..off + len` of
    /// `peer`'s entry `entry`, when attach is on and the entry holds them
    /// (else the error, naming the peer, for a rank that `does` them).
    fn posted(
        &self,
        peer: usize,
        entry: usize,
        off: usize,
        len: usize,
        does: &str,
    ) -> std::result::Result<(&super::Attach, u64), AttachError> {
        let Some(a) = &self.local.attach else {
            return Err(AttachError { peer, detail: "cross-memory attach is off".into() });
        };
        let (addr, posted) = self.entry(peer, entry);
        if off.checked_add(len).is_none_or(|end| end > posted) {
            return Err(AttachError {
                peer,
                detail: format!("peer posted {posted} bytes, this rank {does} {off}+{len}: the ranks passed different sizes"),
            });
        }
        Ok((a, addr + off as u64))
    }

    /// Copies `src` to `off` of the buffer local rank `peer` posted as
    /// `entry`, straight into the peer's memory (through the kernel). The
    /// peer must have posted that buffer for this rank to fill, published
    /// the phase after its post, and must leave it alone until this rank
    /// publishes that it is done.
    pub fn push(&self, peer: usize, entry: usize, off: usize, src: &[u8]) -> std::result::Result<(), AttachError> {
        let (a, addr) = self.posted(peer, entry, off, src.len(), "writes")?;
        a.write(peer, addr, src)
            .map_err(|e| AttachError { peer, detail: format!("writing the peer's buffer (process {}) failed: {e}", a.pids[peer]) })
    }

    /// Whether this rank, as a gather's root, lets the senders of blocks
    /// that no slot takes write them into its outputs ([`Window::push`])
    /// rather than reading them (as a reduce's root that reads, the others
    /// their reduced parts into its buffer): where the local ranks' tensors are read
    /// through the kernel (no shared arena, whose reads are plain copies)
    /// and `RUSTCCL_SHM_GATHER_PUSH` is on, so that the senders share the
    /// copies instead of the root making them all.
    pub fn gather_push(&self) -> bool {
        self.local.gather_push && self.local.attach.as_ref().is_some_and(|a| !a.any_arena())
    }

    /// As a scatter's root: the largest block this rank splits with the
    /// receiver that would read it (`RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES`).
    pub fn scatter_split_max(&self) -> usize {
        self.local.scatter_split_max
    }

    /// As a scatter's root: of a block it splits, it writes the last
    /// 1 / this (`RUSTCCL_SHM_SCATTER_ROOT_SHARE`).
    pub fn scatter_root_share(&self) -> usize {
        self.local.scatter_root_share
    }

    /// As a gather's root that takes pushes: of each pushed block, it
    /// reads the last 1 / this itself (1: none).
    pub fn gather_root_share(&self) -> usize {
        self.local.gather_root_share
    }

    /// The `len` bytes at `off` of the buffer local rank `peer` posted as
    /// `entry`, read in place, when that buffer lies in the peer's shared
    /// tensor arena (`arena.rs`); None otherwise ([`Window::pull`] them).
    /// Under the same rule as `pull`: only until this rank publishes that
    /// it is done.
    pub fn peek(&self, peer: usize, entry: usize, off: usize, len: usize) -> Option<&[u8]> {
        let a = self.local.attach.as_ref()?;
        let (addr, posted) = self.entry(peer, entry);
        if off.checked_add(len).is_none_or(|end| end > posted) {
            return None;
        }
        a.peek(peer, addr + off as u64, len)
    }

    /// An invalid-argument error of `op` (naming the peer) unless local
    /// rank `peer` posted exactly `want` bytes as `entry`. Found before any
    /// byte moved: the ranks stay in step and the group usable.
    pub fn check_posted(&self, op: &'static str, peer: usize, entry: usize, want: usize) -> Result<()> {
        let (_, len) = self.entry(peer, entry);
        self.check_size(op, peer, want, len)
    }

    /// An invalid-argument error of `op` unless local rank `peer` sends
    /// this rank `got` bytes where it expects `want`.
    pub fn check_size(&self, op: &'static str, peer: usize, want: usize, got: usize) -> Result<()> {
        if got != want {
            return Err(Error::invalid(
                op,
                format!(
                    "rank {} expects {want} bytes from rank {}, which sends {got}: the ranks passed different split sizes",
                    self.local.ranks[self.local.me], self.local.ranks[peer]
                ),
            ));
        }
        Ok(())
    }

    /// (address, length) of `peer`'s table entry `entry`.
    fn entry(&self, peer: usize, entry: usize) -> (u64, usize) {
        assert!(entry < self.table_entries(), "table entry {entry} of {}", self.table_entries());
        let l = self.local.segs[peer].layout;
        let mut rec = [0u8; 16];
        // SAFETY: in bounds; the peer wrote the entry before the phase we
        // waited for and rewrites it only after we publish.
        unsafe { self.local.segs[peer].read(l.table_off + entry * 16, &mut rec) };
        (u64::from_ne_bytes(rec[..8].try_into().expect("8 bytes")), u64::from_ne_bytes(rec[8..].try_into().expect("8 bytes")) as usize)
    }

    /// The error for a failed [`Window::pull`], naming the peer.
    pub fn failed(&self, w: &dyn PhaseWait, e: AttachError) -> Error {
        w.mismatch(self.local.ranks[e.peer], e.detail)
    }

    /// This rank's current phase.
    pub fn phase(&self) -> u64 {
        self.local.mine().phase().load(Ordering::Relaxed)
    }

    /// Publishes phase `v` (everything written before it becomes visible to
    /// peers that wait for it) and wakes those asleep (those polling see it).
    pub fn publish(&self, v: u64) {
        self.local.mine().phase().store(v, Ordering::Release);
        for (i, s) in self.local.segs.iter().enumerate() {
            if i != self.local.me {
                s.wake_if_asleep();
            }
        }
    }

    /// The small slot of a one-step operation that starts at phase `p`
    /// (this rank's phase before its first publish). One-step operations
    /// publish once and return without waiting for the peers' reads, so a
    /// rank may already write its slot for the next operation while slower
    /// peers still read this one: it writes the other slot. It writes this
    /// slot again in an operation that starts at `p + 2` or later, after
    /// that operation's first wait: every peer published `p + 2` by then,
    /// which it does only once it returned from this operation.
    pub fn small_slot(p: u64) -> Area {
        Area::Small((p % 2) as usize)
    }

    /// Announces the operation this rank is about to run: at the phase it
    /// starts at, after its first wait and before its first publish. The
    /// descriptor goes to the slot of that phase's parity, so a peer still
    /// verifying the previous operation (a one-step operation does not
    /// wait for that) reads the other slot.
    pub fn announce(&self, w: &dyn PhaseWait, d: &Desc) {
        let slot = self.phase() as usize;
        self.local.mine().desc(slot).store(descriptor(w.seq(), w.what(), d), Ordering::Relaxed);
        self.local.mine().desc_len(slot).store(length_word(d), Ordering::Relaxed);
    }

    /// After the operation's first publish (one phase after its announce)
    /// and the wait that follows it: every peer announced the same
    /// operation. Every local rank compares every other's descriptor, so a
    /// disagreement fails the operation on all of them at the same phase,
    /// and the next operation starts in step.
    pub fn verify(&self, w: &dyn PhaseWait, d: &Desc) -> Result<()> {
        let want = descriptor(w.seq(), w.what(), d);
        let slot = self.phase().wrapping_sub(1) as usize;
        for (i, s) in self.local.segs.iter().enumerate() {
            if i == self.local.me {
                continue;
            }
            let (got, l) = (s.desc(slot).load(Ordering::Relaxed), s.desc_len(slot).load(Ordering::Relaxed));
            if got >> 32 != want >> 32 {
                return Err(w.mismatch(
                    self.local.ranks[i],
                    format!(
                        "peer is at operation seq {} but this rank is at seq {}: the ranks called a different number of collectives",
                        got >> 32,
                        want >> 32
                    ),
                ));
            }
            let (their_len, their_root) = (l & ((1 << LEN_BITS) - 1), ((l >> LEN_BITS) as usize).checked_sub(1));
            if got == want && their_len == d.len as u64 && their_root != d.root {
                let name = |r: Option<usize>| {
                    r.map_or("none".to_string(), |r| self.local.ranks.get(r).map_or(format!("local {r}"), |g| g.to_string()))
                };
                return Err(w.disagree(
                    self.local.ranks[i],
                    format!(
                        "peer runs {} from root {} where this rank has root {}: the ranks passed different roots",
                        d.name,
                        name(their_root),
                        name(d.root)
                    ),
                ));
            }
            if got != want || their_len != d.len as u64 {
                return Err(w.disagree(
                    self.local.ranks[i],
                    format!(
                        "peer runs {} where this rank runs {}: the ranks passed different tensors, dtypes or reduce ops ({})",
                        desc_text(d.name, got, their_len),
                        desc_text(d.name, want, d.len as u64),
                        frame::NEXT_STEP,
                    ),
                ));
            }
        }
        Ok(())
    }
}
