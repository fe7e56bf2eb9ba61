//! Where the host time of a call goes inside rustccl
//! (`RUSTCCL_HOST_PROFILE=1`; `benchmarks/cuda_probe.py --host-profile`,
//! `benchmarks/p2p_latency_parts.py` and `benchmarks/cpu_small_latency.py`
//! read it): per span, calls and nanoseconds, summed process-wide with
//! relaxed atomics. Off, a span costs one branch on a cached setting.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::config::Config;

/// The measured spans, outermost first. The shim's spans (C++) arrive
/// through `rustccl_host_profile_add` with these numbers (`rustccl.h`).
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
    /// The shim's collective entry points (all but the coalesced ones):
    /// checks, DLPack exports, Work, C ABI call.
    Shim = 4,
    /// The shim's `Work::wait` (CUDA: ordering the caller's stream, errors).
    ShimWait = 5,
    /// Within `Launch`: the peer-memory kernel's `cuLaunchKernel` alone.
    Kernel = 6,
    /// Within `Launch`: recording the work's `done` event.
    DoneEvent = 7,
    /// CPU point-to-point: `P2pEngine::submit` (a small send written into
    /// the ring and finished there).
    P2pSubmit = 8,
    /// `Work::finish`: the completion callbacks (stats, the shim's future).
    Callbacks = 9,
    /// `rustccl_work_drive`: a waiting thread reading the rings itself.
    WorkDrive = 10,
    /// The shim's send / recv entry points, C ABI call included.
    ShimP2p = 11,
    /// A shared-memory collective's phase waits (`transport::mesh`).
    PhaseWait = 12,
    /// A CPU collective's algorithm (`collectives::run`), waits included.
    CollectiveRun = 13,
    /// A CPU collective after its algorithm: stats, releasing the tensors,
    /// finishing the work (its callbacks included).
    JobEnd = 14,
    /// A shared-memory worker pool's parallel region (`Workers::for_each`
    /// with more than one thread): waking the threads, their copies or
    /// reductions, until the last is done.
    PoolRun = 15,
}

const N: usize = 16;
const NAMES: [&str; N] = [
    "capi_submit",
    "engine_submit",
    "launch",
    "order_stream",
    "shim",
    "shim_wait",
    "kernel",
    "done_event",
    "p2p_submit",
    "callbacks",
    "work_drive",
    "shim_p2p",
    "phase_wait",
    "collective_run",
    "job_end",
    "pool_run",
];
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static CALLS: [AtomicU64; N] = [ZERO; N];
static NANOS: [AtomicU64; N] = [ZERO; N];

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

/// Whether spans are measured (`RUSTCCL_HOST_PROFILE=1`).
pub fn enabled() -> bool {
    Config::get().host_profile
}

/// Adds one call of `nanos` to span number `span` (the shim's spans);
/// unknown numbers are ignored.
pub fn add(span: usize, nanos: u64) {
    if span < N && enabled() {
        NANOS[span].fetch_add(nanos, Ordering::Relaxed);
        CALLS[span].fetch_add(1, Ordering::Relaxed);
    }
}

/// (span, calls, nanoseconds) for every span; zeroes them with `reset`.
pub fn snapshot(reset: bool) -> Vec<(&'static str, u64, u64)> {
    (0..N)
        .map(|i| {
            if reset {
                (NAMES[i], CALLS[i].swap(0, Ordering::Relaxed), NANOS[i].swap(0, Ordering::Relaxed))
            } else {
                (NAMES[i], CALLS[i].load(Ordering::Relaxed), NANOS[i].load(Ordering::Relaxed))
            }
        })
        .collect()
}
