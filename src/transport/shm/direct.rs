//! Collectives that run straight through the local ranks' segments instead
//! of through links: every rank reads its peers' data where they put it.
//! They live here, beside the segments, because they read shared memory
//! in place (the only `unsafe` of the algorithms).
//!
//! Vocabulary: each rank publishes a monotonically increasing *phase* in its
//! segment; all ranks run the same steps, so phases agree at every step.
//! A rank writes its shared areas only after every peer reached the phase
//! at which it stopped reading them, and reads a peer's areas only after
//! the peer published the phase at which it finished writing them.

use std::sync::atomic::Ordering;

use super::ShmLocal;
use crate::collectives::plan::{bytes, even_chunks, segments};
use crate::collectives::reduce::{finish_avg, reduce_into};
use crate::error::{Error, Result};
use crate::types::{DType, Rank, ReduceOp};

/// Blocks until every local rank's phase is at least `target` (with the
/// transport's deadline, interrupt and dead-peer checks).
pub trait PhaseWait {
    fn wait_phase(&mut self, target: u64) -> Result<()>;
    /// Wire sequence number of the current operation.
    fn seq(&self) -> u32;
    /// A protocol error with `peer` (ranks disagree about the operation).
    fn mismatch(&self, peer: Rank, detail: String) -> Error;
}

fn dtype_code(d: DType) -> u64 {
    match d {
        DType::F32 => 1,
        DType::F64 => 2,
        DType::F16 => 3,
        DType::BF16 => 4,
        DType::U8 => 5,
        DType::I8 => 6,
        DType::I16 => 7,
        DType::I32 => 8,
        DType::I64 => 9,
        DType::Bool => 10,
        DType::Other { code, bits } => 0x1000 | (code as u64) << 16 | bits as u64,
    }
}

fn descriptor(seq: u32, dtype: DType, op: ReduceOp) -> u64 {
    (seq as u64) << 32 | dtype_code(dtype) << 8 | op as u64
}

/// Announces what this rank is about to run (before its first publish).
fn announce(local: &ShmLocal, w: &dyn PhaseWait, len: usize, dtype: DType, op: ReduceOp) {
    local.mine().desc().store(descriptor(w.seq(), dtype, op), Ordering::Relaxed);
    local.mine().desc_len().store(len as u64, Ordering::Relaxed);
}

/// After the first wait: every peer announced the same operation.
fn verify(local: &ShmLocal, w: &dyn PhaseWait, len: usize, dtype: DType, op: ReduceOp) -> Result<()> {
    let want = descriptor(w.seq(), dtype, op);
    for (i, s) in local.segs.iter().enumerate() {
        if i == local.me {
            continue;
        }
        let (d, l) = (s.desc().load(Ordering::Relaxed), s.desc_len().load(Ordering::Relaxed));
        if d >> 32 != want >> 32 {
            return Err(w.mismatch(local.ranks[i], format!(
                "peer is at operation seq {} but this rank is at seq {}: the ranks called a different number of collectives",
                d >> 32,
                want >> 32
            )));
        }
        if d != want || l != len as u64 {
            return Err(w.mismatch(local.ranks[i], format!(
                "peer runs all_reduce on {l} bytes (type/op code {:#x}) where this rank has {len} bytes ({:#x}): the ranks passed different tensors or ops",
                d & 0xffff_ffff,
                want & 0xffff_ffff
            )));
        }
    }
    Ok(())
}

fn phase(local: &ShmLocal) -> u64 {
    local.mine().phase().load(Ordering::Relaxed)
}

fn publish(local: &ShmLocal, v: u64) {
    local.mine().phase().store(v, Ordering::Release);
    for (i, s) in local.segs.iter().enumerate() {
        if i != local.me {
            s.notify();
        }
    }
}

/// Largest buffer [`all_reduce_small`] takes.
pub fn small_capacity(local: &ShmLocal) -> usize {
    local.mine().layout.small
}

/// All-reduce among the local ranks straight through their segments: one
/// round up to the small slot's size, pipelined above. Returns the
/// algorithm's name.
pub fn all_reduce(local: &ShmLocal, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<&'static str> {
    if buf.len() <= small_capacity(local) {
        all_reduce_small(local, w, buf, dtype, op)?;
        Ok("shm_one_round")
    } else {
        all_reduce_large(local, w, buf, dtype, op)?;
        Ok("shm_pipelined")
    }
}

