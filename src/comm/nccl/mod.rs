//! CUDA collectives through NCCL.
//!
//! One [`NcclEngine`] per communicator. It owns, per device, NCCL
//! communicators (the group's own, created on its first CUDA collective with
//! the unique id broadcast over rustccl's CPU links; and two-rank ones for
//! point-to-point between a pair when the group's does not exist yet), a
//! stream per communicator created by rustccl, and a watchdog thread.
//!
//! A submission is launched on the calling thread: an event recorded on the
//! caller's current stream orders the communicator's stream after it, the
//! [`plan`] runs there, and a `done` event marks its end. A peer-memory
//! kernel ([`custom`]) that the caller waits for at once (torch's
//! `asyncOp=False`) runs on the caller's stream itself: no events between
//! the streams, on the host or on the device. The group's launches stay in
//! one order across streams: a launch on another stream than the previous
//! one waits for that one's `done` event while it may still run. The operation's
//! tensors stay with the watchdog until `done` has passed, so torch's
//! caching allocator cannot reuse their memory early; the watchdog then
//! finishes the work, and fails everything (aborting the NCCL
//! communicators) on a timeout or an asynchronous NCCL error.

#![allow(unsafe_code)]

mod comms;
pub mod custom;
mod ids;
mod lib;
pub mod plan;
pub mod staging;
mod watchdog;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::nccl::sys::ncclComm_t;

use self::comms::{DeviceComm, Key};
pub use self::ids::IdExchange;
use self::lib::NcclLib;
use self::plan::{Addr, Plan};
use self::watchdog::{fail_all, watchdog};
use crate::collectives::Op;
use crate::comm::stats::Stats;
use crate::config::log_at;
use crate::config::LogLevel;
use crate::cuda::{self, DeviceBuffer, Event};
use crate::error::{Error, OpSite, Result};
use crate::tensor::Tensor;
use crate::types::Rank;
use crate::work::{DeviceMark, Work};

/// See [`NcclEngine::one_shot_state`].
pub type OneShotState = (Option<i32>, Vec<(i32, Option<usize>)>);

/// The version of the libnccl that CUDA collectives use (the one torch
/// loaded, or `RUSTCCL_NCCL_LIBRARY`); loads it if nothing has yet.
pub fn library_version() -> std::result::Result<String, String> {
    NcclLib::get().map(NcclLib::version_string)
}

/// The caller's side of a submission.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// The caller's current stream on the tensors' device.
    pub stream: u64,
    /// The caller waits for the work at once (torch's `asyncOp=False`).
    pub sync: bool,
}

