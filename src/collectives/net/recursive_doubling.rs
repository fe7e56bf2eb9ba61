//! Recursive doubling all-reduce: log2(p) exchanges of the whole buffer,
//! latency-optimal for small messages.
//!
//! Vocabulary: p is the largest power of two <= n and `rem = n - p`. The
//! first `2 * rem` ranks pair up (even with odd); each even one hands its data
//! to its odd partner and sits out, so p "active" ranks remain, numbered by
//! `new_rank`. Active ranks exchange with `new_rank ^ mask` for mask = 1, 2, 4
//! ... and reduce; finally the odd ranks hand the result back.
//! Each step computes `mine ⊕ theirs` on one side and `theirs ⊕ mine` on the
//! other; every reduce op is commutative, so all ranks end bitwise equal.
#![forbid(unsafe_code)]

use crate::collectives::kernels::{finish_avg, reduce_into, Scratch};
use crate::error::Result;
use crate::transport::Transport;
use crate::types::{DType, ReduceOp};

pub fn all_reduce(t: &mut dyn Transport, buf: &mut [u8], dtype: DType, op: ReduceOp, scratch: &mut Scratch) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    if n == 1 {
        return Ok(());
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let tmp = scratch.get(buf.len());

    let new_rank = if r < 2 * rem {
        if r % 2 == 0 {
            t.send(r + 1, buf)?;
            None
        } else {
            t.recv(r - 1, tmp)?;
            reduce_into(op, dtype, buf, tmp)?;
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };

    if let Some(nr) = new_rank {
        let mut mask = 1;
        while mask < p {
            let partner_new = nr ^ mask;
            let partner = if partner_new < rem { partner_new * 2 + 1 } else { partner_new + rem };
            t.sendrecv(partner, buf, partner, tmp)?;
            reduce_into(op, dtype, buf, tmp)?;
            mask <<= 1;
        }
    }

    if op == ReduceOp::Avg && new_rank.is_some() {
        finish_avg(dtype, buf, n)?;
    }
    if r < 2 * rem {
        if r % 2 == 1 {
            t.send(r - 1, buf)?;
        } else {
            t.recv(r + 1, buf)?;
        }
    }
    Ok(())
}
