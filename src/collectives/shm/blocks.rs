//! How the blocks of all_to_all, gather and scatter (`attach`,
//! `attach::scatter`) go from a sender to their receivers on one host,
//! and the reads of peers' tensors the single-copy collectives share.
//!
//! A sender writes a header in its small slot in every operation, before
//! the first publish ([`offer`]): each block's length, and whether the
//! blocks are all in that slot. Blocks too large for it go through its
//! input slots, packed one after the other ([`packed`]), unless they are
//! read from its tensor (or pushed, a gather's).
//!
//! Blocks through the input slots stream: the sender copies them there
//! after the first publish ([`deliver`]), storing the operation's number
//! (its first phase + 1, `Step::seq`) in a block flag after each chunk of
//! `Window::BLOCK_CHUNK` bytes, and a receiver copies each chunk out as
//! soon as its flag holds that number ([`take`]), so the two copies
//! overlap instead of following each other. The numbers only grow, so a
//! flag left by an earlier operation never reads as ready; the sender
//! writes its slots again only in an operation whose first wait saw every
//! receiver leave this one. A receiving thread that waited
//! `RUSTCCL_SHM_BLOCK_WAIT_US` (20 ms) for a chunk gives up, and the calling thread waits for the sender's
//! flags with the transport's deadline, interrupt and dead-peer checks
//! (`PhaseWait::wait_until`), then copies the blocks again.
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::MAX_ROOT_SHARE;
use crate::error::{Error, Result};
use crate::transport::shm::{Area, AttachError, BlockOp, PhaseWait, Window, Workers};

/// Bytes a block flag covers.
const CHUNK: usize = Window::BLOCK_CHUNK;

/// Where a root's header says what share of a split block it takes
/// over (a scatter root writes, a gather root reads, the last 1 / share):
/// five bits above the push flags (`attach::POSTED_FOR_PUSHES`,
/// `FAILED`); under 2: none.
const SHARE_SHIFT: u32 = 3;
const SHARE_MASK: u64 = MAX_ROOT_SHARE as u64;

/// A root's header flags for `share` ([`SHARE_SHIFT`]).
pub(super) fn share_flags(share: usize) -> u64 {
    (share as u64 & SHARE_MASK) << SHARE_SHIFT
}

/// The share a root's header flags carry ([`share_flags`]).
pub(super) fn share_of(flags: u64) -> usize {
    (flags >> SHARE_SHIFT & SHARE_MASK) as usize
}

/// Runs `pulls` (local peer, table entry, offset in it, destination) on
/// `wk`'s threads, each cut into pieces; the first failure names its peer.
/// The threads take the pieces in [`staggered`] order of their peers.
pub(crate) fn pull_all(win: &Window, w: &dyn PhaseWait, wk: &Workers, mut pulls: Vec<(usize, usize, usize, &mut [u8])>) -> Result<()> {
    staggered(win, &mut pulls, |p| p.0);
    let bytes = pulls.iter().map(|p| p.3.len()).sum();
    let mut items = Vec::new();
    for (peer, entry, off, dst) in pulls {
        items.extend(wk.pieces_mut(dst).map(|(o, piece)| (peer, entry, off + o, piece)));
    }
    wk.for_each(items, bytes, |(peer, entry, off, piece)| win.pull(peer, entry, off, piece)).map_err(|e: AttachError| win.failed(w, e))
}

/// Sorts `items` by their peer (`peer_of`), starting after this rank:
/// local rank r takes r+1, r+2, ... first. A worker team takes its items
/// in list order, so in ascending order every rank's threads would start
/// on the same peer, and where they read the same bytes (all_gather, the
/// all-gather half of all_reduce) the kernel's reads of one page by
/// several processes at once contend (`docs/decisions/0004`).
pub(super) fn staggered<T>(win: &Window, items: &mut [T], peer_of: impl Fn(&T) -> usize) {
    let (n, me) = (win.ranks().len(), win.me());
    items.sort_by_key(|t| (peer_of(t) + n - me - 1) % n);
}

/// Where a block lies in its sender's input slots taken as one area
/// (`Area::Inputs`): its offset, and its first block flag (its chunks'
/// flags follow; blocks never share one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Packed {
    pub at: usize,
    pub flag: usize,
}

