//! The CPU engine: CPU collectives of one communicator run one at a time,
//! in submission order, over the communicator's [`Transport`].
//!
//! Who runs a collective: the thread that waits for it, when it gets there
//! first, else the engine's worker thread. A blocking call (torch's
//! `asyncOp=False`: its caller waits at once) that finds the engine idle
//! (nothing queued, nothing running) runs at once, inside its submit, on
//! the caller's thread: no queue and no hand-off between threads (each a
//! wake-up of several microseconds on a VM). One that finds the engine
//! busy waits in the queue up to the caller-runs grace
//! (`RUSTCCL_CALLER_RUNS_US`; 0 turns both off) for its `wait()`, which
//! then runs it (and any queued before it) on the caller's thread. A
//! caller that would sleep in its wait (the engine busy with earlier
//! work) or whose wait has a deadline hands the job to the worker at once
//! ([`Progress::release`]), so the grace is only a safety net for callers
//! that never wait, and long (10 ms): a worker that woke at each blocking
//! call's grace took the cores of the callers (`docs/decisions/0004`).
//! Async work is the worker's at once (its caller may wait only through
//! the future, which cannot run it),
//! unless a `wait()` takes it first. Whoever runs holds the engine's
//! [`Exec`] lock; the queue has its own lock, so submitting never waits for
//! a running collective. A work's callbacks run after the lock is released
//! and before any other work starts; work they submit runs at once on
//! their thread, so a callback may submit work and wait for it, and every
//! rank runs that work at the same place. Messages carry the execution
//! order's number ([`Exec::next_seq`]), which is the queue's but for such
//! work.
//!
//! Submission assigns the queue number under the queue lock, so queue
//! order and execution order are the same, but for work that callbacks
//! submit (above). A transport
//! failure (timeout, lost peer, protocol error) poisons the engine: every
//! later operation fails at once with that cause instead of talking over a
//! byte stream in an unknown state.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::collectives::compress::codec::Request;
use crate::collectives::{AlgoName, Compression, Op, Scratch};
use crate::config::log_at;
use crate::config::{AlgoConfig, FaultSpec, LogLevel};
use crate::error::{Error, Result};
use crate::tensor::CpuTensor;
use crate::transport::{Interrupter, Transport};
use crate::types::OpKind;
use crate::work::{Progress, Work};

mod exec;
use exec::Exec;

/// What the engine reports after each operation (stats hook).
pub struct Done<'a> {
    pub kind: OpKind,
    pub seq: u64,
    pub bytes: usize,
    pub algo: AlgoName,
    pub transport: &'static str,
    pub duration: Duration,
    pub result: &'a Result<()>,
    /// Bytes this rank sent to other hosts (hierarchical all_reduce leaders).
    pub sent_between_hosts: u64,
    /// Codec of the exchange between hosts, "" when exact.
    pub codec: &'static str,
    /// The caller's thread ran it (in its `wait`), not the worker.
    pub by_caller: bool,
}

pub type Observer = Box<dyn Fn(&Done<'_>) + Send>;

struct Job {
    ops: Vec<Op<CpuTensor>>,
    work: Work,
    timeout: Duration,
    bytes: usize,
    compress: Option<Request>,
    /// When the worker may take it (a blocking call: after the grace).
    due: Instant,
    /// Submitted by a callback of an earlier work, on the thread running
    /// it: it runs at once, before any work queued outside the callbacks.
    child: bool,
}

struct Queue {
    jobs: VecDeque<Job>,
    next_seq: u64,
    open: bool,
    worker: WorkerState,
    /// When the last job due at once (async) was submitted: the worker
    /// polls for more for a while after it.
    last_async: Option<Instant>,
    /// Callbacks of finished work are running (nested: how deep) on this
    /// thread: no other work starts until they return, so that work they
    /// submit runs in the same place on every rank.
    callbacks: Option<(ThreadId, usize)>,
    /// Times a submit woke the sleeping worker.
    wakes: u64,
}

/// What the worker is doing, so that a submit wakes it only when needed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WorkerState {
    Awake,
    /// Sleeping on `Shared::ready` until this instant (None: until woken).
    Asleep(Option<Instant>),
}

impl Queue {
    /// The worker may take the job at the head: it is due, or the queue is
    /// closing (what is left runs at once).
    fn head_is_due(&self) -> bool {
        self.callbacks.is_none() && self.jobs.front().is_some_and(|j| !self.open || Instant::now() >= j.due)
    }

    /// Whether the calling thread is running callbacks of this engine's work.
    fn in_callbacks(&self) -> bool {
        self.callbacks.is_some_and(|(t, _)| t == std::thread::current().id())
    }
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    exec: Mutex<Exec>,
    /// How long a blocking call waits for its caller before the worker runs it.
    grace: Duration,
}

