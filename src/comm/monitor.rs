//! Monitored barrier (gloo's semantics): rank 0 waits up to a timeout for
//! every other rank to check in and names the ones that did not; the other
//! ranks learn the outcome from rank 0. Runs over the point-to-point
//! engine (not the collective queue), so a hung collective of the group
//! does not hide the rank that hangs.
//!
//! Each call uses its own control tag (`Communicator::control_tag`), so a
//! late rank's check-in can never be taken for a later barrier's.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Communicator;
use crate::collectives::OpSpec;
use crate::error::{Error, Result};
use crate::tensor::SharedBuf;
use crate::types::{DType, OpKind, Rank};
use crate::work::Work;

impl Communicator {
    /// One point-to-point send or receive of `buf`, bounded by `timeout`.
    pub(super) fn p2p_bytes(&self, send: bool, peer: Rank, tag: i64, buf: &Arc<SharedBuf>, timeout: Duration) -> Result<Work> {
        let mut s = OpSpec::new(if send { OpKind::Send } else { OpKind::Recv });
        s.root = peer as i64;
        s.tag = tag;
        let t = buf.tensor().ok_or_else(|| Error::Internal("p2p buffer already lent".into()))?;
        if send {
            s.inputs = vec![t];
        } else {
            s.outputs = vec![t];
        }
        self.submit(vec![s], Some(timeout), None)
    }

    /// Waits until every rank of the group has called this, or fails after
    /// `timeout` naming the rank(s) that did not (the first in rank order,
    /// or every one with `wait_all`). The group stays usable.
    pub fn monitored_barrier(&self, timeout: Duration, wait_all: bool) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let tag = self.control_tag();
        let ms = timeout.as_millis();
        if self.rank != 0 {
            return self.monitored_member(tag, timeout);
        }
        let start = Instant::now();
        let mut recvs = Vec::with_capacity(self.size - 1);
        for r in 1..self.size {
            recvs.push((r, self.p2p_bytes(false, r, tag, &SharedBuf::zeros(DType::U8, 1), timeout)?));
        }
        let mut missing = Vec::new();
        let mut processed = Vec::new();
        let mut out_of_time = false;
        for (r, w) in recvs {
            let left = timeout.saturating_sub(start.elapsed());
            // (A receive may already have failed on its own deadline, in
            // the pass that took it: that is no check-in either.)
            if !wait_all && left.is_zero() && !matches!(w.result(), Some(Ok(()))) {
                // gloo's wording: rank 0's own time ran out before this
                // rank's check-in was looked at.
                out_of_time = true;
                missing.extend(r..self.size);
                break;
            }
            if w.wait(Some(left.max(Duration::from_millis(1)))).is_ok() {
                processed.push(r);
            } else {
                missing.push(r);
                if !wait_all {
                    break;
                }
            }
        }
        // Every other rank learns the outcome: one byte per rank, 1 for the
        // ones that did not arrive. Sends to a dead rank fail on their own.
        let mut outcome = vec![0u8; self.size];
        for &r in &missing {
            outcome[r] = 1;
        }
        for r in 1..self.size {
            let buf = SharedBuf::new(DType::U8, &outcome);
            let _ = self.p2p_bytes(true, r, tag, &buf, timeout);
        }
        if missing.is_empty() {
            return Ok(());
        }
        let list = missing.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
        let detail = if out_of_time {
            let done = processed.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
            let done = if done.is_empty() { String::new() } else { format!(" Successfully processed ranks: {done}") };
            format!("Rank 0 timed out in monitoredBarrier after {ms} ms.{done}")
        } else if wait_all {
            format!("Ranks {list} failed to pass monitoredBarrier in {ms} ms: Timed out waiting for them (this process is rank 0)")
        } else {
            format!("Rank {list} failed to pass monitoredBarrier in {ms} ms: Timed out waiting for it (this process is rank 0)")
        };
        Err(Error::Monitored { group: self.opts.group.clone(), detail })
    }

    /// A rank other than 0: check in, then wait for rank 0's verdict. Rank
    /// 0 gives it at most `timeout` after it called, which may be up to
    /// `timeout` after this rank did: wait twice as long for it.
    fn monitored_member(&self, tag: i64, timeout: Duration) -> Result<()> {
        let me = self.rank;
        let hello = SharedBuf::new(DType::U8, &[1u8]);
        let verdict = SharedBuf::zeros(DType::U8, self.size);
        let sent = self.p2p_bytes(true, 0, tag, &hello, timeout)?;
        let got = self.p2p_bytes(false, 0, tag, &verdict, timeout * 2)?;
        let failed = |why: String| Error::Monitored {
            group: self.opts.group.clone(),
            detail: format!("rank {me} (this process) reached the barrier, but {why}; check rank 0's error for the rank that hangs"),
        };
        sent.wait(Some(timeout)).map_err(|e| failed(format!("could not reach rank 0: {e}")))?;
        got.wait(Some(timeout * 2)).map_err(|e| failed(format!("rank 0 did not answer: {e}")))?;
        let v = verdict.bytes().ok_or_else(|| Error::Internal("verdict buffer still lent".into()))?;
        let missing: Vec<Rank> = (0..self.size).filter(|&r| v[r] != 0).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(failed(format!("rank 0 reported that rank(s) {missing:?} failed to pass monitoredBarrier in {} ms", timeout.as_millis())))
        }
    }
}
