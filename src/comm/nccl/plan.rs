//! Planning a CUDA operation as NCCL calls (pure: no CUDA needed).
//!
//! A [`Plan`] lists scratch buffers to allocate, device-to-device copies to
//! run before the NCCL group (e.g. packing a list of inputs), the NCCL calls
//! themselves (one `ncclGroupStart/End`), and copies after it (unpacking a
//! list of outputs). Reductions use NCCL's element types; data movement
//! moves bytes (`ncclInt8`), so every dtype moves.
#![forbid(unsafe_code)]

use cudarc::nccl::sys::{ncclDataType_t as Dt, ncclRedOp_t as Ro};

use crate::collectives::{Op, Parts};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::types::{DType, Rank, ReduceOp};

/// A device address: a tensor's memory, or an offset into a scratch buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addr {
    Dev(u64),
    Temp { idx: usize, off: usize },
}

impl Addr {
    fn at(self, bytes: usize) -> Addr {
        match self {
            Addr::Dev(p) => Addr::Dev(p + bytes as u64),
            Addr::Temp { idx, off } => Addr::Temp { idx, off: off + bytes },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    pub dst: Addr,
    pub src: Addr,
    pub bytes: usize,
}

/// Which way a packed region's copies go (see `Planner::packed`).
#[derive(Clone, Copy)]
enum Side {
    Input,
    Output,
}

/// An NCCL call over [`Addr`]s; counts are in elements of `dt`.
pub type PCall = super::lib::Call<Addr>;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Scratch buffer sizes in bytes.
    pub temps: Vec<usize>,
    pub pre: Vec<Copy>,
    pub calls: Vec<PCall>,
    pub post: Vec<Copy>,
}

/// NCCL's element type and reduce op for `op` on `dtype`, or why NCCL
/// cannot do it. Bool is uint8 with SUM / MAX / BOR as max and PRODUCT /
/// MIN / BAND as min, as torch's NCCL backend does.
pub fn reduction(name: &'static str, dtype: DType, op: ReduceOp) -> Result<(Dt, Ro)> {
    let no = |why: String| Err(Error::unsupported(name, why));
    if dtype == DType::Bool {
        return match op {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => Ok((Dt::ncclUint8, Ro::ncclMax)),
            ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => Ok((Dt::ncclUint8, Ro::ncclMin)),
            _ => no(format!("ReduceOp.{} on bool CUDA tensors has no NCCL equivalent", op.name())),
        };
    }
    let dt = match dtype {
        DType::F32 => Dt::ncclFloat32,
        DType::F64 => Dt::ncclFloat64,
        DType::F16 => Dt::ncclFloat16,
        DType::BF16 => Dt::ncclBfloat16,
        DType::U8 => Dt::ncclUint8,
        DType::I8 => Dt::ncclInt8,
        DType::I32 => Dt::ncclInt32,
        DType::I64 => Dt::ncclInt64,
        _ => return no(format!("NCCL cannot reduce {dtype} tensors")),
    };
    let ro = match op {
        ReduceOp::Sum => Ro::ncclSum,
        ReduceOp::Avg => Ro::ncclAvg,
        ReduceOp::Product => Ro::ncclProd,
        ReduceOp::Min => Ro::ncclMin,
        ReduceOp::Max => Ro::ncclMax,
        _ => return no(format!("NCCL has no bitwise reductions (ReduceOp.{})", op.name())),
    };
    Ok((dt, ro))
}

/// NCCL type and element count for moving `bytes` of elements of `elem`
/// bytes without arithmetic: the widest unsigned type (or float16 for
/// 2-byte words; NCCL copies bits) that divides the element, so copies run
/// as wide as torch's own NCCL backend runs them.
fn movement(bytes: usize, elem: usize) -> (Dt, usize) {
    let w = [8usize, 4, 2, 1].into_iter().find(|w| elem % w == 0).unwrap_or(1);
    let dt = match w {
        8 => Dt::ncclUint64,
        4 => Dt::ncclUint32,
        2 => Dt::ncclFloat16,
        _ => Dt::ncclUint8,
    };
    (dt, bytes / w)
}

/// True when NCCL cannot run this reduction and rustccl must reduce in
/// CPU memory instead.
pub fn needs_host(op: &Op<Tensor>) -> bool {
    let name = op.kind().name();
    match op {
        Op::AllReduce { bufs, op } => bufs.iter().any(|b| reduction(name, b.dtype(), *op).is_err()),
        Op::Reduce { buf, op, .. } => reduction(name, buf.dtype(), *op).is_err(),
        Op::ReduceScatter { output, op, .. } => reduction(name, output.dtype(), *op).is_err(),
        _ => false,
    }
}

struct Planner {
    plan: Plan,
    rank: Rank,
}

/// `(address, bytes)` of each part.
fn part_addrs(parts: &Parts<Tensor>) -> Vec<(Addr, usize)> {
    match parts {
        Parts::List(v) => v.iter().map(|t| (Addr::Dev(t.addr() as u64), t.nbytes())).collect(),
        Parts::Flat { t, lens } => {
            let e = t.dtype().size();
            let mut off = 0;
            lens.iter()
                .map(|l| {
                    let a = (Addr::Dev((t.addr() + off) as u64), l * e);
                    off += l * e;
                    a
                })
                .collect()
        }
    }
}

/// The parts as one contiguous region if they already are one.
fn contiguous(parts: &[(Addr, usize)]) -> Option<Addr> {
    let Addr::Dev(base) = parts.first()?.0 else { return None };
    let mut next = base;
    for &(a, b) in parts {
        if a != Addr::Dev(next) {
            return None;
        }
        next += b as u64;
    }
    Some(Addr::Dev(base))
}

impl Planner {
    fn temp(&mut self, bytes: usize) -> Addr {
        self.plan.temps.push(bytes);
        Addr::Temp { idx: self.plan.temps.len() - 1, off: 0 }
    }

