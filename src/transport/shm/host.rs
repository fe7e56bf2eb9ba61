//! What this host offers a rank (cores, L2 cache, how fast it reads
//! another process's memory) and the shared-memory settings chosen from it
//! when left to the host: worker threads, single-copy thresholds, the
//! one-round all-reduce limit.
#![forbid(unsafe_code)]

use super::{remote, ATTACH_FROM_HOST, BLOCK_SLOT_RANKS, SINGLE_READER_MIN};
use crate::config::log_at;
use crate::config::{ShmConfig, BROADCAST_FROM_HOST, QUICK_FROM_HOST, SLOT_FROM_HOST, SPIN_FROM_HOST, SPLIT_FROM_HOST};
use crate::config::LogLevel;
use crate::types::Rank;

use std::time::Duration;

/// Threads per rank: the setting, or the cores left per local rank (at
/// most 8), so a 2-core machine keeps one and a 64-core host uses several.
pub(super) fn threads_for(sizes: ShmConfig, local_ranks: usize) -> usize {
    if sizes.threads > 0 {
        return sizes.threads;
    }
    (cores() / local_ranks.max(1)).clamp(1, 8)
}

/// Bytes of each input / output slot (`Layout`): `segment_bytes` per
/// thread, at least the setting (`ShmConfig::slot_min`) or, left to the
/// host, [`FEW_RANKS_SLOT`] with 2-4 local ranks of 4 threads or more
/// (from 8, `segment_bytes` x threads is that already).
pub(super) fn slot_bytes_for(sizes: ShmConfig, local_ranks: usize, threads: usize) -> usize {
    let min = match sizes.slot_min {
        SLOT_FROM_HOST if (2..=4).contains(&local_ranks) && threads >= FEW_RANKS_SLOT_THREADS => FEW_RANKS_SLOT,
        SLOT_FROM_HOST => 0,
        set => set,
    };
    sizes.segment_bytes.saturating_mul(threads).max(min)
}

/// Smallest slot with up to 4 local ranks ([`slot_bytes_for`]), where
/// ranks of 4-7 threads would have less (with 8, `segment_bytes` x
/// threads is this already): an 8 MiB scatter's 2 MiB blocks then go through one
/// of the root's slots each, and an 8 MiB all_reduce's 2 MiB chunks take
/// one round instead of two. On the 16-core host (4 ranks of 4 threads,
/// 1 MiB slots before; settings alternating five times): 8 MiB scatter
/// 0.64x the time (4.0x -> 6.2x gloo), all_reduce 0.79x (4.6x -> 5.3x),
/// gather 0.81x, but reduce 8-32 MiB 1.09-1.12x (alone, timed by its
/// spans, the same: 890-912 us against 886-947) and 32 MiB scatter 1.19x
/// longer, the rest within the runs' spread; 3 ranks of 5 (with the
/// quick team, against neither) 0.67-1.03x at 512 KiB - 1 MiB
/// (`benchmarks/results/2026-11-29-h200host-quick-team-4rank/`). Every
/// rank's segment grows by (n + 1) x the difference (4 ranks: 5 MiB).
const FEW_RANKS_SLOT: usize = 2 << 20;

/// Fewest threads a rank needs for [`FEW_RANKS_SLOT`]: measured with 4
/// and 5; ranks of 2-3 threads (2 ranks on a 4-core host) keep their
/// 512-768 KiB slots, untimed with 2 MiB.
const FEW_RANKS_SLOT_THREADS: usize = 4;

/// How long a rank's idle worker threads spin before they sleep: the
/// setting, or [`SPIN`] where the local ranks' threads take at most a
/// quarter of the host's cores, else none (rayon's pool then, as before:
/// its idle threads look for work a few dozen times, yielding, and
/// sleep). On the 64-core host (VM, 256 KiB pieces) spinning made
/// 512 KiB - 8 MiB collectives with 2 ranks of 8 threads 1.1-2x faster
/// (two runs), was mixed with 4 (2 MiB 1.3-1.6x faster, 8 MiB all_reduce
/// 1.4x slower) and made nearly everything 1.2-5x slower with 8 ranks of
/// 8 threads and 16 of 4, every core then busy
/// (`benchmarks/results/2026-11-26-h100x4host-worker-team/`). On the
/// 32-core host, 2 ranks of 8 threads (half the cores) spinning (with
/// 64 KiB pieces) made 512 KiB - 2 MiB collectives 1.8-2.4x faster in
/// some sweeps and 4-18x slower in others, in which the VM lost 6-8 s of
/// CPU time a 20 s sweep to the hypervisor (steal), against < 1 s in the
/// sweeps without spinning between them (`benchmarks/results/2026-11-26-h100x2host-team-pieces/`):
/// a VM whose spinning threads the hypervisor takes away loses far more
/// than the wake-ups cost, so the rule stays at a quarter.
pub(super) fn spin_for(sizes: ShmConfig, local_ranks: usize, threads: usize) -> Duration {
    if sizes.spin_us != SPIN_FROM_HOST {
        return Duration::from_micros(sizes.spin_us as u64);
    }
    if room_to_spin(local_ranks, threads, cores()) {
        SPIN
    } else {
        Duration::ZERO
    }
}

