//! Single-copy collectives among the ranks of one host: every rank posts
//! the addresses of its own tensors in its segment's table and the others
//! read what they need straight out of them (cross-memory attach,
//! `transport::shm::remote`), split among their worker threads. Each byte
//! is copied once, where the shared-slot algorithms copy it twice (into a
//! slot and out of it).
//!
//! Every operation runs the same three steps ([`Step`]): wait until the
//! peers left the previous operation, post and publish (`p+1`); read from
//! the peers; publish `p+2` and wait until every peer did, because a peer
//! may read this rank's tensors until then and the caller may change them
//! as soon as the operation returns. The reducing ones (`shm_attach_reduce`)
//! add a step in the middle.
//!
//! all_to_all, gather and scatter put a sender's blocks into its small
//! slot when they fit there together (a header says so, [`offer`]), else
//! those up to the block-read threshold into its input slots, packed one
//! after the other while they fit (a block fills both of them with 2
//! local ranks, at most one otherwise: [`packed`]); when
//! every rank's do, nobody reads a tensor or an input slot and the
//! operation ends after the first step, as the one-step collectives of
//! `shm_one_round` do (the small slots alternate between operations).
//!
//! A gather whose blocks no slot takes is where data goes the other way
//! (so do a 2-rank broadcast's second half, [`broadcast`], a reduce's
//! parts, `shm_attach_reduce`, and the second half of a scatter's read
//! blocks up to `RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES`, `shm_attach_scatter`): where tensors are read through the kernel, the root
//! posts its outputs and says so in its header ([`POSTED_FOR_PUSHES`]),
//! and each sender writes its block into them itself (`Window::push`),
//! side by side, while the root copies its own part; the root waits for
//! the senders' last publish and reports a failed write flagged in a
//! sender's header ([`FAILED`], which the reductions also set where
//! a rank failed a part that others would read).
#![forbid(unsafe_code)]

use std::convert::Infallible;

use crate::error::Result;
use crate::transport::shm::{split_point, Area, Desc, PhaseWait, AttachError, Window, Workers};
use crate::types::{DType, ReduceOp};

/// One single-copy operation in progress: its first phase.
pub(crate) struct Step {
    pub p: u64,
}

impl Step {
    /// Waits until the peers left the previous operation (so our table,
    /// slots and tensors are ours again), posts `spans` as table entries
    /// 0.., copies the small ones the peers will take from our slots there
    /// (`fill`), and publishes; returns once every peer did too.
    pub fn begin(win: &Window, w: &mut dyn PhaseWait, desc: &Desc, spans: &[&[u8]], fill: impl FnOnce()) -> Result<Step> {
        let p = win.phase();
        w.wait_phase(p)?;
        win.announce(w, desc);
        for (i, s) in spans.iter().enumerate() {
            win.post(i, s);
        }
        fill();
        win.publish(p + 1);
        w.wait_phase(p + 1)?;
        win.verify(w, desc)?;
        Ok(Step { p })
    }

    /// A step in the middle: every rank finished what it did since the last.
    pub fn sync(&self, win: &Window, w: &mut dyn PhaseWait, k: u64) -> Result<()> {
        win.publish(self.p + 1 + k);
        w.wait_phase(self.p + 1 + k)
    }

    /// Publishes that this rank is done reading. When peers may be reading
    /// our tensors (`read_from_us`), waits until every peer is done too:
    /// the caller may change them as soon as we return. Otherwise it need
    /// not wait: what peers read from our slots stays until the next
    /// operation's first wait, which waits for every peer's publish.
    /// Returns `r`, the outcome of this rank's reads: a rank that failed (a
    /// peer passed other sizes, a read failed) still takes every step, so
    /// its peers stay in step and the group stays usable.
    pub fn end(self, win: &Window, w: &mut dyn PhaseWait, steps: u64, read_from_us: bool, r: Result<()>) -> Result<()> {
        if read_from_us {
            self.sync(win, w, steps)?;
        } else {
            win.publish(self.p + 1 + steps);
        }
        r
    }
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
    wk.for_each(items, bytes, |(peer, entry, off, piece)| win.pull(peer, entry, off, piece))
        .map_err(|e: AttachError| win.failed(w, e))
}

