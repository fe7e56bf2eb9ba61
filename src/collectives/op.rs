//! What an operation is, checked: [`OpSpec`] is what a caller asks for (from
//! the C ABI or Python), [`Op`] is the validated form the engines run.
//! `validate.rs` checks the one into the other.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::tensor::{CpuTensor, Tensor};
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

/// Takes the CPU view of every tensor of a validated operation.
pub fn into_cpu(op: Op<Tensor>) -> Result<Op<CpuTensor>> {
    let name = op.kind().name();
    op.map(|t| CpuTensor::new(t).map_err(|why| Error::unsupported(name, why)))
}