pub struct CpuEngine {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    exited: Mutex<Option<mpsc::Receiver<()>>>,
    interrupt: Interrupter,
    group: String,
}

/// How long the worker polls for the next job, after an async submission or
/// a job it ran, before it sleeps: back-to-back async collectives do not
/// pay a wake-up of the worker each.
const POLL_FOR: Duration = Duration::from_micros(50);

/// Largest caller-runs grace (a larger setting is cut to it).
const MAX_GRACE: Duration = Duration::from_secs(10);

/// The caller-runs grace in force for `algo` (the setting, at most
/// `MAX_GRACE`).
pub fn grace(algo: &AlgoConfig) -> Duration {
    Duration::from_micros(algo.caller_runs_us).min(MAX_GRACE)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// The worker's loop: runs each job once its caller had the grace to
    /// run it itself; returns once the queue is closed and empty.
    ///
    /// It polls (yielding the core) only while jobs come that are its own
    /// at once (async ones, or the last it ran): a blocking call's job is
    /// its caller's, so for those it sleeps until the job's grace ends
    /// instead. Polling during a loop of blocking calls kept one core per
    /// rank busy in sched_yield and contended for the queue lock with the
    /// caller (`docs/decisions/0004`).
    fn work(&self) {
        let mut q = lock(&self.queue);
        let mut last_ran = Instant::now();
        // The number of jobs submitted when this thread last went to sleep.
        let mut seen = q.next_seq;
        loop {
            if q.jobs.is_empty() && !q.open {
                // Shutting down: a caller may still be running one;
                // `shutdown` waits for this thread, so wait for it.
                drop(q);
                drop(lock(&self.exec));
                return;
            }
            if q.head_is_due() {
                drop(q);
                self.run_queued(Runner::Worker);
                q = lock(&self.queue);
                last_ran = Instant::now();
                continue;
            }
            if last_ran.elapsed() < POLL_FOR || q.last_async.is_some_and(|t| t.elapsed() < POLL_FOR) {
                drop(q);
                std::thread::yield_now();
                q = lock(&self.queue);
                continue;
            }
            // While callbacks run no job may start: sleep until they end
            // (`leave_callbacks` wakes this thread), not until a due time
            // that has passed, which would spin. With nothing queued but
            // jobs submitted since the last sleep (a caller running its
            // own in a loop), sleep one grace: a blocking job submitted
            // meanwhile is due no earlier than that, so its submit need
            // not wake this thread. Woken for each one, the thread would
            // find its caller had run it already, sleep until the next
            // submit and be woken again: a wake-up a call, on the core
            // of a rank.
            let until = match q.jobs.front() {
                _ if q.callbacks.is_some() => None,
                Some(j) => Some(j.due),
                None if q.next_seq != seen => Some(Instant::now() + self.grace),
                None => None,
            };
            seen = q.next_seq;
            q.worker = WorkerState::Asleep(until);
            q = match until {
                None => self.ready.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(d) => self.ready.wait_timeout(q, d.saturating_duration_since(Instant::now())).unwrap_or_else(|p| p.into_inner()).0,
            };
            q.worker = WorkerState::Awake;
        }
    }

    /// Makes the jobs up to number `upto` due now and wakes the worker: a
    /// caller stops waiting to run its own (it sleeps, or must not run it).
    fn release(&self, upto: u64) {
        let mut q = lock(&self.queue);
        let now = Instant::now();
        let mut any = false;
        for j in q.jobs.iter_mut().take_while(|j| j.work.seq() <= upto) {
            j.due = j.due.min(now);
            any = true;
        }
        if any && matches!(q.worker, WorkerState::Asleep(_)) {
            self.ready.notify_one();
        }
    }

    /// Takes the exec lock and runs queued jobs in order: for the worker,
    /// the job at the head once it is due; for a caller, every job up to
    /// its own (giving up at once if another thread is running).
    ///
    /// A job's callbacks run after the exec lock is released, and no other
    /// job starts until they return, but those they submit (children):
    /// a callback may submit work and wait for it (torch's PowerSGD hook
    /// does), and that work runs at the same place on every rank.
    fn run_queued(&self, who: Runner) {
        loop {
            let exec = match who {
                Runner::Worker | Runner::Submitter(_) => lock(&self.exec),
                Runner::Caller(_) => match self.try_exec() {
                    Some(e) => e,
                    None => return,
                },
            };
            let job = {
                let mut q = lock(&self.queue);
                let take = match who {
                    Runner::Worker => q.head_is_due(),
                    Runner::Caller(upto) => q.callbacks.is_none() && q.jobs.front().is_some_and(|j| j.work.seq() <= upto),
                    Runner::Submitter(_) => q.jobs.front().is_some_and(|j| j.child),
                };
                if take {
                    q.jobs.pop_front()
                } else {
                    None
                }
            };
            let Some(job) = job else { return };
            let done = job.work.seq();
            self.run_job(exec, job, !matches!(who, Runner::Worker), Instant::now());
            match who {
                Runner::Worker => return, // one job, then back to the queue
                Runner::Submitter(seq) if done == seq => return,
                _ => {}
            }
        }
    }

    /// Runs `job` under `exec` from `started`, then its callbacks once the
    /// lock is released; no other job starts until they return. One clock
    /// read at each end of a job: a small collective takes about as long
    /// as a few of them.
    fn run_job(&self, mut exec: MutexGuard<'_, Exec>, job: Job, by_caller: bool, started: Instant) {
        let callbacks = exec.run(job, by_caller, started);
        if callbacks.is_empty() {
            drop(exec);
        } else {
            self.enter_callbacks();
            drop(exec);
            callbacks.run();
            self.leave_callbacks();
        }
    }

    /// The exec lock, if no other thread holds it.
    fn try_exec(&self) -> Option<MutexGuard<'_, Exec>> {
        match self.exec.try_lock() {
            Ok(e) => Some(e),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// This thread runs callbacks of finished work: until they return, no
    /// work but theirs starts.
    fn enter_callbacks(&self) {
        let mut q = lock(&self.queue);
        let me = std::thread::current().id();
        q.callbacks = match q.callbacks {
            Some((t, depth)) if t == me => Some((t, depth + 1)),
            _ => Some((me, 1)),
        };
    }

    fn leave_callbacks(&self) {
        let mut q = lock(&self.queue);
        q.callbacks = match q.callbacks {
            Some((t, depth)) if depth > 1 => Some((t, depth - 1)),
            _ => None,
        };
        if q.callbacks.is_none() && !q.jobs.is_empty() && matches!(q.worker, WorkerState::Asleep(_)) {
            self.ready.notify_one();
        }
    }
}

#[derive(Clone, Copy)]
enum Runner {
    Worker,
    /// A thread waiting for the work with this sequence number.
    Caller(u64),
    /// A callback of an earlier work submitted the work with this number
    /// (a child): the callback's thread runs it at once, with any children
    /// queued before it.
    Submitter(u64),
}

/// Lets a thread waiting for work number `seq` run it (and the jobs queued
/// before it) itself.
struct CallerRuns {
    shared: Weak<Shared>,
    seq: u64,
}

impl Progress for CallerRuns {
    fn progress(&self) {
        if let Some(s) = self.shared.upgrade() {
            s.run_queued(Runner::Caller(self.seq));
        }
    }

    fn blocks(&self) -> bool {
        true
    }

    fn release(&self) {
        if let Some(s) = self.shared.upgrade() {
            s.release(self.seq);
        }
    }
}

impl CpuEngine {
    /// Starts the worker thread; the engine owns `transport`.
    /// `fault`, if given, is injected at its sequence number (already
    /// matched to this rank and group).
    pub fn start(
        transport: Box<dyn Transport>,
        group: String,
        algo: AlgoConfig,
        observer: Option<Observer>,
        fault: Option<FaultSpec>,
    ) -> Result<CpuEngine> {
        let (exit_tx, exit_rx) = mpsc::channel::<()>();
        let interrupt = transport.interrupter();
        let name = format!("rustccl-{}-r{}", group, transport.rank());
        let grace = grace(&algo);
        let exec = Exec {
            transport,
            scratch: Scratch::default(),
            comp: Compression::default(),
            poisoned: None,
            fault,
            algo,
            observer,
            group: group.as_str().into(),
            kept: ManuallyDrop::new(Vec::new()),
            next_seq: 0,
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                next_seq: 0,
                open: true,
                worker: WorkerState::Awake,
                last_async: None,
                callbacks: None,
                wakes: 0,
            }),
            ready: Condvar::new(),
            exec: Mutex::new(exec),
            grace,
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                s.work();
                let _ = exit_tx.send(());
            })
            .map_err(|e| Error::Internal(format!("cannot start the worker thread: {e}")))?;
        Ok(CpuEngine { shared, worker: Mutex::new(Some(worker)), exited: Mutex::new(Some(exit_rx)), interrupt, group })
    }

    /// Runs or queues `ops` as one unit of work that the caller waits for
    /// at once (numbered with the next sequence number).
    pub fn submit_blocking(&self, ops: Vec<Op<CpuTensor>>, bytes: usize, timeout: Duration) -> Result<Work> {
        self.submit(ops, bytes, timeout, None, true, |_| {})
    }

    /// Queues `ops` as one unit of work, numbered with the next sequence
    /// number, with a compression request for the exchange between hosts
    /// (float SUM / AVG all_reduce only). `caller_waits`: the caller waits
    /// for it at once (torch's `asyncOp=False`), so it runs here if the
    /// engine is idle, else waits up to the grace for the caller to run
    /// it. `prepare` attaches callbacks before the work can finish.
    pub fn submit(
        &self,
        ops: Vec<Op<CpuTensor>>,
        bytes: usize,
        timeout: Duration,
        compress: Option<Request>,
        caller_waits: bool,
        prepare: impl FnOnce(&Work),
    ) -> Result<Work> {
        let op_name = ops.first().map(|o| o.kind().name()).unwrap_or("barrier");
        let mut q = lock(&self.shared.queue);
        if !q.open {
            return Err(Error::Closed { op: op_name, how: "shut down" });
        }
        let seq = q.next_seq;
        let now = Instant::now();
        let work = Work::queued_at(op_name, seq, now);
        let child = q.in_callbacks();
        // A call its caller waits for at once, with nothing ahead of it
        // and no callbacks running (so not a child), runs here on the
        // caller's thread: no queue, no hand-off.
        if caller_waits && !self.shared.grace.is_zero() && q.jobs.is_empty() && q.callbacks.is_none() {
            if let Some(exec) = self.shared.try_exec() {
                q.next_seq += 1;
                prepare(&work);
                drop(q);
                let job = Job { ops, work: work.clone(), timeout, bytes, compress, due: now, child: false };
                self.shared.run_job(exec, job, true, now);
                return Ok(work);
            }
        }
        if !self.shared.grace.is_zero() {
            work.set_progress(Arc::new(CallerRuns { shared: Arc::downgrade(&self.shared), seq }));
        }
        prepare(&work);
        let due = now + if caller_waits && !child { self.shared.grace } else { Duration::ZERO };
        if !caller_waits {
            q.last_async = Some(now);
        }
        let job = Job { ops, work: work.clone(), timeout, bytes, compress, due, child };
        if child {
            // After the children already queued, before everything else.
            let at = q.jobs.iter().position(|j| !j.child).unwrap_or(q.jobs.len());
            q.jobs.insert(at, job);
        } else {
            q.jobs.push_back(job);
        }
        q.next_seq += 1;
        // A worker asleep until an earlier job's due time sees this one then;
        // a child is its submitter's to run.
        let wake = !child
            && match q.worker {
                WorkerState::Awake => false,
                WorkerState::Asleep(None) => true,
                WorkerState::Asleep(Some(until)) => due < until,
            };
        if wake {
            q.wakes += 1;
            self.shared.ready.notify_one();
        }
        drop(q);
        if child {
            // No other work starts until the callback returns, which may
            // wait for this one.
            self.shared.run_queued(Runner::Submitter(seq));
        }
        Ok(work)
    }

    /// Number of collectives submitted so far.
    pub fn seq(&self) -> u64 {
        lock(&self.shared.queue).next_seq
    }

    /// Times a submit woke the sleeping worker thread.
    pub fn worker_wakes(&self) -> u64 {
        lock(&self.shared.queue).wakes
    }

    /// Stops accepting work. With `abort`, interrupts the running operation;
    /// otherwise lets queued work finish. Waits up to `grace` for the worker.
    pub fn shutdown(&self, abort: bool, grace: Duration) {
        self.close();
        if abort {
            self.interrupt.interrupt();
        }
        let exited = lock(&self.exited).take();
        let worker = lock(&self.worker).take();
        if let (Some(rx), Some(h)) = (exited, worker) {
            match rx.recv_timeout(grace) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = h.join();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    log_at!(LogLevel::Warn, "group '{}': worker still busy after {grace:?}; interrupting it", self.group);
                    self.interrupt.interrupt();
                    if rx.recv_timeout(Duration::from_secs(5)).is_ok() {
                        let _ = h.join();
                    }
                }
            }
        }
    }

    /// Accepts no more work; the worker runs what is queued, then exits.
    fn close(&self) {
        let mut q = lock(&self.shared.queue);
        q.open = false;
        self.shared.ready.notify_one();
    }
}

impl Drop for CpuEngine {
    fn drop(&mut self) {
        // Never block in Drop (it may run on a thread a callback needs):
        // close the queue and let the worker finish on its own.
        self.close();
    }
}
