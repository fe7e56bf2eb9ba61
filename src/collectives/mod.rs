//! Collective algorithms over a [`Transport`], one algorithm per file, and
//! [`run`], which picks one for each operation by size and world:
//!
//! | collective      | small                         | large                       |
//! |-----------------|-------------------------------|-----------------------------|
//! | all_reduce      | recursive doubling            | ring (reduce-scatter + all-gather) |
//! | all_reduce, one host (shm) | one step over peers' small slots | pipelined reduce-scatter + all-gather in place |
//! | all_reduce, several hosts with shm | within hosts (shm), across leaders (tcp), broadcast within hosts | same |
//! | broadcast       | binomial tree                 | pipelined chain             |
//! | broadcast, all_gather, barrier; one host (shm) | one step over peers' small slots (<= 256 KiB) | |
//! | all_gather, reduce_scatter; one host (shm) | direct: every rank copies straight from the others' areas | same, in rounds |
//! | broadcast; one host (shm) | | pipelined: the root copies a quarter in while the others copy the last one out; 2 ranks where reads are slow, from 1 MiB: the other reads half of the root's tensor while the root writes the other half into its buffer |
//! | reduce, one host (shm) | the shared-memory all-reduce (on a copy on non-roots) | same |
//! | all_reduce, reduce_scatter, all_gather, reduce; one host, >= 16 MiB (all_reduce: 4 MiB per local rank; reduce with pushes: 4 MiB with 5-8 local ranks of at most 2 threads, 8 MiB with 5-8 of more or 3-4 of at most 4 threads, 512 KiB with more; broadcast: only with its own setting) | | single copy: read the peers' tensors (cross-memory attach); a reduce's parts pushed into the root's buffer |
//! | all_to_all, gather, scatter; one host with attach (gather, scatter where reads are slow: blocks over 256 KiB) | one step when every rank's blocks fit its small slot; else blocks up to the block-read threshold (256 KiB; 2 MiB with 3-4 local ranks, 4 MiB with 2, where reads are fast) through the sender's input slots (a block fills one, or both with 2 local ranks) | larger blocks read from the sender's tensor |
//! | reduce          | binomial tree                 | ring reduce-scatter + gather to root |
//! | all_gather      | ring                          | ring                        |
//! | reduce_scatter  | ring                          | ring                        |
//! | all_to_all, gather, scatter | direct            | direct                      |
//! | barrier         | dissemination                 |                             |
#![forbid(unsafe_code)]

pub mod compress;
mod describe;
pub mod hierarchical;
pub mod kernels;
pub mod net;
pub mod op;
pub mod plan;
pub mod shm;
mod validate;

pub use compress::Compression;
pub use describe::wire_what;
pub use kernels::Scratch;
pub use op::{into_cpu, Op, OpSpec, Parts};

use net::{chain, direct, recursive_doubling, ring, tree};

use crate::config::AlgoConfig;
use crate::error::{Error, Result};
use crate::tensor::{copy_region, overlaps, CpuTensor, Tensor};
use crate::transport::shm::{BlockOp, PhaseWait, Window};
use crate::transport::Transport;
use crate::types::{DType, ReduceOp};

/// Which algorithm ran (for stats and logs).
pub type AlgoName = &'static str;

pub(crate) fn all_reduce_bytes(
    t: &mut dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    cfg: &AlgoConfig,
    scratch: &mut Scratch,
) -> Result<AlgoName> {
    all_reduce_bytes_with(t, buf, dtype, op, cfg, scratch, None)
}

