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
//! as soon as the operation returns. The reducing ones (`attach::reduce`)
//! add a step in the middle.
//!
//! all_to_all, gather and scatter send their blocks through their
//! senders' slots where they are not read from the senders' tensors
//! (`blocks`: the headers, the packing, the blocks streamed through
//! the input slots); when every rank's blocks fit its small slot, nobody
//! reads a tensor or an input slot and the operation ends after the first
//! step, as the one-step collectives of `one_round` do (the small
//! slots alternate between operations).
//!
//! A gather whose blocks no slot takes is where data goes the other way
//! (so do a 2-rank broadcast's second half, [`broadcast`], a reduce's
//! parts, `attach::reduce`, and the second half of a scatter's read
//! blocks up to `RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES`, `attach::scatter`): where tensors are read through the kernel, the root
//! posts its outputs and says so in its header ([`POSTED_FOR_PUSHES`]),
//! and each sender writes its block into them itself (`Window::push`),
//! side by side, while the root copies its own part; the root waits for
//! the senders' last publish and reports a failed write flagged in a
//! sender's header ([`FAILED`], which the reductions also set where
//! a rank failed a part that others would read).
#![forbid(unsafe_code)]

pub mod reduce;
pub mod scatter;

use super::blocks::{
    self as blocks, all_in_slots, deliver, eager, fits_small, offer, packed_blocks, pull_all, puts, share_flags, share_of, take, Header,
};
use crate::error::Result;
use crate::transport::shm::{split_at, split_point, Area, AttachError, BlockOp, Desc, PhaseWait, Window};
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
        Step::begin_then(win, w, desc, spans, fill, |_, _| ()).map(|(step, ())| step)
    }

    /// [`Step::begin`], with `then` run between the publish and the wait
    /// on what `fill` returned and the operation's number ([`Step::seq`]):
    /// a sender's copies into its input slots, which its receivers take
    /// chunk by chunk as they land (`blocks::deliver`), start before
    /// the slowest peer arrives.
    pub fn begin_then<T>(
        win: &Window,
        w: &mut dyn PhaseWait,
        desc: &Desc,
        spans: &[&[u8]],
        fill: impl FnOnce() -> T,
        then: impl FnOnce(&T, u64),
    ) -> Result<(Step, T)> {
        let p = win.phase();
        w.wait_phase(p)?;
        win.announce(w, desc);
        for (i, s) in spans.iter().enumerate() {
            win.post(i, s);
        }
        let filled = fill();
        win.publish(p + 1);
        then(&filled, p + 1);
        w.wait_phase(p + 1)?;
        win.verify(w, desc)?;
        Ok((Step { p }, filled))
    }

    /// This operation's number in the block flags (`blocks`): larger
    /// than any earlier operation's.
    pub fn seq(&self) -> u64 {
        self.p + 1
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

/// A gather's root posted its outputs for the senders to push into (a
/// reduce's root its buffer, `attach::reduce`).
pub(super) const POSTED_FOR_PUSHES: u64 = 2;
/// This rank failed its share of the operation where a peer would
/// otherwise take it as done: a push into a peer's buffer, or a part the
/// peers read once reduced (`attach::reduce`). Written over its small
/// slot's first word before the publish after which the peers look.
pub(super) const FAILED: u64 = 4;

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
    let r = r
        .and_then(|()| first_failed(win, w, slot, std::iter::once(root), "write the second half of its broadcast into this rank's buffer"));
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
/// rank p (ours copied here: `ins` and `outs` must not overlap). Sizes
/// are checked against the sender's. The copies run on the all_to_all
/// workers, in one phase (ours into the slots, our own block, then the
/// peers' out of theirs as they land),
/// whose quick team takes larger phases than the others' (`Window::all_to_all_workers`).
pub fn all_to_all(win: &Window, w: &mut dyn PhaseWait, ins: &[&[u8]], outs: &mut [&mut [u8]]) -> Result<()> {
    let me = win.me();
    let slot = Window::small_slot(win.phase());
    let blocks: Vec<_> = ins.iter().copied().enumerate().filter(|(c, _)| *c != me).collect();
    let mut mine = false;
    let wk = win.all_to_all_workers();
    let at = packed_blocks(win, BlockOp::AllToAll, &blocks);
    let step = Step::begin(win, w, &desc("all_to_all", 0, None), ins, || mine = offer(win, slot, &blocks, 0))?;
    let headers = Header::read_all(win, slot, mine);
    let mut ours = puts(wk, &blocks, &at, mine);
    let mut gets = Vec::new();
    for (c, o) in outs.iter_mut().enumerate() {
        if c == me {
            ours.extend(blocks::own(wk, o, ins[me]));
        } else {
            gets.push((c, me, &mut **o));
        }
    }
    let r = take(win, w, wk, BlockOp::AllToAll, slot, &headers, step.seq(), ours, gets);
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
/// side by side, where the root made every copy; of each such block the
/// root may read the last 1 / share itself ([`Window::gather_root_share`],
/// said in its header), and the sender then waits until it has. `own`:
/// the root copies its own input into `outs` (after the first step, while
/// the senders push); false when the caller did (they overlap).
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
    // (A share under 2, none, reads nothing: `pushed_part`.)
    let flags = if posts { POSTED_FOR_PUSHES | share_flags(win.gather_root_share()) } else { 0 };
    let at = packed_blocks(win, BlockOp::Gather, &blocks);
    let wk = win.workers();
    let offered = || offer(win, slot, &blocks, flags);
    let (step, mine) = Step::begin_then(win, w, &desc("gather", input.len(), Some(root)), &posted, offered, |&mine, seq| {
        deliver(win, wk, seq, puts(wk, &blocks, &at, mine))
    })?;
    drop(posted);
    let headers = Header::read_all(win, slot, mine);
    let pushes = me != root && headers[root].flags & POSTED_FOR_PUSHES != 0 && by_tensor(win, input.len());
    // (Our own header, as read, says only whether our blocks are in the slot.)
    let share = share_of(if me == root { flags } else { headers[root].flags });
    let cut = pushed_part(input.len(), share);
    let r = match outs {
        Some(outs) => gather_take(win, w, step.seq(), slot, &headers, outs, own.then_some(input), posts, share),
        None if pushes => push_to(win, w, root, input, cut),
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
    // The root reads a block's last part until it publishes p+2.
    let read_from_us = !mine && me != root && if pushes { cut < input.len() } else { !eager(win, BlockOp::Gather, input.len()) };
    step.end(win, w, 1, read_from_us, r)
}

/// The bytes of a block of `len` its sender pushes where the root reads
/// the last 1 / `share` itself ([`Window::gather_root_share`]; under 2: none).
fn pushed_part(len: usize, share: usize) -> usize {
    if share >= 2 {
        split_at(len, share)
    } else {
        len
    }
}

/// Whether a gather block of `len` bytes goes through no slot: the root
/// reads it, or its sender pushes it where the root posted for that.
fn by_tensor(win: &Window, len: usize) -> bool {
    !eager(win, BlockOp::Gather, len) && !fits_small(win, len)
}

/// Whether the sender of `h` pushes its block, when the root `posts`.
fn pushed(win: &Window, h: &Header, posts: bool) -> bool {
    posts && !h.in_slot && by_tensor(win, h.lens[win.me()])
}

/// The root's part of a gather after the first step: every block that its
/// sender does not push (`posts`: the root posted its outputs), after its
/// own input (`own`) in the same phase; then the last 1 / `share` of
/// each pushed block (under 2: none), read from its sender's input.
#[allow(clippy::too_many_arguments)]
fn gather_take(
    win: &Window,
    w: &mut dyn PhaseWait,
    seq: u64,
    slot: Area,
    headers: &[Header],
    outs: &mut [&mut [u8]],
    own: Option<&[u8]>,
    posts: bool,
    share: usize,
) -> Result<()> {
    let me = win.me();
    let mut blocks = Vec::new();
    let mut tails = Vec::new();
    let mut mine = None;
    for (c, o) in outs.iter_mut().enumerate() {
        if c == me {
            mine = Some(&mut **o);
        } else if pushed(win, &headers[c], posts) {
            // The sender checks the size too, and writes nothing if wrong.
            win.check_size("gather", c, o.len(), headers[c].lens[me])?;
            let cut = pushed_part(o.len(), share);
            if cut < o.len() {
                tails.push((c, 0, cut, &mut o[cut..]));
            }
        } else {
            blocks.push((c, 0, &mut **o));
        }
    }
    // The threads chosen for the blocks alone, as before the root's own
    // part joined their phase (a larger pool only adds wake-ups where
    // each piece has a thread: `Window::solo_workers`).
    let solo = win.solo_workers(blocks.iter().map(|b| b.2.len()).sum());
    let ours = match (own, mine) {
        (Some(input), Some(dst)) => blocks::own(solo, dst, input).collect(),
        _ => Vec::new(),
    };
    take(win, w, solo, BlockOp::Gather, slot, headers, seq, ours, blocks)?;
    if tails.is_empty() {
        return Ok(());
    }
    pull_all(win, w, win.solo_workers(tails.iter().map(|t| t.3.len()).sum()), tails)
}

/// A sender's push of the first `cut` bytes of its gather block into the
/// root's output (entry `me`; the root reads the rest itself), on its
/// worker threads, after checking the size the root posted.
fn push_to(win: &Window, w: &dyn PhaseWait, root: usize, input: &[u8], cut: usize) -> Result<()> {
    let me = win.me();
    win.check_posted("gather", root, me, input.len())?;
    let (wk, head) = (win.workers(), &input[..cut]);
    wk.for_each(wk.ranges(head.len()), head.len(), |r: std::ops::Range<usize>| win.push(root, me, r.start, &head[r]))
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
