//! Reduce to one root among the ranks of one host through their shared
//! segments: the pipelined all-reduce (`shm_pipelined`) without its
//! all-gather. Vocabulary as there: one chunk per rank (rank r reduces
//! chunk r), many segments per chunk, one segment of every chunk per round.
//! Each round, every rank copies its segment of every other rank's chunk
//! into its input slot for that rank and reduces the inputs of its own
//! chunk; the root reduces into its buffer, the others into their output
//! slot, which only the root then copies out. A non-root's buffer is only
//! read, so it needs no copy of it (the all-reduce on a copy cost a
//! single-threaded copy of the whole buffer per call). Every chunk is
//! reduced in the same order as by the all-reduce, so `reduce` gives the
//! root the bits `all_reduce` would.
#![forbid(unsafe_code)]

use super::plan::{bytes, even_chunks, segments};
use super::reduce::{finish_avg, reduce_into};
use crate::error::{Error, Result};
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

/// `tmp`: at least one slot of scratch (non-roots reduce there before
/// publishing the result in their output slot).
pub fn reduce(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize, tmp: &mut [u8]) -> Result<()> {
    let n = win.ranks().len();
    let me = win.me();
    let e = dtype.size();
    let desc = Desc { name: "reduce", dtype, op, len: buf.len() };
    let seg = (win.slot_capacity() / e).max(1);
    let chunks = even_chunks(buf.len() / e, n);
    let segs: Vec<Vec<_>> = chunks.iter().map(|c| segments(c.clone(), seg).collect()).collect();
    let rounds = segs.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let wk = win.workers();
    for k in 0..rounds {
        let p = win.phase();
        w.wait_phase(p)?; // peers finished reading our slots of the last round
        if k == 0 {
            win.announce(w, &desc);
        }
        let mut puts = Vec::new();
        for (c, s) in segs.iter().enumerate() {
            if let (true, Some(g)) = (c != me, s.get(k)) {
                let src = &buf[bytes(g, e)];
                puts.extend(wk.ranges(src.len()).into_iter().map(|r| (c, r.start, &src[r])));
            }
        }
        // Peers read our input slots only between our p+1 and their p+2;
        // all are at >= p.
        let moved = puts.iter().map(|(_, _, piece)| piece.len()).sum();
        wk.for_each(puts, moved, |(c, off, piece)| {
            win.put(Area::Input(c), off, piece);
            Ok::<(), Error>(())
        })?;
        win.publish(p + 1);
        w.wait_phase(p + 1)?;
        if k == 0 {
            win.verify(w, &desc)?;
        }
        if let Some(g) = segs[me].get(k) {
            let r = bytes(g, e);
            let reduce_piece = |off: usize, piece: &mut [u8]| -> Result<()> {
                for i in (0..n).filter(|&i| i != me) {
                    // Rank i wrote this piece of its input slot for us
                    // before its p+1 and rewrites it only after our p+3.
                    win.with(i, Area::Input(me), off, piece.len(), |theirs| reduce_into(op, dtype, piece, theirs))?;
                }
                if op == ReduceOp::Avg {
                    finish_avg(dtype, piece, n)?;
                }
                Ok(())
            };
            if me == root {
                // Nobody reads the root's own chunk: reduce it in place.
                wk.for_pieces_mut(&mut buf[r], reduce_piece)?;
            } else {
                let mine = &buf[r.clone()];
                wk.for_pieces_mut(&mut tmp[..r.len()], |off, piece| {
                    piece.copy_from_slice(&mine[off..off + piece.len()]);
                    reduce_piece(off, piece)?;
                    // The root reads our output slot only between our p+2
                    // and its p+3; it is at >= p+1.
                    win.put(Area::Output, off, piece);
                    Ok(())
                })?;
            }
        }
        if me != root {
            // Nothing to read: the next round's first wait covers the root's
            // reads of our output slot (it publishes p+3 after them).
            win.publish(p + 3);
            continue;
        }
        win.publish(p + 2);
        w.wait_phase(p + 2)?;
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