/// Sorts `items` by their peer (`peer_of`), starting after this rank:
/// local rank r takes r+1, r+2, ... first. A worker team takes its items
/// in list order, so in ascending order every rank's threads would start
/// on the same peer, and where they read the same bytes (all_gather, the
/// all-gather half of all_reduce) the kernel's reads of one page by
/// several processes at once contend: on the 32-core host 7 readers of 8
/// threads read the same 8 MiB at 32 GB/s together, distinct 8 MiB
/// blocks at 90 GB/s (`benchmarks/attach_read_probe.py`,
/// `benchmarks/results/2026-11-27-x2host-split-sends/call1/probe.md`).
fn staggered<T>(win: &Window, items: &mut [T], peer_of: impl Fn(&T) -> usize) {
    let (n, me) = (win.ranks().len(), win.me());
    items.sort_by_key(|t| (peer_of(t) + n - me - 1) % n);
}

/// Where each of a sender's blocks (`lens`, by destination, as its
/// header gives them) lies in its input slots taken as one area
/// (`Area::Inputs`), when it goes through them rather than being read
/// from its tensor (`transport::shm::Attach::block_min`): the blocks
/// that may ([`eager`]), packed in destination order, each from a cache
/// line, while they fit; `None`: read (or a gather's pushed). Sender and
/// receivers compute it from the same lengths, so they agree. With 2
/// local ranks a block may so fill both slots.
pub(super) fn packed(win: &Window, lens: &[usize]) -> Vec<Option<usize>> {
    pack(lens, win.inputs_capacity(), |len| eager(win, len))
}

/// The largest block that goes through its sender's input slots: both of
/// them with 2 local ranks, else one. With 2 ranks of 8 threads (2 MiB
/// slots) 4 MiB blocks, which the kernel's reads took ~290 us for, made
/// 8 MiB scatters take 0.48-0.74x the time through both slots and 8 MiB
/// all_to_alls 0.51-0.91x (32- and 64-core hosts; 0.63x / 0.82x on the
/// 16-core one); with 4 ranks of 4 threads (1 MiB slots, 16-core host),
/// 2 MiB blocks through two slots made 8 MiB all_to_alls 1.4-1.5x slower
/// than reading them (`benchmarks/results/2026-11-28-x2host-packed-blocks/`).
fn block_max(win: &Window) -> usize {
    if win.ranks().len() == 2 {
        win.inputs_capacity()
    } else {
        win.slot_capacity()
    }
}

/// [`packed`] into `room` bytes, `through` saying which lengths may go
/// through the slots.
fn pack(lens: &[usize], room: usize, through: impl Fn(usize) -> bool) -> Vec<Option<usize>> {
    let mut free = 0;
    lens.iter()
        .map(|&len| {
            let at = free;
            (through(len) && at + len <= room).then(|| {
                free = (at + len).div_ceil(64) * 64;
                at
            })
        })
        .collect()
}

/// [`packed`] for this rank's own `blocks` (destination, data), by
/// destination (the lengths its header gives).
pub(super) fn packed_blocks(win: &Window, blocks: &[(usize, &[u8])]) -> Vec<Option<usize>> {
    let mut lens = vec![0; win.ranks().len()];
    for (c, d) in blocks {
        lens[*c] = d.len();
    }
    packed(win, &lens)
}

/// Whether a block of `len` bytes may go through its sender's input slots
/// rather than being read from its tensor: one that is not read and fits
/// [`block_max`] (a sender's only block, a gather's, always has the room:
/// [`packed`]). With the attach threshold at 0 (tests) every block is read.
pub(super) fn eager(win: &Window, len: usize) -> bool {
    !win.block_read(len) && len <= block_max(win)
}

/// Where the blocks of all_to_all, gather and scatter start in a small
/// slot: after a header of one word of flags (whether the sender's blocks
/// are in it, [`IN_SLOT`], and the others below), and one word per local
/// rank with the length of its block.
pub(super) fn blocks_at(n: usize) -> usize {
    (8 * (n + 1)).div_ceil(64) * 64
}

