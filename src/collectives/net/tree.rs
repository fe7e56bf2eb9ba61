//! Binomial trees rooted anywhere: broadcast and reduce for small messages
//! (log2(n) rounds).
//!
//! Vocabulary: ranks are renumbered as *virtual ranks* `vr = (r - root) mod
//! n`, so the root is 0. In a broadcast, vr receives from `vr - mask` for the
//! lowest set bit `mask` of vr, then sends to `vr + m` for every smaller
//! power of two m. A reduce runs the same tree upwards.
#![forbid(unsafe_code)]

use crate::collectives::kernels::{finish_avg, reduce_into, Scratch};
use crate::collectives::plan::sub_mod;
use crate::error::Result;
use crate::transport::{Transport, Xfer};
use crate::types::{DType, ReduceOp};

fn real(vr: usize, root: usize, n: usize) -> usize {
    (vr + root) % n
}

pub fn broadcast(t: &mut dyn Transport, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let vr = sub_mod(r, root, n);
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            t.recv(real(vr - mask, root, n), buf)?;
            break;
        }
        mask <<= 1;
    }
    let mut children = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            children.push(real(vr + mask, root, n));
        }
        mask >>= 1;
    }
    if !children.is_empty() {
        let data: &[u8] = buf;
        let mut x: Vec<Xfer> = children.into_iter().map(|peer| Xfer::Send { peer, data }).collect();
        t.exchange(&mut x)?;
    }
    Ok(())
}

/// Reduces everyone's `buf` into the root's `buf`; other ranks' buffers
/// are left unchanged.
pub fn reduce(t: &mut dyn Transport, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize, scratch: &mut Scratch) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let vr = sub_mod(r, root, n);
    let (acc_store, tmp) = scratch.get2(if vr == 0 { 0 } else { buf.len() }, buf.len());
    let acc: &mut [u8] = if vr == 0 {
        buf
    } else {
        acc_store.copy_from_slice(buf);
        acc_store
    };
    let mut mask = 1;
    while mask < n {
        if vr & mask == 0 {
            let child = vr | mask;
            if child < n {
                t.recv(real(child, root, n), tmp)?;
                reduce_into(op, dtype, acc, tmp)?;
            }
        } else {
            t.send(real(vr & !mask, root, n), acc)?;
            break;
        }
        mask <<= 1;
    }
    if vr == 0 && op == ReduceOp::Avg {
        finish_avg(dtype, acc, n)?;
    }
    Ok(())
}
