//! Host staging for CUDA reductions NCCL cannot do: copy the tensors to
//! CPU memory (after the caller's stream), let the CPU engine reduce, copy
//! the results back.

use std::sync::Arc;

use crate::collectives::Op;
use crate::cuda::{self, Context, CudaError, Event};
use crate::error::{Error, Result};
use crate::tensor::{CpuTensor, SharedBuf, Tensor};

/// The device tensors of a staged operation and their CPU copies.
pub struct Staged {
    ctx: Context,
    pairs: Vec<(Tensor, Arc<SharedBuf>)>,
    op: &'static str,
}

fn derr(op: &'static str) -> impl Fn(CudaError) -> Error {
    move |e| Error::unsupported(op, format!("staging through CPU memory: {e}"))
}

/// Copies every tensor of `ops` to CPU memory once `stream` has reached
/// this point, and returns the same operations over the CPU copies.
pub fn to_cpu(ops: Vec<Op<Tensor>>, device: i32, stream: u64) -> Result<(Vec<Op<CpuTensor>>, Staged)> {
    let op = ops.first().map_or("collective", |o| o.kind().name());
    let ctx = Context::primary(device).map_err(derr(op))?;
    ctx.bind().map_err(derr(op))?;
    if cuda::is_capturing(stream).map_err(derr(op))? {
        return Err(Error::unsupported(
            op,
            "this reduction has no NCCL equivalent and is staged through CPU memory, which cannot be captured in a CUDA graph",
        ));
    }
    let ev = Event::new().map_err(derr(op))?;
    ev.record(stream).map_err(derr(op))?;
    ev.synchronize().map_err(derr(op))?;
    let mut pairs = Vec::new();
    let mut cpu_ops = Vec::with_capacity(ops.len());
    for o in ops {
        cpu_ops.push(o.map(|t| {
            let buf = SharedBuf::zeros(t.dtype(), t.numel());
            let mut h =
                CpuTensor::new(buf.tensor().ok_or_else(|| Error::Internal("fresh buffer lent".into()))?).map_err(Error::Internal)?;
            // SAFETY: `t` is a validated CUDA tensor of this device with
            // `nbytes` bytes, alive in `pairs`; its stream was synchronised.
            unsafe { cuda::copy_to_host(h.bytes_mut(), t.addr() as u64) }.map_err(derr(op))?;
            pairs.push((t, buf));
            Ok(h)
        })?);
    }
    Ok((cpu_ops, Staged { ctx, pairs, op }))
}

impl Staged {
    pub fn bytes(&self) -> usize {
        self.pairs.iter().map(|(t, _)| t.nbytes()).sum()
    }

    /// Copies the host results into the device tensors (after the host
    /// operation finished, so the host buffers are no longer lent).
    pub fn copy_back(self) -> Result<()> {
        self.ctx.bind().map_err(derr(self.op))?;
        for (t, buf) in &self.pairs {
            let data = buf.bytes().ok_or_else(|| Error::Internal("staging buffer still lent".into()))?;
            // SAFETY: as in `to_host`; nothing else uses the tensor here.
            unsafe { cuda::copy_to_device(t.addr() as u64, &data) }.map_err(derr(self.op))?;
        }
        Ok(())
    }
}
