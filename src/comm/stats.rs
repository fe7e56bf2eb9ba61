//! Per-collective counters of one communicator (`rustccl.stats(group)`), and
//! the registry that finds a live communicator by its group name.
//!
//! Bytes follow nccl-tests: the tensor for all_reduce / broadcast / reduce,
//! the whole output for all_gather, the whole input for reduce_scatter and
//! all_to_all, the message for send / recv. Bus bandwidth applies the same
//! factors as the benchmarks (2(n-1)/n for all_reduce, (n-1)/n for
//! all_gather, reduce_scatter and all_to_all, 1 otherwise).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::cpu;
use crate::config::AlgoConfig;
use crate::transport::shm;
use crate::transport::shm::arena::Arena;
use crate::types::OpKind;

/// Calls kept for the "recent" figures.
pub const RECENT: usize = 32;

#[derive(Debug, Clone, Default)]
pub struct OpStats {
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    /// Calls whose duration is known (CUDA ones only with RUSTCCL_CUDA_TIMING).
    pub timed_calls: u64,
    pub timed_bytes: u64,
    pub total: Duration,
    /// (bytes, duration) of the last RECENT timed calls.
    pub recent: VecDeque<(u64, Duration)>,
    pub algorithm: &'static str,
    /// Successful calls per algorithm (by name in a snapshot).
    pub algorithms: Vec<(&'static str, u64)>,
    pub transport: &'static str,
    /// Bytes this rank sent to other hosts (hierarchical all_reduce).
    pub between_hosts_bytes: u64,
    /// Codec of the last call's exchange between hosts ("" when exact).
    pub codec: &'static str,
    /// CPU calls the waiting caller's thread ran itself (the rest: the
    /// engine's worker thread; see `comm::cpu`).
    pub by_caller: u64,
}

/// What one finished operation contributes.
pub struct Sample {
    pub op: OpKind,
    pub bytes: u64,
    pub duration: Option<Duration>,
    pub algorithm: &'static str,
    pub transport: &'static str,
    pub ok: bool,
    /// A CPU call the waiting caller's thread ran itself.
    pub by_caller: bool,
}

#[derive(Default)]
pub struct Stats {
    /// By `OpKind` value; None for an operation not called since a reset.
    ops: Mutex<[Option<OpStats>; OpKind::COUNT]>,
    /// Peers whose link broke under an operation (a dead rank), for
    /// `rustccl.failed_ranks`; reset() keeps them.
    lost: Mutex<std::collections::BTreeSet<crate::types::Rank>>,
    /// The first error that left the group unusable (`Communicator::fatal_error`).
    fatal: Mutex<Option<String>>,
}

/// Bus-bandwidth factor of `op` in a group of `n`.
pub fn bus_factor(op: &str, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

impl Stats {
    /// Notes the peer of a broken link (a failed operation's error).
    pub fn note_error(&self, e: &crate::error::Error) {
        if e.poisons() {
            self.fatal.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| e.to_string());
        }
        let mut e = e;
        while let crate::error::Error::Poisoned { cause, .. } = e {
            e = cause;
        }
        if let crate::error::Error::PeerLost { peer, .. } = e {
            self.lost.lock().unwrap_or_else(|p| p.into_inner()).insert(*peer);
        }
    }

    /// The first error that left the group unusable, if one did.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Peers whose link broke under an operation so far.
    pub fn lost_peers(&self) -> Vec<crate::types::Rank> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect()
    }

    pub fn record(&self, s: Sample) {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let e = ops[s.op as usize].get_or_insert_with(OpStats::default);
        e.calls += 1;
        e.by_caller += s.by_caller as u64;
        if !s.ok {
            e.errors += 1;
            return;
        }
        e.bytes += s.bytes;
        e.algorithm = s.algorithm;
        match e.algorithms.iter_mut().find(|(a, _)| *a == s.algorithm) {
            Some((_, n)) => *n += 1,
            None => e.algorithms.push((s.algorithm, 1)),
        }
        e.transport = s.transport;
        if let Some(d) = s.duration {
            e.timed_calls += 1;
            e.timed_bytes += s.bytes;
            e.total += d;
            if e.recent.len() == RECENT {
                e.recent.pop_front();
            }
            e.recent.push_back((s.bytes, d));
        }
    }

    /// Adds what a finished `op` sent between hosts, and with which codec.
    pub fn record_between_hosts(&self, op: OpKind, bytes: u64, codec: &'static str) {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let e = ops[op as usize].get_or_insert_with(OpStats::default);
        e.between_hosts_bytes += bytes;
        e.codec = codec;
    }

    /// The counters of each operation called since the last reset, by name.
    pub fn snapshot(&self) -> BTreeMap<&'static str, OpStats> {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = BTreeMap::new();
        for (k, e) in ops.iter().enumerate() {
            if let (Some(kind), Some(e)) = (OpKind::from_i32(k as i32), e) {
                let mut e = e.clone();
                e.algorithms.sort_unstable();
                out.insert(kind.name(), e);
            }
        }
        out
    }

    pub fn reset(&self) {
        *self.ops.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
    }
}

