//! The codec step on the leaders' exchange of the hierarchical all-reduce:
//! each leader encodes its host's partial sum (plus the residual of the
//! request's key, with error feedback), the leaders all-gather the payloads
//! (ring), and every leader decodes all payloads in host order into f32 and
//! sums them. All leaders decode the same bytes in the same order, so they
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

use super::codec::{self, Codec, Feedback, Request};
use super::reduce::Scratch;
use super::ring;
use crate::error::{Error, Result};
use crate::transport::Transport;
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

/// All-reduce (sum) of `buf` among the leaders of `t` through the codec of
/// `comp`'s request; with `avg_over`, divides the decoded sum by it. `buf`
/// holds this host's partial sum on entry and the result on return.
pub fn leaders_all_reduce(
    t: &mut dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    avg_over: Option<usize>,
    comp: &mut Compression,
    seg_bytes: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    let req = comp.request.as_ref().ok_or_else(|| Error::Internal("compressed all_reduce without a request".into()))?;
    let feedback = &mut comp.feedback;
    let (h, me) = (t.size(), t.rank());
    let n = buf.len() / dtype.size();
    let c = req.codec;
    let plen = c.payload_len(n);
    let (work, gather) = scratch.get2(n * 4, h * plen);
    let x: &mut [f32] = bytemuck::try_cast_slice_mut(work).map_err(|e| Error::Internal(format!("codec scratch: {e}")))?;
    codec::widen(dtype, buf, x)?;
    let residual = if req.feedback { Some(feedback.residual(&req.key, c, dtype, n)) } else { None };
    codec::encode_with_feedback(c, x, residual, &mut gather[me * plen..(me + 1) * plen])?;
    {
        let mut parts: Vec<&mut [u8]> = gather.chunks_mut(plen.max(1)).take(h).collect();
        if plen > 0 {
            ring::all_gather(t, &mut parts, seg_bytes)?;
        }
    }
    for k in 0..h {
        c.decode(&gather[k * plen..(k + 1) * plen], x, k > 0)?;
    }
    if let Some(m) = avg_over {
        let m = m as f32;
        x.iter_mut().for_each(|v| *v /= m);
    }
    comp.used = Some(c);
    codec::narrow(dtype, x, buf)
}
