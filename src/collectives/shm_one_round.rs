//! One-round all-reduce among the ranks of one host through their shared
//! segments: every rank copies its buffer into its small slot, then every
//! rank reduces all slots in rank order (so all ranks get bitwise
//! identical results) into its buffer. For buffers up to the small slot's
//! size. Phases as in `transport::shm::window`.
#![forbid(unsafe_code)]

use super::reduce::{finish_avg, reduce_into};
use crate::error::Result;
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

pub fn all_reduce(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let n = win.ranks().len();
    let desc = Desc { name: "all_reduce", dtype, op, len: buf.len() };
    let p0 = win.phase();
    w.wait_phase(p0)?; // peers left the previous operation: our slot is free
    // Peers read our slot only between our publish of p0+1 and their own
    // p0+2; they are all at >= p0 now, before that window.
    win.put(Area::Small, 0, buf);
    win.announce(w, &desc); // peers are past verifying the previous operation
    win.publish(p0 + 1);
    w.wait_phase(p0 + 1)?;
    win.verify(w, &desc)?;
    for i in 0..n {
        // Rank i published p0+1 after writing its slot and writes it again
        // only after we publish p0+2.
        win.with(i, Area::Small, 0, buf.len(), |theirs| {
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
    win.publish(p0 + 2);
    Ok(())
}
