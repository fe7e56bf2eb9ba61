//! [`Work`]: the handle of one submitted operation.
//!
//! A work is pending until the engine finishes it with a result; then its
//! waiters wake and its completion callbacks run (on the finishing thread,
//! in registration order, after the state is visible to `is_completed` and
//! `wait`, so a callback may itself wait on the work). The engine keeps the
//! operation's tensors until it has finished with them, before it finishes
//! the work.
#![forbid(unsafe_code)]

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::types::{OpKind, Rank};

/// Runs once when the work finishes, with its result and, for receives,
/// the rank the data came from.
pub type Callback = Box<dyn FnOnce(&Result<()>, Option<Rank>) + Send>;

/// Told of each work it watches once that work finishes ([`Work::watch`]),
/// before the work's callbacks: the communicator's counters, kept without
/// a callback allocated per work.
pub trait Observer: Send + Sync {
    fn finished(&self, w: &Watch, f: Finished<'_>);
}

/// What an [`Observer`] watches a work for.
pub struct Watch {
    pub observer: Arc<dyn Observer>,
    pub kind: OpKind,
    pub bytes: u64,
    /// How the operation reaches its peer (`Communicator::link_kinds`' words).
    pub transport: &'static str,
}

/// A watched work, finished.
pub struct Finished<'a> {
    pub result: &'a Result<()>,
    /// How it went, where its engine said (`Work::set_route`).
    pub route: Option<&'static str>,
    /// From its start to its end, where it was started.
    pub duration: Option<Duration>,
}

/// The device side of a work that runs on a GPU stream: lets `is_completed`
/// ask the device, and the shim find the stream it ran on.
pub trait DeviceMark: Send + Sync {
    /// CUDA device index.
    fn device(&self) -> i32;
    /// Raw handle of the stream the operation was enqueued on.
    fn stream(&self) -> u64;
    /// True once the device has finished the operation.
    fn finished(&self) -> bool;
    /// Makes the stream with raw handle `stream` wait for the operation
    /// (no CPU thread blocks).
    fn order_after(&self, stream: u64) -> std::result::Result<(), String>;
}

/// Lets a thread waiting for a work move its engine on itself (the
/// point-to-point engine: the waiting thread reads the rings), so a message
/// that arrives while it waits needs no hand-off from the engine's thread.
pub trait Progress: Send + Sync {
    /// Does what can be done now (nothing if another thread is at it);
    /// blocks only where [`Progress::blocks`] says so.
    fn progress(&self);

    /// `progress` may run the whole operation (the CPU engine: the
    /// waiting thread runs the collective), so a wait with a deadline must
    /// not call it.
    fn blocks(&self) -> bool {
        false
    }

    /// The waiting thread stops driving (it is about to sleep, or its wait
    /// has a deadline): whoever runs the operation without it (the host
    /// engine's worker) takes it now instead of waiting for it.
    fn release(&self) {}

    /// Between two passes of a waiting thread: yields the CPU (the
    /// point-to-point engine first checks that no other local rank's
    /// polling thread shares it, `transport::shm::place`).
    fn pause(&self) {
        std::thread::yield_now();
    }

    /// How long a waiting thread runs passes back to back at the start of
    /// its wait, before its first pause: a pause is a system call, and a
    /// message due within this time is read sooner without one.
    fn spin(&self) -> Duration {
        Duration::ZERO
    }

    /// The host's cores are taken by other work (`pause` found it): a
    /// waiting thread should sleep rather than drive, since each pause
    /// would cost another task's time slice.
    fn cores_taken(&self) -> bool {
        false
    }

    /// A waiting thread starts (`on`) or stops driving the engine with
    /// `progress`: an engine whose own thread would do the same work may
    /// leave it asleep meanwhile.
    fn driving(&self, _on: bool) {}

    /// A word that moves whenever this engine may have something for
    /// `progress` to do (a message arrived, its own thread finished work),
    /// for a waiter that sleeps on it instead of on the work (None: no
    /// such word; the waiter sleeps on the work).
    fn signal(&self) -> Option<u32> {
        None
    }

    /// Sleeps up to `max` unless the word of [`Progress::signal`] moved
    /// from `seen` or `done()`; returns early on any wake-up.
    fn sleep_unless(&self, _seen: u32, _max: Duration, _done: &dyn Fn() -> bool) {}
}

/// How long `wait` drives a work's engine (`Progress`) before it sleeps.
const PROGRESS_FOR: Duration = Duration::from_micros(60);

/// The longest sleep between two passes of a waiter that drives its
/// engine while the cores are taken (`Work::wait`): its wake-ups come from
/// the engine's word, this bounds one that comes from elsewhere (an error
/// another thread finished the work with).
const DRIVEN_SLEEP: Duration = Duration::from_millis(10);

