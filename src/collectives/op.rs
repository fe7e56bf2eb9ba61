//! What an operation is, checked: [`OpSpec`] is what a caller asks for (from
//! the C ABI or Python), [`Op`] is the validated form the engines run.
//! Validation only reads metadata, so it serves the host and CUDA paths
//! alike; a rejected call sends nothing and leaves the group usable.
#![forbid(unsafe_code)]

use crate::collectives::kernels;
use crate::error::{Error, Result};
use crate::tensor::{first_overlap, CpuTensor, Tensor};
use crate::types::{DType, Device, OpKind, Rank, ReduceOp};

/// An unchecked request.
pub struct OpSpec {
    pub kind: OpKind,
    pub reduce_op: i32,
    /// Root for rooted collectives, peer for send / recv (-1: any source).
    pub root: i64,
    pub tag: i64,
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<Tensor>,
    /// all_to_all_single split sizes, in rows of dimension 0 (empty: even).
    pub in_splits: Vec<i64>,
    pub out_splits: Vec<i64>,
    /// CUDA: the caller's current stream on the tensors' device (0: default).
    pub stream: u64,
    /// The caller waits for the operation at once (torch's `asyncOp=False`).
    pub sync: bool,
}

impl OpSpec {
    pub fn new(kind: OpKind) -> OpSpec {
        OpSpec {
            kind,
            reduce_op: 0,
            root: 0,
            tag: 0,
            inputs: Vec::new(),
            outputs: Vec::new(),
            in_splits: Vec::new(),
            out_splits: Vec::new(),
            stream: 0,
            sync: false,
        }
    }
}

/// One region per rank: separate tensors, or consecutive pieces of one.
pub enum Parts<T> {
    List(Vec<T>),
    /// `lens[p]` elements for rank p, laid end to end.
    Flat {
        t: T,
        lens: Vec<usize>,
    },
}

/// A validated operation over tensors of type `T` (metadata-only
/// [`Tensor`], or [`CpuTensor`] once the host path took it).
pub enum Op<T> {
    AllReduce {
        bufs: Vec<T>,
        op: ReduceOp,
    },
    Broadcast {
        buf: T,
        root: Rank,
    },
    Reduce {
        buf: T,
        op: ReduceOp,
        root: Rank,
    },
    AllGather {
        input: T,
        outputs: Parts<T>,
    },
    ReduceScatter {
        inputs: Parts<T>,
        output: T,
        op: ReduceOp,
    },
    AllToAll {
        inputs: Parts<T>,
        outputs: Parts<T>,
    },
    /// `outputs` only at the root.
    Gather {
        input: T,
        outputs: Option<Parts<T>>,
        root: Rank,
    },
    /// `inputs` only at the root.
    Scatter {
        inputs: Option<Parts<T>>,
        output: T,
        root: Rank,
    },
    Barrier,
    Send {
        buf: T,
        peer: Rank,
        tag: i64,
    },
    /// `peer: None` receives from any source.
    Recv {
        buf: T,
        peer: Option<Rank>,
        tag: i64,
    },
}

impl<T> Parts<T> {
    fn map<U>(self, f: &mut impl FnMut(T) -> Result<U>) -> Result<Parts<U>> {
        Ok(match self {
            Parts::List(v) => Parts::List(v.into_iter().map(&mut *f).collect::<Result<_>>()?),
            Parts::Flat { t, lens } => Parts::Flat { t: f(t)?, lens },
        })
    }

    pub fn len(&self) -> usize {
        match self {
            Parts::List(v) => v.len(),
            Parts::Flat { lens, .. } => lens.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn tensors(&self) -> Vec<&T> {
        self.iter().collect()
    }

    /// The tensors, without collecting them.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        match self {
            Parts::List(v) => v.iter(),
            Parts::Flat { t, .. } => std::slice::from_ref(t).iter(),
        }
    }
}

impl Parts<CpuTensor> {
    /// Byte length of each part.
    pub fn byte_lens(&self) -> Vec<usize> {
        match self {
            Parts::List(v) => v.iter().map(|t| t.nbytes()).collect(),
            Parts::Flat { t, lens } => lens.iter().map(|l| l * t.dtype().size()).collect(),
        }
    }

    pub fn views(&self) -> Vec<&[u8]> {
        match self {
            Parts::List(v) => v.iter().map(|t| t.bytes()).collect(),
            Parts::Flat { t, lens } => {
                let e = t.dtype().size();
                let mut rest = t.bytes();
                lens.iter()
                    .map(|l| {
                        let (a, b) = rest.split_at(l * e);
                        rest = b;
                        a
                    })
                    .collect()
            }
        }
    }

    pub fn views_mut(&mut self) -> Vec<&mut [u8]> {
        match self {
            Parts::List(v) => v.iter_mut().map(|t| t.bytes_mut()).collect(),
            Parts::Flat { t, lens } => {
                let e = t.dtype().size();
                let mut rest = t.bytes_mut();
                lens.iter()
                    .map(|l| {
                        let (a, b) = std::mem::take(&mut rest).split_at_mut(l * e);
                        rest = b;
                        a
                    })
                    .collect()
            }
        }
    }

    pub fn spans(&self) -> Vec<(usize, usize)> {
        self.tensors().iter().map(|t| t.span()).collect()
    }
}

