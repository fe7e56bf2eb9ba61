//! Which transfers between ranks of one host read a peer's memory
//! through the kernel (single-copy) rather than copy through the shared
//! slots, when that is left to the host: the thresholds of [`Reads`] for
//! each collective and for sends, and how a scatter root splits the blocks
//! its receivers read. Every rank computes its own; the group takes the
//! largest (`Attach::agreed`), or the root decides and says so.
#![forbid(unsafe_code)]

use super::{remote, ATTACH_FROM_HOST, BLOCK_SLOT_RANKS, SINGLE_READER_MIN};
use crate::config::log_at;
use crate::config::{LogLevel, ShmConfig, BROADCAST_FROM_HOST, MAX_ROOT_SHARE, SPLIT_FROM_HOST};
use crate::types::Rank;

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
/// blocks and sends: `Reads::slow`), except all_reduce, reduce_scatter and
/// reduce with many local ranks ([`many_few_thread_ranks`],
/// [`pushed_reduce_attach_min`]).
fn host_attach_min(me: Rank, threads: usize) -> usize {
    if threads >= 2 {
        return ATTACH_MIN;
    }
    match remote::read_and_copy_speed_once() {
        Some((read, copy)) if read >= READ_VS_COPY * copy => ATTACH_MIN,
        measured => {
            let speeds = measured.map_or("could not time reads through the kernel".to_string(), |(read, copy)| {
                format!(
                    "reads memory through the kernel (as from a peer) at {:.1} GB/s and copies it at {:.1} GB/s",
                    read / 1e9,
                    copy / 1e9
                )
            });
            log_at!(LogLevel::Info, "rank {me}: one thread per rank, which {speeds}: no collective reads peers' tensors, but with more than {MANY_LOCAL_RANKS} local ranks all_reduce, reduce_scatter and reduce (RUSTCCL_SHM_ATTACH_MIN_BYTES overrides)");
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
    pub reduce_scatter: usize,
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
        all_reduce_attach_min(attach, n, threads)
    };
    let reduce_scatter = if host && !shared { reduce_scatter_attach_min(attach, n, threads) } else { attach };
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
    Reads { attach, single, all_reduce, reduce_scatter, reduce, all_gather, block, broadcast, slow, split_send }
}

/// The largest scatter block a root splits with its receiver (the
/// setting; `usize::MAX`: any): 2 MiB. On the 64-core host (settings
/// alternating twice) splitting made 8 MiB scatters 0.80x / 0.82x the
/// time with 8 / 4 ranks (1 / 2 MiB blocks), but 32 MiB ones (4 / 8 MiB
/// blocks) 1.58 / 1.8x longer: there the root's threads, writing half of
/// every block, are the slowest part
/// (`docs/decisions/0004`).
pub(super) fn scatter_split_max(sizes: ShmConfig) -> usize {
    match sizes.scatter_split_max {
        0 => SCATTER_SPLIT_MAX,
        set => set,
    }
}

const SCATTER_SPLIT_MAX: usize = 2 << 20;

/// Of a block it splits, a scatter root writes the last 1 / this: the
/// setting, or half where the root has threads of its own for its solo
/// phases (`root_threads` over 1), else 1 / `local_ranks`, so that the
/// root with its one thread writes (n - 1) / n of a block, as much as each
/// receiver reads; clamped to 2 ..= `MAX_ROOT_SHARE`. On the
/// 16-core host with 16 ranks (a thread each, settings alternating twice)
/// the root writing half of every block was the slowest part: 1 / 16 made
/// 32 MiB scatters 0.24x the time (2.4x -> 9.6x gloo), not splitting at
/// all 0.21x, 1 / 4 0.45x; at 8 MiB 1 / 4 and no split 0.56-0.61x. With 8
/// ranks of 2 threads (root 8) 1 / 8, 1 / 4 and no split were all within
/// 0.92-1.2x of half at 512 KiB - 32 MiB, 4 ranks' 1 / 4 within
/// 1.0-1.15x (`docs/decisions/0004`).
pub(super) fn scatter_root_share(sizes: ShmConfig, local_ranks: usize, root_threads: usize) -> usize {
    let share = match sizes.scatter_root_share {
        0 if root_threads <= 1 => local_ranks,
        0 => 2,
        set => set,
    };
    share.clamp(2, MAX_ROOT_SHARE)
}

/// Of each block pushed into it, a gather root reads the last 1 / this
/// from the sender's tensor itself (1: none; clamped to
/// `MAX_ROOT_SHARE`): the setting, or [`PAIR_GATHER_ROOT_SHARE`]
/// with 2 local ranks of one thread each, where the root otherwise only
/// copies its own half while the other pushes its half through the
/// kernel; else 1.
pub(super) fn gather_root_share(sizes: ShmConfig, local_ranks: usize, threads: usize) -> usize {
    let share = match sizes.gather_root_share {
        0 if local_ranks == 2 && threads == 1 => PAIR_GATHER_ROOT_SHARE,
        0 => 1,
        set => set,
    };
    share.min(MAX_ROOT_SHARE)
}

/// [`gather_root_share`] between 2 ranks of one thread: the root reads a
/// quarter of the other's block while that rank pushes the rest.
const PAIR_GATHER_ROOT_SHARE: usize = 4;

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
/// (`docs/decisions/0004`).
const SPLIT_SEND_MIN: usize = 512 << 10;

/// Where a rank's tensors are shared (`arena.rs`, `RUSTCCL_SHM_TENSORS=1`)
/// and the thresholds are left to the host: the smallest collective (bytes
/// per rank) that reads peers' tensors. On the 16-core host reading shared
/// tensors made 1-16 MiB reduce_scatter 1.1-2x faster than the slots with
/// 4 and 8 ranks, reduce 1.2-1.7x with 8 (but 1.2-1.3x slower with 4 at
/// 1-4 MiB), all_gather 1.0-1.25x with 8 (0.8-1.0x with 4)
/// (`docs/decisions/0004`).
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
/// 32-core one (`docs/decisions/0004`);
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
/// (`docs/decisions/0004`).
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

/// The all_reduce's single-copy threshold when left to the host: with
/// [`many_few_thread_ranks`], [`MANY_ALL_REDUCE_READ_MIN`] (even where
/// reads are slow); else from 4 MiB per local rank (each rank then reads
/// slices of at least 4 MiB from each peer, twice), at least the
/// collectives' `attach_min`. The
/// single-copy all_reduce reads every peer twice (its reduce-scatter and
/// its all-gather), and the kernel's reads of a few MiB from one process
/// do not get faster with more readers: on the 16-core host with 8 ranks,
/// 16 MiB all_reduce took 4480-5237 us with two copies and 6596-6794 us
/// reading (32 MiB: even), while reduce and reduce_scatter (one read
/// phase) were 1.1-1.3x faster reading from 16 MiB; on the 64-core host
/// with 8 ranks the same (2308-2672 against 3696-3959 us at 16 MiB).
fn all_reduce_attach_min(attach_min: usize, local_ranks: usize, threads: usize) -> usize {
    if many_few_thread_ranks(local_ranks, threads) {
        return MANY_ALL_REDUCE_READ_MIN;
    }
    attach_min.max(local_ranks.saturating_mul(4 << 20))
}

/// The reduce_scatter's single-copy threshold when left to the host: with
/// [`many_few_thread_ranks`], from [`MANY_REDUCE_SCATTER_READ_MIN`] (even
/// where reads are slow), else the collectives' `attach_min`.
fn reduce_scatter_attach_min(attach_min: usize, local_ranks: usize, threads: usize) -> usize {
    if many_few_thread_ranks(local_ranks, threads) {
        return attach_min.min(MANY_REDUCE_SCATTER_READ_MIN);
    }
    attach_min
}

/// More than [`MANY_LOCAL_RANKS`] local ranks of at most
/// [`MID_READ_THREADS`] threads each: there one read phase of many
/// readers beats the slots' copies from a few MiB, even where one thread
/// reads through the kernel more slowly than it copies. Settings
/// alternating in one process against the old thresholds (16 MiB
/// reduce_scatter, 64 MiB all_reduce; never with one-thread ranks whose
/// reads are slow), forty-fifth session
/// (`docs/decisions/0004`):
/// - 16 ranks of 2 threads (32-core host), three sweeps: reading made
///   8 MiB reduce_scatters 0.66-0.70x the time, 16 / 32 MiB all_reduces
///   0.70-0.78x / 0.80-0.86x; 8 MiB all_reduces 0.75-0.98x, 4 MiB ones
///   1.30-1.35x longer, 4 MiB reduce_scatters 0.73-1.11x; with the rule,
///   against the old thresholds: 16 / 32 MiB all_reduces 1.18-1.29x
///   faster, 8 MiB reduce_scatters 1.28 / 1.50x; 12 ranks of 2 threads:
///   32 MiB all_reduces 1.16 / 1.21x;
/// - 16 ranks of one thread (16-core host, where one thread reads slower
///   than it copies), one quiet sweep: reduce_scatters of 4-32 MiB
///   0.67-0.86x, all_reduces 0.87-0.96x; with the rule, two sweeps:
///   8 MiB reduce_scatters 1.36 / 1.51x faster, all_reduces even
///   (0.97-1.08x);
/// - 8 ranks (2 threads on the 16-core host, 4 on the 32-core one):
///   all_reduces below 16 MiB 0.93-1.70x, 8 MiB reduce_scatters
///   0.81-0.95x on the 32-core host but 0.84 / 1.16x on the 16-core one;
///   they keep the old thresholds, as do 16 ranks of 4 threads (64-core
///   host, unmeasured) and 10 ranks of 3 (32-core host: one sweep,
///   16 / 32 MiB all_reduces 0.81 / 0.75x reading, 8 MiB reduce_scatters
///   1.06x).
fn many_few_thread_ranks(local_ranks: usize, threads: usize) -> bool {
    local_ranks > MANY_LOCAL_RANKS && threads <= MID_READ_THREADS
}

/// See [`many_few_thread_ranks`].
const MANY_LOCAL_RANKS: usize = 8;
/// See [`many_few_thread_ranks`].
const MANY_ALL_REDUCE_READ_MIN: usize = 16 << 20;
/// See [`many_few_thread_ranks`].
const MANY_REDUCE_SCATTER_READ_MIN: usize = 8 << 20;

/// The reduce's single-copy threshold when left to the host, where its
/// root takes the others' parts as pushes (`RUSTCCL_SHM_GATHER_PUSH`, no
/// shared tensors): from [`PUSHED_REDUCE_MANY_READ_MIN`] with more than 8
/// local ranks, even where reads are slow (`attach_min` is not
/// [`ATTACH_MIN`]: no other collective reads); where they are fast, from
/// [`PUSHED_REDUCE_MID_READ_MIN`] with 5-8 local ranks of at most
/// [`MID_READ_THREADS`] threads each, from [`PUSHED_REDUCE_READ_MIN`] with
/// 5-8 of more threads and with 3-4 of at most [`FEW_THREADS`]; else
/// `attach_min`. The
/// two-copy reduce leaves the root to copy every other rank's part out
/// of its slot alone while they wait; with pushes nobody waits for one
/// rank's copies. On the 64-core host (settings alternating, reading from
/// 512 KiB against the default) reading with pushes made 8-rank reduces of
/// 8 MiB 0.76x the time but 512 KiB / 2 MiB ones 1.45 / 1.23x longer (two
/// runs), 16-rank ones of 512 KiB - 32 MiB 0.60-0.93x (one run), 4-rank
/// ones 1.13-1.49x longer below 32 MiB; reading without pushes (the root
/// reads every part) took 1.2-2x as long as with them at every size
/// (`docs/decisions/0004`). Those 4 ranks had
/// 8 threads each, whose two copies outran the kernel's; with 4 threads
/// (16-core host, reading from 1 MiB against the default, alternating
/// twice) 8 MiB reduces took 0.81x the time reading (4.1x -> 5.1x gloo),
/// 2 MiB ones 1.36x longer
/// (`docs/decisions/0004`). With 16
/// ranks of one thread on the 16-core host, where a rank's reads through
/// the kernel are slower than its copies, reading with pushes made 2-32 MiB
/// reduces 0.55-0.88x the time (8 MiB 2.2x -> 3.8x gloo), 512 KiB even,
/// against the two copies that leave the root's one thread to copy every
/// part out (settings alternating twice, reading from 512 KiB and 2 MiB,
/// and from 8 MiB in another call: 0.50 / 0.65x at 8 / 32 MiB;
/// `docs/decisions/0004`). With 8 ranks of 2
/// threads on the 16-core host, reading made 4 MiB reduces 0.74-0.96x the
/// time in all seven alternations of two calls (2.6x -> 3.0x gloo), 2 MiB
/// ones 1.08-1.41x longer
/// (`docs/decisions/0004`); 8 ranks of 4 threads (32-core host) keep
/// 8 MiB: reading from 4 MiB made 4 MiB reduces 1.25x longer, timed in one
/// process against the default and an A/A group (1.05x) in two quiet
/// sweeps (`docs/decisions/0004`;
/// separate sweeps under steal had given 0.41-1.96x); ranks of 8 threads
/// are unmeasured and keep 8 MiB too; ranks of one thread whose reads are
/// fast take 4 MiB unmeasured (on the hosts measured, one-thread ranks read
/// slowly).
fn pushed_reduce_attach_min(attach_min: usize, local_ranks: usize, threads: usize) -> usize {
    match local_ranks {
        n if n > MANY_LOCAL_RANKS => PUSHED_REDUCE_MANY_READ_MIN,
        _ if attach_min != ATTACH_MIN => attach_min,
        n if n > BLOCK_SLOT_RANKS && threads <= MID_READ_THREADS => PUSHED_REDUCE_MID_READ_MIN,
        n if n > BLOCK_SLOT_RANKS => PUSHED_REDUCE_READ_MIN,
        n if n > 2 && threads <= FEW_THREADS => PUSHED_REDUCE_READ_MIN,
        _ => attach_min,
    }
}

/// See [`pushed_reduce_attach_min`].
const FEW_THREADS: usize = 4;
/// See [`pushed_reduce_attach_min`].
const MID_READ_THREADS: usize = 2;

/// Where reads are slow and a host has 2 local ranks, broadcasts from this
/// size read the root's tensor, the root writing the second half into the
/// other's (`collectives::shm_attach::broadcast`, where the root takes
/// pushes): both ranks' one thread copies, where the pipelined copies
/// through the root's slot move every byte twice, one copy on each. On the
/// 2-core VM (settings alternating) 2-32 MiB broadcasts took 0.46-0.69x the
/// time of the pipelined ones (two runs) and 1 MiB 0.77x, 128-512 KiB
/// 1.3-2x longer (three runs); reading the whole buffer without the
/// root's half took 1.03-1.3x longer at 2-32 MiB
/// (`docs/decisions/0004`).
const PAIR_BROADCAST_READ_MIN: usize = 1 << 20;

/// See [`pushed_reduce_attach_min`].
const PUSHED_REDUCE_READ_MIN: usize = 8 << 20;
/// See [`pushed_reduce_attach_min`].
const PUSHED_REDUCE_MID_READ_MIN: usize = 4 << 20;
/// See [`pushed_reduce_attach_min`].
const PUSHED_REDUCE_MANY_READ_MIN: usize = 512 << 10;

/// The default single-copy threshold where reads pay.
const ATTACH_MIN: usize = 16 << 20;
/// How fast a read through the kernel must be, as a fraction of a copy,
/// for one thread per rank to read peers' tensors.
const READ_VS_COPY: f64 = 0.8;

#[cfg(test)]
mod tests {
    use super::{
        all_reduce_attach_min, gather_root_share, pushed_reduce_attach_min, reduce_scatter_attach_min, scatter_root_share, ATTACH_MIN,
    };
    use crate::config::{Config, ShmConfig};

    #[test]
    fn more_than_8_ranks_of_at_most_2_threads_read_from_16_mib_in_all_reduce_and_8_mib_in_reduce_scatter_even_where_reads_are_slow() {
        let ar = |attach, n, threads| all_reduce_attach_min(attach, n, threads);
        let rs = |attach, n, threads| reduce_scatter_attach_min(attach, n, threads);
        // 16 ranks of 1 or 2 threads, reads fast or slow; 9 ranks
        assert_eq!(
            (ar(ATTACH_MIN, 16, 2), ar(ATTACH_MIN, 16, 1), ar(usize::MAX, 16, 1), ar(ATTACH_MIN, 9, 2)),
            (16 << 20, 16 << 20, 16 << 20, 16 << 20)
        );
        assert_eq!(
            (rs(ATTACH_MIN, 16, 2), rs(ATTACH_MIN, 16, 1), rs(usize::MAX, 16, 1), rs(ATTACH_MIN, 9, 2)),
            (8 << 20, 8 << 20, 8 << 20, 8 << 20)
        );
        // a smaller collectives' threshold stays
        assert_eq!(rs(1 << 20, 16, 2), 1 << 20);
        // 16 ranks of 4 threads, and 8 ranks: 4 MiB per rank for
        // all_reduce (at least the collectives'), the collectives' for
        // reduce_scatter; nothing where reads are slow
        assert_eq!(
            (ar(ATTACH_MIN, 16, 4), ar(ATTACH_MIN, 8, 2), ar(ATTACH_MIN, 2, 8), ar(usize::MAX, 8, 1)),
            (64 << 20, 32 << 20, ATTACH_MIN, usize::MAX)
        );
        assert_eq!((rs(ATTACH_MIN, 16, 4), rs(ATTACH_MIN, 8, 2), rs(usize::MAX, 8, 1)), (ATTACH_MIN, ATTACH_MIN, usize::MAX));
    }

    #[test]
    fn a_reduce_with_pushes_reads_from_4_or_8_mib_with_5_to_8_ranks_or_3_to_4_of_few_threads_and_512_kib_with_more_even_where_reads_are_slow(
    ) {
        let at = |n, threads| pushed_reduce_attach_min(ATTACH_MIN, n, threads);
        assert_eq!(
            (at(2, 8), at(4, 8), at(5, 8), at(8, 8), at(9, 8), at(16, 8)),
            (ATTACH_MIN, ATTACH_MIN, 8 << 20, 8 << 20, 512 << 10, 512 << 10)
        );
        // 5-8 ranks of up to 2 threads read from 4 MiB
        assert_eq!((at(5, 2), at(8, 1), at(8, 2), at(8, 3), at(9, 2)), (4 << 20, 4 << 20, 4 << 20, 8 << 20, 512 << 10));
        // 3-4 ranks of up to 4 threads read from 8 MiB; 2 ranks do not
        assert_eq!((at(2, 4), at(3, 4), at(4, 4), at(4, 2), at(4, 5)), (ATTACH_MIN, 8 << 20, 8 << 20, 8 << 20, ATTACH_MIN));
        // slow reads (no other collective reads): more than 8 ranks read
        // from 512 KiB as well, fewer not at all
        assert_eq!((pushed_reduce_attach_min(usize::MAX, 16, 1), pushed_reduce_attach_min(usize::MAX, 9, 1)), (512 << 10, 512 << 10));
        assert_eq!(
            (
                pushed_reduce_attach_min(usize::MAX, 8, 1),
                pushed_reduce_attach_min(usize::MAX, 4, 1),
                pushed_reduce_attach_min(usize::MAX, 2, 1)
            ),
            (usize::MAX, usize::MAX, usize::MAX)
        );
    }

    #[test]
    fn a_scatter_root_of_one_thread_writes_1_over_n_of_a_block_others_half_unless_set() {
        let host = ShmConfig { scatter_root_share: 0, ..Config::get().shm };
        // 16 ranks on 16 cores (root 1 thread): 1/16; 8 ranks on 16 cores
        // (root 8): half; the 2-core VM's 2 ranks (root 1): half; 3 ranks
        // of one thread: a third; 64 ranks of one: the header's limit
        assert_eq!((scatter_root_share(host, 16, 1), scatter_root_share(host, 8, 8), scatter_root_share(host, 2, 1)), (16, 2, 2));
        assert_eq!((scatter_root_share(host, 3, 1), scatter_root_share(host, 64, 1)), (3, 31));
        // a setting wins, clamped to 2..=31
        let set = |v| ShmConfig { scatter_root_share: v, ..host };
        assert_eq!((scatter_root_share(set(4), 16, 1), scatter_root_share(set(1), 2, 8), scatter_root_share(set(99), 8, 8)), (4, 2, 31));
    }

    #[test]
    fn a_gather_root_reads_a_quarter_of_the_pushed_block_with_2_one_thread_ranks_else_none_unless_set() {
        let host = ShmConfig { gather_root_share: 0, ..Config::get().shm };
        assert_eq!(
            (gather_root_share(host, 2, 1), gather_root_share(host, 2, 2), gather_root_share(host, 3, 1), gather_root_share(host, 16, 1)),
            (4, 1, 1, 1)
        );
        let set = |v| ShmConfig { gather_root_share: v, ..host };
        assert_eq!((gather_root_share(set(1), 2, 1), gather_root_share(set(3), 16, 1), gather_root_share(set(99), 8, 8)), (1, 3, 31));
    }
}