/// [`all_reduce_bytes`] with the engine's compression state: a request
/// compresses the exchange between hosts (groups on one host stay exact).
fn all_reduce_bytes_with(
    t: &mut dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    cfg: &AlgoConfig,
    scratch: &mut Scratch,
    comp: Option<&mut Compression>,
) -> Result<AlgoName> {
    if t.size() == 1 {
        return Ok("local");
    }
    let size = t.size();
    if let Some((win, wait)) = t.window() {
        if win.ranks().len() == size {
            return all_reduce_shm(&win, wait, buf, dtype, op);
        }
    }
    if let Some(hosts) = t.hosts() {
        let compress = hosts.len() > 1 && comp.as_ref().is_some_and(|c| c.request.is_some());
        if compress || hosts.iter().any(|h| h.len() > 1) {
            return hierarchical::all_reduce(t, &hosts, buf, dtype, op, cfg, scratch, comp);
        }
    }
    if buf.len() <= cfg.small_allreduce_bytes {
        recursive_doubling::all_reduce(t, buf, dtype, op, scratch)?;
        Ok("recursive_doubling")
    } else {
        ring::all_reduce(t, buf, dtype, op, plan::seg_elems(cfg.segment_bytes, dtype.size()), scratch)?;
        Ok("ring")
    }
}

/// All-reduce among the ranks of one host through shared memory: reading
/// the peers' buffers directly from the attach size on, one round up to
/// the small slot's size, pipelined between.
pub(crate) fn all_reduce_shm(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<AlgoName> {
    if win.all_reduce_attach_min().is_some_and(|m| buf.len() >= m) {
        shm::attach::reduce::all_reduce(win, w, buf, dtype, op)?;
        Ok("shm_attach")
    } else if buf.len() <= win.one_round_max() {
        shm::one_round::all_reduce(win, w, buf, dtype, op, None)?;
        Ok("shm_one_round")
    } else {
        shm::pipelined::all_reduce(win, w, buf, dtype, op)?;
        Ok("shm_pipelined")
    }
}

/// Reduce among the ranks of one host. Small buffers: the one-round
/// all-reduce, on a copy where the buffer must not change (the copy is a
/// few cache lines). Larger: the all-reduce without its all-gather, which
/// leaves the non-roots' buffers untouched, and beats a ring reduce and an
/// all-reduce on a copy (`docs/decisions/0004`).
fn reduce_shm(
    win: &Window,
    w: &mut dyn PhaseWait,
    buf: &mut CpuTensor,
    op: ReduceOp,
    root: usize,
    scratch: &mut Scratch,
) -> Result<AlgoName> {
    let dtype = buf.dtype();
    let (n, me) = (win.ranks().len(), win.me());
    if win.reduce_attach_min().is_some_and(|m| buf.nbytes() >= m) {
        let part = plan::bytes(&plan::even_chunks(buf.nbytes() / dtype.size(), n)[me], dtype.size()).len();
        shm::attach::reduce::reduce(win, w, buf.bytes_mut(), dtype, op, root, scratch.get(part))?;
        Ok("shm_attach")
    } else if buf.nbytes() <= win.one_round_max() {
        if me == root {
            shm::one_round::all_reduce(win, w, buf.bytes_mut(), dtype, op, Some(root))?;
        } else {
            // Reused scratch (aligned for every dtype).
            let copy = scratch.get(buf.nbytes());
            copy.copy_from_slice(buf.bytes());
            shm::one_round::all_reduce(win, w, copy, dtype, op, Some(root))?;
        }
        Ok("shm_one_round")
    } else {
        shm::pipelined::reduce(win, w, buf.bytes_mut(), dtype, op, root, scratch.get(win.slot_capacity()))?;
        Ok("shm_pipelined")
    }
}

/// All-reduce of several tensors: packed into one buffer when they share a
/// dtype, one after another otherwise.
fn all_reduce_many(
    t: &mut dyn Transport,
    bufs: &mut [CpuTensor],
    op: ReduceOp,
    cfg: &AlgoConfig,
    scratch: &mut Scratch,
    comp: Option<&mut Compression>,
) -> Result<AlgoName> {
    if let [one] = bufs {
        let dtype = one.dtype();
        return all_reduce_bytes_with(t, one.bytes_mut(), dtype, op, cfg, scratch, comp);
    }
    let dtype = bufs[0].dtype();
    if bufs.iter().any(|b| b.dtype() != dtype) {
        let mut name = "local";
        for b in bufs.iter_mut() {
            let d = b.dtype();
            name = all_reduce_bytes(t, b.bytes_mut(), d, op, cfg, scratch)?; // mixed dtypes: exact
        }
        return Ok(name);
    }
    let total: usize = bufs.iter().map(|b| b.nbytes()).sum();
    let mut packed = CpuTensor::new(Tensor::zeros(DType::U8, total)).map_err(Error::Internal)?;
    let mut off = 0;
    for b in bufs.iter() {
        copy_region(&mut packed, off, b, 0, b.nbytes());
        off += b.nbytes();
    }
    let name = all_reduce_bytes_with(t, packed.bytes_mut(), dtype, op, cfg, scratch, comp)?;
    let mut off = 0;
    for b in bufs.iter_mut() {
        let n = b.nbytes();
        copy_region(b, 0, &packed, off, n);
        off += n;
    }
    Ok(name)
}

/// Reduce of a large buffer: ring reduce-scatter on a copy, then every rank
/// sends the chunk it finished to the root.
fn reduce_ring(
    t: &mut dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
    cfg: &AlgoConfig,
    scratch: &mut Scratch,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let e = dtype.size();
    let chunks = plan::even_chunks(buf.len() / e, n);
    let mut stage = CpuTensor::new(Tensor::zeros(DType::U8, buf.len())).map_err(Error::Internal)?;
    let stage = stage.bytes_mut();
    stage.copy_from_slice(buf);
    let seg = plan::seg_elems(cfg.segment_bytes, e);
    ring::reduce_scatter_inplace(t, stage, dtype, op, &chunks, seg, scratch)?;
    let owned = |p: usize| plan::bytes(&chunks[(p + 1) % n], e);
    if r != root {
        return t.send(root, &stage[owned(r)]);
    }
    buf[owned(r)].copy_from_slice(&stage[owned(r)]);
    {
        let mut parts = split_chunks_mut(buf, &chunks, e);
        let mut x = Vec::with_capacity(n - 1);
        for p in (0..n).filter(|&p| p != r) {
            let c = (p + 1) % n;
            x.push(crate::transport::Xfer::Recv { peer: p, data: std::mem::take(&mut parts[c]) });
        }
        t.exchange(&mut x)?;
    }
    if op == ReduceOp::Avg {
        kernels::finish_avg(dtype, buf, n)?;
    }
    Ok(())
}

/// Splits `buf` into one mutable slice per chunk.
fn split_chunks_mut<'a>(buf: &'a mut [u8], chunks: &[std::ops::Range<usize>], e: usize) -> Vec<&'a mut [u8]> {
    let mut rest = buf;
    chunks
        .iter()
        .map(|c| {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(c.len() * e);
            rest = b;
            a
        })
        .collect()
}

