//! Pipelined chain broadcast for large messages.
//!
//! Vocabulary: the chain is root, root+1, ..., root+n-1 (mod n); the buffer
//! moves in segments. A rank in the middle receives segment j from its
//! predecessor while it forwards segment j-1 to its successor, so the time
//! is about (segments + n - 2) segment transfers instead of (n - 1) whole
//! buffers.
#![forbid(unsafe_code)]

use crate::collectives::plan::{segments, sub_mod};
use crate::error::Result;
use crate::tensor::split_rw;
use crate::transport::{Transport, Xfer};

pub fn broadcast(t: &mut dyn Transport, buf: &mut [u8], root: usize, seg_bytes: usize) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    if n == 1 {
        return Ok(());
    }
    let pos = sub_mod(r, root, n);
    let prev = (r + n - 1) % n;
    let next = (r + 1) % n;
    let segs: Vec<_> = segments(0..buf.len(), seg_bytes).collect();
    if pos == 0 {
        let data: &[u8] = buf;
        let mut x: Vec<Xfer> = segs.iter().map(|g| Xfer::Send { peer: next, data: &data[g.clone()] }).collect();
        return t.exchange(&mut x);
    }
    if pos == n - 1 {
        let mut rest: &mut [u8] = buf;
        let mut x = Vec::with_capacity(segs.len());
        for g in &segs {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(g.len());
            rest = b;
            x.push(Xfer::Recv { peer: prev, data: a });
        }
        return t.exchange(&mut x);
    }
    for j in 0..=segs.len() {
        match (j.checked_sub(1).map(|k| &segs[k]), segs.get(j)) {
            (Some(sg), Some(rg)) => {
                let (sdata, rdata) = split_rw(buf, sg.clone(), rg.clone());
                t.sendrecv(next, sdata, prev, rdata)?;
            }
            (Some(sg), None) => t.send(next, &buf[sg.clone()])?,
            (None, Some(rg)) => t.recv(prev, &mut buf[rg.clone()])?,
            (None, None) => {}
        }
    }
    Ok(())
}
