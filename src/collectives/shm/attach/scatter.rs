//! Scatter among the ranks of one host, single-copy (steps and posting as
//! in `attach`, the root's header and blocks as in `blocks`):
//! every receiver takes its
//! block from the root, out of the root's small slot, its input slots or
//! its tensor, and where the root takes pushes it writes the last part
//! of a block its receiver reads ([`scatter`]). A root that could not
//! write a receiver's part says which (`share_written`).
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::super::blocks::{
    self as blocks, all_in_slots, blocks_at, deliver, offer, packed_blocks, pull_all, puts, share_flags, share_of, take, Header,
};
use super::{desc, first_failed, set_slot_word, set_slot_word_at, slot_word, slot_word_at, Step, FAILED, POSTED_FOR_PUSHES};
use crate::error::Result;
use crate::transport::shm::{split_at, Area, AttachError, BlockOp, PhaseWait, Window, Workers};

/// A scatter root's bits for the receivers whose blocks it splits
/// ([`split_bit`]), above its share's (`blocks::share_flags`).
const SPLIT_BITS: u64 = u64::MAX << 8;

/// Every rank reads its part of the root's `ins`. The root copies the
/// blocks that go through its slots on its solo-phase threads once it
/// published the first step, and the receivers copy each chunk out as it
/// lands (`blocks`). A block
/// read from the root's tensor, of at most the root's
/// [`Window::scatter_split_max`] bytes, is split where the root takes
/// pushes ([`Window::gather_push`]): its receiver reads the first part
/// while the root, idle otherwise, writes the last 1 / `share`
/// ([`Window::scatter_root_share`]) into the receiver's output (posted
/// for it), on its solo-phase threads; the root's readers all go through
/// its one address space, its writes through theirs. The root alone
/// decides, and says which receivers it writes to (`split_bit`) and what
/// share in its header, so ranks with other settings cannot disagree.
/// Where it splits any block, every rank takes one more step: a split
/// receiver reads whether the root failed its part (`share_written`)
/// after the root's writes (`p+2`) and before the root, waiting for `p+3`,
/// may start its next operation and write that slot again.
/// `own`: the root copies its own part of `ins` into `output` after its
/// blocks, in the same phase, while the others take theirs (false: the
/// caller copies it after the operation, as `output` overlaps some of
/// `ins`).
pub fn scatter(win: &Window, w: &mut dyn PhaseWait, ins: Option<&[&[u8]]>, output: &mut [u8], root: usize, own: bool) -> Result<()> {
    let me = win.me();
    let ins = ins.unwrap_or(&[]);
    let slot = Window::small_slot(win.phase());
    let blocks: Vec<_> = ins.iter().copied().enumerate().filter(|(c, _)| *c != me).collect();
    let solo = win.solo_workers(blocks.iter().map(|(_, d)| d.len()).sum());
    // The root's choice: which receivers' blocks it splits (their reads
    // stay whole where the blocks go through its slots after all).
    let at = packed_blocks(win, BlockOp::Scatter, &blocks);
    let mut flags = 0;
    if me == root && win.gather_push() {
        flags = POSTED_FOR_PUSHES | share_flags(win.scatter_root_share());
        for &(c, d) in &blocks {
            if at[c].is_none() && d.len() <= win.scatter_split_max() {
                flags |= split_bit(c);
            }
        }
    }
    // The root posts its inputs and copies the blocks that go through its
    // slots as soon as it published (its receivers take each chunk as it
    // lands), then its own part in the same phase; a receiver posts its
    // output (where the root may write).
    let d = desc("scatter", output.len(), Some(root));
    let offered = || offer(win, slot, &blocks, flags);
    let begun = if me == root {
        let out = &mut *output;
        let deliver_ours = |&mine: &bool, seq| {
            let mut ours = puts(solo, &blocks, &at, mine);
            if own {
                ours.extend(blocks::own(solo, out, ins[me]));
            }
            deliver(win, solo, seq, ours);
        };
        Step::begin_then(win, w, &d, ins, offered, deliver_ours)
    } else {
        Step::begin_then(win, w, &d, &[&*output], offered, |_, _| ())
    };
    let (step, mine) = begun?;
    let headers = Header::read_all(win, slot, mine);
    // (Our own header, as read, says only whether our blocks are in the slot.)
    let root_flags = if me == root { flags } else { headers[root].flags };
    let pushes = !headers[root].in_slot && root_flags & POSTED_FOR_PUSHES != 0;
    let split = |c: usize| pushes && root_flags & split_bit(c) != 0;
    let steps = if pushes && root_flags & SPLIT_BITS != 0 { 2 } else { 1 };
    let share = share_of(root_flags);
    if me != root && split(me) {
        let r = win.check_size("scatter", root, output.len(), headers[root].lens[me]).and_then(|()| {
            let cut = split_at(output.len(), share);
            pull_all(win, w, win.workers(), vec![(root, me, 0, &mut output[..cut])])
        });
        // The root writes the rest until it publishes p+2, and
        // keeps its slot (the word that says whether it failed) until p+3.
        step.sync(win, w, 1)?;
        let r = r.and_then(|()| share_written(win, w, slot, root));
        return step.end(win, w, 2, false, r);
    }
    let r = if me != root {
        take(win, w, win.workers(), BlockOp::Scatter, slot, &headers, step.seq(), Vec::new(), vec![(root, me, output)])
    } else {
        let (unwritten, r) = push_shares(win, w, solo, &blocks, share, split);
        if r.is_err() {
            if let Some(at) = unwritten_at(win) {
                set_slot_word_at(win, slot, at, unwritten);
            }
            set_slot_word(win, slot, flags | FAILED);
        }
        r
    };
    if all_in_slots(&headers) {
        return r;
    }
    let read_from_us = !mine && blocks.iter().any(|(c, _)| at[*c].is_none());
    step.end(win, w, steps, read_from_us, r)
}