/// A point-to-point work's sample: its route is the algorithm, "direct"
/// where the engine named none.
impl crate::work::Observer for Stats {
    fn finished(&self, w: &crate::work::Watch, f: crate::work::Finished<'_>) {
        let ok = f.result.is_ok();
        let algorithm = f.route.unwrap_or("direct");
        self.record(Sample { op: w.kind, bytes: w.bytes, duration: f.duration, algorithm, transport: w.transport, ok, by_caller: false });
        if let Err(e) = f.result {
            self.note_error(e);
        }
    }
}

fn registry() -> &'static Mutex<HashMap<String, Weak<super::Communicator>>> {
    static R: OnceLock<Mutex<HashMap<String, Weak<super::Communicator>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Makes `comm` findable by its group name (the newest group of a name wins).
pub fn register(comm: &Arc<super::Communicator>) {
    register_as(comm, comm.group());
}

/// Makes `comm` findable as `name` (torch's name of the group, which torch
/// gives split and shrunk groups after the engine made them).
pub fn register_as(comm: &Arc<super::Communicator>, name: &str) {
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    r.retain(|_, w| w.strong_count() > 0);
    r.insert(name.to_string(), Arc::downgrade(comm));
}

/// The live communicator of group `name`.
pub fn lookup(name: &str) -> Option<Arc<super::Communicator>> {
    registry().lock().unwrap_or_else(|p| p.into_inner()).get(name).and_then(Weak::upgrade)
}

/// Every live communicator.
pub fn all() -> Vec<Arc<super::Communicator>> {
    registry().lock().unwrap_or_else(|p| p.into_inner()).values().filter_map(Weak::upgrade).collect()
}