/// Where part `p` of `parts` lives: (tensor, byte offset, byte length).
fn locate(parts: &Parts<CpuTensor>, p: usize) -> (&CpuTensor, usize, usize) {
    match parts {
        Parts::List(v) => (&v[p], 0, v[p].nbytes()),
        Parts::Flat { t, lens } => {
            let e = t.dtype().size();
            (t, lens[..p].iter().sum::<usize>() * e, lens[p] * e)
        }
    }
}

fn locate_mut(parts: &mut Parts<CpuTensor>, p: usize) -> (&mut CpuTensor, usize, usize) {
    match parts {
        Parts::List(v) => {
            let n = v[p].nbytes();
            (&mut v[p], 0, n)
        }
        Parts::Flat { t, lens } => {
            let e = t.dtype().size();
            let off = lens[..p].iter().sum::<usize>() * e;
            let len = lens[p] * e;
            (t, off, len)
        }
    }
}

/// A private copy of `parts` (same layout), for inputs that overlap outputs.
fn stage_parts(parts: &Parts<CpuTensor>) -> Result<Parts<CpuTensor>> {
    let lens = parts.byte_lens();
    let total: usize = lens.iter().sum();
    let mut t = CpuTensor::new(Tensor::zeros(DType::U8, total)).map_err(Error::Internal)?;
    let mut off = 0;
    for p in 0..lens.len() {
        let (src, so, len) = locate(parts, p);
        copy_region(&mut t, off, src, so, len);
        off += len;
    }
    Ok(Parts::Flat { t, lens })
}