/// Where each of a sender's blocks (`lens`, by destination, as its
/// header gives them) lies in its input slots when it goes through them
/// rather than being read from its tensor (`transport::shm::Attach::block_min`):
/// the blocks that may ([`eager`]), packed in destination order, each
/// from a cache line, while they fit; `None`: read (or a gather's
/// pushed). Sender and receivers compute it from the same lengths, so
/// they agree. With 2 local ranks a block may so fill both slots.
pub(super) fn packed(win: &Window, op: BlockOp, lens: &[usize]) -> Vec<Option<Packed>> {
    pack(lens, win.inputs_capacity(), |len| eager(win, op, len))
}

/// The largest block that goes through its sender's input slots: both of
/// them with 2 local ranks, where the two slots beat the kernel's reads,
/// else one: with more ranks, blocks through two slots were slower than
/// reading them (`docs/decisions/0004`).
fn block_max(win: &Window) -> usize {
    if win.ranks().len() == 2 {
        win.inputs_capacity()
    } else {
        win.slot_capacity()
    }
}

/// [`packed`] into `room` bytes, `through` saying which lengths may go
/// through the slots. The flags of a block's chunks follow those of the
/// block before, so there are at most one per chunk of the area and one
/// more per block (`Layout::block_flags`).
fn pack(lens: &[usize], room: usize, through: impl Fn(usize) -> bool) -> Vec<Option<Packed>> {
    let (mut free, mut flag) = (0, 0);
    lens.iter()
        .map(|&len| {
            let at = free;
            (through(len) && at + len <= room).then(|| {
                free = (at + len).div_ceil(64) * 64;
                let p = Packed { at, flag };
                flag += len.div_ceil(CHUNK);
                p
            })
        })
        .collect()
}

/// [`packed`] for this rank's own `blocks` (destination, data), by
/// destination (the lengths its header gives).
pub(super) fn packed_blocks(win: &Window, op: BlockOp, blocks: &[(usize, &[u8])]) -> Vec<Option<Packed>> {
    let mut lens = vec![0; win.ranks().len()];
    for (c, d) in blocks {
        lens[*c] = d.len();
    }
    packed(win, op, &lens)
}

/// Whether a block of `len` bytes may go through its sender's input slots
/// rather than being read from its tensor: one that is not read and fits
/// [`block_max`] (a sender's only block, a gather's, always has the room:
/// [`packed`]). With the attach threshold at 0 (tests) every block is read.
pub(super) fn eager(win: &Window, op: BlockOp, len: usize) -> bool {
    !win.block_read(op, len) && len <= block_max(win)
}

/// Where the blocks of all_to_all, gather and scatter start in a small
/// slot: after a header of one word of flags (whether the sender's blocks
/// are in it, [`IN_SLOT`], and those of `attach`), and one word per
/// local rank with the length of its block.
pub(super) fn blocks_at(n: usize) -> usize {
    (8 * (n + 1)).div_ceil(64) * 64
}

/// A header's first word: the sender's blocks are in its small slot.
const IN_SLOT: u64 = 1;

/// A sender's header, as written by [`offer`].
pub(super) struct Header {
    pub in_slot: bool,
    /// The first word: [`IN_SLOT`], `attach::POSTED_FOR_PUSHES` and
    /// `FAILED`, a scatter root's `attach::scatter::split_bit`s.
    pub flags: u64,
    pub lens: Vec<usize>,
}

impl Header {
    /// After the first step: every rank's header, ours standing for
    /// whether our blocks went to our slot (`mine`).
    pub fn read_all(win: &Window, slot: Area, mine: bool) -> Vec<Header> {
        let n = win.ranks().len();
        (0..n)
            .map(|peer| {
                if peer == win.me() {
                    return Header { in_slot: mine, flags: mine as u64, lens: vec![0; n] };
                }
                let mut raw = vec![0u8; 8 * (n + 1)];
                win.get(peer, slot, 0, &mut raw);
                let word = |i: usize| u64::from_ne_bytes(raw[8 * i..8 * i + 8].try_into().expect("8 bytes"));
                let flags = word(0);
                Header { in_slot: flags & IN_SLOT != 0, flags, lens: (0..n).map(|c| word(1 + c) as usize).collect() }
            })
            .collect()
    }