struct State {
    result: Option<Result<()>>,
    mark: Option<Arc<dyn DeviceMark>>,
    callbacks: Vec<Callback>,
    watch: Option<Watch>,
    /// For receives from any source: who sent.
    source: Option<Rank>,
    /// How a point-to-point message crossed, where the engine says
    /// (`comm::p2p`'s routes, counted in stats).
    route: Option<&'static str>,
    started: Option<Instant>,
    finished: Option<Instant>,
    /// Threads asleep in `wait`: `finish` wakes them only if there are any
    /// (a wake-up is a system call whether or not someone sleeps).
    waiters: u32,
}

impl State {
    /// From start to finish, once both are known.
    fn took(&self) -> Option<Duration> {
        Some(self.finished?.saturating_duration_since(self.started?))
    }
}

struct Inner {
    op: &'static str,
    seq: u64,
    /// When its engine queued it, where the engine read the clock for
    /// itself (the flight recorder reads it rather than the clock again).
    queued: Option<Instant>,
    state: Mutex<State>,
    cv: Condvar,
    progress: OnceLock<Arc<dyn Progress>>,
}

#[derive(Clone)]
pub struct Work(Arc<Inner>);

/// The callbacks of a finished work, still to run ([`Work::complete`]).
#[derive(Default)]
#[must_use = "the work's callbacks run only through Callbacks::run"]
pub struct Callbacks {
    callbacks: Vec<Callback>,
    watched: Option<(Watch, Option<&'static str>, Option<Duration>)>,
    result: Option<(Result<()>, Option<Rank>)>,
}

impl Callbacks {
    pub fn is_empty(&self) -> bool {
        self.callbacks.is_empty() && self.watched.is_none()
    }

    pub fn run(self) {
        let Some((result, source)) = self.result else { return };
        if let Some((w, route, duration)) = &self.watched {
            w.observer.finished(w, Finished { result: &result, route: *route, duration: *duration });
        }
        if self.callbacks.is_empty() {
            return;
        }
        let _t = crate::profile::start(crate::profile::Span::Callbacks);
        for cb in self.callbacks {
            cb(&result, source);
        }
    }
}

impl Work {
    pub fn new(op: &'static str, seq: u64) -> Work {
        Work::new_at(op, seq, None)
    }

    /// A work its engine queued at `queued` ([`Work::queued`]).
    pub fn queued_at(op: &'static str, seq: u64, queued: Instant) -> Work {
        Work::new_at(op, seq, Some(queued))
    }

    fn new_at(op: &'static str, seq: u64, queued: Option<Instant>) -> Work {
        Work(Arc::new(Inner {
            op,
            seq,
            queued,
            state: Mutex::new(State {
                result: None,
                mark: None,
                callbacks: Vec::new(),
                watch: None,
                source: None,
                route: None,
                started: None,
                finished: None,
                waiters: 0,
            }),
            cv: Condvar::new(),
            progress: OnceLock::new(),
        }))
    }

    /// A device work, started at `started`, its mark set (one allocation
    /// and no lock on the launch path).
    pub fn started_on_device(op: &'static str, seq: u64, mark: Arc<dyn DeviceMark>, started: Instant) -> Work {
        Work(Arc::new(Inner {
            op,
            seq,
            queued: Some(started),
            state: Mutex::new(State {
                result: None,
                mark: Some(mark),
                callbacks: Vec::new(),
                watch: None,
                source: None,
                route: None,
                started: Some(started),
                finished: None,
                waiters: 0,
            }),
            cv: Condvar::new(),
            progress: OnceLock::new(),
        }))
    }

    /// A work that is already finished (e.g. an operation with nothing to do).
    pub fn done(op: &'static str, seq: u64, result: Result<()>) -> Work {
        let w = Work::new(op, seq);
        w.finish(result);
        w
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking callback never holds the lock (callbacks run outside
        // it), so poisoning cannot hide state; recover the guard regardless.
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn op(&self) -> &'static str {
        self.0.op
    }

    pub fn seq(&self) -> u64 {
        self.0.seq
    }

    /// Marks the start of execution (for durations and the flight recorder).
    pub fn mark_started(&self) {
        self.mark_started_at(Instant::now());
    }

    /// As [`Work::mark_started`], with the instant the caller already read.
    pub fn mark_started_at(&self, at: Instant) {
        self.lock().started = Some(at);
    }

    /// A receive's message came from `rank`, by `route` where the engine
    /// says how it crossed.
    pub fn arrived(&self, rank: Rank, route: Option<&'static str>) {
        let mut s = self.lock();
        s.source = Some(rank);
        s.route = route.or(s.route);
    }

    pub fn source(&self) -> Option<Rank> {
        self.lock().source
    }

    /// Records how a send's message crossed (the last call wins).
    pub fn set_route(&self, route: &'static str) {
        self.lock().route = Some(route);
    }

    pub fn route(&self) -> Option<&'static str> {
        self.lock().route
    }