impl<T> Op<T> {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::AllReduce { .. } => OpKind::AllReduce,
            Op::Broadcast { .. } => OpKind::Broadcast,
            Op::Reduce { .. } => OpKind::Reduce,
            Op::AllGather { .. } => OpKind::AllGather,
            Op::ReduceScatter { .. } => OpKind::ReduceScatter,
            Op::AllToAll { .. } => OpKind::AllToAll,
            Op::Gather { .. } => OpKind::Gather,
            Op::Scatter { .. } => OpKind::Scatter,
            Op::Barrier => OpKind::Barrier,
            Op::Send { .. } => OpKind::Send,
            Op::Recv { .. } => OpKind::Recv,
        }
    }

    /// Converts every tensor (e.g. metadata -> CPU view), keeping the shape
    /// of the operation.
    pub fn map<U>(self, mut f: impl FnMut(T) -> Result<U>) -> Result<Op<U>> {
        let f = &mut f;
        Ok(match self {
            Op::AllReduce { bufs, op } => Op::AllReduce { bufs: bufs.into_iter().map(&mut *f).collect::<Result<_>>()?, op },
            Op::Broadcast { buf, root } => Op::Broadcast { buf: f(buf)?, root },
            Op::Reduce { buf, op, root } => Op::Reduce { buf: f(buf)?, op, root },
            Op::AllGather { input, outputs } => Op::AllGather { input: f(input)?, outputs: outputs.map(f)? },
            Op::ReduceScatter { inputs, output, op } => Op::ReduceScatter { inputs: inputs.map(f)?, output: f(output)?, op },
            Op::AllToAll { inputs, outputs } => Op::AllToAll { inputs: inputs.map(f)?, outputs: outputs.map(f)? },
            Op::Gather { input, outputs, root } => Op::Gather { input: f(input)?, outputs: outputs.map(|o| o.map(f)).transpose()?, root },
            Op::Scatter { inputs, output, root } => Op::Scatter { inputs: inputs.map(|i| i.map(f)).transpose()?, output: f(output)?, root },
            Op::Barrier => Op::Barrier,
            Op::Send { buf, peer, tag } => Op::Send { buf: f(buf)?, peer, tag },
            Op::Recv { buf, peer, tag } => Op::Recv { buf: f(buf)?, peer, tag },
        })
    }

    /// The root of a rooted collective (broadcast, reduce, gather, scatter).
    pub fn root(&self) -> Option<Rank> {
        match self {
            Op::Broadcast { root, .. } | Op::Reduce { root, .. } | Op::Gather { root, .. } | Op::Scatter { root, .. } => Some(*root),
            _ => None,
        }
    }

    /// The first of [`Op::tensors`], without collecting them (the
    /// submission path asks for it on every call).
    pub fn first_tensor(&self) -> Option<&T> {
        match self {
            Op::AllReduce { bufs, .. } => bufs.first(),
            Op::Broadcast { buf, .. } | Op::Reduce { buf, .. } | Op::Send { buf, .. } | Op::Recv { buf, .. } => Some(buf),
            Op::AllGather { input, .. } | Op::Gather { input, .. } => Some(input),
            Op::ReduceScatter { inputs, output, .. } => inputs.iter().next().or(Some(output)),
            Op::AllToAll { inputs, outputs } => inputs.iter().next().or_else(|| outputs.iter().next()),
            Op::Scatter { inputs, output, .. } => inputs.as_ref().and_then(|i| i.iter().next()).or(Some(output)),
            Op::Barrier => None,
        }
    }

    /// Every tensor of the operation, inputs first.
    pub fn tensors(&self) -> Vec<&T> {
        let mut v: Vec<&T> = Vec::new();
        match self {
            Op::AllReduce { bufs, .. } => v.extend(bufs.iter()),
            Op::Broadcast { buf, .. } | Op::Reduce { buf, .. } | Op::Send { buf, .. } | Op::Recv { buf, .. } => v.push(buf),
            Op::AllGather { input, outputs } => {
                v.push(input);
                v.extend(outputs.tensors());
            }
            Op::ReduceScatter { inputs, output, .. } => {
                v.extend(inputs.tensors());
                v.push(output);
            }
            Op::AllToAll { inputs, outputs } => {
                v.extend(inputs.tensors());
                v.extend(outputs.tensors());
            }
            Op::Gather { input, outputs, .. } => {
                v.push(input);
                if let Some(o) = outputs {
                    v.extend(o.tensors());
                }
            }
            Op::Scatter { inputs, output, .. } => {
                if let Some(i) = inputs {
                    v.extend(i.tensors());
                }
                v.push(output);
            }
            Op::Barrier => {}
        }
        v
    }
}

impl Op<Tensor> {
    /// The device all tensors live on (CPU for tensor-less operations).
    pub fn device(&self) -> Device {
        self.first_tensor().map_or(Device::Cpu, |t| t.device())
    }

    /// The dtype of the first tensor (None for tensor-less operations).
    pub fn first_dtype(&self) -> Option<DType> {
        self.first_tensor().map(|t| t.dtype())
    }

    /// Payload bytes of this rank's contribution (for stats and logs).
    pub fn bytes(&self) -> usize {
        match self {
            Op::AllReduce { bufs, .. } => bufs.iter().map(|t| t.nbytes()).sum(),
            Op::Broadcast { buf, .. } | Op::Reduce { buf, .. } | Op::Send { buf, .. } | Op::Recv { buf, .. } => buf.nbytes(),
            Op::AllGather { outputs, .. } => outputs.iter().map(|t| t.nbytes()).sum(),
            Op::ReduceScatter { inputs, .. } | Op::AllToAll { inputs, .. } => inputs.iter().map(|t| t.nbytes()).sum(),
            Op::Gather { input, .. } => input.nbytes(),
            Op::Scatter { output, .. } => output.nbytes(),
            Op::Barrier => 0,
        }
    }
}

// ---------------------------------------------------------------- validation

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

/// Takes the CPU view of every tensor of a validated operation.
pub fn into_cpu(op: Op<Tensor>) -> Result<Op<CpuTensor>> {
    let name = op.kind().name();
    op.map(|t| CpuTensor::new(t).map_err(|why| Error::unsupported(name, why)))
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
