//! Ring algorithms: reduce-scatter, all-gather, and all-reduce as the two
//! in sequence (bandwidth-optimal for large messages).
//!
//! Vocabulary: the buffer is split into one *chunk* per rank
//! (`plan::even_chunks`); each chunk moves in *segments* of at most
//! `segment_bytes`. Rank r sends to its right neighbour r+1 and receives from
//! its left neighbour r-1; every step moves one chunk around the ring.
//! Segmentation depends only on the chunk, so both ends of a link agree on
//! it, and the link's kernel buffers let segment j+1 travel while segment j
//! is being reduced.
#![forbid(unsafe_code)]

use std::ops::Range;

use crate::collectives::kernels::{finish_avg, reduce_into, reduce_out, Scratch};
use crate::collectives::plan::{bytes, ring_neighbours, segments, sub_mod};
use crate::error::Result;
use crate::tensor::split_rw;
use crate::transport::{Transport, Xfer};
use crate::types::{DType, ReduceOp};

fn segs(chunk: &Range<usize>, seg: usize) -> Vec<Range<usize>> {
    segments(chunk.clone(), seg).collect()
}

/// Reduce-scatter in place: afterwards chunk `(rank + 1) % n` of `buf` holds
/// the reduction over all ranks (other chunks hold partial sums).
pub fn reduce_scatter_inplace(
    t: &mut dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    chunks: &[Range<usize>],
    seg: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (left, right) = ring_neighbours(r, n);
    let e = dtype.size();
    let tmp = scratch.get(seg * e);
    for s in 0..n - 1 {
        let sends = segs(&chunks[sub_mod(r, s, n)], seg);
        let recvs = segs(&chunks[sub_mod(r, s + 1, n)], seg);
        for j in 0..sends.len().max(recvs.len()) {
            let rlen = recvs.get(j).map_or(0, |g| g.len() * e);
            {
                let mut x = Vec::with_capacity(2);
                if let Some(g) = sends.get(j) {
                    x.push(Xfer::Send { peer: right, data: &buf[bytes(g, e)] });
                }
                if let Some(_g) = recvs.get(j) {
                    x.push(Xfer::Recv { peer: left, data: &mut tmp[..rlen] });
                }
                t.exchange(&mut x)?;
            }
            if let Some(g) = recvs.get(j) {
                reduce_into(op, dtype, &mut buf[bytes(g, e)], &tmp[..rlen])?;
            }
        }
    }
    Ok(())
}

/// All-gather in place: rank r starts owning chunk `(r + 1 + shift) % n`;
/// afterwards every chunk is everywhere. `shift` is 0 after
/// [`reduce_scatter_inplace`] and n-1 when rank r owns chunk r.
pub fn all_gather_inplace(
    t: &mut dyn Transport,
    buf: &mut [u8],
    elem: usize,
    chunks: &[Range<usize>],
    seg: usize,
    shift: usize,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (left, right) = ring_neighbours(r, n);
    for s in 0..n - 1 {
        let sends = segs(&chunks[sub_mod(r + 1 + shift, s, n)], seg);
        let recvs = segs(&chunks[sub_mod(r + shift, s, n)], seg);
        for j in 0..sends.len().max(recvs.len()) {
            match (sends.get(j), recvs.get(j)) {
                (Some(sg), Some(rg)) => {
                    let (sdata, rdata) = split_rw(buf, bytes(sg, elem), bytes(rg, elem));
                    t.sendrecv(right, sdata, left, rdata)?;
                }
                (Some(sg), None) => t.send(right, &buf[bytes(sg, elem)])?,
                (None, Some(rg)) => t.recv(left, &mut buf[bytes(rg, elem)])?,
                (None, None) => {}
            }
        }
    }
    Ok(())
}

/// Ring all-reduce of `buf` in place.
pub fn all_reduce(t: &mut dyn Transport, buf: &mut [u8], dtype: DType, op: ReduceOp, seg: usize, scratch: &mut Scratch) -> Result<()> {
    let n = t.size();
    let e = dtype.size();
    let chunks = crate::collectives::plan::even_chunks(buf.len() / e, n);
    reduce_scatter_inplace(t, buf, dtype, op, &chunks, seg, scratch)?;
    if op == ReduceOp::Avg {
        let own = &chunks[(t.rank() + 1) % n];
        finish_avg(dtype, &mut buf[bytes(own, e)], n)?;
    }
    all_gather_inplace(t, buf, e, &chunks, seg, 0)
}