    /// One region standing for a list of parts: the parts themselves when
    /// they are already contiguous, else a scratch buffer with copies from
    /// the parts before the calls (`Side::Input`) or into them after
    /// (`Side::Output`).
    fn packed(&mut self, parts: &[(Addr, usize)], side: Side) -> Addr {
        if let Some(a) = contiguous(parts) {
            return a;
        }
        let total = parts.iter().map(|p| p.1).sum();
        let t = self.temp(total);
        let mut off = 0;
        for &(a, bytes) in parts {
            match side {
                Side::Input => self.plan.pre.push(Copy { dst: t.at(off), src: a, bytes }),
                Side::Output => self.plan.post.push(Copy { dst: a, src: t.at(off), bytes }),
            }
            off += bytes;
        }
        t
    }

    fn send(&mut self, (buf, n): (Addr, usize), elem: usize, peer: usize) {
        let (dt, count) = movement(n, elem);
        self.plan.calls.push(PCall::Send { buf, count, dt, peer });
    }

    fn recv(&mut self, (buf, n): (Addr, usize), elem: usize, peer: usize) {
        let (dt, count) = movement(n, elem);
        self.plan.calls.push(PCall::Recv { buf, count, dt, peer });
    }

    fn add(&mut self, op: &Op<Tensor>, peer: &dyn Fn(Rank) -> usize) -> Result<()> {
        let name = op.kind().name();
        let bytes = |t: &Tensor| (Addr::Dev(t.addr() as u64), t.nbytes());
        match op {
            Op::AllReduce { bufs, op } => {
                for b in bufs {
                    let (dt, ro) = reduction(name, b.dtype(), *op)?;
                    self.plan.calls.push(PCall::AllReduce { buf: bytes(b).0, count: b.numel(), dt, op: ro });
                }
            }
            Op::Broadcast { buf, root } => {
                let (a, n) = bytes(buf);
                let (dt, count) = movement(n, buf.dtype().size());
                self.plan.calls.push(PCall::Broadcast { buf: a, count, dt, root: peer(*root) });
            }
            Op::Reduce { buf, op, root } => {
                let (dt, ro) = reduction(name, buf.dtype(), *op)?;
                self.plan.calls.push(PCall::Reduce { buf: bytes(buf).0, count: buf.numel(), dt, op: ro, root: peer(*root) });
            }
            Op::AllGather { input, outputs } => {
                let parts = part_addrs(outputs);
                let recv = self.packed(&parts, Side::Output);
                let (send, n) = bytes(input);
                let (dt, count) = movement(n, input.dtype().size());
                self.plan.calls.push(PCall::AllGather { send, recv, count, dt });
            }
            Op::ReduceScatter { inputs, output, op } => {
                let (dt, ro) = reduction(name, output.dtype(), *op)?;
                let parts = part_addrs(inputs);
                let send = self.packed(&parts, Side::Input);
                self.plan.calls.push(PCall::ReduceScatter { send, recv: bytes(output).0, count: output.numel(), dt, op: ro });
            }
            Op::AllToAll { inputs, outputs } => {
                let (ins, outs) = (part_addrs(inputs), part_addrs(outputs));
                if ins[self.rank].1 != outs[self.rank].1 {
                    return Err(Error::invalid(
                        name,
                        format!("rank {} sends itself {} bytes but expects {} from itself", self.rank, ins[self.rank].1, outs[self.rank].1),
                    ));
                }
                // Every part, ours included, as a send / receive pair of one
                // NCCL group: NCCL copies the self part concurrently with the
                // transfers (a separate copy first would serialise them).
                let e = outputs.tensors()[0].dtype().size();
                for p in 0..ins.len() {
                    self.send(ins[p], e, peer(p));
                    self.recv(outs[p], e, peer(p));
                }
            }
            Op::Gather { input, outputs, root } => {
                let e = input.dtype().size();
                self.send(bytes(input), e, peer(*root));
                if let Some(outs) = outputs {
                    for (p, part) in part_addrs(outs).into_iter().enumerate() {
                        self.recv(part, e, peer(p));
                    }
                }
            }
            Op::Scatter { inputs, output, root } => {
                let e = output.dtype().size();
                if let Some(ins) = inputs {
                    for (p, part) in part_addrs(ins).into_iter().enumerate() {
                        self.send(part, e, peer(p));
                    }
                }
                self.recv(bytes(output), e, peer(*root));
            }
            Op::Send { buf, peer: p, .. } => self.send(bytes(buf), buf.dtype().size(), peer(*p)),
            Op::Recv { buf, peer: p, .. } => {
                let Some(p) = p else {
                    return Err(Error::unsupported(
                        name,
                        "receiving from any source is not supported for CUDA tensors (NCCL has no wildcard receive)",
                    ));
                };
                self.recv(bytes(buf), buf.dtype().size(), peer(*p));
            }
            Op::Barrier => return Err(Error::Internal("barrier reached the NCCL planner".into())),
        }
        Ok(())
    }
}

/// Plans `ops` for this `rank`; `peer` maps a group rank to the rank in the
/// NCCL communicator used.
pub fn plan(ops: &[Op<Tensor>], rank: Rank, peer: &dyn Fn(Rank) -> usize) -> Result<Plan> {
    let mut p = Planner { plan: Plan::default(), rank };
    for op in ops {
        p.add(op, peer)?;
    }
    // Zero-byte copies cost a launch each: drop them.
    p.plan.pre.retain(|c| c.bytes > 0 && c.dst != c.src);
    p.plan.post.retain(|c| c.bytes > 0 && c.dst != c.src);
    Ok(p.plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::OpSpec;
    use crate::types::OpKind;

    fn t(n: usize) -> Tensor {
        Tensor::zeros(DType::F32, n)
    }

    fn build(spec: OpSpec, rank: Rank, size: usize) -> Plan {
        let op = Op::from_spec(spec, rank, size).unwrap();
        plan(&[op], rank, &|p| p).unwrap()
    }

    #[test]
    fn all_reduce_is_one_call_with_nccl_types() {
        let mut s = OpSpec::new(OpKind::AllReduce);
        s.inputs = vec![t(10)];
        s.reduce_op = ReduceOp::Avg as i32;
        let p = build(s, 0, 2);
        assert!(p.temps.is_empty() && p.pre.is_empty() && p.post.is_empty());
        assert!(matches!(p.calls[..], [PCall::AllReduce { count: 10, dt: Dt::ncclFloat32, op: Ro::ncclAvg, .. }]));
    }

    #[test]
    fn list_all_gather_goes_through_a_temp_unless_adjacent() {
        let mut s = OpSpec::new(OpKind::AllGather);
        s.inputs = vec![t(4)];
        s.outputs = vec![t(4), t(4), t(4)];
        let p = build(s, 1, 3);
        assert_eq!(p.temps, vec![48]);
        assert_eq!(p.post.len(), 3);
        assert!(matches!(p.calls[..], [PCall::AllGather { count: 4, dt: Dt::ncclUint32, recv: Addr::Temp { idx: 0, off: 0 }, .. }]));
        // a flat output needs no temp
        let mut s = OpSpec::new(OpKind::AllGather);
        s.inputs = vec![t(4)];
        s.outputs = vec![t(12)];
        let p = build(s, 1, 3);
        assert!(p.temps.is_empty() && p.post.is_empty());
    }

    #[test]
    fn all_to_all_is_one_group_of_send_recv_pairs_self_included() {
        let mut s = OpSpec::new(OpKind::AllToAll);
        s.inputs = vec![t(6)];
        s.outputs = vec![t(6)];
        let p = build(s, 2, 3);
        assert!(p.pre.is_empty());
        let sends = p.calls.iter().filter(|c| matches!(c, PCall::Send { count: 2, dt: Dt::ncclUint32, .. })).count();
        let recvs = p.calls.iter().filter(|c| matches!(c, PCall::Recv { count: 2, dt: Dt::ncclUint32, .. })).count();
        assert_eq!((sends, recvs), (3, 3));
    }

    #[test]
    fn data_moves_in_the_widest_type() {
        assert_eq!(movement(12, 4), (Dt::ncclUint32, 3));
        assert_eq!(movement(16, 8), (Dt::ncclUint64, 2));
        assert_eq!(movement(32, 16), (Dt::ncclUint64, 4)); // complex128
        assert_eq!(movement(6, 2), (Dt::ncclFloat16, 3));
        assert_eq!(movement(5, 1), (Dt::ncclUint8, 5));
    }

    #[test]
    fn nccl_gaps_need_the_host() {
        let mut s = OpSpec::new(OpKind::AllReduce);
        s.inputs = vec![Tensor::zeros(DType::I32, 3)];
        s.reduce_op = ReduceOp::BXor as i32;
        let op = Op::from_spec(s, 0, 2).unwrap();
        assert!(needs_host(&op));
        let mut s = OpSpec::new(OpKind::AllReduce);
        s.inputs = vec![Tensor::zeros(DType::Bool, 3)];
        s.reduce_op = ReduceOp::BOr as i32;
        let op = Op::from_spec(s, 0, 2).unwrap();
        assert!(!needs_host(&op), "bool OR is NCCL max");
        assert_eq!(reduction("x", DType::Bool, ReduceOp::Product).unwrap(), (Dt::ncclUint8, Ro::ncclMin));
    }

    #[test]
    fn any_source_recv_is_refused() {
        let mut s = OpSpec::new(OpKind::Recv);
        s.root = -1;
        s.outputs = vec![t(2)];
        let op = Op::from_spec(s, 0, 2).unwrap();
        let e = plan(&[op], 0, &|p| p).unwrap_err();
        assert!(e.to_string().contains("any source"), "{e}");
    }
}
