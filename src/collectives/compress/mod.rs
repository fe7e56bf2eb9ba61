//! The codec step on the leaders' exchange of the hierarchical all-reduce:
//! each leader encodes its host's partial sum (plus the residual of the
//! request's key, with error feedback), the leaders all-gather the payloads
//! (chunk by chunk, pipelined with the coding), and every leader decodes all
//! payloads in host order into f32 and sums them. All leaders decode the same bytes in the same order, so they
//! hold bitwise identical results, which they then broadcast within their
//! hosts exactly.
//!
//! Vocabulary: *payload* is one leader's encoded partial sum
//! ([`Codec::payload_len`] bytes); the leaders' payloads lie end to end in
//! one gather buffer, leader h's at `h * payload_len`.
//!
//! Each leader sends and receives `(hosts - 1) * payload_len` bytes. For
//! two hosts that is what a ring all-reduce of the payload would move; for
//! many hosts a compressed reduce-scatter + all-gather would move less
//! (and quantise twice).
#![forbid(unsafe_code)]

pub mod codec;

use crate::collectives::kernels::Scratch;
use codec::{Codec, Feedback, Request};

use crate::error::{Error, Result};
use crate::transport::{Transport, Xfer};
use crate::types::DType;

/// Engine state for compressed all-reduces: what the current operation
/// asks for, the residuals kept across operations, and what the last
/// operation sent between hosts.
#[derive(Default)]
pub struct Compression {
    /// Set by the engine for each operation (None: exact).
    pub request: Option<Request>,
    pub feedback: Feedback,
    /// Bytes this rank sent to other hosts during the operation (leaders only).
    pub sent_between_hosts: u64,
    /// Codec the operation ran with, if any part of it was compressed.
    pub used: Option<Codec>,
}

impl Compression {
    /// Clears the per-operation fields and sets the request.
    pub fn begin(&mut self, request: Option<Request>) {
        self.request = request;
        self.sent_between_hosts = 0;
        self.used = None;
    }
}

/// Values per pipeline chunk (a multiple of the int8 block, so chunking
/// changes no value).
pub const CHUNK: usize = 1024 * codec::INT8_BLOCK;

/// All-reduce (sum) of `buf` among the leaders of `t` through the codec of
/// `comp`'s request; with `avg_over`, divides the decoded sum by it. `buf`
/// holds this host's partial sum on entry and the result on return.
pub fn leaders_all_reduce(
    t: &mut dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    avg_over: Option<usize>,
    comp: &mut Compression,
    scratch: &mut Scratch,
) -> Result<()> {
    let req = comp.request.clone().ok_or_else(|| Error::Internal("compressed all_reduce without a request".into()))?;
    let n = buf.len() / dtype.size();
    let plen: usize = (0..n).step_by(CHUNK).map(|s| req.codec.payload_len(CHUNK.min(n - s))).sum();
    let residual = if req.feedback { Some(comp.feedback.residual(&req.key, req.codec, dtype, n)) } else { None };
    comp.used = Some(req.codec);
    let h = t.size();
    if dtype == DType::F32 && bytemuck::try_cast_slice_mut::<u8, f32>(buf).is_ok() {
        let x: &mut [f32] = bytemuck::try_cast_slice_mut(buf).expect("checked above");
        return pipeline(t, x, scratch.get(h * plen), req.codec, residual, avg_over);
    }
    let (work, gather) = scratch.get2(n * 4, h * plen);
    let x: &mut [f32] = bytemuck::try_cast_slice_mut(work).map_err(|e| Error::Internal(format!("codec scratch: {e}")))?;
    codec::widen(dtype, buf, x)?;
    pipeline(t, x, gather, req.codec, residual, avg_over)?;
    codec::narrow(dtype, x, buf)
}

/// Chunk by chunk: a helper thread encodes this leader's chunks in order
/// (adding and updating the residual) and hands each over as soon as it is
/// ready; this thread sends chunk k to every other leader while receiving
/// theirs, then decodes chunk k in host order while the helper encodes
/// ahead. Every exchange pairs each send with a receive of the same size,
/// so no send waits on a peer that is not receiving. `gather` holds leader
/// j's payload at `j * len`.
fn pipeline(
    t: &mut dyn Transport,
    x: &mut [f32],
    gather: &mut [u8],
    c: Codec,
    residual: Option<&mut [f32]>,
    avg_over: Option<usize>,
) -> Result<()> {
    let (h, me, n) = (t.size(), t.rank(), x.len());
    if n == 0 {
        return Ok(());
    }
    let total: usize = (0..n).step_by(CHUNK).map(|s| c.payload_len(CHUNK.min(n - s))).sum();
    let mut regions: Vec<&mut [u8]> = gather.chunks_mut(total).take(h).collect();
    let mine = std::mem::take(&mut regions[me]);
    // Per chunk: this leader's values, payload and residual.
    let xs: Vec<&mut [f32]> = x.chunks_mut(CHUNK).collect();
    let mut ps: Vec<&mut [u8]> = Vec::with_capacity(xs.len());
    let mut rest = mine;
    for xk in &xs {
        let (a, b) = std::mem::take(&mut rest).split_at_mut(c.payload_len(xk.len()));
        ps.push(a);
        rest = b;
    }
    let mut rs: Vec<Option<&mut [f32]>> = match residual {
        Some(r) => r.chunks_mut(CHUNK).map(Some).collect(),
        None => (0..xs.len()).map(|_| None).collect(),
    };
    // Peers' regions, cut the same way.
    let mut peer_chunks: Vec<Vec<&mut [u8]>> = Vec::with_capacity(h);
    for (j, r) in regions.into_iter().enumerate() {
        let mut v = Vec::new();
        if j != me {
            let mut rest = r;
            for xk in &xs {
                let (a, b) = std::mem::take(&mut rest).split_at_mut(c.payload_len(xk.len()));
                v.push(a);
                rest = b;
            }
        }
        peer_chunks.push(v);
    }
    let jobs: Vec<_> = xs.into_iter().zip(ps).zip(rs.drain(..)).collect();
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<(&mut [f32], &mut [u8])>>(2);
        scope.spawn(move || {
            for ((xk, pk), rk) in jobs {
                let done = codec::encode_with_feedback(c, xk, rk, pk).map(|_| (xk, pk));
                let failed = done.is_err();
                if tx.send(done).is_err() || failed {
                    return;
                }
            }
        });
        for k in 0.. {
            let Ok(ready) = rx.recv() else { break };
            let (xk, pk) = ready?;
            let pk: &[u8] = pk;
            {
                let mut xf = Vec::with_capacity(2 * h);
                for (j, pc) in peer_chunks.iter_mut().enumerate() {
                    if j != me {
                        xf.push(Xfer::Send { peer: j, data: pk });
                        xf.push(Xfer::Recv { peer: j, data: &mut *pc[k] });
                    }
                }
                t.exchange(&mut xf)?;
            }
            for (j, pc) in peer_chunks.iter().enumerate() {
                let src: &[u8] = if j == me { pk } else { &*pc[k] };
                c.decode(src, xk, j > 0)?;
            }
            if let Some(m) = avg_over {
                let m = m as f32;
                xk.iter_mut().for_each(|v| *v /= m);
            }
        }
        Ok(())
    })
}
