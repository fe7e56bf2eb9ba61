//! Where the host time of a CUDA collective goes inside rustccl
//! (`RUSTCCL_HOST_PROFILE=1`; `benchmarks/cuda_probe.py --host-profile`
//! reads it): per span, calls and nanoseconds, summed process-wide with
//! relaxed atomics. Off, a span costs one branch on a cached setting.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::config::Config;

/// The measured spans, outermost first.
#[derive(Debug, Clone, Copy)]
pub enum Span {
    /// `rustccl_submit`: the whole C ABI call (DLPack import, checks, engine).
    CapiSubmit = 0,
    /// `NcclEngine::submit`: choosing the path, the launch, queueing the work.
    EngineSubmit = 1,
    /// The driver calls of a launch (events, stream wait, kernel or NCCL).
    Launch = 2,
    /// `rustccl_work_order_stream`: `work.wait()` ordering the caller's stream.
    OrderStream = 3,
}

const NAMES: [&str; 4] = ["capi_submit", "engine_submit", "launch", "order_stream"];
static CALLS: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static NANOS: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Adds the time until it is dropped to its span (when profiling is on).
pub struct Timer(Option<(Span, Instant)>);

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((s, t0)) = self.0 {
            NANOS[s as usize].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            CALLS[s as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub fn start(span: Span) -> Timer {
    Timer(Config::get().host_profile.then(|| (span, Instant::now())))
}

/// (span, calls, nanoseconds) for every span; zeroes them with `reset`.
pub fn snapshot(reset: bool) -> Vec<(&'static str, u64, u64)> {
    (0..NAMES.len())
        .map(|i| {
            if reset {
                (NAMES[i], CALLS[i].swap(0, Ordering::Relaxed), NANOS[i].swap(0, Ordering::Relaxed))
            } else {
                (NAMES[i], CALLS[i].load(Ordering::Relaxed), NANOS[i].load(Ordering::Relaxed))
            }
        })
        .collect()
}
