//! Checks what a caller asks for ([`OpSpec`]) against the group and
//! builds the [`Op`] the engines run. Validation only reads metadata, so it
//! serves the CPU and CUDA paths alike; a rejected call sends nothing and
//! leaves the group usable.
#![forbid(unsafe_code)]

use super::op::{Op, OpSpec, Parts};
use crate::collectives::kernels;
use crate::error::{Error, Result};
use crate::tensor::{first_overlap, Tensor};
use crate::types::{DType, OpKind, Rank, ReduceOp};

struct Check {
    op: &'static str,
    size: usize,
}

impl Check {
    fn err(&self, reason: impl Into<String>) -> Error {
        Error::invalid(self.op, reason)
    }

    fn rank_arg(&self, what: &str, v: i64) -> Result<Rank> {
        if v < 0 || v as usize >= self.size {
            return Err(self.err(format!("{what} {v} is out of range for a group of size {}", self.size)));
        }
        Ok(v as usize)
    }

    fn reduce_op(&self, v: i32, dtype: DType) -> Result<ReduceOp> {
        let op = ReduceOp::from_i32(v).ok_or_else(|| {
            Error::unsupported(self.op, format!("reduce op {v} is not supported (PREMUL_SUM carries a factor the engine never sees: the torch backend scales the inputs and asks for SUM)"))
        })?;
        kernels::check(op, dtype).map_err(|why| Error::unsupported(self.op, why))?;
        Ok(op)
    }

    fn one<'a>(&self, v: &'a [Tensor], what: &str) -> Result<&'a Tensor> {
        if v.len() != 1 {
            return Err(self.err(format!("expected exactly one {what} tensor, got {}", v.len())));
        }
        Ok(&v[0])
    }

    /// All tensors share one device and one dtype.
    fn no_overlap(&self, ts: &[&Tensor], what: &str) -> Result<()> {
        if ts.len() < 2 {
            return Ok(()); // a single tensor's own layout is checked where it is made
        }
        let spans: Vec<_> = ts.iter().map(|t| t.span()).collect();
        if let Some((i, j)) = first_overlap(&spans) {
            return Err(self.err(format!("{what} tensors {i} and {j} share memory")));
        }
        Ok(())
    }

    /// Per-rank parts: `size` tensors of `numel` elements each, or one
    /// tensor of `size * numel`.
    fn parts(&self, mut ts: Vec<Tensor>, numel: usize, what: &str) -> Result<Parts<Tensor>> {
        if ts.len() == 1 && self.size != 1 {
            let t = ts.pop().expect("one tensor");
            if t.numel() != numel * self.size {
                return Err(self.err(format!(
                    "{what} tensor has {} elements; expected world size {} x {numel} = {}",
                    t.numel(),
                    self.size,
                    numel * self.size
                )));
            }
            return Ok(Parts::Flat { t, lens: vec![numel; self.size] });
        }
        if ts.len() != self.size {
            return Err(self.err(format!("expected {} {what} tensors (one per rank), got {}", self.size, ts.len())));
        }
        if let Some((i, t)) = ts.iter().enumerate().find(|(_, t)| t.numel() != numel) {
            return Err(self.err(format!("{what} tensor {i} has {} elements, expected {numel}", t.numel())));
        }
        Ok(Parts::List(ts))
    }

    /// all_to_all parts: a list of `size` tensors, or one tensor split along
    /// dimension 0 by `splits` rows (even when empty).
    fn a2a_parts(&self, mut ts: Vec<Tensor>, splits: &[i64], what: &str) -> Result<Parts<Tensor>> {
        if ts.len() == self.size && splits.is_empty() && self.size != 1 {
            return Ok(Parts::List(ts));
        }
        if ts.len() != 1 {
            return Err(self.err(format!("expected 1 or {} {what} tensors, got {}", self.size, ts.len())));
        }
        let t = ts.pop().expect("one tensor");
        let rows = t.shape().first().copied().unwrap_or(1).max(0) as usize;
        let row_elems = t.numel().checked_div(rows).unwrap_or(0);
        let lens: Vec<usize> = if splits.is_empty() {
            if rows % self.size != 0 {
                return Err(self.err(format!(
                    "{what} dimension 0 ({rows}) is not divisible by the world size {} and no split sizes were given",
                    self.size
                )));
            }
            vec![rows / self.size * row_elems; self.size]
        } else {
            if splits.len() != self.size {
                return Err(self.err(format!("{} {what} split sizes for a group of size {}", splits.len(), self.size)));
            }
            if splits.iter().any(|&s| s < 0) {
                return Err(self.err(format!("negative {what} split size in {splits:?}")));
            }
            let total: i64 = splits.iter().sum();
            if total as usize != rows {
                return Err(self.err(format!("{what} split sizes {splits:?} add up to {total}, but dimension 0 is {rows}")));
            }
            splits.iter().map(|&s| s as usize * row_elems).collect()
        };
        Ok(Parts::Flat { t, lens })
    }
}

