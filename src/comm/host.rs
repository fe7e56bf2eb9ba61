//! The host engine: one worker thread per communicator runs CPU collectives
//! in submission order over the communicator's [`Transport`].
//!
//! Submission assigns the sequence number under the queue lock, so queue
//! order, sequence order and execution order are the same. A transport
//! failure (timeout, lost peer, protocol error) poisons the engine: every
//! later operation fails at once with that cause instead of talking over a
//! byte stream in an unknown state.
#![forbid(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::collectives::codec::Request;
use crate::collectives::{self, AlgoName, Compression, Op, Scratch};
use crate::config::{AlgoConfig, FaultAction, FaultSpec, LogLevel};
use crate::error::{Error, OpSite, Result};
use crate::log_at;
use crate::tensor::HostTensor;
use crate::transport::{Interrupter, OpCtx, Transport};
use crate::work::Work;

/// What the worker reports after each operation (stats hook).
pub struct Done<'a> {
    pub op: &'static str,
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
}

pub type Observer = Box<dyn Fn(&Done<'_>) + Send>;

struct Job {
    ops: Vec<Op<HostTensor>>,
    work: Work,
    timeout: Duration,
    bytes: usize,
    compress: Option<Request>,
}

struct Queue {
    tx: Option<mpsc::Sender<Job>>,
    next_seq: u64,
}

pub struct HostEngine {
    queue: Mutex<Queue>,
    worker: Mutex<Option<JoinHandle<()>>>,
    exited: Mutex<Option<mpsc::Receiver<()>>>,
    interrupt: Interrupter,
    group: String,
}

/// The next job: polls briefly first, so back-to-back collectives do not
/// pay a sleep / wake-up of the worker each.
fn next_job(rx: &mpsc::Receiver<Job>) -> Option<Job> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_micros(50) {
        match rx.try_recv() {
            Ok(j) => return Some(j),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    rx.recv().ok()
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl HostEngine {
    /// Starts the worker thread that owns `transport`.
    /// `fault`, if given, is injected at its sequence number (already
    /// matched to this rank and group).
    pub fn start(
        mut transport: Box<dyn Transport>,
        group: String,
        algo: AlgoConfig,
        observer: Option<Observer>,
        fault: Option<FaultSpec>,
    ) -> Result<HostEngine> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (exit_tx, exit_rx) = mpsc::channel::<()>();
        let interrupt = transport.interrupter();
        let name = format!("rustccl-{}-r{}", group, transport.rank());
        let g = group.clone();
        let worker = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let mut scratch = Scratch::default();
                let mut comp = Compression::default();
                let mut poisoned: Option<Error> = None;
                while let Some(mut job) = next_job(&rx) {
                    job.work.mark_started();
                    let op_name = job.work.op();
                    let seq = job.work.seq();
                    let started = std::time::Instant::now();
                    let mut algo_name: AlgoName = "none";
                    comp.begin(job.compress.take());
                    let injected = fault.as_ref().filter(|f| f.seq == seq).map(|f| f.action);
                    if let Some(FaultAction::Delay(d)) = injected {
                        log_at!(LogLevel::Warn, "group '{g}' rank {}: RUSTCCL_FAULT: delaying {op_name} seq {seq} by {d:?}", transport.rank());
                        std::thread::sleep(d);
                    }
                    let result = if let Some(cause) = &poisoned {
                        Err(Error::Poisoned { op: op_name, cause: Box::new(cause.clone()) })
                    } else if let Some(FaultAction::Drop) = injected {
                        Err(Error::Internal(format!("RUSTCCL_FAULT: rank {} dropped {op_name} seq {seq}", transport.rank())))
                    } else if let Some(FaultAction::Kill) = injected {
                        transport.sever();
                        Err(Error::Internal(format!("RUSTCCL_FAULT: rank {} closed its links at {op_name} seq {seq}", transport.rank())))
                    } else {
                        let site = OpSite { op: op_name, seq, group: g.clone() };
                        transport.begin(OpCtx::new(site, job.timeout));
                        log_at!(LogLevel::Trace, "group '{g}' rank {}: {op_name} seq {seq} ({} bytes) start", transport.rank(), job.bytes);
                        let t = transport.as_mut();
                        catch_unwind(AssertUnwindSafe(|| -> Result<()> {
                            let base = comp.request.as_ref().map(|r| r.key.clone());
                            for (i, op) in job.ops.iter_mut().enumerate() {
                                if let (true, Some(r), Some(b)) = (i > 0, comp.request.as_mut(), base.as_ref()) {
                                    r.key = format!("{b}#{i}"); // coalesced: one residual per tensor
                                }
                                algo_name = collectives::run(t, op, &algo, &mut scratch, Some(&mut comp))?;
                            }
                            Ok(())
                        }))
                        .unwrap_or_else(|p| Err(Error::Internal(format!("{op_name} panicked: {}", panic_message(p.as_ref())))))
                    };
                    if let Err(e) = &result {
                        log_at!(LogLevel::Warn, "group '{g}' rank {}: {e}", transport.rank());
                        if e.poisons() && poisoned.is_none() {
                            poisoned = Some(e.clone());
                        }
                    }
                    if job.bytes > (256 << 20) {
                        scratch.trim(64 << 20);
                    }
                    job.ops.clear(); // release the caller's tensors before finishing
                    if let Some(obs) = &observer {
                        obs(&Done {
                            op: op_name,
                            seq,
                            bytes: job.bytes,
                            algo: algo_name,
                            transport: transport.kind(),
                            duration: started.elapsed(),
                            result: &result,
                            sent_between_hosts: comp.sent_between_hosts,
                            codec: comp.used.map_or("", |c| c.name()),
                        });
                    }
                    job.work.finish(result);
                }
                let _ = exit_tx.send(());
            })
            .map_err(|e| Error::Internal(format!("cannot start the worker thread: {e}")))?;
        Ok(HostEngine {
            queue: Mutex::new(Queue { tx: Some(tx), next_seq: 0 }),
            worker: Mutex::new(Some(worker)),
            exited: Mutex::new(Some(exit_rx)),
            interrupt,
            group,
        })
    }

    /// Queues `ops` as one unit of work, numbered with the next sequence
    /// number. `prepare` attaches callbacks before the work can finish.
    pub fn submit(
        &self,
        ops: Vec<Op<HostTensor>>,
        bytes: usize,
        timeout: Duration,
        prepare: impl FnOnce(&Work),
    ) -> Result<Work> {
        self.submit_compressed(ops, bytes, timeout, None, prepare)
    }

    /// [`HostEngine::submit`] with a compression request for the exchange
    /// between hosts (applies to float SUM / AVG all_reduce only).
    pub fn submit_compressed(
        &self,
        ops: Vec<Op<HostTensor>>,
        bytes: usize,
        timeout: Duration,
        compress: Option<Request>,
        prepare: impl FnOnce(&Work),
    ) -> Result<Work> {
        let op_name = ops.first().map(|o| o.kind().name()).unwrap_or("barrier");
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = q.tx.as_ref() else {
            return Err(Error::Closed { op: op_name, how: "shut down" });
        };
        let seq = q.next_seq;
        let work = Work::new(op_name, seq);
        prepare(&work);
        tx.send(Job { ops, work: work.clone(), timeout, bytes, compress })
            .map_err(|_| Error::Closed { op: op_name, how: "shut down" })?;
        q.next_seq += 1;
        Ok(work)
    }

    /// Number of collectives submitted so far.
    pub fn seq(&self) -> u64 {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).next_seq
    }

    /// Stops accepting work. With `abort`, interrupts the running operation;
    /// otherwise lets queued work finish. Waits up to `grace` for the worker.
    pub fn shutdown(&self, abort: bool, grace: Duration) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).tx = None;
        if abort {
            self.interrupt.interrupt();
        }
        let exited = self.exited.lock().unwrap_or_else(|p| p.into_inner()).take();
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
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
}

impl Drop for HostEngine {
    fn drop(&mut self) {
        // Never block in Drop (it may run on a thread a callback needs):
        // close the queue and let the worker finish on its own.
        if let Ok(mut q) = self.queue.lock() {
            q.tx = None;
        }
    }
}
