//! RUSTCCL_CHECK: before a collective runs, the ranks compare a
//! rank-independent description of it (op, dtype, sizes, root) over the
//! CPU links and fail on a mismatch, before anything is sent.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use super::Communicator;
use crate::collectives::{into_cpu, Op};
use crate::error::{Error, Result};
use crate::tensor::{SharedBuf, Tensor};
use crate::types::DType;

/// A rank-independent description of a collective for RUSTCCL_CHECK.
fn describe(ops: &[Op<Tensor>]) -> String {
    let one = |o: &Op<Tensor>| -> String {
        let dt = o.tensors().first().map(|t| t.dtype().name()).unwrap_or_default();
        match o {
            Op::AllReduce { bufs, op } => {
                format!("all_reduce({}) of {:?} {dt}", op.name(), bufs.iter().map(|b| b.numel()).collect::<Vec<_>>())
            }
            Op::Broadcast { buf, root } => format!("broadcast of {} {dt} from {root}", buf.numel()),
            Op::Reduce { buf, op, root } => format!("reduce({}) of {} {dt} to {root}", op.name(), buf.numel()),
            Op::AllGather { input, .. } => format!("all_gather of {} {dt}", input.numel()),
            Op::ReduceScatter { output, op, .. } => format!("reduce_scatter({}) of {} {dt}", op.name(), output.numel()),
            Op::AllToAll { .. } => format!("all_to_all of {dt}"),
            Op::Gather { input, root, .. } => format!("gather of {} {dt} to {root}", input.numel()),
            Op::Scatter { output, root, .. } => format!("scatter of {} {dt} from {root}", output.numel()),
            Op::Barrier => "barrier".into(),
            Op::Send { .. } | Op::Recv { .. } => "point-to-point".into(),
        }
    };
    ops.iter().map(one).collect::<Vec<_>>().join(" + ")
}

impl Communicator {
    /// RUSTCCL_CHECK: every rank's description of the collective, compared
    /// over the CPU links; a mismatch fails here on every rank, before
    /// anything is sent, so the group stays usable.
    pub(super) fn check_collective(&self, ops: &[Op<Tensor>], timeout: Duration) -> Result<()> {
        const REC: usize = 160;
        let desc = describe(ops);
        let mut mine = [0u8; REC];
        let n = desc.len().min(REC);
        mine[..n].copy_from_slice(&desc.as_bytes()[..n]);
        let input = SharedBuf::new(DType::U8, &mine[..]);
        let all = SharedBuf::zeros(DType::U8, REC * self.size);
        let lent = |b: &Arc<SharedBuf>| b.tensor().ok_or_else(|| Error::Internal("fresh buffer lent".into()));
        let op =
            Op::AllGather { input: lent(&input)?, outputs: crate::collectives::Parts::Flat { t: lent(&all)?, lens: vec![REC; self.size] } };
        self.cpu.submit_blocking(vec![into_cpu(op)?], REC, timeout)?.wait(None)?;
        let bytes = all.bytes().ok_or_else(|| Error::Internal("buffer still lent".into()))?;
        let text = |r: usize| String::from_utf8_lossy(&bytes[r * REC..(r + 1) * REC]).trim_end_matches('\0').to_string();
        let name = ops[0].kind().name();
        if let Some(bad) = (0..self.size).find(|&r| text(r) != desc) {
            return Err(Error::invalid(
                name,
                format!(
                "RUSTCCL_CHECK: ranks disagree about collective {} of group '{}': rank {} (this process) calls {desc}, rank {bad} calls {}",
                self.cpu.seq(),
                self.opts.group,
                self.rank,
                text(bad)
            ),
            ));
        }
        Ok(())
    }
}