    /// Offset of rank `c`'s block in the sender's small slot.
    fn offset(&self, c: usize) -> usize {
        blocks_at(self.lens.len()) + self.lens[..c].iter().sum::<usize>()
    }
}

/// Before publishing: our header, with `flags` (a root's push flags, a
/// scatter root's split bits) in its first word, and our `blocks`
/// (destination, data; ascending destinations) in our small slot `slot`
/// when they fit together, so that the operation may end in one step
/// (see [`all_in_slots`]). Every rank writes its header in every
/// operation, with or without blocks. Returns whether the blocks are in
/// the small slot; where not, those [`packed`] in the input slots go there
/// after the publish ([`deliver`], [`take`]).
pub(super) fn offer(win: &Window, slot: Area, blocks: &[(usize, &[u8])], flags: u64) -> bool {
    let n = win.ranks().len();
    let in_slot = fits_small(win, blocks.iter().map(|(_, d)| d.len()).sum());
    let mut header = vec![0u8; 8 * (n + 1)];
    header[..8].copy_from_slice(&(in_slot as u64 | flags).to_ne_bytes());
    let mut off = blocks_at(n);
    for (c, d) in blocks {
        header[8 * (1 + c)..8 * (2 + c)].copy_from_slice(&(d.len() as u64).to_ne_bytes());
        if in_slot {
            win.put(slot, off, d);
            off += d.len();
        }
    }
    win.put(slot, 0, &header);
    in_slot
}

/// Whether blocks of `total` bytes fit a small slot after its header.
pub(super) fn fits_small(win: &Window, total: usize) -> bool {
    blocks_at(win.ranks().len()) + total <= win.small_capacity()
}

/// Whether every rank's blocks are in its small slot. Every rank reads the
/// same headers, so all take the same decision: then nobody reads
/// anybody's tensors or input slots, and the operation ends without a
/// second step (the small slots alternate).
pub(super) fn all_in_slots(headers: &[Header]) -> bool {
    headers.iter().all(|h| h.in_slot)
}

/// A piece of a block on its way through its sender's input slots, copied
/// chunk by chunk by one worker thread.
pub(super) enum Piece<'a> {
    /// Ours, into our input slots at `at`, each chunk's flag (from `flag`)
    /// set once it is in.
    Put { at: usize, flag: usize, src: &'a [u8] },
    /// A peer's, out of its input slots at `at`, each chunk once its flag
    /// (from `flag`) holds the operation's number.
    Get { peer: usize, at: usize, flag: usize, dst: &'a mut [u8] },
    /// Our own block, from our input to our output, in the same phase.
    Own { dst: &'a mut [u8], src: &'a [u8] },
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Put { src, .. } | Piece::Own { src, .. } => src.len(),
            Piece::Get { dst, .. } => dst.len(),
        }
    }
}

/// The copy of our own block `src` into `dst` (the same length), cut into
/// `wk`'s pieces, to run in the phase of our other copies.
pub(super) fn own<'a>(wk: &Workers, dst: &'a mut [u8], src: &'a [u8]) -> impl Iterator<Item = Piece<'a>> + use<'a> {
    assert_eq!(dst.len(), src.len(), "own block copied between buffers of different lengths");
    let pieces: Vec<_> = wk.pieces_mut(dst).collect();
    pieces.into_iter().map(move |(off, d)| {
        let len = d.len();
        Piece::Own { dst: d, src: &src[off..off + len] }
    })
}

/// After the first publish: the copies of our `blocks` (destination,
/// data) that [`packed`] puts in our input slots (`at`), cut into `wk`'s
/// pieces (a root's or an all_to_all's blocks add up to more than one
/// thread should copy alone); none where they went to our small slot
/// (`in_slot`).
pub(super) fn puts<'a>(wk: &Workers, blocks: &[(usize, &'a [u8])], at: &[Option<Packed>], in_slot: bool) -> Vec<Piece<'a>> {
    let mut items = Vec::new();
    for &(c, d) in blocks.iter().filter(|_| !in_slot) {
        let Some(pk) = at[c] else { continue };
        items.extend(wk.ranges_aligned(d.len(), CHUNK).into_iter().map(|r| Piece::Put {
            at: pk.at + r.start,
            flag: pk.flag + r.start / CHUNK,
            src: &d[r],
        }));
    }
    items
}