/// The thresholds of `algo`, plus the shared-memory ones of `local`.
pub(super) fn thresholds(algo: &AlgoConfig, local: Option<&shm::ShmLocal>) -> Vec<(&'static str, u64)> {
    let mut v = vec![
        ("small_allreduce_bytes", algo.small_allreduce_bytes as u64),
        ("small_broadcast_bytes", algo.small_broadcast_bytes as u64),
        ("segment_bytes", algo.segment_bytes as u64),
        ("caller_runs_us", cpu::grace(algo).as_micros() as u64),
    ];
    if let Some(l) = local {
        v.push(("shm_one_round_max_bytes", l.one_round_max.min(l.mine().layout.small) as u64));
        v.push(("shm_small_slot_bytes", l.mine().layout.small as u64));
        v.push(("shm_slot_bytes", l.mine().layout.seg as u64));
        v.push(("shm_threads", l.workers.threads() as u64));
        v.push(("shm_root_threads", l.root_threads.max(l.workers.threads()) as u64));
        v.push(("shm_spin_us", l.workers.spin().as_micros() as u64));
        // The most a waiting thread polls for its local peers before it sleeps.
        v.push(("shm_wait_spin_max_us", l.wait_window.max().as_micros() as u64));
        // Threads of the quick team for small parallel phases (0: none).
        v.push(("shm_quick_threads", l.workers.quick_threads() as u64));
        let (quick_max, quick_piece) = l.workers.quick_limits();
        v.push(("shm_quick_max_bytes", quick_max as u64));
        v.push(("shm_quick_min_piece_bytes", quick_piece as u64));
        // 1: phases too large for the quick team start on it while the workers wake.
        v.push(("shm_quick_leads", l.workers.quick_leads() as u64));
        // all_to_all's block copies: the quick team's largest phase there.
        v.push(("shm_quick_all_to_all_max_bytes", l.all_to_all_workers.quick_limits().0 as u64));
        v.push(("shm_min_piece_bytes", l.workers.min_piece() as u64));
        v.push(("shm_reduce_min_piece_bytes", l.reduce_workers.min_piece() as u64));
        v.push(("shm_sum_min_piece_bytes", l.sum_workers.min_piece() as u64));
        v.push(("local_ranks", l.ranks.len() as u64));
        // u64::MAX: never (reads off, impossible, or slow here: then single readers only).
        v.push(("shm_attach_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.min_bytes as u64)));
        v.push(("shm_all_reduce_attach_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.all_reduce_min as u64)));
        v.push(("shm_reduce_scatter_attach_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.reduce_scatter_min as u64)));
        v.push(("shm_reduce_attach_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.reduce_min as u64)));
        v.push(("shm_all_gather_attach_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.all_gather_min as u64)));
        v.push(("shm_broadcast_attach_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.broadcast_min as u64)));
        v.push(("shm_single_reader_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.single_min as u64)));
        v.push(("shm_block_read_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.block_min as u64)));
        v.push(("shm_scatter_block_read_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.scatter_block_min as u64)));
        v.push(("shm_gather_block_read_min_bytes", l.attach.as_ref().map_or(u64::MAX, |a| a.gather_block_min as u64)));
        // Sends received by rendezvous from this size: the sender writes the second half.
        v.push(("shm_split_send_min_bytes", if l.attach.is_some() { l.split_send_min as u64 } else { u64::MAX }));
        // 0: no staged sends (no staging area, or no single-copy reads to stage instead of).
        v.push(("shm_staged_send_min_bytes", l.stage_min as u64));
        v.push(("shm_staged_send_max_bytes", if l.attach.is_some() { l.stage_capacity() as u64 } else { 0 }));
        // 1: sends of shared tensors (RUSTCCL_SHM_TENSORS=1) are staged too.
        v.push(("shm_stage_shared_sends", l.stage_shared as u64));
        // 1: waiting threads move off a CPU another local rank's poller shares.
        v.push(("shm_keep_apart", l.keep_apart as u64));
        // 1: as a gather's root, senders write the blocks no slot takes into its outputs.
        v.push(("shm_gather_push", l.gather_push as u64));
        // u64::MAX: blocks of any size.
        v.push(("shm_scatter_split_max_bytes", l.scatter_split_max as u64));
        // Of a block it splits, a scatter root writes the last 1 / this.
        v.push(("shm_scatter_root_share", l.scatter_root_share as u64));
        v.push(("shm_gather_root_share", l.gather_root_share as u64));
        // How long a thread waits for a chunk of a block before the rank does.
        v.push(("shm_block_wait_us", l.block_wait.as_micros() as u64));
        // Local peers whose shared tensors (RUSTCCL_SHM_TENSORS=1) this rank mapped.
        v.push(("shm_peer_tensor_arenas", l.attach.as_ref().map_or(0, |a| a.arenas.iter().flatten().count() as u64)));
    }
    v
}

/// Times this process's waiting threads moved off a CPU another local
/// rank's polling thread shared (`transport::shm::place`).
pub fn thread_moves() -> u64 {
    shm::thread_moves()
}

/// This process's shared tensors now (`transport::shm::arena`; None
/// without `RUSTCCL_SHM_TENSORS=1`): bytes in use, most in use, freed but
/// kept, and tensors the arena could not hold.
pub fn shared_tensors() -> Option<Vec<(&'static str, u64)>> {
    let a = Arena::get()?;
    let s = a.stats();
    Some(vec![
        ("min_bytes", a.min_bytes as u64),
        ("in_use_bytes", s.in_use),
        ("peak_bytes", s.peak),
        ("cached_bytes", s.cached),
        ("full", s.full),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_recent_window() {
        let s = Stats::default();
        for i in 0..40u64 {
            s.record(Sample {
                op: OpKind::AllReduce,
                bytes: 100,
                duration: Some(Duration::from_micros(10 + i)),
                algorithm: "ring",
                transport: "tcp",
                ok: true,
                by_caller: false,
            });
        }
        s.record(Sample { op: OpKind::AllReduce, bytes: 5, duration: None, algorithm: "x", transport: "y", ok: false, by_caller: false });
        s.record(Sample {
            op: OpKind::AllReduce,
            bytes: 0,
            duration: None,
            algorithm: "one_round",
            transport: "shm",
            ok: true,
            by_caller: true,
        });
        s.record(Sample {
            op: OpKind::AllReduce,
            bytes: 0,
            duration: None,
            algorithm: "ring",
            transport: "tcp",
            ok: true,
            by_caller: false,
        });
        let snap = s.snapshot();
        let a = &snap["all_reduce"];
        assert_eq!((a.calls, a.errors, a.bytes, a.timed_calls, a.by_caller), (43, 1, 4000, 40, 1));
        // Failed calls count under no algorithm.
        assert_eq!(a.algorithms.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(), vec![("one_round", 1), ("ring", 41)]);
        assert_eq!(a.recent.len(), RECENT);
        assert_eq!(a.recent.back().unwrap().1, Duration::from_micros(49));
        assert_eq!(a.algorithm, "ring");
        s.reset();
        assert!(s.snapshot().is_empty());
        assert!((bus_factor("all_reduce", 4) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn watched_works_count_without_callbacks() {
        use crate::work::{Watch, Work};
        let s = Arc::new(Stats::default());
        let watch = |kind| Watch { observer: s.clone(), kind, bytes: 8, transport: "shm" };
        let send = Work::new("send", 1);
        send.mark_started();
        send.watch(watch(OpKind::Send));
        send.set_route("ring");
        assert!(s.snapshot().is_empty(), "counted before it finished");
        send.finish(Ok(()));
        // Watching a finished work counts it at once, under the default
        // algorithm when the engine named no route.
        let recv = Work::done("recv", 2, Err(crate::error::Error::Internal("lost".into())));
        recv.watch(watch(OpKind::Recv));
        let recv2 = Work::new("recv", 3);
        recv2.watch(watch(OpKind::Recv));
        recv2.finish(Ok(()));
        let snap = s.snapshot();
        let (a, b) = (&snap["send"], &snap["recv"]);
        assert_eq!((a.calls, a.errors, a.bytes, a.timed_calls, a.algorithm, a.transport), (1, 0, 8, 1, "ring", "shm"));
        assert_eq!((b.calls, b.errors, b.bytes, b.timed_calls, b.algorithm), (2, 1, 8, 0, "direct"));
        assert_eq!(snap.len(), 2);
    }
}