/// A header's first word: the sender's blocks are in its small slot.
const IN_SLOT: u64 = 1;
/// A gather's root posted its outputs for the senders to push into (a
/// reduce's root its buffer, `shm_attach_reduce`).
pub(super) const POSTED_FOR_PUSHES: u64 = 2;
/// This rank failed its share of the operation where a peer would
/// otherwise take it as done: a push into a peer's buffer, or a part the
/// peers read once reduced (`shm_attach_reduce`). Written over its small
/// slot's first word before the publish after which the peers look.
pub(super) const FAILED: u64 = 4;

/// A sender's header, as written by [`offer`].
pub(super) struct Header {
    pub in_slot: bool,
    /// The first word: [`IN_SLOT`], [`POSTED_FOR_PUSHES`], [`FAILED`],
    /// a scatter root's `shm_attach_scatter::split_bit`s.
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

/// Before publishing: our `blocks` (destination, data; ascending
/// destinations) go into our small slot `slot` when they fit together, so
/// that the operation may end in one step (see [`all_in_slots`]); else
/// the ones not read into our input slots at `at` (their [`packed`]
/// offsets by destination, [`packed_blocks`]), split among the
/// worker threads (a root's or an all_to_all's blocks add up: 7 x 256 KiB
/// copied on one thread took ~350 us), and the others are read from our
/// tensors (or pushed, a gather's). Every rank writes its header in every operation,
/// with or without blocks, `flags` (a root's push flags, a scatter root's
/// split bits) in its first word. Returns whether the blocks are in the
/// small slot.
pub(super) fn offer(win: &Window, wk: &Workers, slot: Area, blocks: &[(usize, &[u8])], at: &[Option<usize>], flags: u64) -> bool {
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
    if !in_slot {
        win.put_all(wk, blocks.iter().filter_map(|&(c, d)| Some((Area::Inputs, at[c]?, d))));
    }
    win.put(slot, 0, &header);
    in_slot
}

/// Whether blocks of `total` bytes fit a small slot after its header.
fn fits_small(win: &Window, total: usize) -> bool {
    blocks_at(win.ranks().len()) + total <= win.small_capacity()
}

/// Whether every rank's blocks are in its small slot. Every rank reads the
/// same headers, so all take the same decision: then nobody reads
/// anybody's tensors or input slots, and the operation ends without a
/// second step (the small slots alternate).
pub(super) fn all_in_slots(headers: &[Header]) -> bool {
    headers.iter().all(|h| h.in_slot)
}

/// Takes `blocks` (peer, table entry, destination): from the peer's small
/// slot when its header says the blocks are there; else from its input
/// slots where it [`packed`] ours there, or straight out of the tensor it
/// posted as that entry; copies and reads on `wk`'s threads. Sizes are
/// checked against the sender's first, for every block: a mismatch moves
/// nothing and names the peer.
pub(super) fn take(win: &Window, w: &dyn PhaseWait, wk: &Workers, op: &'static str, slot: Area, headers: &[Header], blocks: Vec<(usize, usize, &mut [u8])>) -> Result<()> {
    let me = win.me();
    let mut from = Vec::with_capacity(blocks.len());
    for (peer, entry, dst) in blocks {
        let h = &headers[peer];
        if h.in_slot {
            win.check_size(op, peer, dst.len(), h.lens[me])?;
            from.push((peer, From::Small(h.offset(me)), dst));
        } else {
            win.check_posted(op, peer, entry, dst.len())?;
            from.push((peer, packed(win, &h.lens)[me].map_or(From::Tensor(entry), From::Inputs), dst));
        }
    }
    let (mut gets, mut pulls) = (Vec::new(), Vec::new());
    staggered(win, &mut from, |f| f.0);
    for (peer, src, dst) in from {
        match src {
            From::Small(at) => win.get(peer, slot, at, dst),
            From::Inputs(at) => gets.extend(wk.pieces_mut(dst).map(|(off, piece)| (peer, at + off, piece))),
            From::Tensor(entry) => pulls.push((peer, entry, 0, dst)),
        }
    }
    let bytes = gets.iter().map(|(_, _, piece)| piece.len()).sum();
    let Ok(()) = wk.for_each(gets, bytes, |(peer, off, piece)| {
        win.get(peer, Area::Inputs, off, piece);
        Ok::<(), Infallible>(())
    });
    pull_all(win, w, wk, pulls)
}

/// Where [`take`] finds a block.
enum From {
    /// At this offset of the sender's small slot.
    Small(usize),
    /// At this offset of the sender's input slots ([`packed`]).
    Inputs(usize),
    /// In the tensor the sender posted as this table entry.
    Tensor(usize),
}

pub(super) fn desc(name: &'static str, len: usize, root: Option<usize>) -> Desc {
    Desc { name, dtype: DType::U8, op: ReduceOp::Sum, len, root }
}

/// `root`: local index of the root. Every other rank reads the root's
/// buffer. Between two ranks the root, idle otherwise, writes the second
/// half into the other's buffer itself meanwhile ([`Window::push`]), so
/// both ranks' cores copy: the root's choice ([`Window::gather_push`]),
/// said in its small slot, whose first word keeps that flag and gets
/// [`FAILED`] beside it if a write failed. The other rank then
/// publishes its last phase only after reading that word (so the root's
/// next operation cannot have written the slot yet).
pub fn broadcast(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], root: usize) -> Result<()> {
    let me = win.me();
    let slot = Window::small_slot(win.phase());
    let posts = me == root && win.ranks().len() == 2 && win.gather_push();
    let flags = if posts { POSTED_FOR_PUSHES } else { 0 };
    // Ours: the root's data, or where the root may write the second half.
    let step = Step::begin(win, w, &desc("broadcast", buf.len(), Some(root)), &[&*buf], || {
        if me == root {
            set_slot_word(win, slot, flags);
        }
    })?;
    let half = split_point(buf.len());
    if me == root {
        let r = if posts { push_tail(win, w, 1 - me, buf, half) } else { Ok(()) };
        if posts && r.is_err() {
            set_slot_word(win, slot, flags | FAILED);
        }
        return step.end(win, w, 1, true, r);
    }
    let split = slot_word(win, root, slot) & POSTED_FOR_PUSHES != 0;
    let mine = if split { half } else { buf.len() };
    let r = pull_all(win, w, win.workers(), vec![(root, 0, 0, &mut buf[..mine])]);
    if !split {
        return step.end(win, w, 1, false, r);
    }
    // The root writes our second half until it publishes p+2.
    w.wait_phase(step.p + 2)?;
    let r = r.and_then(|()| first_failed(win, w, slot, std::iter::once(root), "write the second half of its broadcast into this rank's buffer"));
    win.publish(step.p + 2);
    r
}

