//! How a host operation describes itself to its peers: the `frame::What`
//! that every message of it carries, the same on every rank of a call.
#![forbid(unsafe_code)]

use super::op::{Op, Parts};
use crate::tensor::CpuTensor;
use crate::transport::frame::{self, What};

impl Parts<CpuTensor> {
    /// Elements in all parts together.
    fn total_numel(&self) -> usize {
        match self {
            Parts::List(v) => v.iter().map(|t| t.numel()).sum(),
            Parts::Flat { lens, .. } => lens.iter().sum(),
        }
    }
}

/// What a (possibly coalesced) CPU operation is, as every rank describes
/// it alike (`frame::What`): the message headers carry it, so that ranks
/// whose messages have the same length but not the same meaning fail.
pub fn wire_what(ops: &[Op<CpuTensor>]) -> What {
    let Some(first) = ops.first() else { return What::default() };
    let reduce = |o: &Op<CpuTensor>| match o {
        Op::AllReduce { op, .. } | Op::Reduce { op, .. } | Op::ReduceScatter { op, .. } => Some(*op),
        _ => None,
    };
    // The counts every rank shares; all_to_all, gather and scatter may
    // pass other counts on each rank, whose messages' lengths still agree.
    let shared = |o: &Op<CpuTensor>| -> Option<usize> {
        match o {
            Op::Broadcast { buf, .. } | Op::Reduce { buf, .. } => Some(buf.numel()),
            Op::AllGather { outputs, .. } => Some(outputs.total_numel()),
            Op::ReduceScatter { inputs, .. } => Some(inputs.total_numel()),
            _ => None,
        }
    };
    let unchecked =
        ops.iter().any(|o| matches!(o, Op::AllToAll { .. } | Op::Gather { .. } | Op::Scatter { .. } | Op::Send { .. } | Op::Recv { .. }));
    let count = if unchecked {
        frame::UNCHECKED_COUNT
    } else {
        frame::count_tag(ops.iter().flat_map(|o| {
            let bufs = match o {
                Op::AllReduce { bufs, .. } => bufs.as_slice(),
                _ => &[],
            };
            bufs.iter().map(|b| b.numel()).chain(shared(o))
        }))
    };
    What::new(first.kind(), reduce(first), first.first_tensor().map(|t| t.dtype()), count)
}