/// Threads of a rank's quick team (`Workers::add_quick`): the setting,
/// or where the rank's own `threads` sleep when idle (no [`room_to_spin`],
/// and no spin set), the share of a quarter of the cores each local rank
/// may spin on (as `room_to_spin` allows), at most `threads`; 0 (none)
/// below 2. On the 64-core host, 8 ranks' 512 KiB all_reduce, reduce and
/// reduce_scatter took 0.3-0.55x the time with 2 spinning threads a rank
/// as with 8 sleeping ones (4 ranks, 4 spinning against 8 sleeping:
/// 0.3-0.5x), but 8 MiB ones 1.1-1.7x longer: hence only for the small
/// phases (`benchmarks/results/2026-11-26-h200x4host-quick-team/`).
/// A share of one thread (the caller alone) becomes a team of 2 where
/// the team `leads` the larger phases ([`quick_leads_for`]) or with
/// [`MANY_LOCAL_RANKS`] or more local ranks: see there.
pub(super) fn quick_threads_for(sizes: ShmConfig, local_ranks: usize, threads: usize, leads: bool) -> usize {
    if sizes.quick_threads != QUICK_FROM_HOST {
        return sizes.quick_threads;
    }
    if sizes.spin_us != SPIN_FROM_HOST {
        return 0;
    }
    quick_share(local_ranks, threads, cores(), leads)
}

/// [`quick_threads_for`] from the host, on `cores` cores.
fn quick_share(local_ranks: usize, threads: usize, cores: usize, leads: bool) -> usize {
    if room_to_spin(local_ranks, threads, cores) {
        return 0;
    }
    let q = (cores / 4 / local_ranks.max(1)).min(threads);
    match q {
        2.. => q,
        1 if (leads || local_ranks >= MANY_LOCAL_RANKS) && threads >= 2 => 2,
        _ => 0,
    }
}

/// From this many local ranks a rank whose share of a quarter of the
/// cores is one thread still gets a quick team of 2 (its caller and one
/// spinning helper: the quarter counted in helpers rather than threads).
/// Every phase waits for the rank whose sleeping workers woke last, and
/// the more ranks, the later that one: on the 64-core host 16 ranks of 4
/// sleeping workers took 0.51-0.62x the time with a team of 2 for 512 KiB
/// all_reduce, all_to_all, broadcast and reduce_scatter (scatter, gather
/// 0.80-0.87x, reduce 1.07x), 8 MiB ones 0.85-1.18x, small ones mostly
/// within the runs' spread (a few 1.1-1.35x), settings alternating twice;
/// builds alternating twice, 512 KiB all_reduce, broadcast, all_to_all and
/// send_recv 0.61-0.72x, but all_gathers of 128 KiB parts 1.45x slower
/// (1.11x in the settings runs; untested guess: the helper, still
/// spinning after the rank's copy-in, beside its 4 workers' copy-out) (`benchmarks/results/2026-11-27-x4host-quick-16rank/`);
/// a team of 3 was no better. With 8 ranks of 4 on the 32-core host the
/// same team was a wash (512 KiB all_to_all and reduce 0.82x, 2 MiB
/// all_to_all and small all_gathers 1.3x slower:
/// `benchmarks/results/2026-11-27-x4host-a2a-quick/quick-team-8rank-32core/`):
/// there the team does not lead, so it took all_to_all's 1.75 MiB phases
/// alone, on 2 threads instead of the rank's 4.
///
/// Where the team leads, a phase too large for it starts on it and the
/// workers join, so it never holds such a phase alone: with 4 ranks of 4
/// on the 16-core host a team of 2 (settings alternating twice) made
/// 512 KiB all_reduce, reduce, broadcast, scatter, all_to_all and
/// send/recv take 0.63-0.83x the time, 2 MiB reduce, broadcast and
/// scatter 0.77-0.82x, 8 MiB ones and gathers within the runs' spread
/// (builds alternating twice: 512 KiB 0.52-0.77x, all_gather and
/// gather 0.93-0.94x); with 3 ranks of 5 (with 2 MiB slots, against neither)
/// 512 KiB - 1 MiB 0.67-1.03x
/// (`benchmarks/results/2026-11-29-h200host-quick-team-4rank/`).
const MANY_LOCAL_RANKS: usize = 16;