fn any_overlap(a: &[(usize, usize)], b: &[(usize, usize)]) -> bool {
    a.iter().any(|x| b.iter().any(|y| overlaps(*x, *y)))
}

/// The shared-memory window, when every rank of the group is on this host.
fn whole_host(t: &mut dyn Transport) -> Option<(Window, &mut dyn PhaseWait)> {
    let n = t.size();
    t.window().filter(|(win, _)| win.ranks().len() == n)
}

/// Copies `len` bytes of `src` at `so` to `dst` at `off`: this rank's own
/// part of all_gather, all_to_all, gather or scatter. On the window's
/// threads where there is one and the two do not overlap: on one thread
/// it is 1/n of the bytes (half of them with 2 ranks) while the peers'
/// parts use every thread.
fn copy_own(win: Option<&Window>, dst: &mut CpuTensor, off: usize, src: &CpuTensor, so: usize, len: usize) {
    let d = dst.bytes().as_ptr() as usize + off;
    let s = src.bytes().as_ptr() as usize + so;
    match win {
        Some(win) if !overlaps((d, d + len), (s, s + len)) => {
            win.workers().copy(&mut dst.bytes_mut()[off..off + len], &src.bytes()[so..so + len])
        }
        _ => copy_region(dst, off, src, so, len),
    }
}

/// The window when every rank is on this host and can read the others'
/// memory, for all_to_all, gather and scatter of `block` bytes per block
/// (the same on every rank; None for all_to_all, whose blocks differ):
/// their totals differ between ranks (no size every rank could compare
/// with the threshold), so they read directly whenever reads are fast;
/// where they are slow, all_to_all still does, gathers and scatters only
/// for blocks large enough (`Window::attach_blocks`).
fn attach_host(t: &mut dyn Transport, op: BlockOp, block: Option<usize>) -> Option<(Window, &mut dyn PhaseWait)> {
    whole_host(t).filter(|(win, _)| win.attach_blocks(op, block))
}