/// One round: every rank copies its buffer into its small slot, then every
/// rank reduces all slots in rank order (so all ranks get bitwise identical
/// results) into its buffer.
pub fn all_reduce_small(local: &ShmLocal, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let n = local.ranks.len();
    let off = local.mine().layout.small_off;
    let p0 = phase(local);
    w.wait_phase(p0)?; // peers left the previous operation: our slot is free
    // SAFETY: peers read our slot only between our publish of p0+1 and their
    // own p0+2; they are all at >= p0 now, before that window.
    unsafe { local.mine().write(off, buf) };
    announce(local, w, buf.len(), dtype, op); // peers are past verifying the previous operation
    publish(local, p0 + 1);
    w.wait_phase(p0 + 1)?;
    verify(local, w, buf.len(), dtype, op)?;
    for (i, seg) in local.segs.iter().enumerate().take(n) {
        // SAFETY: rank i published p0+1 after writing its slot and writes it
        // again only after we publish p0+2.
        let theirs = unsafe { seg.view(off, buf.len()) };
        if i == 0 {
            buf.copy_from_slice(theirs);
        } else {
            reduce_into(op, dtype, buf, theirs)?;
        }
    }
    if op == ReduceOp::Avg {
        finish_avg(dtype, buf, n)?;
    }
    publish(local, p0 + 2);
    Ok(())
}

/// Rank r reduces chunk r of the buffer, segment by segment: each round,
/// every rank copies its segment of every other rank's chunk into its input
/// area, reduces the inputs of its own chunk, publishes the result in its
/// output area, and copies the other chunks' results out.
pub fn all_reduce_large(local: &ShmLocal, w: &mut dyn PhaseWait, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let n = local.ranks.len();
    let me = local.me;
    let e = dtype.size();
    let l = local.mine().layout;
    let seg = (l.seg / e).max(1);
    let chunks = even_chunks(buf.len() / e, n);
    let segs: Vec<Vec<_>> = chunks.iter().map(|c| segments(c.clone(), seg).collect()).collect();
    let rounds = segs.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let wk = &local.workers;
    for k in 0..rounds {
        let p = phase(local);
        w.wait_phase(p)?; // peers finished reading our areas of the last round
        if k == 0 {
            // Only now: a peer may still be verifying the previous operation.
            announce(local, w, buf.len(), dtype, op);
        }
        for (c, s) in segs.iter().enumerate() {
            if let (true, Some(g)) = (c != me, s.get(k)) {
                let src = &buf[bytes(g, e)];
                wk.for_pieces(src.len(), |r| {
                    // SAFETY: peers read our input area only between our
                    // p+1 and their p+2; all are at >= p.
                    unsafe { local.mine().write(l.in_off + c * l.seg + r.start, &src[r]) };
                    Ok::<(), Error>(())
                })?;
            }
        }
        publish(local, p + 1);
        w.wait_phase(p + 1)?;
        if k == 0 {
            verify(local, w, buf.len(), dtype, op)?;
        }
        if let Some(g) = segs[me].get(k) {
            let r = bytes(g, e);
            wk.for_pieces_mut(&mut buf[r.clone()], |off, piece| {
                for (i, sgm) in local.segs.iter().enumerate() {
                    if i != me {
                        // SAFETY: rank i wrote this sub-slot before its p+1
                        // and rewrites it only after we publish p+3.
                        let theirs = unsafe { sgm.view(l.in_off + me * l.seg + off, piece.len()) };
                        reduce_into(op, dtype, piece, theirs)?;
                    }
                }
                if op == ReduceOp::Avg {
                    finish_avg(dtype, piece, n)?;
                }
                // SAFETY: peers read our output area only between our p+2
                // and their p+3; all are at >= p+1.
                unsafe { local.mine().write(l.out_off + off, piece) };
                Ok(())
            })?;
        }
        publish(local, p + 2);
        w.wait_phase(p + 2)?;
        for (c, s) in segs.iter().enumerate() {
            if let (true, Some(g)) = (c != me, s.get(k)) {
                let r = bytes(g, e);
                wk.for_pieces_mut(&mut buf[r], |off, piece| {
                    // SAFETY: rank c wrote its output area before its p+2
                    // and rewrites it only after we publish p+3.
                    unsafe { local.segs[c].read(l.out_off + off, piece) };
                    Ok::<(), Error>(())
                })?;
            }
        }
        publish(local, p + 3);
    }
    Ok(())
}