    /// (started, finished) instants, where known.
    /// When its engine queued it, if the engine said ([`Work::queued_at`]).
    pub fn queued(&self) -> Option<Instant> {
        self.0.queued
    }

    pub fn times(&self) -> (Option<Instant>, Option<Instant>) {
        let s = self.lock();
        (s.started, s.finished)
    }

    /// Time from start to finish, once finished.
    pub fn duration(&self) -> Option<Duration> {
        let s = self.lock();
        s.took()
    }

    /// Finishes the work. The first call wins; later ones are ignored.
    pub fn finish(&self, result: Result<()>) {
        self.complete(result).run();
    }

    /// Finishes the work and wakes its waiters, but leaves its callbacks
    /// to the caller ([`Callbacks::run`]): an engine that finishes work
    /// under its own lock runs them after releasing it, so that a callback
    /// may submit and wait for more work.
    pub fn complete(&self, result: Result<()>) -> Callbacks {
        self.complete_at(result, Instant::now())
    }

    /// As [`Work::complete`], for work that finished at `at`.
    pub fn complete_at(&self, result: Result<()>, at: Instant) -> Callbacks {
        let (callbacks, source, asleep) = {
            let mut s = self.lock();
            if s.result.is_some() {
                return Callbacks::default();
            }
            s.finished = Some(at);
            s.result = Some(result.clone());
            let watched = s.watch.take().map(|w| (w, s.route, s.took()));
            ((std::mem::take(&mut s.callbacks), watched), s.source, s.waiters > 0)
        };
        // A waiter counts itself under the lock before it sleeps (and the
        // condition variable releases the lock atomically), so one that
        // did not count itself yet will see the result.
        if asleep {
            self.0.cv.notify_all();
        }
        let (callbacks, watched) = callbacks;
        Callbacks { callbacks, watched, result: Some((result, source)) }
    }

    /// Finished, or (for device work) the device has run it.
    pub fn is_completed(&self) -> bool {
        let mark = {
            let s = self.lock();
            if s.result.is_some() {
                return true;
            }
            s.mark.clone()
        };
        mark.is_some_and(|m| m.finished())
    }

    pub fn mark(&self) -> Option<Arc<dyn DeviceMark>> {
        self.lock().mark.clone()
    }

    /// The result, if finished.
    pub fn result(&self) -> Option<Result<()>> {
        self.lock().result.clone()
    }

    /// Runs `cb` once the work finishes (at once, on this thread, if it
    /// already has).
    pub fn on_complete(&self, cb: Callback) {
        let (r, source) = {
            let mut s = self.lock();
            match &s.result {
                Some(r) => (r.clone(), s.source),
                None => {
                    s.callbacks.push(cb);
                    return;
                }
            }
        };
        cb(&r, source);
    }

    /// Tells `w.observer` when the work finishes (at once, on this thread,
    /// if it already has). A work has one watch.
    pub fn watch(&self, w: Watch) {
        let (result, route, duration) = {
            let mut s = self.lock();
            match &s.result {
                None => {
                    debug_assert!(s.watch.is_none(), "a work has one watch");
                    s.watch = Some(w);
                    return;
                }
                Some(r) => (r.clone(), s.route, s.took()),
            }
        };
        w.observer.finished(&w, Finished { result: &result, route, duration });
    }

    /// Lets `wait` drive the engine with `p` (the first call wins).
    pub fn set_progress(&self, p: Arc<dyn Progress>) {
        let _ = self.0.progress.set(p);
    }

    /// Drives the work's engine (`Progress`) for up to `budget`, pausing
    /// between passes ([`Progress::pause`]), until the work finishes;
    /// nothing for a work without one. A blocking `Progress` (the CPU engine) may run the whole
    /// operation in one pass, past `budget`. True once the work finished.
    pub fn drive(&self, budget: Duration) -> bool {
        let Some(p) = self.0.progress.get() else { return self.lock().result.is_some() };
        p.driving(true);
        let done = self.drive_with(&**p, budget);
        p.driving(false);
        done
    }

    fn drive_with(&self, p: &dyn Progress, budget: Duration) -> bool {
        // The budget counts from the end of the first pass: a small
        // operation that the first pass finishes reads no clock. How long
        // to spin is asked then too: a wait whose cores are taken stops
        // at its next pass anyway.
        let mut start: Option<(Instant, Duration)> = None;
        loop {
            if self.lock().result.is_some() {
                return true;
            }
            if budget.is_zero() || start.is_some_and(|(s, _)| s.elapsed() >= budget) {
                return false;
            }
            p.progress();
            if self.lock().result.is_some() {
                return true;
            }
            if p.cores_taken() {
                return false;
            }
            let (s, spin) = *start.get_or_insert_with(|| (Instant::now(), p.spin()));
            if s.elapsed() < spin {
                std::hint::spin_loop();
            } else {
                p.pause();
            }
        }
    }