/// A broadcast root's writes of `buf[from..]` into the same bytes of the
/// buffer local rank `peer` posted, on the worker threads.
fn push_tail(win: &Window, w: &dyn PhaseWait, peer: usize, buf: &[u8], from: usize) -> Result<()> {
    win.check_posted("broadcast", peer, 0, buf.len())?;
    let tail = &buf[from..];
    let wk = win.workers();
    wk.for_each(wk.ranges(tail.len()), tail.len(), |r: std::ops::Range<usize>| win.push(peer, 0, from + r.start, &tail[r]))
        .map_err(|e: AttachError| win.failed(w, e))
}

/// `outs[c]`: rank c's part of the output; ours already holds our input.
pub fn all_gather(win: &Window, w: &mut dyn PhaseWait, outs: &mut [&mut [u8]]) -> Result<()> {
    let me = win.me();
    let total = outs.iter().map(|o| o.len()).sum();
    let step = Step::begin(win, w, &desc("all_gather", total, None), &[&*outs[me]], || ())?;
    let pulls = outs.iter_mut().enumerate().filter(|(c, _)| *c != me).map(|(c, o)| (c, 0, 0, &mut **o)).collect();
    let r = pull_all(win, w, win.workers(), pulls);
    step.end(win, w, 1, true, r)
}

