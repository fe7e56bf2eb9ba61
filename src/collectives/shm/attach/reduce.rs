//! Single-copy reductions among the ranks of one host (steps and posting
//! as in `attach`): every rank reduces its own part by reading the
//! peers' inputs for that part straight out of their tensors, a
//! cache-sized block at a time, into its output. all_reduce then reads
//! every other rank's finished part out of that rank's buffer. Every part
//! is reduced by one rank, in the same order (its own input first, then
//! the peers' in rank order), so all ranks hold the same bits. A reduce's
//! root lets the others write their finished parts into its buffer
//! themselves, side by side, where it would read them all (as a gather's,
//! `attach`).
#![forbid(unsafe_code)]

use super::super::blocks::pull_all;
use super::{first_failed, set_slot_word, slot_word, Step, FAILED, POSTED_FOR_PUSHES};
use crate::collectives::kernels::{finish_avg, reduce_into};
use crate::collectives::plan::{bytes, even_chunks};
use crate::collectives::split_chunks_mut;
use crate::error::Result;
use crate::transport::shm::{AttachError, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

/// Bytes read from a peer before they are reduced: small enough that the
/// block stays in the core's L2 cache between the read and the reduction.
const BLOCK: usize = 64 << 10;

/// Where in every peer's posted entries a part starts.
#[derive(Clone, Copy)]
struct At {
    entry: usize,
    offset: usize,
}

/// Reduces `acc` with the bytes at `src` of every other local rank, on
/// the worker threads. `acc` holds this rank's own values already, or they
/// are in `own` (as long as `acc`), copied block by block by the same
/// threads right before the block is reduced (a serial copy first ran
/// 1/n of the bytes on one thread while the reduction used all of them).
/// `then(offset, piece)`: called by the same thread with each finished
/// piece of `acc`, while it is still in its cache.
// Eight arguments: the part, where it comes from, the reduction and what
// follows each piece are all independent of each other.
#[allow(clippy::too_many_arguments)]
fn reduce_part(
    win: &Window,
    w: &dyn PhaseWait,
    acc: &mut [u8],
    own: Option<&[u8]>,
    src: At,
    dtype: DType,
    op: ReduceOp,
    then: impl Fn(usize, &[u8]) -> std::result::Result<(), AttachError> + Sync + Send,
) -> Result<()> {
    debug_assert!(own.is_none_or(|o| o.len() == acc.len()));
    let (n, me) = (win.ranks().len(), win.me());
    let wk = win.workers();
    // The phase reads every local rank's bytes: counted n times, as a
    // reduction is (`Workers::reducing`), so that a quick team of 2 does not
    // take a many-rank reduce's large parts, which its few threads copy slowly.
    let bytes = acc.len() * n;
    let pieces: Vec<_> = wk.pieces_mut(acc).collect();
    wk.for_each(pieces, bytes, |(off, piece)| {
        let mut words = vec![0u64; BLOCK.min(piece.len()).div_ceil(8)]; // aligned for every dtype
        let block: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        let mut done = 0;
        for sub in piece.chunks_mut(BLOCK) {
            if let Some(own) = own {
                sub.copy_from_slice(&own[off + done..off + done + sub.len()]);
            }
            let tmp = &mut block[..sub.len()];
            for i in (0..n).filter(|&i| i != me) {
                // A peer's shared tensor is reduced in place (no copy
                // first), when its elements are aligned here too.
                let at = src.offset + off + done;
                let theirs = match win.peek(i, src.entry, at, sub.len()) {
                    Some(s) if s.as_ptr() as usize % dtype.size() == 0 => s,
                    _ => {
                        win.pull(i, src.entry, at, tmp)?;
                        &*tmp
                    }
                };
                reduce_into(op, dtype, sub, theirs).map_err(|e| AttachError { peer: i, detail: e.to_string() })?;
            }
            if op == ReduceOp::Avg {
                finish_avg(dtype, sub, n).map_err(|e| AttachError { peer: me, detail: e.to_string() })?;
            }
            done += sub.len();
        }
        then(off, piece)
    })
    .map_err(|e| win.failed(w, e))
}

pub fn all_reduce(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let (n, me, e) = (win.ranks().len(), win.me(), dtype.size());
    let chunks = even_chunks(buf.len() / e, n);
    let slot = Window::small_slot(win.phase());
    let step =
        Step::begin(win, w, &Desc { name: "all_reduce", dtype, op, len: buf.len(), root: None }, &[&*buf], || set_slot_word(win, slot, 0))?;
    // Peers read our chunk c (their own) until they publish p+2; we
    // change only chunk `me` before that.
    let mine = bytes(&chunks[me], e);
    let r = reduce_part(win, w, &mut buf[mine.clone()], None, At { entry: 0, offset: mine.start }, dtype, op, |_, _| Ok(()));
    if r.is_err() {
        // Read by the others after our next publish, before their last.
        set_slot_word(win, slot, FAILED);
    }
    step.sync(win, w, 1)?;
    if r.is_err() {
        return step.end(win, w, 2, true, r);
    }
    // Every chunk is final in its owner's buffer, unless its owner failed;
    // nobody reads our other chunks any more.
    if let Err(e) = first_failed(win, w, slot, (0..n).filter(|&c| c != me), "reduce its part of the all_reduce") {
        return step.end(win, w, 2, true, Err(e));
    }
    let pulls = split_chunks_mut(buf, &chunks, e)
        .into_iter()
        .enumerate()
        .filter(|(c, _)| *c != me)
        .map(|(c, part)| (c, 0, bytes(&chunks[c], e).start, part))
        .collect();
    let r = pull_all(win, w, win.workers(), pulls);
    step.end(win, w, 2, true, r)
}

/// Reduce to `root`: every rank reduces its own chunk as in `all_reduce`
/// (the root in its buffer, the others into `part`, one chunk of scratch,
/// posted as entry 1). Where the root takes pushes ([`Window::gather_push`],
/// said in the first word of its small slot), each other rank writes every
/// finished piece of its chunk into the root's buffer at once (only it
/// reads the root's bytes of that chunk, and it has read them by then);
/// else the root reads the other chunks on its solo-phase threads while
/// the others wait. The caller's buffer changes only on the root.
pub fn reduce(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize, part: &mut [u8]) -> Result<()> {
    let (n, me, e) = (win.ranks().len(), win.me(), dtype.size());
    let chunks = even_chunks(buf.len() / e, n);
    let mine = bytes(&chunks[me], e);
    let part = &mut part[..if me == root { 0 } else { mine.len() }];
    let slot = Window::small_slot(win.phase());
    let posts = me == root && win.gather_push();
    let desc = Desc { name: "reduce", dtype, op, len: buf.len(), root: Some(root) };
    let step = Step::begin(win, w, &desc, &[&*buf, &*part], || {
        if me == root {
            set_slot_word(win, slot, if posts { POSTED_FOR_PUSHES } else { 0 });
        }
    })?;
    let pushes = me != root && slot_word(win, root, slot) & POSTED_FOR_PUSHES != 0;
    // Peers read our chunk c (their own) until they publish p+2; the root
    // changes only chunk `me` before that (and the others push into its
    // chunk of theirs), the others nothing.
    let at = At { entry: 0, offset: mine.start };
    let r = if me == root {
        reduce_part(win, w, &mut buf[mine.clone()], None, at, dtype, op, |_, _| Ok(()))
    } else if pushes {
        reduce_part(win, w, part, Some(&buf[mine.clone()]), at, dtype, op, |off, piece| win.push(root, 0, mine.start + off, piece))
    } else {
        reduce_part(win, w, part, Some(&buf[mine.clone()]), at, dtype, op, |_, _| Ok(()))
    };
    if me != root {
        // Read by the root after our next publish, before its last one.
        set_slot_word(win, slot, if r.is_err() { FAILED } else { 0 });
    }
    step.sync(win, w, 1)?;
    if r.is_err() || me != root {
        // The root reads our part (or our slot's word) until it publishes p+3.
        return step.end(win, w, 2, me != root, r);
    }
    let failed = first_failed(
        win,
        w,
        slot,
        (0..n).filter(|&c| c != me),
        if posts { "reduce its part of the reduce or write it into this rank's buffer" } else { "reduce its part of the reduce" },
    );
    if posts || failed.is_err() {
        return step.end(win, w, 2, false, failed);
    }
    let pulls: Vec<_> =
        split_chunks_mut(buf, &chunks, e).into_iter().enumerate().filter(|(c, _)| *c != me).map(|(c, part)| (c, 1, 0, part)).collect();
    let solo = win.solo_workers(pulls.iter().map(|p| p.3.len()).sum());
    let r = pull_all(win, w, solo, pulls);
    step.end(win, w, 2, false, r)
}

/// `ins[p]`: this rank's contribution to rank p's part; `out`: our part
/// (does not overlap `ins`).
pub fn reduce_scatter(win: &Window, w: &mut dyn PhaseWait, ins: &[&[u8]], out: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let me = win.me();
    let total = ins.iter().map(|i| i.len()).sum();
    let step = Step::begin(win, w, &Desc { name: "reduce_scatter", dtype, op, len: total, root: None }, ins, || ())?;
    let r = (0..win.ranks().len())
        .filter(|&c| c != me)
        .try_for_each(|c| win.check_posted("reduce_scatter", c, me, out.len()))
        .and_then(|()| reduce_part(win, w, out, Some(ins[me]), At { entry: me, offset: 0 }, dtype, op, |_, _| Ok(())));
    step.end(win, w, 1, true, r)
}