/// In a scatter root's header: it writes the last part of local rank
/// `c`'s block (none beyond the word's 56 bits for receivers: those read
/// their whole block).
fn split_bit(c: usize) -> u64 {
    if c < 56 {
        1 << (8 + c)
    } else {
        0
    }
}

/// A scatter root's writes of the last 1 / `share` of the block of every
/// receiver `split` into its posted output, on `wk`'s threads; a receiver
/// that posted another size gets nothing (it fails itself). Every piece is
/// tried; returns the [`split_bit`]s of the receivers some piece of whose
/// share could not be written, and the first failure.
fn push_shares(
    win: &Window,
    w: &dyn PhaseWait,
    wk: &Workers,
    blocks: &[(usize, &[u8])],
    share: usize,
    split: impl Fn(usize) -> bool,
) -> (u64, Result<()>) {
    let mut items = Vec::new();
    for &(c, d) in blocks.iter().filter(|(c, _)| split(*c)) {
        if win.check_posted("scatter", c, 0, d.len()).is_err() {
            continue;
        }
        let cut = split_at(d.len(), share);
        items.extend(wk.ranges(d.len() - cut).into_iter().map(|r| (c, cut + r.start, &d[cut + r.start..cut + r.end])));
    }
    let bytes = items.iter().map(|i| i.2.len()).sum();
    // Each failure is recorded and the closure goes on: `for_each` on one
    // thread would stop at the first error, and a receiver after it would
    // take its part as written.
    let (unwritten, first) = (AtomicU64::new(0), Mutex::new(None));
    let Ok(()) = wk.for_each(items, bytes, |(c, off, src)| {
        if let Err(e) = win.push(c, 0, off, src) {
            unwritten.fetch_or(split_bit(c), Ordering::Relaxed);
            first.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        }
        Ok::<(), Infallible>(())
    });
    let first = first.into_inner().unwrap_or_else(|p| p.into_inner());
    (unwritten.into_inner(), first.map_or(Ok(()), |e: AttachError| Err(win.failed(w, e))))
}

/// Where a scatter root that failed ([`FAILED`]) says whose parts it
/// could not write ([`push_shares`]' bits): the word after its header
/// in its small slot, whose blocks area a root that splits does not use
/// (its blocks are read); `None` where the slot has no room for it.
fn unwritten_at(win: &Window) -> Option<usize> {
    let at = blocks_at(win.ranks().len());
    (at + 8 <= win.small_capacity()).then_some(at)
}

/// After a scatter root's writes (`p+2`): whether it wrote this split
/// receiver's part. A root that failed names the receivers it
/// could not write to ([`unwritten_at`]; all where there is no room), so
/// the others keep their blocks.
fn share_written(win: &Window, w: &dyn PhaseWait, slot: Area, root: usize) -> Result<()> {
    let mine = |at| slot_word_at(win, root, slot, at) & split_bit(win.me()) != 0;
    if slot_word(win, root, slot) & FAILED != 0 && unwritten_at(win).is_none_or(mine) {
        return first_failed(win, w, slot, std::iter::once(root), "write its share of this rank's scatter block into its output");
    }
    Ok(())
}
