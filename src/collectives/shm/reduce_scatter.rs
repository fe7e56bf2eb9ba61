//! Reduce-scatter among the ranks of one host through their shared
//! segments. Vocabulary: one part per rank (rank r's output is the
//! reduction of part r of every rank's input), many segments per part, one
//! segment of every part per round. Each round, every rank copies its
//! segment of every other rank's part into its input slot for that rank
//! and publishes; then every rank reduces its own part's segment with the
//! peers' slots (in rank order) straight into its output, and publishes
//! that it is done reading. Phases as in `transport::shm::window`.
#![forbid(unsafe_code)]

use crate::collectives::kernels::{finish_avg, reduce_into};
use crate::collectives::plan::segments;
use crate::error::Result;
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

/// `ins[p]`: this rank's contribution to rank p's part; `out`: our part
/// (does not overlap `ins`).
pub fn reduce_scatter(win: &Window, w: &mut dyn PhaseWait, ins: &[&[u8]], out: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let n = win.ranks().len();
    let me = win.me();
    let e = dtype.size();
    let total: usize = ins.iter().map(|i| i.len()).sum();
    let desc = Desc { name: "reduce_scatter", dtype, op, len: total, root: None };
    let seg = (win.slot_capacity() / e).max(1) * e;
    let parts: Vec<Vec<_>> = ins.iter().map(|i| segments(0..i.len(), seg).collect()).collect();
    let rounds = parts.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let wk = win.reduce_workers();
    for k in 0..rounds {
        let p = win.phase();
        w.wait_phase(p)?; // peers finished reading our slots of the last round
        if k == 0 {
            win.announce(w, &desc);
        }
        // Peers read our slots only between our p+1 and their p+2.
        win.put_inputs(wk, (0..n).filter(|&c| c != me).filter_map(|c| Some((c, &ins[c][parts[c].get(k)?.clone()]))));
        win.publish(p + 1);
        w.wait_phase(p + 1)?;
        if k == 0 {
            win.verify(w, &desc)?;
        }
        if let Some(g) = parts[me].get(k) {
            let mine = &ins[me][g.clone()];
            win.sum_workers().for_pieces_mut(&mut out[g.clone()], |off, piece| {
                piece.copy_from_slice(&mine[off..off + piece.len()]);
                for i in (0..n).filter(|&i| i != me) {
                    // Rank i wrote its slot for us before its p+1 and
                    // rewrites it only after we publish p+2.
                    win.with(i, Area::Input(me), off, piece.len(), |theirs| reduce_into(op, dtype, piece, theirs))?;
                }
                if op == ReduceOp::Avg {
                    finish_avg(dtype, piece, n)?;
                }
                Ok(())
            })?;
        }
        win.publish(p + 2);
    }
    Ok(())
}
