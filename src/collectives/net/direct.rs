//! Direct algorithms: every transfer goes straight to its destination.
//! gather / scatter (root <-> everyone), all-to-all (everyone <-> everyone,
//! posted at once and ordered pairwise: at position k rank r sends to r+k and
//! receives from r-k) and a dissemination barrier (round k: send to
//! r + 2^k, receive from r - 2^k; empty messages).
#![forbid(unsafe_code)]

use crate::collectives::plan::sub_mod;
use crate::error::Result;
use crate::transport::{Transport, Xfer};

/// Root: receives `outputs[p]` from every p (its own part is already in
/// place). Others: send `input` to the root.
pub fn gather(t: &mut dyn Transport, input: &[u8], outputs: Option<&mut [&mut [u8]]>, root: usize) -> Result<()> {
    let r = t.rank();
    match outputs {
        Some(outs) if r == root => {
            let mut x: Vec<Xfer> =
                outs.iter_mut().enumerate().filter(|(p, _)| *p != r).map(|(peer, o)| Xfer::Recv { peer, data: o }).collect();
            t.exchange(&mut x)
        }
        _ => t.send(root, input),
    }
}

/// Root: sends `inputs[p]` to every p other than itself. Others: receive
/// into `output`.
pub fn scatter(t: &mut dyn Transport, inputs: Option<&[&[u8]]>, output: &mut [u8], root: usize) -> Result<()> {
    let r = t.rank();
    match inputs {
        Some(ins) if r == root => {
            let mut x: Vec<Xfer> = ins.iter().enumerate().filter(|(p, _)| *p != r).map(|(peer, i)| Xfer::Send { peer, data: i }).collect();
            t.exchange(&mut x)
        }
        _ => t.recv(root, output),
    }
}

/// Sends `inputs[p]` to p and receives `outputs[p]` from p for every p other
/// than this rank (the local part is copied by the caller).
pub fn all_to_all(t: &mut dyn Transport, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let mut order: Vec<Option<&mut [u8]>> = outputs.iter_mut().map(|o| Some(&mut **o)).collect();
    let mut x = Vec::with_capacity(2 * (n - 1));
    for k in 1..n {
        let to = (r + k) % n;
        let from = sub_mod(r, k, n);
        x.push(Xfer::Send { peer: to, data: inputs[to] });
        if let Some(data) = order[from].take() {
            x.push(Xfer::Recv { peer: from, data });
        }
    }
    t.exchange(&mut x)
}

pub fn barrier(t: &mut dyn Transport) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let mut k = 1;
    while k < n {
        t.sendrecv((r + k) % n, &[], sub_mod(r, k, n), &mut [])?;
        k <<= 1;
    }
    Ok(())
}