struct RawComm(ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread as long as calls
// on it are not concurrent; every use goes through DeviceComm::raw's mutex.
unsafe impl Send for RawComm {}

struct Pending {
    started: Instant,
    /// Timed start event (RUSTCCL_CUDA_TIMING only).
    start: Option<Event>,
    done: Arc<Event>,
    kind: crate::types::OpKind,
    bytes: u64,
    /// For stats: "nccl" / "nccl", or "one_shot" (two_shot, peer_copy) / "nvlink".
    algorithm: &'static str,
    transport: &'static str,
    _ops: Vec<Op<Tensor>>,
    _temps: Vec<DeviceBuffer>,
    work: Work,
    deadline: Instant,
}

/// What a submission runs on the communicator's stream.
enum Body {
    Nccl(Plan),
    Peer { ar: Arc<custom::CustomAr>, choice: custom::Choice, timeout: Duration },
}

/// Work in flight, one FIFO per communicator stream: work on one stream
/// finishes in order, so only the oldest entry of each queue is polled.
#[derive(Default)]
struct WatchState {
    queues: HashMap<Key, std::collections::VecDeque<Pending>>,
    stop: bool,
}

impl WatchState {
    fn is_empty(&self) -> bool {
        self.queues.values().all(|q| q.is_empty())
    }

    fn drain(&mut self) -> Vec<Pending> {
        self.queues.values_mut().flat_map(|q| q.drain(..)).collect()
    }
}

struct Shared {
    rank: Rank,
    group: Arc<str>,
    lib: &'static NcclLib,
    comms: Mutex<HashMap<Key, Arc<DeviceComm>>>,
    watch: Mutex<WatchState>,
    cv: Condvar,
    poisoned: Mutex<Option<Error>>,
    /// `done` events whose works are gone, ready for reuse.
    events: Mutex<Vec<Event>>,
    stats: Arc<Stats>,
    timing: bool,
    /// The peer-memory collectives per device, once set up (`None`: unavailable).
    custom: Mutex<HashMap<i32, Option<Arc<custom::CustomAr>>>>,
}

pub struct NcclEngine {
    sh: Arc<Shared>,
    size: usize,
    /// The one device this group's CUDA work runs on, set by its first use.
    bound: OnceLock<i32>,
    /// The group's communicator on the bound device, once created (also in
    /// `sh.comms`): the submission path finds it without a map lookup.
    group_comm: OnceLock<Arc<DeviceComm>>,
    /// The bound device's peer-memory state, once decided (also in
    /// `sh.custom`).
    peer_state: OnceLock<Option<Arc<custom::CustomAr>>>,
    seq: AtomicU64,
    watchdog: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held while the peer-memory collectives are being set up.
    custom_setup: Mutex<()>,
}

struct Mark {
    device: i32,
    stream: u64,
    done: Arc<Event>,
}

impl DeviceMark for Mark {
    fn device(&self) -> i32 {
        self.device
    }
    fn stream(&self) -> u64 {
        self.stream
    }
    fn finished(&self) -> bool {
        self.done.query().unwrap_or(false)
    }
    fn order_after(&self, stream: u64) -> std::result::Result<(), String> {
        if stream == self.stream {
            return Ok(()); // ran on that stream: already in order
        }
        cuda::wait_event_raw(stream, &self.done).map_err(|e| e.0)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NcclEngine {
    /// Loads libcuda and libnccl; fails with the reason when either is missing.
    pub fn new(rank: Rank, size: usize, group: String, stats: Arc<Stats>) -> std::result::Result<NcclEngine, String> {
        cuda::load().map_err(|e| e.0)?;
        let lib = NcclLib::get()?;
        log_at!(LogLevel::Info, "group '{group}' rank {rank}: NCCL {} loaded", lib.version_string());
        let sh = Arc::new(Shared {
            rank,
            group: group.into(),
            lib,
            comms: Mutex::new(HashMap::new()),
            watch: Mutex::new(WatchState::default()),
            cv: Condvar::new(),
            poisoned: Mutex::new(None),
            events: Mutex::new(Vec::new()),
            stats,
            timing: crate::config::Config::get().cuda_timing,
            custom: Mutex::new(HashMap::new()),
        });
        let w = sh.clone();
        let handle = std::thread::Builder::new()
            .name(format!("rustccl-cuda-{}-r{rank}", sh.group))
            .spawn(move || watchdog(w))
            .map_err(|e| format!("cannot start the CUDA watchdog: {e}"))?;
        Ok(NcclEngine {
            sh,
            size,
            bound: OnceLock::new(),
            group_comm: OnceLock::new(),
            peer_state: OnceLock::new(),
            seq: AtomicU64::new(0),
            watchdog: Mutex::new(Some(handle)),
            custom_setup: Mutex::new(()),
        })
    }

    pub fn nccl_version(&self) -> String {
        self.sh.lib.version_string()
    }

    /// The device this group's CUDA work is bound to, once it has run some.
    pub fn device(&self) -> Option<i32> {
        self.bound.get().copied()
    }

    /// The device the group is bound to, and per device whether the one-shot
    /// all-reduce is set up (`Some(its buffer bytes)`) or off (`None`);
    /// devices where no eligible all_reduce has run yet are absent.
    pub fn one_shot_state(&self) -> OneShotState {
        let mut per: Vec<_> = lock(&self.sh.custom).iter().map(|(d, ar)| (*d, ar.as_ref().map(|a| a.bytes()))).collect();
        per.sort_unstable();
        (self.device(), per)
    }

    /// The peer-memory kernel for `ops`, when one can run them: set up on
    /// the first eligible call (never during graph capture, where its
    /// allocations are not allowed; every rank decides alike).
    fn peer(
        &self,
        dc: &DeviceComm,
        ops: &[Op<Tensor>],
        device: i32,
        capturing: bool,
        ids: &dyn IdExchange,
    ) -> Result<Option<(Arc<custom::CustomAr>, custom::Choice)>> {
        let cfg = crate::config::Config::get();
        if !cfg.custom_allreduce || ops.len() != 1 || !matches!(dc.key, Key::Group(_)) {
            return Ok(None);
        }
        let (one_shot, all_reduce, gather) = cfg.peer_limits(self.size);
        let lim = custom::Limits { one_shot, all_reduce, gather };
        let Some(choice) = custom::choose(&ops[0], self.size, &lim) else {
            return Ok(None);
        };
        // `dc` is the group's communicator, so `device` is the bound one.
        if let Some(state) = self.peer_state.get() {
            return Ok(state.clone().map(|a| (a, choice)));
        }
        if capturing || !ids.single_host() {
            return Ok(None);
        }
        let _setup = lock(&self.custom_setup);
        if let Some(state) = self.peer_state.get() {
            return Ok(state.clone().map(|a| (a, choice)));
        }
        let ar = custom::CustomAr::setup(device, self.sh.rank, self.size, lim.cap(), ids)?.map(Arc::new);
        lock(&self.sh.custom).insert(device, ar.clone());
        let _ = self.peer_state.set(ar.clone());
        Ok(ar.map(|a| (a, choice)))
    }

    /// Launches `ops` (all on `device`) after the work already queued on
    /// `caller_stream`. Under CUDA graph capture the work is captured, not
    /// run: it is finished at once and not watched.
    pub fn submit(
        &self,
        ops: Vec<Op<Tensor>>,
        device: i32,
        caller: Caller,
        timeout: Duration,
        ids: &dyn IdExchange,
        prepare: impl FnOnce(&Work),
    ) -> Result<Work> {
        let caller_stream = caller.stream;
        let _t = crate::profile::start(crate::profile::Span::EngineSubmit);
        let name = ops.first().map_or("collective", |o| o.kind().name());
        if let Some(cause) = lock(&self.sh.poisoned).clone() {
            return Err(Error::Poisoned { op: name, cause: Box::new(cause) });
        }
        self.bind(name, device)?;
        let dc = self.pick(&ops, device, ids)?;
        let seq = self.seq.load(Ordering::Relaxed);
        let derr = |detail: String| Error::Device {
            site: OpSite { op: name, seq, group: self.sh.group.clone() },
            rank: self.sh.rank,
            device,
            detail,
        };
        dc.ctx.bind().map_err(|e| derr(e.0))?;
        let capturing = cuda::is_capturing(caller_stream).map_err(|e| derr(e.0))?;
        let body = match self.peer(&dc, &ops, device, capturing, ids)? {
            Some((ar, choice)) => Body::Peer { ar, choice, timeout },
            None => {
                let map = |p: Rank| dc.ranks.get(p).copied().flatten().unwrap_or(usize::MAX);
                let plan = plan::plan(&ops, self.sh.rank, &map)?;
                if capturing && !plan.temps.is_empty() {
                    return Err(Error::unsupported(
                        name,
                        "this call needs scratch memory, which rustccl does not allocate under CUDA graph capture",
                    ));
                }
                Body::Nccl(plan)
            }
        };
        let (algorithm, transport) = match body {
            Body::Peer { choice, .. } => (choice.kind.algorithm(), "nvlink"),
            Body::Nccl(_) => ("nccl", "nccl"),
        };
        self.seq.fetch_add(1, Ordering::Relaxed);
        let kind = ops[0].kind();
        let bytes: u64 = ops.iter().map(|o| o.bytes() as u64).sum();
        // Sync peer kernels run on the caller's stream (not under capture,
        // where the capture's own stream order already applies).
        let on_caller = caller.sync && !capturing && matches!(body, Body::Peer { .. });
        let (start, done, temps, ran_on) = self.launch(&dc, &body, &ops, caller_stream, capturing, on_caller).map_err(derr)?;
        let now = Instant::now();
        let work = Work::started_on_device(name, seq, Arc::new(Mark { device, stream: ran_on, done: done.clone() }), now);
        prepare(&work);
        if capturing {
            // Runs when the graph is replayed; the caller owns the tensors.
            work.finish(Ok(()));
            return Ok(work);
        }
        let entry = Pending {
            started: now,
            start,
            done,
            kind,
            bytes,
            algorithm,
            transport,
            _ops: ops,
            _temps: temps,
            work: work.clone(),
            deadline: now + timeout,
        };
        let wake = {
            let mut w = lock(&self.sh.watch);
            let was_idle = w.is_empty();
            w.queues.entry(dc.key).or_default().push_back(entry);
            was_idle
        };
        if wake {
            self.sh.cv.notify_all();
        }
        Ok(work)
    }

    fn event(&self) -> std::result::Result<Event, String> {
        if let Some(e) = lock(&self.sh.events).pop() {
            return Ok(e);
        }
        if self.sh.timing { Event::timed() } else { Event::new() }.map_err(|e| e.0)
    }

    /// Enqueues `body` on the communicator's stream after `caller_stream`,
    /// or (`on_caller`) on `caller_stream` itself (the caller has made
    /// `dc.ctx` current); returns the (timed) start event, the `done` event,
    /// the scratch buffers to keep until `done` and the stream it ran on.
    #[allow(clippy::type_complexity)]
    fn launch(
        &self,
        dc: &DeviceComm,
        body: &Body,
        ops: &[Op<Tensor>],
        caller_stream: u64,
        capturing: bool,
        on_caller: bool,
    ) -> std::result::Result<(Option<Event>, Arc<Event>, Vec<DeviceBuffer>, u64), String> {
        let _t = crate::profile::start(crate::profile::Span::Launch);
        let raw = lock(&dc.raw);
        let comm = raw.as_ref().ok_or("the NCCL communicator was aborted")?.0;
        let s = if on_caller { caller_stream } else { dc.stream.raw() }; // dc.ctx is current: submit bound it
        if !on_caller {
            dc.ready.record(caller_stream).map_err(|e| e.0)?;
            dc.stream.wait(&dc.ready).map_err(|e| e.0)?;
        }
        let mut last = lock(&dc.last);
        if !capturing {
            // After the group's previous launch when it went to another
            // stream and may still run (its event lives until it is reaped).
            if let Some((ls, prev)) = last.as_ref().and_then(|(ls, w)| Some((*ls, w.upgrade()?))) {
                let covered = !on_caller && ls == caller_stream; // the `ready` event already orders it
                if ls != s && !covered && !prev.query().unwrap_or(false) {
                    cuda::wait_event_raw(s, &prev).map_err(|e| e.0)?;
                }
            }
        }
        let start = if self.sh.timing && !capturing {
            let e = self.event()?;
            e.record(s).map_err(|e| e.0)?;
            Some(e)
        } else {
            None
        };
        let temps = match body {
            Body::Peer { ar, choice, timeout } => {
                let op = ops.first().ok_or("a peer-memory collective without an operation")?;
                ar.launch(*choice, op, s, *timeout)?;
                Vec::new()
            }
            Body::Nccl(plan) => self.launch_plan(comm, plan, s)?,
        };
        // Captured events are graph nodes: never pooled or queried.
        let done = Arc::new(if capturing { Event::new().map_err(|e| e.0)? } else { self.event()? });
        let _e = crate::profile::start(crate::profile::Span::DoneEvent);
        done.record(s).map_err(|e| e.0)?;
        drop(_e);
        if !capturing {
            *last = Some((s, Arc::downgrade(&done)));
        }
        Ok((start, done, temps, s))
    }

    /// Enqueues the copies and NCCL calls of `plan` on stream `s`.
    fn launch_plan(&self, comm: ncclComm_t, plan: &Plan, s: u64) -> std::result::Result<Vec<DeviceBuffer>, String> {
        let temps = plan.temps.iter().map(|&b| DeviceBuffer::new(b, s)).collect::<std::result::Result<Vec<_>, _>>().map_err(|e| e.0)?;
        let at = |a: Addr| match a {
            Addr::Dev(p) => p,
            Addr::Temp { idx, off } => temps[idx].ptr() + off as u64,
        };
        for c in &plan.pre {
            // SAFETY: addresses come from validated tensors of this device
            // (kept alive by the pending entry) or from scratch buffers
            // allocated on this stream; sizes are the planned byte counts.
            unsafe { cuda::copy_async(at(c.dst), at(c.src), c.bytes, s) }.map_err(|e| e.0)?;
        }
        let grouped = plan.calls.len() > 1;
        if grouped {
            self.sh.lib.group_start()?;
        }
        let mut result = Ok(());
        for c in &plan.calls {
            let call = c.map(at);
            // SAFETY: as for the copies above; `comm` is live under its lock.
            result = unsafe { self.sh.lib.launch(comm, s, call) };
            if result.is_err() {
                break;
            }
        }
        if grouped {
            let end = self.sh.lib.group_end();
            result = result.and(end);
        }
        result?;
        for c in &plan.post {
            // SAFETY: as above.
            unsafe { cuda::copy_async(at(c.dst), at(c.src), c.bytes, s) }.map_err(|e| e.0)?;
        }
        Ok(temps)
    }

    /// Blocks until every CUDA operation of the group has run on its device.
    pub fn wait_idle(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut w = lock(&self.sh.watch);
        while !w.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    site: OpSite { op: "barrier", seq: self.seq.load(Ordering::Relaxed), group: self.sh.group.clone() },
                    rank: self.sh.rank,
                    waiting: vec![],
                    elapsed: timeout,
                });
            }
            w = self.sh.cv.wait_timeout(w, (deadline - now).min(Duration::from_millis(5))).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(())
    }

    /// Stops the watchdog. `abort` aborts the NCCL communicators and fails
    /// pending work; otherwise waits (bounded) for it to finish first.
    pub fn shutdown(&self, abort: bool, grace: Duration) {
        if !abort && self.wait_idle(grace).is_err() {
            log_at!(LogLevel::Warn, "group '{}': CUDA work still pending at shutdown; aborting", self.sh.group);
        }
        fail_all(&self.sh, Error::Closed { op: "collective", how: "shut down" }, true);
        lock(&self.sh.watch).stop = true;
        self.sh.cv.notify_all();
        if let Some(h) = lock(&self.watchdog).take() {
            let _ = h.join();
        }
    }
}

impl Drop for NcclEngine {
    fn drop(&mut self) {
        lock(&self.sh.watch).stop = true;
        self.sh.cv.notify_all();
        let idle = lock(&self.sh.watch).is_empty();
        for (_, c) in lock(&self.sh.comms).drain() {
            if let Some(raw) = lock(&c.raw).take() {
                let _ = c.ctx.bind();
                // SAFETY: the communicator is live and never used again.
                unsafe {
                    if idle {
                        self.sh.lib.destroy(raw.0)
                    } else {
                        self.sh.lib.abort(raw.0)
                    }
                }
            }
        }
    }
}