/// Ring reduce-scatter out of place: `inputs[p]` is this rank's
/// contribution to rank p; `output` receives the reduction of everyone's
/// `inputs[rank]`. Inputs are not modified.
///
/// At step s rank r sends the partial result for chunk `r - s - 1` (its own
/// input at s = 0) and receives the partial for chunk `r - s - 2`, adding its
/// input; the last step lands chunk r in `output`.
pub fn reduce_scatter(
    t: &mut dyn Transport,
    inputs: &[&[u8]],
    output: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    seg: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let e = dtype.size();
    if n == 1 {
        output.copy_from_slice(inputs[0]);
        return finish_avg_if(op, dtype, output, n);
    }
    let (left, right) = ring_neighbours(r, n);
    let max_chunk = inputs.iter().map(|c| c.len()).max().unwrap_or(0);
    let (mut prev, mut next, tmp) = scratch.get3(max_chunk, max_chunk, seg * e);
    for s in 0..n - 1 {
        let send_c = sub_mod(r, s + 1, n);
        let recv_c = sub_mod(r, s + 2, n);
        let last = s == n - 2;
        let send_len = inputs[send_c].len() / e;
        let recv_len = inputs[recv_c].len() / e;
        let sends = segs(&(0..send_len), seg);
        let recvs = segs(&(0..recv_len), seg);
        for j in 0..sends.len().max(recvs.len()) {
            let rlen = recvs.get(j).map_or(0, |g| g.len() * e);
            {
                let mut x = Vec::with_capacity(2);
                if let Some(g) = sends.get(j) {
                    let src: &[u8] = if s == 0 { inputs[send_c] } else { &prev[..send_len * e] };
                    x.push(Xfer::Send { peer: right, data: &src[bytes(g, e)] });
                }
                if recvs.get(j).is_some() {
                    x.push(Xfer::Recv { peer: left, data: &mut tmp[..rlen] });
                }
                t.exchange(&mut x)?;
            }
            if let Some(g) = recvs.get(j) {
                let mine = &inputs[recv_c][bytes(g, e)];
                let dst = if last { &mut output[bytes(g, e)] } else { &mut next[bytes(g, e)] };
                reduce_out(op, dtype, dst, mine, &tmp[..rlen])?;
            }
        }
        std::mem::swap(&mut prev, &mut next);
    }
    finish_avg_if(op, dtype, output, n)
}

fn finish_avg_if(op: ReduceOp, dtype: DType, buf: &mut [u8], n: usize) -> Result<()> {
    if op == ReduceOp::Avg {
        finish_avg(dtype, buf, n)?;
    }
    Ok(())
}

/// Ring all-gather into per-rank output regions; `outputs[rank]` must
/// already hold this rank's data.
pub fn all_gather(t: &mut dyn Transport, outputs: &mut [&mut [u8]], seg_bytes: usize) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (left, right) = ring_neighbours(r, n);
    for s in 0..n - 1 {
        let send_c = sub_mod(r, s, n);
        let recv_c = sub_mod(r, s + 1, n);
        let sends = segs(&(0..outputs[send_c].len()), seg_bytes);
        let recvs = segs(&(0..outputs[recv_c].len()), seg_bytes);
        let (sbuf, rbuf) = pair_mut(outputs, send_c, recv_c);
        for j in 0..sends.len().max(recvs.len()) {
            let mut x = Vec::with_capacity(2);
            if let Some(g) = sends.get(j) {
                x.push(Xfer::Send { peer: right, data: &sbuf[g.clone()] });
            }
            if let Some(g) = recvs.get(j) {
                x.push(Xfer::Recv { peer: left, data: &mut rbuf[g.clone()] });
            }
            t.exchange(&mut x)?;
        }
    }
    Ok(())
}

/// Two distinct elements of a slice, both mutably.
pub fn pair_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert_ne!(i, j, "pair_mut needs distinct indices");
    if i < j {
        let (a, b) = v.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = v.split_at_mut(i);
        (&mut b[0], &mut a[j])
    }
}
