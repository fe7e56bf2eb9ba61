//! Running one job of the CPU engine to its end: the fault a test
//! injects, the poisoned state after a broken operation, the algorithms
//! over the transport, the memory kept from a caller whose peers may still
//! write into it, the observer and the work's completion.
#![forbid(unsafe_code)]

use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use super::{Done, Job, Observer};
use crate::collectives::{self, AlgoName, Compression, Op, Scratch};
use crate::config::log_at;
use crate::config::{AlgoConfig, FaultAction, FaultSpec, LogLevel};
use crate::error::{Error, OpSite, Result};
use crate::tensor::CpuTensor;
use crate::transport::{frame, OpCtx, Transport};
use crate::types::OpKind;
use crate::work::Callbacks;

/// Everything a running collective uses; one runner at a time.
pub(super) struct Exec {
    pub(super) transport: Box<dyn Transport>,
    pub(super) scratch: Scratch,
    pub(super) comp: Compression,
    pub(super) poisoned: Option<Error>,
    pub(super) fault: Option<FaultSpec>,
    pub(super) algo: AlgoConfig,
    pub(super) observer: Option<Observer>,
    pub(super) group: Arc<str>,
    /// The tensors of the first operation that broke (poisoned) or was
    /// aborted in a group with peers on this host, which could still write
    /// into them (see `run`): never released.
    pub(super) kept: ManuallyDrop<Vec<Op<CpuTensor>>>,
    /// The next operation's number in execution order, which its messages
    /// carry: the order every rank runs its operations in, also where work
    /// submitted from a callback ran before work queued earlier.
    pub(super) next_seq: u64,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Exec {
    /// Runs `job`, starting at `started` (the runner read the clock), to
    /// the end and finishes its work; returns the work's callbacks, which
    /// the runner runs once it released the exec lock.
    pub(super) fn run(&mut self, mut job: Job, by_caller: bool, started: Instant) -> Callbacks {
        let g = self.group.clone();
        let rank = self.transport.rank();
        job.work.mark_started_at(started);
        let op_name = job.work.op();
        let kind = job.ops.first().map_or(OpKind::Barrier, |o| o.kind());
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut algo_name: AlgoName = "none";
        self.comp.begin(job.compress.take());
        let injected = self.fault.as_ref().filter(|f| f.seq == seq).map(|f| f.action);
        // The operation's deadline counts from when it starts on the wire:
        // after an injected delay, which plays a rank that calls late.
        let mut on_wire = started;
        if let Some(FaultAction::Delay(d)) = injected {
            log_at!(LogLevel::Warn, "group '{g}' rank {rank}: RUSTCCL_FAULT: delaying {op_name} seq {seq} by {d:?}");
            std::thread::sleep(d);
            on_wire = Instant::now();
        }
        let result = if let Some(cause) = &self.poisoned {
            Err(Error::Poisoned { op: op_name, cause: Box::new(cause.clone()) })
        } else if let Some(FaultAction::Drop) = injected {
            Err(Error::Internal(format!("RUSTCCL_FAULT: rank {rank} dropped {op_name} seq {seq}")))
        } else if let Some(FaultAction::Kill) = injected {
            self.transport.sever();
            Err(Error::Internal(format!("RUSTCCL_FAULT: rank {rank} closed its links at {op_name} seq {seq}")))
        } else {
            let site = OpSite { op: op_name, seq, group: g.clone() };
            let roots = frame::roots_tag(job.ops.iter().filter_map(|o| o.root()));
            let what = collectives::wire_what(&job.ops);
            self.transport.begin(OpCtx::started_at(site, job.timeout, on_wire).with_roots(roots).with_what(what));
            log_at!(LogLevel::Trace, "group '{g}' rank {rank}: {op_name} seq {seq} ({} bytes) start", job.bytes);
            let Exec { transport, scratch, comp, algo, .. } = self;
            let t = transport.as_mut();
            let _t = crate::profile::start(crate::profile::Span::CollectiveRun);
            let ran = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
                if let Some(FaultAction::Panic) = injected {
                    panic!("RUSTCCL_FAULT: rank {rank} panics in {op_name} seq {seq}");
                }
                let base = comp.request.as_ref().map(|r| r.key.clone());
                for (i, op) in job.ops.iter_mut().enumerate() {
                    if let (true, Some(r), Some(b)) = (i > 0, comp.request.as_mut(), base.as_ref()) {
                        r.key = format!("{b}#{i}"); // coalesced: one residual per tensor
                    }
                    algo_name = collectives::run(t, op, algo, scratch, Some(&mut *comp))?;
                }
                Ok(())
            }));
            ran.unwrap_or_else(|p| {
                // The rank left the algorithm at an unknown step; its peers
                // would wait for the rest until the timeout. Its links close,
                // as a crashed process's would, so they fail at once (the
                // rank is poisoned below, as after a lost peer).
                t.sever();
                Err(Error::Internal(format!("{op_name} panicked: {}", panic_message(p.as_ref()))))
            })
        };
        let _t = crate::profile::start(crate::profile::Span::JobEnd);
        if let Err(e) = &result {
            log_at!(LogLevel::Warn, "group '{g}' rank {rank}: {e}");
            // A peer of this host may still be writing into our buffers
            // where this rank gave up on it (a timeout, a lost peer, an
            // abort): a gather's or reduce's root, the receiver of a split
            // broadcast or scatter (`collectives::shm::attach`,
            // `collectives::shm::attach::scatter`). The first
            // such operation's memory is kept from the caller, so that a
            // late write cannot land in memory it reuses (the group is
            // unusable after it; later operations never reach a peer).
            let gave_up = (e.poisons() && self.poisoned.is_none()) || matches!(e, Error::Closed { .. });
            if gave_up {
                if self.kept.is_empty() && self.transport.kind().starts_with("shm") {
                    self.kept.append(&mut job.ops);
                }
                // This rank runs no further step: peers that wait for one
                // fail now, not at their timeout. Not over TCP after our
                // own timeout: the peers waiting for the same straggler
                // time out themselves about now, and one that saw our
                // link close first would name us instead of the straggler.
                self.transport.give_up(seq, !matches!(e, Error::Timeout { .. }));
            }
            if e.poisons() && self.poisoned.is_none() {
                self.poisoned = Some(e.clone());
            }
        }
        if job.bytes > (256 << 20) {
            self.scratch.trim(64 << 20);
        }
        job.ops.clear(); // release the caller's tensors before finishing
        let ended = Instant::now();
        if let Some(obs) = &self.observer {
            obs(&Done {
                kind,
                seq,
                bytes: job.bytes,
                algo: algo_name,
                transport: self.transport.kind(),
                duration: ended.saturating_duration_since(started),
                result: &result,
                sent_between_hosts: self.comp.sent_between_hosts,
                codec: self.comp.used.map_or("", |c| c.name()),
                by_caller,
            });
        }
        // Still under the exec lock: works finish in sequence order.
        job.work.complete_at(result, ended)
    }
}