/// Runs one collective (not send / recv) over `t`. `comp` (all_reduce
/// only) carries the engine's compression request and memory.
pub fn run(
    t: &mut dyn Transport,
    op: &mut Op<CpuTensor>,
    cfg: &AlgoConfig,
    scratch: &mut Scratch,
    comp: Option<&mut Compression>,
) -> Result<AlgoName> {
    let (n, r) = (t.size(), t.rank());
    match op {
        Op::AllReduce { bufs, op } => all_reduce_many(t, bufs, *op, cfg, scratch, comp),
        Op::Broadcast { buf, root } => {
            if n == 1 {
                Ok("local")
            } else if let Some((win, wait)) = whole_host(t) {
                if win.broadcast_attach_min().is_some_and(|m| buf.nbytes() >= m) {
                    shm::attach::broadcast(&win, wait, buf.bytes_mut(), *root)?;
                    return Ok("shm_attach");
                }
                if buf.nbytes() <= win.small_capacity() {
                    shm::one_round::broadcast(&win, wait, buf.bytes_mut(), *root)?;
                    return Ok("shm_one_round");
                }
                shm::broadcast::broadcast(&win, wait, buf.bytes_mut(), *root)?;
                Ok("shm_direct")
            } else if buf.nbytes() <= cfg.small_broadcast_bytes {
                tree::broadcast(t, buf.bytes_mut(), *root)?;
                Ok("tree")
            } else {
                chain::broadcast(t, buf.bytes_mut(), *root, cfg.segment_bytes)?;
                Ok("chain")
            }
        }
        Op::Reduce { buf, op, root } => {
            let dtype = buf.dtype();
            if n == 1 {
                Ok("local")
            } else if let Some((win, wait)) = whole_host(t) {
                reduce_shm(&win, wait, buf, *op, *root, scratch)
            } else if buf.nbytes() <= cfg.small_allreduce_bytes {
                tree::reduce(t, buf.bytes_mut(), dtype, *op, *root, scratch)?;
                Ok("tree")
            } else {
                reduce_ring(t, buf.bytes_mut(), dtype, *op, *root, cfg, scratch)?;
                Ok("ring")
            }
        }
        Op::AllGather { input, outputs } => {
            let host = if n > 1 { whole_host(t) } else { None };
            let (dst, off, len) = locate_mut(outputs, r);
            copy_own(host.as_ref().map(|h| &h.0), dst, off, input, 0, len);
            if n == 1 {
                return Ok("local");
            }
            if let Some((win, wait)) = host {
                let total: usize = outputs.byte_lens().iter().sum();
                // Each rank reads n - 1 parts, half of what an all-reduce of
                // the total reads: compared by the part, where the slots
                // stay faster up to large parts with many ranks; its own
                // threshold with shared tensors on a crowded host
                // (`Attach::all_gather_min`, `docs/decisions/0004`).
                if win.all_gather_attach_min().is_some_and(|m| len >= m) {
                    shm::attach::all_gather(&win, wait, &mut outputs.views_mut())?;
                    return Ok("shm_attach");
                }
                if total <= win.small_capacity() {
                    shm::one_round::all_gather(&win, wait, &mut outputs.views_mut())?;
                    return Ok("shm_one_round");
                }
                shm::all_gather::all_gather(&win, wait, &mut outputs.views_mut())?;
                return Ok("shm_direct");
            }
            ring::all_gather(t, &mut outputs.views_mut(), cfg.segment_bytes)?;
            Ok("ring")
        }
        Op::ReduceScatter { inputs, output, op } => {
            let dtype = output.dtype();
            let seg = plan::seg_elems(cfg.segment_bytes, dtype.size());
            if n > 1 && t.window().is_some_and(|(win, _)| win.ranks().len() == n) {
                let staged;
                let ins: &Parts<CpuTensor> = if any_overlap(&inputs.spans(), &[output.span()]) {
                    staged = stage_parts(inputs)?;
                    &staged
                } else {
                    inputs
                };
                let (win, wait) = whole_host(t).ok_or_else(|| Error::Internal("shared memory went away".into()))?;
                // Reading the peers' inputs directly: from 16 MiB by
                // default (below, the two-copy algorithm is faster: reads
                // by several ranks of one source contend, and each step's
                // wake-ups cost more than the saved copy), from 8 MiB with
                // many ranks of few threads
                // (`Window::reduce_scatter_attach_min`).
                if win.reduce_scatter_attach_min().is_some_and(|m| ins.byte_lens().iter().sum::<usize>() >= m) {
                    shm::attach::reduce::reduce_scatter(&win, wait, &ins.views(), output.bytes_mut(), dtype, *op)?;
                    return Ok("shm_attach");
                }
                shm::reduce_scatter::reduce_scatter(&win, wait, &ins.views(), output.bytes_mut(), dtype, *op)?;
                return Ok("shm_direct");
            }
            if any_overlap(&inputs.spans(), &[output.span()]) {
                let staged = stage_parts(inputs)?;
                ring::reduce_scatter(t, &staged.views(), output.bytes_mut(), dtype, *op, seg, scratch)?;
            } else {
                ring::reduce_scatter(t, &inputs.views(), output.bytes_mut(), dtype, *op, seg, scratch)?;
            }
            Ok("ring")
        }
        Op::AllToAll { inputs, outputs } => {
            let (in_lens, out_lens) = (inputs.byte_lens(), outputs.byte_lens());
            if in_lens[r] != out_lens[r] {
                return Err(Error::invalid(
                    "all_to_all",
                    format!("rank {r} sends itself {} bytes but expects {} from itself", in_lens[r], out_lens[r]),
                ));
            }
            let staged;
            let inputs: &Parts<CpuTensor> = if any_overlap(&inputs.spans(), &outputs.spans()) {
                staged = stage_parts(inputs)?;
                &staged
            } else {
                inputs
            };
            if n > 1 {
                if let Some((win, wait)) = attach_host(t, BlockOp::AllToAll, None) {
                    // Our own block too, in the phase of its other copies.
                    shm::attach::all_to_all(&win, wait, &inputs.views(), &mut outputs.views_mut())?;
                    return Ok("shm_attach");
                }
            }
            {
                let (src, so, len) = locate(inputs, r);
                let (dst, d_off, _) = locate_mut(outputs, r);
                copy_region(dst, d_off, src, so, len);
            }
            if n == 1 {
                return Ok("local");
            }
            direct::all_to_all(t, &inputs.views(), &mut outputs.views_mut())?;
            Ok("direct")
        }
        Op::Gather { input, outputs, root } => {
            if n > 1 {
                if let Some((win, wait)) = whole_host(t).filter(|(win, _)| win.one_round_blocks(BlockOp::Gather, input.nbytes(), 1)) {
                    let mut outs = outputs.as_mut().map(|o| {
                        let (dst, off, len) = locate_mut(o, r);
                        copy_region(dst, off, input, 0, len);
                        o.views_mut()
                    });
                    shm::one_round::gather(&win, wait, input.bytes(), outs.as_deref_mut(), *root)?;
                    return Ok("shm_one_round");
                }
                if let Some((win, wait)) = attach_host(t, BlockOp::Gather, Some(input.nbytes())) {
                    // The root's own part: copied by the algorithm while the
                    // senders' blocks arrive, unless the input overlaps an
                    // output (theirs too: they may write it meanwhile);
                    // then first, as before.
                    let mut own = true;
                    let mut outs = outputs.as_mut().map(|o| {
                        if any_overlap(&o.spans(), &[input.span()]) {
                            let (dst, off, len) = locate_mut(o, r);
                            copy_own(Some(&win), dst, off, input, 0, len);
                            own = false;
                        }
                        o.views_mut()
                    });
                    shm::attach::gather(&win, wait, input.bytes(), outs.as_deref_mut(), *root, own)?;
                    return Ok("shm_attach");
                }
            }
            match outputs {
                Some(outs) => {
                    let (dst, off, len) = locate_mut(outs, r);
                    copy_region(dst, off, input, 0, len);
                    direct::gather(t, &[], Some(&mut outs.views_mut()), *root)?;
                }
                None => direct::gather(t, input.bytes(), None, *root)?,
            }
            Ok("direct")
        }
        Op::Scatter { inputs, output, root } => {
            if n > 1 {
                if let Some((win, wait)) = whole_host(t).filter(|(win, _)| win.one_round_blocks(BlockOp::Scatter, output.nbytes(), n)) {
                    let views = inputs.as_ref().map(|i| i.views());
                    shm::one_round::scatter(&win, wait, views.as_deref(), output.bytes_mut(), *root)?;
                    if let Some(ins) = inputs.as_ref() {
                        let (src, so, len) = locate(ins, r);
                        copy_region(output, 0, src, so, len);
                    }
                    return Ok("shm_one_round");
                }
                if let Some((win, wait)) = attach_host(t, BlockOp::Scatter, Some(output.nbytes())) {
                    // The root copies its own part while the others take
                    // theirs, unless its output overlaps an input the
                    // others read: then after them.
                    let own = inputs.as_ref().is_some_and(|ins| !any_overlap(&ins.spans(), &[output.span()]));
                    let views = inputs.as_ref().map(|i| i.views());
                    shm::attach::scatter::scatter(&win, wait, views.as_deref(), output.bytes_mut(), *root, own)?;
                    if let (false, Some(ins)) = (own, inputs.as_ref()) {
                        let (src, so, len) = locate(ins, r);
                        copy_own(Some(&win), output, 0, src, so, len);
                    }
                    return Ok("shm_attach");
                }
            }
            match inputs {
                Some(ins) => {
                    direct::scatter(t, Some(&ins.views()), &mut [], *root)?;
                    let (src, so, len) = locate(ins, r);
                    copy_region(output, 0, src, so, len);
                }
                None => direct::scatter(t, None, output.bytes_mut(), *root)?,
            }
            Ok("direct")
        }
        Op::Barrier => {
            if n > 1 {
                if let Some((win, wait)) = whole_host(t) {
                    shm::one_round::barrier(&win, wait)?;
                    return Ok("shm_one_round");
                }
            }
            direct::barrier(t)?;
            Ok("dissemination")
        }
        Op::Send { .. } | Op::Recv { .. } => Err(Error::Internal("point-to-point op reached the collective engine".into())),
    }
}