    /// Drives the work's engine for the usual time (see `wait`), then, if
    /// the work is not done, releases it ([`Progress::release`]): the
    /// caller blocks next.
    pub fn drive_briefly(&self) -> bool {
        let done = self.drive(PROGRESS_FOR);
        if !done {
            self.release();
        }
        done
    }

    fn release(&self) {
        if let Some(p) = self.0.progress.get() {
            p.release();
        }
    }

    /// While the host's cores are taken, a waiter whose engine has a word
    /// to sleep on ([`Progress::signal`]: the shared-memory point-to-point
    /// links) sleeps on it and runs the engine's pass itself when woken:
    /// one wake-up between a message's arrival and its receiver, where
    /// sleeping on the work takes two (the engine's thread, then this
    /// one), each a time slice of the busy cores. None: not so (or no
    /// longer: it sleeps on the work).
    fn wait_driving(&self, timeout: Option<Duration>, start: Option<Instant>) -> Option<Result<()>> {
        let p = self.0.progress.get()?;
        if p.blocks() || !p.cores_taken() {
            return None;
        }
        let done = || self.lock().result.is_some();
        loop {
            let seen = p.signal()?;
            if let Some(r) = &self.lock().result {
                return Some(r.clone());
            }
            p.progress();
            let left = match (timeout, start) {
                (Some(t), Some(s)) => {
                    let waited = s.elapsed();
                    if waited >= t && !done() {
                        return Some(Err(Error::WaitTimeout { op: self.0.op, seq: self.0.seq, waited }));
                    }
                    t.saturating_sub(waited)
                }
                _ => DRIVEN_SLEEP,
            };
            p.sleep_unless(seen, left.min(DRIVEN_SLEEP), &done);
        }
    }

    /// Blocks until the work finishes, or `timeout` passes
    /// (`Error::WaitTimeout`; the operation goes on).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        // The clock only for a wait with a deadline.
        let start = timeout.is_some().then(Instant::now);
        // A work whose engine the waiter can drive (`Progress`) is driven
        // for up to PROGRESS_FOR, yielding between passes (a host
        // collective: run by this thread, unless the wait has a deadline,
        // which running it could overshoot). Otherwise no
        // polling before sleeping: the worker running this operation needs
        // a core, and a caller polling for it took one (on a machine with as
        // many cores as ranks, small all-reduces slowed severalfold); a
        // condition-variable wake-up costs a few microseconds.
        let skip = timeout.is_some() && self.0.progress.get().is_some_and(|p| p.blocks());
        if skip || !self.drive(timeout.map_or(PROGRESS_FOR, |t| t.min(PROGRESS_FOR))) {
            self.release();
            if !skip {
                if let Some(r) = self.wait_driving(timeout, start) {
                    return r;
                }
            }
        }
        let mut s = self.lock();
        loop {
            if let Some(r) = &s.result {
                return r.clone();
            }
            let left = match timeout {
                None => None,
                Some(t) => {
                    let waited = start.map_or(Duration::ZERO, |s| s.elapsed());
                    if waited >= t {
                        return Err(Error::WaitTimeout { op: self.0.op, seq: self.0.seq, waited });
                    }
                    Some(t - waited)
                }
            };
            s.waiters += 1;
            s = match left {
                None => self.0.cv.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => self.0.cv.wait_timeout(s, d).unwrap_or_else(|p| p.into_inner()).0,
            };
            s.waiters -= 1;
        }
    }
}

/// A work that finishes when all of `parts` have, with the first error
/// among them (coalesced point-to-point batches).
pub fn join(op: &'static str, seq: u64, parts: Vec<Work>) -> Work {
    let all = Work::new(op, seq);
    if let Some(p) = parts.iter().find_map(|w| w.0.progress.get()) {
        all.set_progress(p.clone());
    }
    if parts.is_empty() {
        all.finish(Ok(()));
        return all;
    }
    let left = Arc::new(Mutex::new((parts.len(), None::<Error>)));
    for p in parts {
        let all = all.clone();
        let left = left.clone();
        p.on_complete(Box::new(move |r, _| {
            let done = {
                let mut l = left.lock().unwrap_or_else(|p| p.into_inner());
                l.0 -= 1;
                if let Err(e) = r {
                    l.1.get_or_insert_with(|| e.clone());
                }
                (l.0 == 0).then(|| l.1.take())
            };
            if let Some(err) = done {
                all.finish(err.map_or(Ok(()), Err));
            }
        }));
    }
    all
}

#[cfg(test)]
mod tests;