/// Whether a phase too large for the quick team starts on it while the
/// rank's sleeping workers wake and join (`Workers::add_quick`): the
/// `setting` (`ShmConfig::quick_leads`), or with at most
/// [`LEAD_MAX_LOCAL_RANKS`] local ranks.
pub(super) fn quick_leads_for(setting: Option<bool>, local_ranks: usize) -> bool {
    setting.unwrap_or(local_ranks <= LEAD_MAX_LOCAL_RANKS)
}

/// Up to this many local ranks the quick team leads the larger phases. On
/// the 32-core host, settings alternating (2 and 4 ranks, two and three
/// pairs of runs, all_to_all's copies then led from the quick team's
/// usual 256 KiB a thread), 2 MiB collectives took 0.54-0.93x the time
/// (a few 4-rank ones up to 1.05x), 8 MiB ones 0.73-0.96x (4-rank
/// reduce_scatter and scatter 1.16-1.30x, each one run of two at twice the
/// other), 512 KiB ones mostly within the runs' spread (2-rank broadcast
/// and scatter 1.1-1.2x); on the 64-core host 4 ranks' 512 KiB - 8 MiB
/// ones 0.23-0.89x (one pair). With 8 ranks there (every core a worker's,
/// 10-45 s of steal a sweep) all_reduce and all_gather took 1.1-3.4x
/// longer, reduce_scatter and all_to_all 0.3-0.8x: the sleeping team that
/// replaces rayon's pool there did worse than rayon before too
/// (`benchmarks/results/2026-11-27-quick-leads/`).
const LEAD_MAX_LOCAL_RANKS: usize = 4;

/// Whether `local_ranks` ranks of `threads` threads take at most a
/// quarter of `cores` (one thread a rank has nobody to spin for).
fn room_to_spin(local_ranks: usize, threads: usize, cores: usize) -> bool {
    threads > 1 && local_ranks.saturating_mul(threads).saturating_mul(4) <= cores
}

/// How long idle worker threads spin where the host has room for it.
pub(super) const SPIN: Duration = Duration::from_micros(200);

/// The cores this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads of a root's solo phases: the setting, or the cores not taken
/// by the other local ranks' waiting threads (one each), at least the
/// rank's own `threads` and at most 8.
pub(super) fn root_threads_for(sizes: ShmConfig, local_ranks: usize, threads: usize) -> usize {
    if sizes.root_threads > 0 {
        return sizes.root_threads;
    }
    cores().saturating_sub(local_ranks.saturating_sub(1)).clamp(threads, threads.max(8))
}

/// The collectives' single-copy threshold when the setting is left to the
/// host (`config::ATTACH_FROM_HOST`): 16 MiB where a rank has two or more
/// threads, as measured on a 32-core host (4-8 threads per rank: reading
/// the peers' tensors won from 16-32 MiB, and for all_to_all blocks from
/// 2 MiB). With one thread per rank,
/// the two ranks' user-space copies through shared memory run side by side
/// where a single-copy read is one thread's kernel copy, so reads must be
/// nearly as fast as copies to pay: on a 2-core VM they ran at 13 GB/s
/// against 45 GB/s for copies, and without them 16 MiB all_reduce was 2x
/// and 1-4 MiB all_to_all and scatter 1.3-2x faster; only single large
/// transfers still gained. Where reads are slower than [`READ_VS_COPY`]
/// of a copy (or cannot be measured): no collective reads (`usize::MAX`;
/// blocks and sends: `Reads::slow`).
fn host_attach_min(me: Rank, threads: usize) -> usize {
    if threads >= 2 {
        return ATTACH_MIN;
    }
    match remote::read_and_copy_speed_once() {
        Some((read, copy)) if read >= READ_VS_COPY * copy => ATTACH_MIN,
        measured => {
            let speeds = measured.map_or("could not time reads through the kernel".to_string(), |(read, copy)| {
                format!("reads memory through the kernel (as from a peer) at {:.1} GB/s and copies it at {:.1} GB/s", read / 1e9, copy / 1e9)
            });
            log_at!(LogLevel::Info, "rank {me}: one thread per rank, which {speeds}: no collective reads peers' tensors (RUSTCCL_SHM_ATTACH_MIN_BYTES overrides)");
            usize::MAX
        }
    }
}

