//! The CUDA engine's watchdog thread: reaps finished work (releasing its
//! tensors, finishing its Work, recording stats), enforces deadlines, and
//! fails the group (aborting the NCCL communicators and raising the NVLink
//! kernels' abort word) on a timeout, an asynchronous NCCL error or a
//! peer-memory kernel that gave up waiting.

#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{lock, Pending, Shared};
use crate::comm::stats::Sample;
use crate::config::log_at;
use crate::config::LogLevel;
use crate::cuda;
use crate::error::{Error, OpSite};

/// Fails every pending work with `e`; with `abort`, aborts every NCCL
/// communicator first (so kernels stuck waiting for peers return).
pub(super) fn fail_all(sh: &Shared, e: Error, abort: bool) {
    if abort {
        for c in lock(&sh.comms).values() {
            if let Some(raw) = lock(&c.raw).take() {
                let _ = c.ctx.bind();
                // SAFETY: live communicator, taken out so nobody uses it again.
                unsafe { sh.lib.abort(raw.0) };
            }
        }
    }
    if abort {
        for ar in lock(&sh.custom).values().flatten() {
            ar.abort();
        }
    }
    let pending = lock(&sh.watch).drain();
    for p in pending {
        let Pending { work, kind, bytes, algorithm, transport, .. } = p;
        sh.stats.record(Sample { op: kind, bytes, duration: None, algorithm, transport, ok: false, by_caller: false });
        work.finish(Err(e.clone()));
    }
    sh.cv.notify_all();
}

fn poison(sh: &Shared, e: Error) {
    log_at!(LogLevel::Warn, "group '{}' rank {}: {e}", sh.group, sh.rank);
    lock(&sh.poisoned).get_or_insert(e.clone());
    fail_all(sh, e, true);
}

/// Reaps finished work, enforces deadlines, watches for NCCL errors.
pub(super) fn watchdog(sh: Arc<Shared>) {
    // Event queries from here must not invalidate a graph capture running
    // on the user's thread (torch's NCCL watchdog does the same).
    cuda::relax_capture_mode();
    let mut last_error_check = Instant::now();
    loop {
        let mut finished = Vec::new();
        let mut failure = None;
        {
            let mut w = lock(&sh.watch);
            if w.is_empty() {
                if w.stop {
                    return;
                }
                let _g = sh.cv.wait_timeout(w, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let now = Instant::now();
            for q in w.queues.values_mut() {
                while let Some(front) = q.front() {
                    match front.done.query() {
                        Ok(true) => finished.extend(q.pop_front()),
                        Ok(false) => {
                            if front.deadline <= now && failure.is_none() {
                                failure = Some(Error::Timeout {
                                    site: OpSite { op: front.work.op(), seq: front.work.seq(), group: sh.group.clone() },
                                    rank: sh.rank,
                                    waiting: vec![],
                                    elapsed: now.saturating_duration_since(front.started),
                                });
                            }
                            break;
                        }
                        Err(e) => {
                            failure.get_or_insert(Error::Device {
                                site: OpSite { op: front.work.op(), seq: front.work.seq(), group: sh.group.clone() },
                                rank: sh.rank,
                                device: -1,
                                detail: format!("CUDA error while waiting for the operation: {e}"),
                            });
                            break;
                        }
                    }
                }
            }
        }
        let reaped = !finished.is_empty();
        for p in finished {
            let Pending { work, done, start, kind, bytes, algorithm, transport, .. } = p; // tensors and scratch released here
            let duration = start.as_ref().and_then(|s| done.since(s).ok());
            sh.stats.record(Sample { op: kind, bytes, duration, algorithm, transport, ok: true, by_caller: false });
            work.finish(Ok(()));
            drop(work);
            let mut pool = lock(&sh.events);
            pool.extend(start);
            if let Ok(ev) = Arc::try_unwrap(done) {
                pool.push(ev);
            }
        }
        if reaped {
            sh.cv.notify_all();
        }
        if failure.is_none() && last_error_check.elapsed() > Duration::from_millis(50) {
            last_error_check = Instant::now();
            for (device, ar) in lock(&sh.custom).iter() {
                if ar.as_ref().is_some_and(|a| a.gave_up()) {
                    failure = Some(Error::Device {
                        site: OpSite { op: "all_reduce", seq: 0, group: sh.group.clone() },
                        rank: sh.rank,
                        device: *device,
                        detail: "a peer-memory kernel (one-shot / two-shot all-reduce, all-gather, reduce-scatter) gave up waiting for a peer (a rank stopped calling collectives, or a graph replay ran on some ranks only)".into(),
                    });
                }
            }
            for c in lock(&sh.comms).values() {
                if let Some(raw) = lock(&c.raw).as_ref() {
                    // SAFETY: live communicator under its lock.
                    if let Err(why) = unsafe { sh.lib.async_error(raw.0) } {
                        failure = Some(Error::Device {
                            site: OpSite { op: "collective", seq: 0, group: sh.group.clone() },
                            rank: sh.rank,
                            device: c.ctx.device,
                            detail: format!("NCCL communicator {:?}: {why}", c.key),
                        });
                        break;
                    }
                }
            }
        }
        if let Some(e) = failure {
            poison(&sh, e);
            continue;
        }
        // Reaping only releases tensors and finishes works (waiting and
        // is_completed ask the device directly), so poll gently: driver calls
        // from this thread contend with launches on the caller's thread.
        std::thread::sleep(Duration::from_millis(1));
    }
}