/// `ins[p]`: what this rank sends rank p; `outs[p]`: what it gets from
/// rank p (ours already copied). Sizes are checked against the sender's.
/// The copies into and out of the slots run on the all_to_all workers,
/// whose quick team takes larger phases than the others' (`Window::all_to_all_workers`).
pub fn all_to_all(win: &Window, w: &mut dyn PhaseWait, ins: &[&[u8]], outs: &mut [&mut [u8]]) -> Result<()> {
    let me = win.me();
    let slot = Window::small_slot(win.phase());
    let blocks: Vec<_> = ins.iter().copied().enumerate().filter(|(c, _)| *c != me).collect();
    let mut mine = false;
    let wk = win.all_to_all_workers();
    let at = packed_blocks(win, &blocks);
    let step = Step::begin(win, w, &desc("all_to_all", 0, None), ins, || mine = offer(win, wk, slot, &blocks, &at, 0))?;
    let headers = Header::read_all(win, slot, mine);
    let r = take(win, w, wk, "all_to_all", slot, &headers, outs.iter_mut().enumerate().filter(|(c, _)| *c != me).map(|(c, o)| (c, me, &mut **o)).collect());
    if all_in_slots(&headers) {
        return r;
    }
    let read_from_us = !mine && blocks.iter().any(|(c, _)| at[*c].is_none());
    step.end(win, w, 1, read_from_us, r)
}

/// The root gets every rank's input into `outs`: blocks in the senders'
/// slots it copies out, on its solo-phase threads; blocks no slot takes
/// ([`by_tensor`]) it reads, or, where it posts its outputs for them
/// ([`Window::gather_push`]), their senders write them there themselves,
/// side by side, where the root made every copy. `own`: the root copies
/// its own input into `outs` (after the first step, while the senders
/// push); false when the caller did (they overlap).
pub fn gather(win: &Window, w: &mut dyn PhaseWait, input: &[u8], outs: Option<&mut [&mut [u8]]>, root: usize, own: bool) -> Result<()> {
    let me = win.me();
    debug_assert_eq!(outs.is_some(), me == root, "only the root has outputs");
    let slot = Window::small_slot(win.phase());
    let blocks = if me == root { vec![] } else { vec![(root, input)] };
    // The root decides, from its setting and size, and says so in its
    // header; it posts its outputs (entry c: rank c's part).
    let posts = me == root && win.gather_push() && by_tensor(win, input.len());
    let posted: Vec<&[u8]> = match (&outs, posts) {
        (Some(o), true) => o.iter().map(|b| &**b).collect(),
        _ => vec![input],
    };
    let flags = if posts { POSTED_FOR_PUSHES } else { 0 };
    let mut mine = false;
    let at = packed_blocks(win, &blocks);
    let step = Step::begin(win, w, &desc("gather", 0, Some(root)), &posted, || mine = offer(win, win.workers(), slot, &blocks, &at, flags))?;
    drop(posted);
    let headers = Header::read_all(win, slot, mine);
    let pushes = me != root && headers[root].flags & POSTED_FOR_PUSHES != 0 && by_tensor(win, input.len());
    let r = match outs {
        Some(outs) => {
            if own {
                win.workers().copy(outs[me], input);
            }
            gather_take(win, w, slot, &headers, outs, posts)
        }
        None if pushes => push_to(win, w, root, input),
        None => Ok(()),
    };
    if all_in_slots(&headers) {
        return r;
    }
    if posts {
        // The senders' pushes end with their last publish, their headers
        // saying whether one failed; they start the next operation only
        // after our publish.
        w.wait_phase(step.p + 2)?;
        let r = r.and_then(|()| push_failures(win, w, slot, &headers));
        win.publish(step.p + 2);
        return r;
    }
    if pushes && r.is_err() {
        set_slot_word(win, slot, FAILED);
    }
    step.end(win, w, 1, !mine && me != root && !pushes && !eager(win, input.len()), r)
}

/// Whether a gather block of `len` bytes goes through no slot: the root
/// reads it, or its sender pushes it where the root posted for that.
fn by_tensor(win: &Window, len: usize) -> bool {
    !eager(win, len) && !fits_small(win, len)
}

/// Whether the sender of `h` pushes its block, when the root `posts`.
fn pushed(win: &Window, h: &Header, posts: bool) -> bool {
    posts && !h.in_slot && by_tensor(win, h.lens[win.me()])
}

