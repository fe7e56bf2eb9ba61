//! Broadcast among the ranks of one host through their shared segments:
//! the root copies one segment of the buffer into its input area and
//! publishes; every other rank copies it straight into its buffer and
//! publishes that it is done reading; repeat. One copy in, one copy out per
//! byte. Phases as in `transport::shm::window`.
#![forbid(unsafe_code)]

use super::plan::segments;
use crate::error::{Error, Result};
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

/// `root`: local index of the root.
pub fn broadcast(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], root: usize) -> Result<()> {
    let me = win.me();
    let desc = Desc { name: "broadcast", dtype: DType::U8, op: ReduceOp::Sum, len: buf.len(), root: Some(root) };
    let segs: Vec<_> = segments(0..buf.len(), win.inputs_capacity()).collect();
    let wk = win.workers();
    for k in 0..segs.len().max(1) {
        let p = win.phase();
        w.wait_phase(p)?; // every rank finished reading the root's area of the last round
        if k == 0 {
            win.announce(w, &desc);
        }
        if let (true, Some(g)) = (me == root, segs.get(k)) {
            let src = &buf[g.clone()];
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
        if let (false, Some(g)) = (me == root, segs.get(k)) {
            // The root wrote this segment before its p+1 and rewrites its
            // area only after we publish p+2.
            wk.for_pieces_mut(&mut buf[g.clone()], |off, piece| {
                win.get(root, Area::Inputs, off, piece);
                Ok::<(), Error>(())
            })?;
        }
        win.publish(p + 2);
    }
    Ok(())
}