impl Op<Tensor> {
    /// Checks a request for rank `rank` of `size` and builds the operation.
    pub fn from_spec(spec: OpSpec, rank: Rank, size: usize) -> Result<Op<Tensor>> {
        let c = Check { op: spec.kind.name(), size };
        {
            let mut all = spec.inputs.iter().chain(spec.outputs.iter());
            if let Some(t) = all.clone().find(|t| !t.is_contiguous()) {
                return Err(c.err(format!("tensor of shape {:?} is not contiguous", t.shape())));
            }
            if let Some(first) = all.next() {
                for t in all {
                    if t.device() != first.device() {
                        return Err(c.err(format!("tensors on different devices ({} and {})", first.device(), t.device())));
                    }
                    if spec.kind != OpKind::AllReduce && t.dtype() != first.dtype() {
                        return Err(c.err(format!("tensors of different dtypes ({} and {})", first.dtype(), t.dtype())));
                    }
                }
            }
        }
        let OpSpec { kind, reduce_op, root, tag, inputs, outputs, in_splits, out_splits, stream: _, sync: _ } = spec;
        let op = match kind {
            OpKind::AllReduce => {
                if inputs.is_empty() {
                    return Err(c.err("no tensors given"));
                }
                let mut op = ReduceOp::Sum;
                for t in &inputs {
                    op = c.reduce_op(reduce_op, t.dtype())?;
                }
                if inputs.len() > 1 {
                    c.no_overlap(&inputs.iter().collect::<Vec<_>>(), "all_reduce")?;
                }
                Op::AllReduce { bufs: inputs, op }
            }
            OpKind::Broadcast => {
                c.one(&inputs, "")?;
                Op::Broadcast { buf: inputs.into_iter().next().expect("one"), root: c.rank_arg("root", root)? }
            }
            OpKind::Reduce => {
                let t = c.one(&inputs, "")?;
                let op = c.reduce_op(reduce_op, t.dtype())?;
                Op::Reduce { buf: inputs.into_iter().next().expect("one"), op, root: c.rank_arg("root", root)? }
            }
            OpKind::AllGather => {
                let numel = c.one(&inputs, "input")?.numel();
                let outputs = c.parts(outputs, numel, "output")?;
                c.no_overlap(&outputs.tensors(), "output")?;
                Op::AllGather { input: inputs.into_iter().next().expect("one"), outputs }
            }
            OpKind::ReduceScatter => {
                let out = c.one(&outputs, "output")?;
                let op = c.reduce_op(reduce_op, out.dtype())?;
                let inputs = c.parts(inputs, out.numel(), "input")?;
                Op::ReduceScatter { inputs, output: outputs.into_iter().next().expect("one"), op }
            }
            OpKind::AllToAll => {
                let inputs = c.a2a_parts(inputs, &in_splits, "input")?;
                let outputs = c.a2a_parts(outputs, &out_splits, "output")?;
                c.no_overlap(&outputs.tensors(), "output")?;
                Op::AllToAll { inputs, outputs }
            }
            OpKind::Gather => {
                let numel = c.one(&inputs, "input")?.numel();
                let root = c.rank_arg("root", root)?;
                let outputs = if rank == root {
                    let o = c.parts(outputs, numel, "output")?;
                    c.no_overlap(&o.tensors(), "output")?;
                    Some(o)
                } else if outputs.is_empty() {
                    None
                } else {
                    return Err(c.err(format!("only the root (rank {root}) passes gather outputs")));
                };
                Op::Gather { input: inputs.into_iter().next().expect("one"), outputs, root }
            }
            OpKind::Scatter => {
                let numel = c.one(&outputs, "output")?.numel();
                let root = c.rank_arg("root", root)?;
                let inputs = if rank == root {
                    Some(c.parts(inputs, numel, "input")?)
                } else if inputs.is_empty() {
                    None
                } else {
                    return Err(c.err(format!("only the root (rank {root}) passes scatter inputs")));
                };
                Op::Scatter { inputs, output: outputs.into_iter().next().expect("one"), root }
            }
            OpKind::Barrier => Op::Barrier,
            OpKind::Send => {
                c.one(&inputs, "")?;
                let peer = c.rank_arg("destination rank", root)?;
                if peer == rank {
                    return Err(c.err(format!("rank {rank} cannot send to itself")));
                }
                Op::Send { buf: inputs.into_iter().next().expect("one"), peer, tag }
            }
            OpKind::Recv => {
                c.one(&outputs, "")?;
                let peer = if root < 0 { None } else { Some(c.rank_arg("source rank", root)?) };
                if peer == Some(rank) {
                    return Err(c.err(format!("rank {rank} cannot receive from itself")));
                }
                Op::Recv { buf: outputs.into_iter().next().expect("one"), peer, tag }
            }
        };
        Ok(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(n: usize) -> Tensor {
        Tensor::zeros(DType::F32, n)
    }

    fn spec(kind: OpKind) -> OpSpec {
        OpSpec::new(kind)
    }

    #[test]
    fn all_gather_shapes() {
        let mut s = spec(OpKind::AllGather);
        s.inputs = vec![f32s(3)];
        s.outputs = vec![f32s(12)];
        assert!(matches!(Op::from_spec(s, 0, 4).unwrap(), Op::AllGather { outputs: Parts::Flat { .. }, .. }));
        let mut s = spec(OpKind::AllGather);
        s.inputs = vec![f32s(3)];
        s.outputs = vec![f32s(11)];
        let e = Op::from_spec(s, 0, 4).err().unwrap().to_string();
        assert!(e.contains("rustccl all_gather") && e.contains("11 elements"), "{e}");
        let mut s = spec(OpKind::AllGather);
        s.inputs = vec![f32s(3)];
        s.outputs = (0..4).map(|_| f32s(3)).collect();
        assert!(matches!(Op::from_spec(s, 1, 4).unwrap(), Op::AllGather { outputs: Parts::List(_), .. }));
    }

    #[test]
    fn bad_roots_and_ops_are_rejected() {
        let mut s = spec(OpKind::Broadcast);
        s.inputs = vec![f32s(3)];
        s.root = 4;
        assert!(Op::from_spec(s, 0, 4).err().unwrap().to_string().contains("root 4 is out of range"));
        let mut s = spec(OpKind::AllReduce);
        s.inputs = vec![f32s(3)];
        s.reduce_op = ReduceOp::BXor as i32;
        let e = Op::from_spec(s, 0, 2).err().unwrap();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        let mut s = spec(OpKind::AllReduce);
        s.inputs = vec![f32s(3)];
        s.reduce_op = 8; // PREMUL_SUM
        assert!(Op::from_spec(s, 0, 2).err().unwrap().to_string().contains("PREMUL_SUM"));
    }

    #[test]
    fn mixed_dtypes_and_self_send_are_rejected() {
        let mut s = spec(OpKind::AllGather);
        s.inputs = vec![f32s(3)];
        s.outputs = vec![Tensor::zeros(DType::F64, 6)];
        assert!(Op::from_spec(s, 0, 2).err().unwrap().to_string().contains("different dtypes"));
        let mut s = spec(OpKind::Send);
        s.inputs = vec![f32s(3)];
        s.root = 1;
        assert!(Op::from_spec(s, 1, 2).err().unwrap().to_string().contains("itself"));
    }

    #[test]
    fn a2a_splits() {
        let mut s = spec(OpKind::AllToAll);
        s.inputs = vec![f32s(6)];
        s.outputs = vec![f32s(6)];
        s.in_splits = vec![1, 2, 3];
        s.out_splits = vec![2, 2, 2];
        match Op::from_spec(s, 0, 3).unwrap() {
            Op::AllToAll { inputs: Parts::Flat { lens, .. }, outputs: Parts::Flat { lens: ol, .. } } => {
                assert_eq!(lens, vec![1, 2, 3]);
                assert_eq!(ol, vec![2, 2, 2]);
            }
            _ => panic!("expected flat parts"),
        }
        let mut s = spec(OpKind::AllToAll);
        s.inputs = vec![f32s(5)];
        s.outputs = vec![f32s(6)];
        assert!(Op::from_spec(s, 0, 3).err().unwrap().to_string().contains("not divisible"));
    }
}