/// One rank's single-copy thresholds (bytes); the group takes the largest
/// of each (`Attach::agreed`).
pub(super) struct Reads {
    /// Collectives (`Attach::min_bytes`).
    pub attach: usize,
    pub single: usize,
    pub all_reduce: usize,
    pub reduce: usize,
    pub all_gather: usize,
    /// 0: the group decides (`Attach::agreed`).
    pub block: usize,
    pub broadcast: usize,
    /// Reads through the kernel are slower than copies here and a rank has
    /// one thread (`host_attach_min`): sends over [`SINGLE_READER_MIN`]
    /// are read by the receiver, not staged (`connect` makes no staging
    /// area). On the 2-core VM, settings alternating (two runs each), the
    /// 2-stage pipeline step (1 MiB micro-batches) took 1.83 / 2.12 ms so
    /// against 3.08 / 3.77 ms when sends up to 4 MiB went through the
    /// rings, and one-way 2-4 MiB 327-564 us against 395-981 us; staging
    /// them instead made the step 3.10 / 2.17 ms. Blocks of all_to_all,
    /// gather and scatter are read over the single-reader threshold
    /// (`Attach::agreed`).
    pub slow: bool,
    /// Sends this rank receives by rendezvous from this size are split
    /// (`comm::p2p::rendezvous`); not agreed: the receiver asks.
    pub split_send: usize,
}

/// The thresholds from the settings, and from the host where they are
/// left to it. With our large tensors in shared memory (`shared`,
/// `arena.rs`) peers read them with a plain copy, which pays from a
/// smaller size on than the kernel's reads (while every local rank has
/// them: the group takes the largest thresholds). A threshold set by hand
/// keeps single readers at 256 KiB; a single-reader setting wins.
pub(super) fn reads_for(me: Rank, sizes: ShmConfig, local_ranks: usize, threads: usize, shared: bool) -> Reads {
    let n = local_ranks;
    let host = sizes.attach_min == ATTACH_FROM_HOST;
    let attach = match sizes.attach_min {
        ATTACH_FROM_HOST if shared => SHARED_READ_MIN,
        ATTACH_FROM_HOST => host_attach_min(me, threads),
        set => set,
    };
    let crowded = shared && crowded(n, threads);
    let all_reduce = if !host {
        attach
    } else if crowded {
        SHARED_CROWDED_ALL_REDUCE_READ_MIN
    } else if shared {
        SHARED_ALL_REDUCE_READ_MIN
    } else {
        all_reduce_attach_min(attach, n)
    };
    let reduce = if host && shared && n <= BLOCK_SLOT_RANKS {
        SHARED_FEW_RANKS_REDUCE_READ_MIN
    } else if host && !shared && sizes.gather_push {
        pushed_reduce_attach_min(attach, n, threads)
    } else {
        attach
    };
    let all_gather = if host && crowded { SHARED_CROWDED_ALL_GATHER_READ_MIN } else { attach };
    // Reads through the kernel slower than copies, one thread a rank
    // (`host_attach_min`): sends over 256 KiB are read, not staged; blocks
    // over the single-reader threshold too (`Attach::agreed`).
    let slow = host && !shared && attach == usize::MAX;
    let block = match sizes.block_min {
        0 if shared && n > BLOCK_SLOT_RANKS => SHARED_BLOCK_READ_MIN,
        0 if shared => SINGLE_READER_MIN,
        set => set,
    };
    // Broadcast reads the root only with two or more threads a rank: with
    // one (2 ranks on 2 cores) the pipelined copies were 1.1-1.2x faster
    // at 4-16 MiB even with shared tensors; unless the root, idle
    // otherwise, writes half of it ([`PAIR_BROADCAST_READ_MIN`]).
    let broadcast = match sizes.broadcast_min {
        BROADCAST_FROM_HOST if shared && threads > 1 => SHARED_BROADCAST_READ_MIN,
        BROADCAST_FROM_HOST if slow && n == 2 && sizes.gather_push => PAIR_BROADCAST_READ_MIN,
        BROADCAST_FROM_HOST => usize::MAX,
        set => set,
    };
    let single = match sizes.single_min {
        0 => SINGLE_READER_MIN,
        set => set,
    };
    // The sender, idle while its receiver reads, writes half where this
    // rank takes pushes.
    let split_send = match sizes.split_send_min {
        SPLIT_FROM_HOST if sizes.gather_push => SPLIT_SEND_MIN,
        SPLIT_FROM_HOST => usize::MAX,
        set => set,
    };
    Reads { attach, single, all_reduce, reduce, all_gather, block, broadcast, slow, split_send }
}

/// The largest scatter block a root splits with its receiver (the
/// setting; `usize::MAX`: any): 2 MiB. On the 64-core host (settings
/// alternating twice) splitting made 8 MiB scatters 0.80x / 0.82x the
/// time with 8 / 4 ranks (1 / 2 MiB blocks), but 32 MiB ones (4 / 8 MiB
/// blocks) 1.58 / 1.8x longer: there the root's threads, writing half of
/// every block, are the slowest part
/// (`benchmarks/results/2026-11-27-x4host-scatter-split/`).
pub(super) fn scatter_split_max(sizes: ShmConfig) -> usize {
    match sizes.scatter_split_max {
        0 => SCATTER_SPLIT_MAX,
        set => set,
    }
}

