//! Pipelined all-reduce among the ranks of one host through their shared
//! segments (reduce-scatter + all-gather in place), and reduce to one root
//! (the same without the all-gather). Vocabulary: one chunk per rank (rank
//! r reduces chunk r), many segments per chunk, one segment of every chunk
//! per round. Each round, every rank copies its segment of every other
//! rank's chunk into its input slot for that rank, reduces the inputs of
//! its own chunk, publishes the result in its output slot, and copies the
//! other chunks' results out (reduce: only the root, which needs no output
//! slot; a non-root reduces into scratch, as its buffer must not change,
//! and does not copy out). Each rank's copies and reductions are split
//! among its worker threads, one parallel region per phase (waking the
//! pool costs more than a small copy). Every chunk is reduced in the same
//! order either way, so reduce gives the root all_reduce's bits. Phases as
//! in `transport::shm::window`.
#![forbid(unsafe_code)]

use crate::collectives::kernels::{finish_avg, reduce_into};
use crate::collectives::plan::{bytes, even_chunks, segments};
use crate::error::{Error, Result};
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

pub fn all_reduce(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    run(win, w, buf, dtype, op, None)
}

/// Reduce to local rank `root`; `tmp`: at least one slot of scratch (a
/// non-root reduces its chunk there). Only the root's buffer changes.
pub fn reduce(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize, tmp: &mut [u8]) -> Result<()> {
    run(win, w, buf, dtype, op, Some((root, tmp)))
}

/// `to`: reduce to (root, scratch) instead of all-reduce.
fn run(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp, to: Option<(usize, &mut [u8])>) -> Result<()> {
    let n = win.ranks().len();
    let me = win.me();
    let e = dtype.size();
    let all = to.is_none();
    let root = to.as_ref().map(|(root, _)| *root);
    let (collects, mut tmp) = match to {
        None => (true, None),
        Some((root, tmp)) => (root == me, (root != me).then_some(tmp)),
    };
    // Someone reads our output slot: every rank of an all-reduce, the root
    // of a reduce (from the non-roots).
    let publishes = all || tmp.is_some();
    let desc = Desc { name: if all { "all_reduce" } else { "reduce" }, dtype, op, len: buf.len(), root };
    let seg = (win.slot_capacity() / e).max(1);
    let chunks = even_chunks(buf.len() / e, n);
    let segs: Vec<Vec<_>> = chunks.iter().map(|c| segments(c.clone(), seg).collect()).collect();
    let rounds = segs.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let wk = win.reduce_workers();
    for k in 0..rounds {
        let p = win.phase();
        w.wait_phase(p)?; // peers finished reading our slots of the last round
        if k == 0 {
            // Only now: a peer may still be verifying the previous operation.
            win.announce(w, &desc);
        }
        // Peers read our input slots only between our p+1 and their p+2;
        // all are at >= p.
        let ours: &[u8] = buf;
        win.put_inputs(wk, segs.iter().enumerate().filter(|(c, _)| *c != me).filter_map(|(c, s)| Some((c, &ours[bytes(s.get(k)?, e)]))));
        win.publish(p + 1);
        w.wait_phase(p + 1)?;
        if k == 0 {
            win.verify(w, &desc)?;
        }
        if let Some(g) = segs[me].get(k) {
            let r = bytes(g, e);
            let reduced = |off: usize, piece: &mut [u8]| -> Result<()> {
                for i in (0..n).filter(|&i| i != me) {
                    // Rank i wrote this piece of its input slot for us
                    // before its p+1 and rewrites it only after our p+3.
                    win.with(i, Area::Input(me), off, piece.len(), |theirs| reduce_into(op, dtype, piece, theirs))?;
                }
                if op == ReduceOp::Avg {
                    finish_avg(dtype, piece, n)?;
                }
                if publishes {
                    // Peers read our output slot only between our p+2 and
                    // their p+3; all are at >= p+1.
                    win.put(Area::Output, off, piece);
                }
                Ok(())
            };
            let sum = win.sum_workers();
            match tmp.as_deref_mut() {
                // Nobody reads our own chunk of `buf`: reduce it in place.
                None => sum.for_pieces_mut(&mut buf[r], reduced)?,
                Some(tmp) => {
                    let mine = &buf[r.clone()];
                    sum.for_pieces_mut(&mut tmp[..r.len()], |off, piece| {
                        piece.copy_from_slice(&mine[off..off + piece.len()]);
                        reduced(off, piece)
                    })?
                }
            }
        }
        if !collects {
            // A reduce's non-root reads nothing more: the next round's first
            // wait covers the root's reads of our output slot (it publishes
            // p+3 after them).
            win.publish(p + 3);
            continue;
        }
        win.publish(p + 2);
        w.wait_phase(p + 2)?;
        // Rank c wrote its output slot before its p+2 and rewrites it only
        // after we publish p+3.
        let mut gets = Vec::new();
        let mut rest: &mut [u8] = buf;
        let mut at = 0;
        for (c, s) in segs.iter().enumerate() {
            if let (true, Some(g)) = (c != me, s.get(k)) {
                let r = bytes(g, e);
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - at);
                let (seg_buf, tail) = tail.split_at_mut(r.len());
                rest = tail;
                at = r.end;
                gets.extend(wk.pieces_mut(seg_buf).map(|(off, piece)| (c, off, piece)));
            }
        }
        let moved = gets.iter().map(|(_, _, piece)| piece.len()).sum();
        wk.for_each(gets, moved, |(c, off, piece)| {
            win.get(c, Area::Output, off, piece);
            Ok::<(), Error>(())
        })?;
        win.publish(p + 3);
    }
    Ok(())
}