/// A sender's copies of its blocks into its input slots ([`puts`]), and
/// any of its own ([`own`]) after them, in one phase of `wk`'s threads,
/// for operation `seq` (`Step::seq`).
pub(super) fn deliver(win: &Window, wk: &Workers, seq: u64, ours: Vec<Piece>) {
    copy(win, wk, seq, ours, &AtomicBool::new(false));
}

/// Takes `blocks` (peer, table entry, destination): from the peer's small
/// slot when its header says the blocks are there; else from its input
/// slots where it [`packed`] ours there, each chunk as it lands, or
/// straight out of the tensor it posted as that entry. Our own copies,
/// `ours` (an all_to_all's [`puts`], our own block), go first in the
/// same phase of `wk`'s threads, so they are never behind a thread that
/// waits for a peer's chunk. Sizes are checked against the sender's
/// first, for every block: a mismatch moves nothing of theirs and names
/// the peer (our copies still go: the peers wait for our puts).
#[allow(clippy::too_many_arguments)]
pub(super) fn take(
    win: &Window,
    w: &mut dyn PhaseWait,
    wk: &Workers,
    op: BlockOp,
    slot: Area,
    headers: &[Header],
    seq: u64,
    ours: Vec<Piece>,
    blocks: Vec<(usize, usize, &mut [u8])>,
) -> Result<()> {
    let me = win.me();
    let mut from = Vec::with_capacity(blocks.len());
    for (peer, entry, dst) in blocks {
        let h = &headers[peer];
        let src = if h.in_slot {
            win.check_size(op.name(), peer, dst.len(), h.lens[me]).map(|()| From::Small(h.offset(me)))
        } else {
            win.check_posted(op.name(), peer, entry, dst.len())
                .map(|()| packed(win, op, &h.lens)[me].map_or(From::Tensor(entry), From::Inputs))
        };
        match src {
            Ok(src) => from.push((peer, src, dst)),
            Err(e) => {
                deliver(win, wk, seq, ours);
                return Err(e);
            }
        }
    }
    let (mut streamed, mut pulls) = (Vec::new(), Vec::new());
    staggered(win, &mut from, |f| f.0);
    for (peer, src, dst) in from {
        match src {
            From::Small(at) => win.get(peer, slot, at, dst),
            From::Inputs(pk) => streamed.push((peer, pk, dst)),
            From::Tensor(entry) => pulls.push((peer, entry, 0, dst)),
        }
    }
    let gave_up = AtomicBool::new(false);
    let mut items = ours;
    items.extend(gets(wk, &mut streamed));
    copy(win, wk, seq, items, &gave_up);
    if gave_up.into_inner() {
        // A sender is slow, stopped or gone: wait for all its chunks as
        // the transport waits for phases, then copy everything again
        // (the sender's bytes stay until we publish that we are done).
        for (peer, pk, dst) in &streamed {
            let chunks = dst.len().div_ceil(CHUNK);
            w.wait_until(*peer, &|| (0..chunks).all(|j| win.block_flag_is(*peer, pk.flag + j, seq)))?;
        }
        let again = AtomicBool::new(false);
        copy(win, wk, seq, gets(wk, &mut streamed).collect(), &again);
        if again.into_inner() {
            return Err(Error::Internal(format!("{}: a peer's block flags changed while this rank copied its block", op.name())));
        }
    }
    pull_all(win, w, wk, pulls)
}

/// The pieces of the `streamed` blocks (peer, where it packed ours,
/// destination) to copy out of their senders' input slots.
fn gets<'b, 'd: 'b>(wk: &'b Workers, streamed: &'b mut [(usize, Packed, &'d mut [u8])]) -> impl Iterator<Item = Piece<'b>> + use<'b, 'd> {
    streamed.iter_mut().flat_map(move |(peer, pk, dst)| {
        let (peer, pk) = (*peer, *pk);
        wk.pieces_aligned_mut(dst, CHUNK).map(move |(off, piece)| Piece::Get {
            peer,
            at: pk.at + off,
            flag: pk.flag + off / CHUNK,
            dst: piece,
        })
    })
}