const SCATTER_SPLIT_MAX: usize = 2 << 20;

/// Rendezvous sends from this size are split between receiver and sender
/// where the receiver takes pushes ([`Reads::split_send`]); staged sends
/// (where reads are fast, up to the staging area's size when it is free)
/// are not. On the 2-core VM (reads slow, every send over 256 KiB read by
/// its receiver) 4-16 MiB messages one way took 0.3-0.55x the time, the
/// 4-stage pipeline step 0.68x; on the 32-core host (sends up to 8 MiB
/// staged) 16-32 MiB ones 0.62-0.76x with 2 and 8 ranks, the pipeline
/// step 0.74x / 0.84x with 4 / 8 ranks (its sends split when the staging
/// area is busy), while splitting 1-8 MiB sends instead of staging them
/// took 1.3-2x longer with 2 ranks
/// (`benchmarks/results/2026-11-27-devbox-split-sends/`,
/// `benchmarks/results/2026-11-27-x2host-split-sends/`).
const SPLIT_SEND_MIN: usize = 512 << 10;

/// Where a rank's tensors are shared (`arena.rs`, `RUSTCCL_SHM_TENSORS=1`)
/// and the thresholds are left to the host: the smallest collective (bytes
/// per rank) that reads peers' tensors. On the 16-core host reading shared
/// tensors made 1-16 MiB reduce_scatter 1.1-2x faster than the slots with
/// 4 and 8 ranks, reduce 1.2-1.7x with 8 (but 1.2-1.3x slower with 4 at
/// 1-4 MiB), all_gather 1.0-1.25x with 8 (0.8-1.0x with 4)
/// (`benchmarks/results/2026-11-26-h200host-shm-tensors/`).
const SHARED_READ_MIN: usize = 256 << 10;
/// The same for all_reduce, which reads every peer twice: at 1 MiB the
/// slots were 1.8x faster with 4 ranks and as fast with 8, at 4 MiB
/// reading was as fast or 1.14x faster, at 16 MiB 1.45-1.7x.
const SHARED_ALL_REDUCE_READ_MIN: usize = 4 << 20;
/// The same for reduce with shared tensors on at most [`BLOCK_SLOT_RANKS`]
/// local ranks: with 4 ranks on the 16-core host reading took 1.1-1.4x
/// longer than the pipelined slots at 256 KiB - 4 MiB (two runs of two
/// sweeps each), and was 1.0-1.1x faster at 16 MiB; with 8 and 16 ranks
/// reading was 1.2-1.8x faster from 1 MiB.
const SHARED_FEW_RANKS_REDUCE_READ_MIN: usize = 16 << 20;
/// With shared tensors on more than [`BLOCK_SLOT_RANKS`] local ranks,
/// all_to_all / gather / scatter blocks over this size are read: with 8
/// ranks 1 MiB all_to_all (128 KiB blocks) and scatter took 1.8x less time
/// so than through the slots on the 16-core host, 2.2x / 2.8x on the
/// 32-core one (`benchmarks/results/2026-11-26-h200host-shm-tensors/`);
/// with 4 ranks it made no difference (over 256 KiB they are read).
const SHARED_BLOCK_READ_MIN: usize = 32 << 10;
/// The same for broadcast (every rank reads the root's tensor), where a
/// rank has two or more threads: 1.6-2x faster than the pipelined copies
/// from 1 MiB with 4 and 8 ranks on the 16-core host, 1.2-1.55x with 16 on
/// the 32-core one; with one thread a rank (the 2-core VM) 0.84-0.92x.
const SHARED_BROADCAST_READ_MIN: usize = 1 << 20;

/// With shared tensors on a crowded host ([`crowded`]) all_gather reads
/// peers' tensors from this size (bytes per rank) on. On the 64-core host
/// with 8 and 16 ranks (4-8 threads each) reading made all_gather of
/// 256 KiB - 4 MiB per rank 0.73-0.96x as fast as the pipelined slots and
/// 16 MiB 1.14-1.25x faster; keeping the slots below 16 MiB made 1-8 MiB
/// 1.1-1.5x faster (`run4/`); on the 16-core host (8 ranks, 2 threads
/// each) reading was 1.1-1.25x faster from 256 KiB
/// (`benchmarks/results/2026-11-26-h100x4host-shm-tensors/`).
const SHARED_CROWDED_ALL_GATHER_READ_MIN: usize = 16 << 20;
/// The same for all_reduce: on the 64-core host the slots were 1.2-1.5x
/// faster at 4 MiB with 8 and 16 ranks, reading 1.2-1.4x faster at 8 MiB
/// (`run4/`); on the 16-core host with 8 ranks reading was 1.3x faster
/// at 4 MiB ([`SHARED_ALL_REDUCE_READ_MIN`]).
const SHARED_CROWDED_ALL_REDUCE_READ_MIN: usize = 8 << 20;

