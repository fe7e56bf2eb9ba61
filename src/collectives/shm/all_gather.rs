//! All-gather among the ranks of one host through their shared segments.
//! Vocabulary: one part per rank (its input, possibly of its own length),
//! many segments per part, one segment of every part per round. Each round,
//! every rank copies its segment into its input area and publishes; then
//! every rank copies every peer's segment straight into its output, and
//! publishes that it is done reading. One copy in, one copy out per byte,
//! no hop through other ranks. Phases as in `transport::shm::window`.
#![forbid(unsafe_code)]

use crate::collectives::plan::segments;
use crate::error::{Error, Result};
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

/// `outs[p]`: rank p's part of the output (ours already holds our input).
pub fn all_gather(win: &Window, w: &mut dyn PhaseWait, outs: &mut [&mut [u8]]) -> Result<()> {
    let me = win.me();
    let total: usize = outs.iter().map(|o| o.len()).sum();
    let desc = Desc { name: "all_gather", dtype: DType::U8, op: ReduceOp::Sum, len: total, root: None };
    let seg = win.inputs_capacity();
    let parts: Vec<Vec<_>> = outs.iter().map(|o| segments(0..o.len(), seg).collect()).collect();
    let rounds = parts.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let wk = win.workers();
    for k in 0..rounds {
        let p = win.phase();
        w.wait_phase(p)?; // peers finished reading our area of the last round
        if k == 0 {
            win.announce(w, &desc);
        }
        if let Some(g) = parts[me].get(k) {
            let src = &outs[me][g.clone()];
            // Peers read our area only between our p+1 and their p+2.
            wk.for_pieces(src.len(), |r| {
                win.put(Area::Inputs, r.start, &src[r]);
                Ok::<(), Error>(())
            })?;
        }
        win.publish(p + 1);
        w.wait_phase(p + 1)?;
        if k == 0 {
            win.verify(w, &desc)?;
        }
        // Rank c wrote its segment before its p+1 and rewrites its area
        // only after we publish p+2. One parallel region for all peers.
        let mut gets = Vec::new();
        for (c, out) in outs.iter_mut().enumerate() {
            if let (true, Some(g)) = (c != me, parts[c].get(k)) {
                gets.extend(wk.pieces_mut(&mut out[g.clone()]).map(|(off, piece)| (c, off, piece)));
            }
        }
        let bytes = gets.iter().map(|(_, _, piece)| piece.len()).sum();
        wk.for_each(gets, bytes, |(c, off, piece)| {
            win.get(c, Area::Inputs, off, piece);
            Ok::<(), Error>(())
        })?;
        win.publish(p + 2);
    }
    Ok(())
}