/// Runs `items` on `wk`'s threads (in list order: ours before gets). A
/// get whose chunk does not come within `RUSTCCL_SHM_BLOCK_WAIT_US` sets `gave_up` and
/// stops, and so do the gets after it.
fn copy(win: &Window, wk: &Workers, seq: u64, items: Vec<Piece>, gave_up: &AtomicBool) {
    let bytes = items.iter().map(Piece::len).sum();
    let Ok(()) = wk.for_each(items, bytes, |item| {
        match item {
            Piece::Put { at, flag, src } => {
                for (j, c) in src.chunks(CHUNK).enumerate() {
                    win.put(Area::Inputs, at + j * CHUNK, c);
                    win.set_block_flag(flag + j, seq);
                }
            }
            Piece::Own { dst, src } => dst.copy_from_slice(src),
            Piece::Get { peer, at, flag, dst } => {
                for (j, c) in dst.chunks_mut(CHUNK).enumerate() {
                    if gave_up.load(Ordering::Relaxed) || !win.wait_block_flag(peer, flag + j, seq) {
                        gave_up.store(true, Ordering::Relaxed);
                        break;
                    }
                    win.get(peer, Area::Inputs, at + j * CHUNK, c);
                }
            }
        }
        Ok::<(), Infallible>(())
    });
}

/// Where [`take`] finds a block.
enum From {
    /// At this offset of the sender's small slot.
    Small(usize),
    /// Where the sender packed it in its input slots ([`packed`]).
    Inputs(Packed),
    /// In the tensor the sender posted as this table entry.
    Tensor(usize),
}

#[cfg(test)]
mod tests {
    use super::{pack, Packed, CHUNK};

    fn at(at: usize, flag: usize) -> Option<Packed> {
        Some(Packed { at, flag })
    }

    /// Blocks that may go through the slots go one after the other from
    /// cache lines, across slot boundaries, while they fit; one that does
    /// not fit (or may not) is read and takes no room, so a later small
    /// one still fits. Each block's flags follow the last block's.
    #[test]
    fn blocks_pack_in_destination_order_while_they_fit() {
        let through = |len: usize| len <= 3000;
        assert_eq!(pack(&[0, 1000, 100, 2000], 4096, through), vec![at(0, 0), at(0, 0), at(1024, 1), at(1152, 2)]);
        assert_eq!(pack(&[2000, 2000, 100], 4096, through), vec![at(0, 0), at(2048, 1), None]);
        assert_eq!(pack(&[3500, 2000, 4000, 64], 4096, through), vec![None, at(0, 0), None, at(2048, 1)]);
        assert_eq!(pack(&[4096], 4096, |_| true), vec![at(0, 0)]);
        assert_eq!(pack(&[4097], 4096, |_| true), vec![None]);
        // one slot's worth (1024) at most: the 2000-byte block is read
        assert_eq!(pack(&[1000, 2000, 1000], 4096, |len| len <= 1024), vec![at(0, 0), None, at(1024, 1)]);
    }

    /// Blocks of several chunks take a flag per chunk, counted from each
    /// block's start: a chunk boundary inside the area does not make two
    /// blocks share a flag, and the count stays within one per chunk of
    /// the area plus one per block.
    #[test]
    fn each_chunk_of_a_block_has_a_flag_of_its_own() {
        let room = 8 * CHUNK;
        let lens = [CHUNK + 100, 2 * CHUNK, CHUNK - 64, 1];
        let p = pack(&lens, room, |_| true);
        assert_eq!(p, vec![at(0, 0), at(CHUNK + 128, 2), at(3 * CHUNK + 128, 4), at(4 * CHUNK + 64, 5)]);
        let used: usize = lens.iter().map(|l| l.div_ceil(CHUNK)).sum();
        assert!(used <= room.div_ceil(CHUNK) + lens.len());
    }
}