/// Whether `local_ranks` ranks of `threads` threads each crowd the host's
/// memory when they all read peers' shared tensors at once: 8 or more
/// local ranks and 32 or more threads among them. The pipelined slots'
/// copies gained more from threads than the reads did: with 8 ranks of 8
/// threads (64-core host) the slots' 4 MiB all_reduce ran 1.7x faster
/// than with 2 threads (16-core host), the reads not at all; 4 ranks of
/// 8 threads still read faster. On the 32-core host (8 ranks of 4
/// threads, 16 of 2) the rule came out even (`run5-32core/`).
fn crowded(local_ranks: usize, threads: usize) -> bool {
    local_ranks >= 8 && local_ranks * threads >= 32
}

/// The staging area's size when left to the host: 2 MiB per thread of the
/// rank, 4 to 8 MiB. On the 16-core host (ping-pong one way, sends staged
/// up to 8 MiB against up to 4 MiB): 8 MiB messages took 234-318 us
/// instead of 448-532 with 2 ranks (8 threads each) and 417-461 instead of
/// 481-509 with 4 (4 threads), but 796-836 us instead of 650-720 with 8
/// ranks (2 threads), where 4 MiB still gained
/// (`benchmarks/results/2026-11-26-h200host-p2p-overlap/`). Against sends
/// read in halves (`Reads::split_send`), 4 MiB for ranks of 4 threads made
/// 8 MiB one-way sends 0.82-1.04x the time, but a 4-stage pipeline step
/// with 6-8 MiB micro-batches 1.10-1.13x longer (a staged send completes
/// once copied in, a read one when its receiver has read it); not taken
/// (`benchmarks/results/2026-11-29-h200host-s35/`).
pub(super) fn stage_for(threads: usize) -> usize {
    (threads.saturating_mul(2 << 20)).clamp(4 << 20, 8 << 20)
}

/// The all_reduce's single-copy threshold when left to the host: from
/// 4 MiB per local rank (each rank then reads slices of at least 4 MiB
/// from each peer, twice), at least the collectives' `attach_min`. The
/// single-copy all_reduce reads every peer twice (its reduce-scatter and
/// its all-gather), and the kernel's reads of a few MiB from one process
/// do not get faster with more readers: on the 16-core host with 8 ranks,
/// 16 MiB all_reduce took 4480-5237 us with two copies and 6596-6794 us
/// reading (32 MiB: even), while reduce and reduce_scatter (one read
/// phase) were 1.1-1.3x faster reading from 16 MiB; on the 64-core host
/// with 8 ranks the same (2308-2672 against 3696-3959 us at 16 MiB).
fn all_reduce_attach_min(attach_min: usize, local_ranks: usize) -> usize {
    attach_min.max(local_ranks.saturating_mul(4 << 20))
}

/// The reduce's single-copy threshold when left to the host, where its
/// root takes the others' parts as pushes (`RUSTCCL_SHM_GATHER_PUSH`, no
/// shared tensors) and reads are fast (`attach_min` is [`ATTACH_MIN`]):
/// from [`PUSHED_REDUCE_READ_MIN`] with 5-8 local ranks (and with 3-4
/// of at most [`FEW_THREADS`] threads each), from
/// [`PUSHED_REDUCE_MANY_READ_MIN`] with more than 8, else `attach_min`. The
/// two-copy reduce leaves the root to copy every other rank's part out
/// of its slot alone while they wait; with pushes nobody waits for one
/// rank's copies. On the 64-core host (settings alternating, reading from
/// 512 KiB against the default) reading with pushes made 8-rank reduces of
/// 8 MiB 0.76x the time but 512 KiB / 2 MiB ones 1.45 / 1.23x longer (two
/// runs), 16-rank ones of 512 KiB - 32 MiB 0.60-0.93x (one run), 4-rank
/// ones 1.13-1.49x longer below 32 MiB; reading without pushes (the root
/// reads every part) took 1.2-2x as long as with them at every size
/// (`benchmarks/results/2026-11-27-x4host-s20-call2/`). Those 4 ranks had
/// 8 threads each, whose two copies outran the kernel's; with 4 threads
/// (16-core host, reading from 1 MiB against the default, alternating
/// twice) 8 MiB reduces took 0.81x the time reading (4.1x -> 5.1x gloo),
/// 2 MiB ones 1.36x longer
/// (`benchmarks/results/2026-11-29-h200host-s36/reduce-reads/`).
fn pushed_reduce_attach_min(attach_min: usize, local_ranks: usize, threads: usize) -> usize {
    match local_ranks {
        _ if attach_min != ATTACH_MIN => attach_min,
        n if n > 8 => PUSHED_REDUCE_MANY_READ_MIN,
        n if n > BLOCK_SLOT_RANKS => PUSHED_REDUCE_READ_MIN,
        n if n > 2 && threads <= FEW_THREADS => PUSHED_REDUCE_READ_MIN,
        _ => attach_min,
    }
}

