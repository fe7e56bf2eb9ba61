//! One-step collectives among the ranks of one host through their small
//! shared slots, for buffers up to a slot's size: every rank writes what it
//! contributes into its slot, publishes once and waits until every peer
//! did, then reads what it needs from the peers' slots and returns without
//! waiting for anyone's reads. One cross-rank step per operation where the
//! slot algorithms take two (write, read, wait for the readers): every
//! rank has two small slots and uses them by turns (the parity of the
//! phase the operation starts at, [`Window::small_slot`]), so a rank that
//! finished early may write the next operation's data while its peers
//! still read this one's.
//!
//! - all_reduce: every rank reduces all slots in rank order into its
//!   buffer, so all ranks get bitwise identical results;
//! - broadcast: the root writes, the others read;
//! - all_gather: every rank writes its part and reads the others';
//! - gather: every rank but the root writes its block, the root reads them;
//! - scatter: the root writes every other rank's block, each reads its own;
//! - barrier: the step alone.
//!
//! Every rank picks this algorithm from sizes that its peers announce and
//! verify in the same step (the all-reduce's and broadcast's length,
//! all_gather's total), so ranks that disagree fail together at the verify
//! instead of running different algorithms. Phases as in
//! `transport::shm::window`.
#![forbid(unsafe_code)]

use super::attach::Step;
use crate::collectives::kernels::{finish_avg, reduce_into};
use crate::error::Result;
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

/// The one step: the first step of every shared-memory operation
/// ([`Step::begin`]: wait until the peers left the previous operation,
/// announce, let `fill` write our slot, publish, wait for every peer,
/// verify), with nothing posted and nothing after it. Returns the slot to
/// read the peers' data from: each peer wrote it before its publish and
/// writes it again only after we publish the phase after this one (the
/// peers, at most one step behind, read only our other slot).
fn step(win: &Window, w: &mut dyn PhaseWait, desc: &Desc, fill: impl FnOnce(Area)) -> Result<Area> {
    let slot = Window::small_slot(win.phase());
    Step::begin(win, w, desc, &[], || fill(slot))?;
    Ok(slot)
}

/// For buffers up to [`Window::one_round_max`]. `root`: the root of the
/// reduce this all-reduce serves (checked against the peers' like sizes).
pub fn all_reduce(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp, root: Option<usize>) -> Result<()> {
    let n = win.ranks().len();
    let desc = Desc { name: if root.is_some() { "reduce" } else { "all_reduce" }, dtype, op, len: buf.len(), root };
    let slot = step(win, w, &desc, |slot| win.put(slot, 0, buf))?;
    for i in 0..n {
        win.with(i, slot, 0, buf.len(), |theirs| {
            if i == 0 {
                buf.copy_from_slice(theirs);
                Ok(())
            } else {
                reduce_into(op, dtype, buf, theirs)
            }
        })?;
    }
    if op == ReduceOp::Avg {
        finish_avg(dtype, buf, n)?;
    }
    Ok(())
}

/// `root`: local index of the root. For buffers up to a small slot.
pub fn broadcast(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], root: usize) -> Result<()> {
    let me = win.me();
    let desc = Desc { name: "broadcast", dtype: DType::U8, op: ReduceOp::Sum, len: buf.len(), root: Some(root) };
    let slot = step(win, w, &desc, |slot| {
        if me == root {
            win.put(slot, 0, buf);
        }
    })?;
    if me != root {
        win.get(root, slot, 0, buf);
    }
    Ok(())
}

/// `outs[c]`: rank c's part (ours already holds our input). For a total
/// up to a small slot.
pub fn all_gather(win: &Window, w: &mut dyn PhaseWait, outs: &mut [&mut [u8]]) -> Result<()> {
    let me = win.me();
    let total = outs.iter().map(|o| o.len()).sum();
    let desc = Desc { name: "all_gather", dtype: DType::U8, op: ReduceOp::Sum, len: total, root: None };
    let slot = step(win, w, &desc, |slot| win.put(slot, 0, outs[me]))?;
    for (c, out) in outs.iter_mut().enumerate().filter(|(c, _)| *c != me) {
        win.get(c, slot, 0, out);
    }
    Ok(())
}

/// `input`: this rank's block; `outs`: the root's outputs (rank c's part
/// in `outs[c]`; the caller copies the root's own), None elsewhere. For
/// blocks up to a small slot.
pub fn gather(win: &Window, w: &mut dyn PhaseWait, input: &[u8], outs: Option<&mut [&mut [u8]]>, root: usize) -> Result<()> {
    let me = win.me();
    let desc = Desc { name: "gather", dtype: DType::U8, op: ReduceOp::Sum, len: input.len(), root: Some(root) };
    let slot = step(win, w, &desc, |slot| {
        if me != root {
            win.put(slot, 0, input);
        }
    })?;
    for (c, out) in outs.into_iter().flatten().enumerate().filter(|(c, _)| *c != me) {
        win.get(c, slot, 0, out);
    }
    Ok(())
}

/// `ins`: the root's blocks (rank c's in `ins[c]`; the caller copies the
/// root's own), None elsewhere; `out`: this rank's block. For all the
/// blocks together up to a small slot.
pub fn scatter(win: &Window, w: &mut dyn PhaseWait, ins: Option<&[&[u8]]>, out: &mut [u8], root: usize) -> Result<()> {
    let me = win.me();
    let len = out.len();
    let desc = Desc { name: "scatter", dtype: DType::U8, op: ReduceOp::Sum, len, root: Some(root) };
    let slot = step(win, w, &desc, |slot| {
        for (c, block) in ins.into_iter().flatten().enumerate().filter(|(c, _)| *c != me) {
            win.put(slot, c * len, block);
        }
    })?;
    if me != root {
        win.get(root, slot, me * len, out);
    }
    Ok(())
}

pub fn barrier(win: &Window, w: &mut dyn PhaseWait) -> Result<()> {
    let desc = Desc { name: "barrier", dtype: DType::U8, op: ReduceOp::Sum, len: 0, root: None };
    step(win, w, &desc, |_| ()).map(|_| ())
}