/// The root's part of a gather after the first step: every block that its
/// sender does not push (`posts`: the root posted its outputs).
fn gather_take(win: &Window, w: &dyn PhaseWait, slot: Area, headers: &[Header], outs: &mut [&mut [u8]], posts: bool) -> Result<()> {
    let me = win.me();
    let mut blocks = Vec::new();
    for (c, o) in outs.iter_mut().enumerate().filter(|(c, _)| *c != me) {
        if pushed(win, &headers[c], posts) {
            // The sender checks the size too, and writes nothing if wrong.
            win.check_size("gather", c, o.len(), headers[c].lens[me])?;
        } else {
            blocks.push((c, 0, &mut **o));
        }
    }
    let solo = win.solo_workers(blocks.iter().map(|b| b.2.len()).sum());
    take(win, w, solo, "gather", slot, headers, blocks)
}

/// A sender's push of its gather block into the root's output (entry
/// `me`), on its worker threads, after checking the size the root posted.
fn push_to(win: &Window, w: &dyn PhaseWait, root: usize, input: &[u8]) -> Result<()> {
    let me = win.me();
    win.check_posted("gather", root, me, input.len())?;
    let wk = win.workers();
    wk.for_each(wk.ranges(input.len()), input.len(), |r: std::ops::Range<usize>| win.push(root, me, r.start, &input[r]))
        .map_err(|e: AttachError| win.failed(w, e))
}

/// After the senders' last publish: the first whose push failed.
fn push_failures(win: &Window, w: &dyn PhaseWait, slot: Area, headers: &[Header]) -> Result<()> {
    let senders = headers.iter().enumerate().filter(|(c, h)| *c != win.me() && pushed(win, h, true)).map(|(c, _)| c);
    first_failed(win, w, slot, senders, "write its gather block into this rank's output")
}

/// Writes the first word of this rank's small slot `slot` (push flags).
pub(super) fn set_slot_word(win: &Window, slot: Area, word: u64) {
    set_slot_word_at(win, slot, 0, word);
}

/// Writes the word at byte `at` of this rank's small slot `slot`.
pub(super) fn set_slot_word_at(win: &Window, slot: Area, at: usize, word: u64) {
    win.put(slot, at, &word.to_ne_bytes());
}

/// The first word of local rank `peer`'s small slot `slot`.
pub(super) fn slot_word(win: &Window, peer: usize, slot: Area) -> u64 {
    slot_word_at(win, peer, slot, 0)
}

/// The word at byte `at` of local rank `peer`'s small slot `slot`.
pub(super) fn slot_word_at(win: &Window, peer: usize, slot: Area, at: usize) -> u64 {
    let mut word = [0u8; 8];
    win.get(peer, slot, at, &mut word);
    u64::from_ne_bytes(word)
}

/// After the `senders`' last publish: an error naming the first whose
/// small slot says that it failed (to do `what`).
pub(super) fn first_failed(win: &Window, w: &dyn PhaseWait, slot: Area, senders: impl Iterator<Item = usize>, what: &str) -> Result<()> {
    for c in senders {
        if slot_word(win, c, slot) & FAILED != 0 {
            return Err(w.mismatch(win.ranks()[c], format!("the peer could not {what} (its own error names the cause)")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pack;

    /// Blocks that may go through the slots go one after the other from
    /// cache lines, across slot boundaries, while they fit; one that does
    /// not fit (or may not) is read and takes no room, so a later small
    /// one still fits.
    #[test]
    fn blocks_pack_in_destination_order_while_they_fit() {
        let through = |len: usize| len <= 3000;
        assert_eq!(pack(&[0, 1000, 100, 2000], 4096, through), vec![Some(0), Some(0), Some(1024), Some(1152)]);
        assert_eq!(pack(&[2000, 2000, 100], 4096, through), vec![Some(0), Some(2048), None]);
        assert_eq!(pack(&[3500, 2000, 4000, 64], 4096, through), vec![None, Some(0), None, Some(2048)]);
        assert_eq!(pack(&[4096], 4096, |_| true), vec![Some(0)]);
        assert_eq!(pack(&[4097], 4096, |_| true), vec![None]);
        // one slot's worth (1024) at most: the 2000-byte block is read
        assert_eq!(pack(&[1000, 2000, 1000], 4096, |len| len <= 1024), vec![Some(0), None, Some(1024)]);
    }
}