/// See [`pushed_reduce_attach_min`].
const FEW_THREADS: usize = 4;

/// Where reads are slow and a host has 2 local ranks, broadcasts from this
/// size read the root's tensor, the root writing the second half into the
/// other's (`collectives::shm_attach::broadcast`, where the root takes
/// pushes): both ranks' one thread copies, where the pipelined copies
/// through the root's slot move every byte twice, one copy on each. On the
/// 2-core VM (settings alternating) 2-32 MiB broadcasts took 0.46-0.69x the
/// time of the pipelined ones (two runs) and 1 MiB 0.77x, 128-512 KiB
/// 1.3-2x longer (three runs); reading the whole buffer without the
/// root's half took 1.03-1.3x longer at 2-32 MiB
/// (`benchmarks/results/2026-11-27-devbox-pair-broadcast/`).
const PAIR_BROADCAST_READ_MIN: usize = 1 << 20;

/// See [`pushed_reduce_attach_min`].
const PUSHED_REDUCE_READ_MIN: usize = 8 << 20;
/// See [`pushed_reduce_attach_min`].
const PUSHED_REDUCE_MANY_READ_MIN: usize = 512 << 10;

/// The default single-copy threshold where reads pay.
const ATTACH_MIN: usize = 16 << 20;
/// How fast a read through the kernel must be, as a fraction of a copy,
/// for one thread per rank to read peers' tensors.
const READ_VS_COPY: f64 = 0.8;

/// Largest one-round all-reduce by default, and the smallest size of each
/// of the two small slots (one-step broadcast and all_gather use them up
/// to their size: 512 KiB of shared memory per rank).
pub(super) const SMALL_SLOT: usize = 256 << 10;

/// L2 cache of one core (sysfs), 1 MiB when unknown.
fn l2_bytes() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size").unwrap_or_default();
    let t = text.trim();
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    num.parse::<usize>().map(|v| v * mult).ok().filter(|&v| v >= 64 << 10).unwrap_or(1 << 20)
}

/// The one-round limit: the setting, or the core's L2 cache / (2 n^2),
/// 16 KiB to 256 KiB (2 MiB L2: 256 KiB for 2 ranks, 64 KiB for 4, 16 KiB
/// from 8). In one round every rank reads all n copies, so the all-reduce
/// costs n reads per byte where the pipelined one moves ~3, and all ranks
/// read the same slots at once. Measured on a 32-core host with 2 MiB L2
/// and 8 ranks: one round took 73 / 120 / 174 us at 32 / 64 / 128 KiB, the
/// pipelined all-reduce 47 / 53 / 82 us (16 KiB and below: the same).
pub fn one_round_max(setting: usize, local_ranks: usize) -> usize {
    if setting > 0 {
        return setting;
    }
    let n = local_ranks.max(1);
    (l2_bytes() / (2 * n * n)).clamp(16 << 10, SMALL_SLOT)
}

#[cfg(test)]
mod tests {
    use super::{pushed_reduce_attach_min, quick_leads_for, quick_share, room_to_spin, slot_bytes_for, stage_for, ATTACH_MIN};
    use crate::config::{Config, ShmConfig, SLOT_FROM_HOST};

    #[test]
    fn a_reduce_with_pushes_reads_from_8_mib_with_5_to_8_ranks_or_3_to_4_of_few_threads_and_512_kib_with_more() {
        let at = |n, threads| pushed_reduce_attach_min(ATTACH_MIN, n, threads);
        assert_eq!((at(2, 8), at(4, 8), at(5, 8), at(8, 8), at(9, 8), at(16, 8)), (ATTACH_MIN, ATTACH_MIN, 8 << 20, 8 << 20, 512 << 10, 512 << 10));
        // 3-4 ranks of up to 4 threads read from 8 MiB; 2 ranks do not
        assert_eq!((at(2, 4), at(3, 4), at(4, 4), at(4, 2), at(4, 5)), (ATTACH_MIN, 8 << 20, 8 << 20, 8 << 20, ATTACH_MIN));
        // slow reads (no collective reads) stay so
        assert_eq!(pushed_reduce_attach_min(usize::MAX, 16, 1), usize::MAX);
        assert_eq!(pushed_reduce_attach_min(usize::MAX, 4, 1), usize::MAX);
    }

