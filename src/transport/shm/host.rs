//! What this host offers a rank (cores, L2 cache, how fast it reads
//! another process's memory) and the shared-memory settings chosen from it
//! when left to the host: worker threads, single-copy thresholds, the
//! one-round all-reduce limit.
#![forbid(unsafe_code)]

use super::{remote, ShmSizes, SINGLE_READER_MIN, SLOW_SINGLE_READER_MIN};
use crate::config::log_at;
use crate::config::LogLevel;
use crate::types::Rank;

/// Threads per rank: the setting, or the cores left per local rank (at
/// most 8), so a 2-core machine keeps one and a 64-core host uses several.
pub(super) fn threads_for(sizes: ShmSizes, local_ranks: usize) -> usize {
    if sizes.threads > 0 {
        return sizes.threads;
    }
    (cores() / local_ranks.max(1)).clamp(1, 8)
}

/// The cores this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads of a root's solo phases: the setting, or the cores not taken
/// by the other local ranks' waiting threads (one each), at least the
/// rank's own `threads` and at most 8.
pub(super) fn root_threads_for(sizes: ShmSizes, local_ranks: usize, threads: usize) -> usize {
    if sizes.root_threads > 0 {
        return sizes.root_threads;
    }
    cores().saturating_sub(local_ranks.saturating_sub(1)).clamp(threads, threads.max(8))
}

/// The single-copy thresholds (collectives, single readers) when the
/// setting is left to the host (`config::ATTACH_FROM_HOST`): 16 MiB and
/// 256 KiB where a rank has two or more threads, as measured on a 32-core
/// host (4-8 threads per rank: reading the peers' tensors won from 16-32
/// MiB, and for all_to_all blocks from 2 MiB). With one thread per rank,
/// the two ranks' user-space copies through shared memory run side by side
/// where a single-copy read is one thread's kernel copy, so reads must be
/// nearly as fast as copies to pay: on a 2-core VM they ran at 13 GB/s
/// against 45 GB/s for copies, and without them 16 MiB all_reduce was 2x
/// and 1-4 MiB all_to_all and scatter 1.3-2x faster; only single large
/// transfers still gained. Where reads are slower than [`READ_VS_COPY`]
/// of a copy (or cannot be measured): no collective reads, and single
/// readers from [`SLOW_SINGLE_READER_MIN`].
pub(super) fn host_attach_min(me: Rank, threads: usize) -> (usize, usize) {
    if threads >= 2 {
        return (ATTACH_MIN, SINGLE_READER_MIN);
    }
    match remote::read_and_copy_speed_once() {
        Some((read, copy)) if read >= READ_VS_COPY * copy => (ATTACH_MIN, SINGLE_READER_MIN),
        measured => {
            let speeds = measured.map_or("could not time reads through the kernel".to_string(), |(read, copy)| {
                format!("reads memory through the kernel (as from a peer) at {:.1} GB/s and copies it at {:.1} GB/s", read / 1e9, copy / 1e9)
            });
            log_at!(LogLevel::Info, "rank {me}: one thread per rank, which {speeds}: no collective reads peers' tensors (RUSTCCL_SHM_ATTACH_MIN_BYTES overrides)");
            (usize::MAX, SLOW_SINGLE_READER_MIN)
        }
    }
}

/// The staging area's size when left to the host: 2 MiB per thread of the
/// rank, 4 to 8 MiB. On the 16-core host (ping-pong one way, sends staged
/// up to 8 MiB against up to 4 MiB): 8 MiB messages took 234-318 us
/// instead of 448-532 with 2 ranks (8 threads each) and 417-461 instead of
/// 481-509 with 4 (4 threads), but 796-836 us instead of 650-720 with 8
/// ranks (2 threads), where 4 MiB still gained
/// (`benchmarks/results/2026-11-26-h200host-p2p-overlap/`).
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
pub(super) fn all_reduce_attach_min(attach_min: usize, local_ranks: usize) -> usize {
    attach_min.max(local_ranks.saturating_mul(4 << 20))
}

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