    #[test]
    fn a_quick_team_takes_a_ranks_share_of_a_quarter_of_the_cores() {
        // 64 cores: 4 ranks of 8 sleeping workers get 4, 8 ranks 2, 16
        // ranks of 4 (1 a rank, but many ranks) 2; 2 ranks of 8 spin
        // themselves; 2 ranks of 8 on 16 cores get 2, 4 ranks of 4 (1 a
        // rank, a team that leads) 2, the same without leading none;
        // 8 ranks of 4 on 32 cores (1 a rank, no lead, fewer ranks) none;
        // 16 ranks of 2 on 32 cores (no share) none; the 2-core VM none.
        let (lead, alone) = (true, false);
        assert_eq!((quick_share(4, 8, 64, lead), quick_share(8, 8, 64, alone), quick_share(16, 4, 64, alone)), (4, 2, 2));
        assert_eq!((quick_share(2, 8, 64, lead), quick_share(2, 8, 16, lead), quick_share(4, 4, 16, lead)), (0, 2, 2));
        assert_eq!(quick_share(4, 4, 16, alone), 0);
        assert_eq!((quick_share(8, 4, 32, alone), quick_share(16, 2, 32, alone), quick_share(32, 4, 128, alone)), (0, 0, 2));
        assert_eq!((quick_share(2, 1, 2, lead), quick_share(4, 2, 64, lead)), (0, 0));
    }

    #[test]
    fn slots_hold_2_mib_with_up_to_4_ranks_of_several_threads_unless_set() {
        let host = ShmConfig { segment_bytes: 256 << 10, slot_min: SLOT_FROM_HOST, ..Config::get().shm };
        let slot = |sizes, n, threads| slot_bytes_for(sizes, n, threads);
        // 16 cores: 4 ranks of 4 threads (1 MiB) and 3 of 5 get 2 MiB; 2
        // ranks of 8 have it; 8 ranks of 2, 2 ranks of 2 (a 4-core host),
        // a rank of one thread (the 2-core VM) and a lone rank keep
        // segment x threads
        assert_eq!((slot(host, 4, 4), slot(host, 3, 5), slot(host, 2, 8)), (2 << 20, 2 << 20, 2 << 20));
        assert_eq!((slot(host, 8, 2), slot(host, 2, 2), slot(host, 2, 1), slot(host, 1, 8)), (512 << 10, 512 << 10, 256 << 10, 2 << 20));
        // a setting: that floor (0: none) whatever the ranks
        let none = ShmConfig { slot_min: 0, ..host };
        assert_eq!((slot(none, 4, 4), slot(ShmConfig { slot_min: 3 << 20, ..host }, 8, 2)), (1 << 20, 3 << 20));
    }

    #[test]
    fn the_staging_area_holds_2_mib_a_thread_from_4_to_8_mib() {
        // the 2-core VM's one thread and 8 ranks of 2 on 16 cores: 4 MiB;
        // 3 threads 6; 4 ranks of 4 on 16 cores, 8 and more: 8
        assert_eq!((stage_for(1), stage_for(2), stage_for(3)), (4 << 20, 4 << 20, 6 << 20));
        assert_eq!((stage_for(4), stage_for(8), stage_for(64)), (8 << 20, 8 << 20, 8 << 20));
    }

    #[test]
    fn the_quick_team_leads_with_up_to_four_local_ranks_unless_set() {
        assert_eq!((quick_leads_for(None, 2), quick_leads_for(None, 4), quick_leads_for(None, 5), quick_leads_for(None, 16)), (true, true, false, false));
        assert_eq!((quick_leads_for(Some(true), 16), quick_leads_for(Some(false), 2)), (true, false));
    }

    #[test]
    fn threads_spin_where_they_take_at_most_a_quarter_of_the_cores() {
        // the hosts measured: 2 ranks of 8 on 64 cores spin; 4 of 8 on 64,
        // 2 of 8 on 32 (the hypervisor took the spinning VM's CPU time
        // away), every core busy (8 of 8 on 64, 16 of 2 on 32) or one
        // thread a rank (the 2-core VM) do not
        assert!(room_to_spin(2, 8, 64) && room_to_spin(2, 4, 32));
        assert!(!room_to_spin(2, 8, 32) && !room_to_spin(4, 8, 64) && !room_to_spin(16, 2, 32) && !room_to_spin(8, 8, 64));
        assert!(!room_to_spin(2, 1, 2) && !room_to_spin(1, 1, 64));
    }
}
