//! Which transfers between ranks of one host read a peer's memory
//! through the kernel (single-copy) rather than copy through the shared
//! slots, when that is left to the host: the thresholds of [`Reads`] for
//! each collective and for sends, and how a scatter root splits the blocks
//! its receivers read. Every rank computes its own; the group takes the
//! largest ([`agreed_blocks`] follows from them), or the root decides and
//! says so.
#![forbid(unsafe_code)]

use crate::config::log_at;
use crate::config::{LogLevel, Setting, ShmConfig, MAX_ROOT_SHARE, NEVER};
use crate::types::Rank;

/// The collectives' single-copy threshold when the setting is left to the
/// host: [`ATTACH_MIN`] where a rank has two or
/// more threads, where reading the peers' tensors won for large transfers.
/// With one thread per rank, the two ranks' user-space copies through shared
/// memory run side by side where a single-copy read is one thread's kernel
/// copy, so reads must be nearly as fast as copies to pay: where they are
/// slower than [`READ_VS_COPY`] of a copy (or cannot be measured), no
/// collective reads (`usize::MAX`; blocks and sends: `Reads::slow`), except
/// all_reduce, reduce_scatter and reduce with many local ranks
/// ([`many_few_thread_ranks`], [`pushed_reduce_attach_min`]) and large
/// collectives between two ranks ([`PAIR_SLOW_READ_MIN`]). The
/// measurements: `docs/decisions/0004`.
fn host_attach_min(me: Rank, threads: usize, read_speed: &dyn Fn() -> Option<(f64, f64)>) -> usize {
    if threads >= 2 {
        return ATTACH_MIN;
    }
    match read_speed() {
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
            NEVER
        }
    }
}

/// One rank's single-copy thresholds (bytes); the group takes the largest
/// of each (`Attach::agreed`).
#[derive(Debug, Clone)]
pub struct Reads {
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
    /// one thread (`host_attach_min`): sends over [`SINGLE_READER_MIN`] are read
    /// by the receiver, not staged (`connect` makes no staging area), since both
    /// ring copies and staging cost the sender's one thread a copy the read
    /// saves. Blocks of all_to_all, gather and scatter are read over the
    /// single-reader threshold (`Attach::agreed`).
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
pub(super) fn reads_for(
    me: Rank,
    sizes: &ShmConfig,
    local_ranks: usize,
    threads: usize,
    shared: bool,
    read_speed: &dyn Fn() -> Option<(f64, f64)>,
) -> Reads {
    let n = local_ranks;
    let host = sizes.attach_min.is_auto();
    let attach = match sizes.attach_min {
        Setting::Auto if shared => SHARED_READ_MIN,
        Setting::Auto => host_attach_min(me, threads, read_speed),
        Setting::Fixed(set) => set,
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
    let slow = host && !shared && attach == NEVER;
    // Two such ranks read large buffers all the same: each then copies a
    // byte once, where the slots' algorithms hand every one over twice
    // through phases that both must reach ([`PAIR_SLOW_READ_MIN`]). A
    // collective's own setting wins over both.
    let pair = slow && n == 2;
    let per_op = |own: Setting<usize>, rule: usize| own.or_auto(|| if pair { rule.min(PAIR_SLOW_READ_MIN) } else { rule });
    let own = &sizes.op_attach_min;
    let all_reduce = per_op(own.all_reduce, all_reduce);
    let reduce_scatter = per_op(own.reduce_scatter, reduce_scatter);
    let reduce = per_op(own.reduce, reduce);
    let all_gather = per_op(own.all_gather, all_gather);
    let block = match sizes.block_min {
        Setting::Auto if shared && n > BLOCK_SLOT_RANKS => SHARED_BLOCK_READ_MIN,
        Setting::Auto if shared => SINGLE_READER_MIN,
        Setting::Auto => 0,
        Setting::Fixed(set) => set,
    };
    // Broadcast reads the root only with two or more threads a rank: with
    // one the pipelined copies stay faster even with shared tensors;
    // unless the root, idle otherwise, writes half of it
    // ([`PAIR_BROADCAST_READ_MIN`]).
    let broadcast = match sizes.broadcast_min {
        Setting::Auto if shared && threads > 1 => SHARED_BROADCAST_READ_MIN,
        Setting::Auto if slow && n == 2 && sizes.gather_push => PAIR_BROADCAST_READ_MIN,
        Setting::Auto => NEVER,
        Setting::Fixed(set) => set,
    };
    let single = sizes.single_min.or_auto(|| SINGLE_READER_MIN);
    // The sender, idle while its receiver reads, writes half where this
    // rank takes pushes.
    let split_send = sizes.split_send_min.or_auto(|| if sizes.gather_push { SPLIT_SEND_MIN } else { NEVER });
    Reads { attach, single, all_reduce, reduce_scatter, reduce, all_gather, block, broadcast, slow, split_send }
}

/// The largest scatter block a root splits with its receiver (the setting;
/// [`NEVER`]: any): [`SCATTER_SPLIT_MAX`]. Splitting lets the idle root
/// write part of a block while its receiver reads the rest; on large blocks
/// the root's threads, writing part of every block, become the slowest part
/// (`docs/decisions/0004`).
pub(super) fn scatter_split_max(sizes: &ShmConfig) -> usize {
    sizes.scatter_split_max.or_auto(|| SCATTER_SPLIT_MAX)
}

const SCATTER_SPLIT_MAX: usize = 2 << 20;

/// Of a block it splits, a scatter root writes the last 1 / this: the
/// setting, or half where the root has threads of its own for its solo
/// phases (`root_threads` over 1), else 1 / `local_ranks`, so that the root
/// with its one thread writes (n - 1) / n of a block, as much as each
/// receiver reads, and is no longer the slowest part; clamped to 2 ..=
/// `MAX_ROOT_SHARE` (`docs/decisions/0004`).
pub(super) fn scatter_root_share(sizes: &ShmConfig, local_ranks: usize, root_threads: usize) -> usize {
    let share = sizes.scatter_root_share.or_auto(|| if root_threads <= 1 { local_ranks } else { 2 });
    share.clamp(2, MAX_ROOT_SHARE)
}

/// Of each block pushed into it, a gather root reads the last 1 / this
/// from the sender's tensor itself (1: none; clamped to
/// `MAX_ROOT_SHARE`): the setting, or [`PAIR_GATHER_ROOT_SHARE`]
/// with 2 local ranks of one thread each, where the root otherwise only
/// copies its own half while the other pushes its half through the
/// kernel; else 1.
pub(super) fn gather_root_share(sizes: &ShmConfig, local_ranks: usize, threads: usize) -> usize {
    let share = sizes.gather_root_share.or_auto(|| if local_ranks == 2 && threads == 1 { PAIR_GATHER_ROOT_SHARE } else { 1 });
    share.min(MAX_ROOT_SHARE)
}

/// [`gather_root_share`] between 2 ranks of one thread: the root reads a
/// quarter of the other's block while that rank pushes the rest.
const PAIR_GATHER_ROOT_SHARE: usize = 4;

/// Rendezvous sends from this size are split between receiver and sender
/// where the receiver takes pushes ([`Reads::split_send`]): the sender, idle
/// while its receiver reads, writes part of the message. Staged sends (where
/// reads are fast, up to the staging area's size when it is free) are not:
/// for those, staging beat splitting (`docs/decisions/0004`).
const SPLIT_SEND_MIN: usize = 512 << 10;

/// Where a rank's tensors are shared (`arena.rs`, `RUSTCCL_SHM_TENSORS=1`)
/// and the thresholds are left to the host: the smallest collective (bytes
/// per rank) that reads peers' tensors, which then is a plain copy in user
/// space, not the kernel's (`docs/decisions/0004`).
const SHARED_READ_MIN: usize = 256 << 10;
/// The same for all_reduce, which reads every peer twice: it pays from a
/// larger size on.
const SHARED_ALL_REDUCE_READ_MIN: usize = 4 << 20;
/// The same for reduce with shared tensors on at most [`BLOCK_SLOT_RANKS`]
/// local ranks, where the pipelined slots keep up with reading until large
/// sizes (`docs/decisions/0004`).
const SHARED_FEW_RANKS_REDUCE_READ_MIN: usize = 16 << 20;
/// With shared tensors on more than [`BLOCK_SLOT_RANKS`] local ranks,
/// all_to_all / gather / scatter blocks over this size are read: many small
/// blocks through the slots cost more than one read each
/// (`docs/decisions/0004`); with fewer ranks, those over 256 KiB are read.
const SHARED_BLOCK_READ_MIN: usize = 32 << 10;
/// The same for broadcast (every rank reads the root's tensor), where a
/// rank has two or more threads; with one, the pipelined copies stay faster
/// (`docs/decisions/0004`).
const SHARED_BROADCAST_READ_MIN: usize = 1 << 20;

/// With shared tensors on a crowded host ([`crowded`]) all_gather reads
/// peers' tensors from this size (bytes per rank) on: below it, the
/// pipelined slots, which gain from the ranks' threads, are faster
/// (`docs/decisions/0004`).
const SHARED_CROWDED_ALL_GATHER_READ_MIN: usize = 16 << 20;
/// The same for all_reduce ([`SHARED_ALL_REDUCE_READ_MIN`] elsewhere).
const SHARED_CROWDED_ALL_REDUCE_READ_MIN: usize = 8 << 20;

/// Whether `local_ranks` ranks of `threads` threads each crowd the host's
/// memory when they all read peers' shared tensors at once: 8 or more local
/// ranks and 32 or more threads among them. The pipelined slots' copies gain
/// more from threads than the reads do, so on such hosts the slots stay
/// ahead to larger sizes (`docs/decisions/0004`).
fn crowded(local_ranks: usize, threads: usize) -> bool {
    local_ranks >= 8 && local_ranks * threads >= 32
}

/// The all_reduce's single-copy threshold when left to the host: with
/// [`many_few_thread_ranks`], [`MANY_ALL_REDUCE_READ_MIN`] (even where reads
/// are slow); else from 4 MiB per local rank (each rank then reads slices of
/// at least 4 MiB from each peer, twice), at least the collectives'
/// `attach_min`. The single-copy all_reduce reads every peer twice (its
/// reduce-scatter and its all-gather), and the kernel's reads of a few MiB
/// from one process do not get faster with more readers, so it pays later
/// than reduce and reduce_scatter, which read once (`docs/decisions/0004`).
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
/// [`MID_READ_THREADS`] threads each: there one read phase of many readers
/// beats the slots' copies from a few MiB, even where one thread reads
/// through the kernel more slowly than it copies; with fewer ranks or more
/// threads, the slots' copies keep up (`docs/decisions/0004`).
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
/// `attach_min`. The two-copy reduce leaves the root to copy every other
/// rank's part out of its slot alone while they wait; with pushes nobody
/// waits for one rank's copies. Where ranks have many threads, their two
/// copies outrun the kernel's reads up to larger sizes
/// (`docs/decisions/0004`).
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
/// other's (`collectives::shm::attach::broadcast`, where the root takes
/// pushes): both ranks' one thread copies, where the pipelined copies
/// through the root's slot move every byte twice, one copy on each; below
/// it, the pipelined copies are faster (`docs/decisions/0004`).
const PAIR_BROADCAST_READ_MIN: usize = 1 << 20;

/// Where reads are slow and a host has 2 local ranks (one thread each),
/// all_reduce, all_gather, reduce_scatter and reduce from this size read
/// the peer's tensor. The slots' algorithms move every byte twice, in
/// phases both ranks must reach: while the cores are taken each phase
/// waits out a scheduler slice, and where the ranks' caches lie apart
/// every byte the peer just wrote crosses twice. Below it, and for the
/// quiet all_reduce of a host in its fast state, the slots are as fast or
/// faster (`docs/decisions/0004`).
const PAIR_SLOW_READ_MIN: usize = 4 << 20;

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

/// Blocks from this size are read by their one reader: smaller ones cost
/// more in the system call and page pinning than the copy saves
/// (`docs/decisions/0004`).
pub const SINGLE_READER_MIN: usize = 256 << 10;

/// all_to_all / gather / scatter blocks up to this size go through the
/// senders' input slots where reads are fast (when they fit one: a slot
/// holds 2 MiB with 8 threads a rank, 1 MiB with 4; with 2 local ranks a
/// block may fill both, `collectives::shm::attach::block_max`) and the host
/// has at most [`BLOCK_SLOT_RANKS`] local ranks: there the threads' copies
/// through the slots beat the kernel's reads. With more ranks, every rank
/// copying twice at once is slower, and blocks over `single_min` are read
/// (`docs/decisions/0004`).
pub const BLOCK_READ_MIN: usize = 2 << 20;
/// The most local ranks for which [`BLOCK_READ_MIN`] applies.
pub const BLOCK_SLOT_RANKS: usize = 4;
/// [`BLOCK_READ_MIN`] for a host with 2 local ranks where reads are fast:
/// blocks up to 4 MiB go through the sender's two input slots (2 MiB each
/// with 8 threads a rank, one block filling both), taken together, which
/// beats the kernel's reads and writes (`docs/decisions/0004`).
pub const PAIR_FAST_BLOCK_READ_MIN: usize = 4 << 20;
/// Scatter blocks over this size are read where no collective reads (one
/// thread a rank, reads slower than copies) and the host has more than
/// [`MANY_SLOW_RANKS`] local ranks: through the root's slots its one thread
/// copies every block, where reads spread them over the receivers
/// (`docs/decisions/0004`).
pub const SLOW_MANY_SCATTER_BLOCK_READ_MIN: usize = 16 << 10;
/// See [`SLOW_MANY_SCATTER_BLOCK_READ_MIN`].
pub const MANY_SLOW_RANKS: usize = 8;
/// Gather blocks over this size are pushed into the root's buffer by their
/// senders (`RUSTCCL_SHM_GATHER_PUSH`; read by the root where it takes no
/// pushes) under the same conditions as [`SLOW_MANY_SCATTER_BLOCK_READ_MIN`]:
/// as messages through the rings the root's one thread copies every block.
/// Smaller blocks gain nothing: many senders writing into one process
/// through the kernel at once contend (`docs/decisions/0004`).
pub const SLOW_MANY_GATHER_BLOCK_READ_MIN: usize = 64 << 10;

/// A collective threshold this large (1 TiB) means that no collective
/// reads peers' tensors: where reads are slow, the host's rule.
pub const NO_COLLECTIVE_READS: usize = 1 << 40;

/// The block thresholds every local rank applies, from the largest each
/// rank published: `block_set` (0: left to rustccl), the collectives'
/// `min_bytes` and the single readers' `single_min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockReads {
    pub block_min: usize,
    pub scatter_block_min: usize,
    pub gather_block_min: usize,
}

/// See [`BlockReads`]; `local_ranks` of this host.
pub fn agreed_blocks(block_set: usize, min_bytes: usize, single_min: usize, local_ranks: usize) -> BlockReads {
    let reads = min_bytes < NO_COLLECTIVE_READS;
    let block_min = match block_set {
        0 if reads && local_ranks == 2 => PAIR_FAST_BLOCK_READ_MIN.max(single_min),
        0 if reads && local_ranks <= BLOCK_SLOT_RANKS => BLOCK_READ_MIN.max(single_min),
        // Where no collective reads (one thread a rank, reads slower than
        // copies: `host_attach_min`), blocks over `single_min` are read
        // all the same (or a gather's pushed): that spreads a gather's or
        // scatter's copies over every rank, where shared memory leaves
        // them all to the root (`docs/decisions/0004`).
        0 => single_min,
        set => set,
    };
    let slow_many = block_set == 0 && !reads && local_ranks > MANY_SLOW_RANKS;
    BlockReads {
        block_min,
        scatter_block_min: if slow_many { SLOW_MANY_SCATTER_BLOCK_READ_MIN.min(block_min) } else { block_min },
        gather_block_min: if slow_many { SLOW_MANY_GATHER_BLOCK_READ_MIN.min(block_min) } else { block_min },
    }
}

#[cfg(test)]
mod tests {
    use super::{
        all_reduce_attach_min, gather_root_share, pushed_reduce_attach_min, reduce_scatter_attach_min, scatter_root_share, ATTACH_MIN,
    };
    use crate::config::{Config, Setting, ShmConfig};

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
    fn a_collectives_own_threshold_wins_over_the_shared_one_and_the_hosts_rule_and_leaves_the_others() {
        use super::{reads_for, NEVER};
        use crate::config::OpAttach;
        let auto = OpAttach::AUTO;
        let host = ShmConfig { attach_min: Setting::Auto, op_attach_min: auto, gather_push: false, ..Config::get().shm };
        // one thread a rank, reads through the kernel at half the speed of
        // a copy: no collective reads
        let slow = || Some((1e9, 2e9));
        let r = reads_for(0, &host, 3, 1, false, &slow);
        assert_eq!((r.all_reduce, r.all_gather, r.reduce_scatter, r.reduce, r.slow), (NEVER, NEVER, NEVER, NEVER, true));
        let own = ShmConfig { op_attach_min: OpAttach { all_gather: Setting::Fixed(1 << 20), ..auto }, ..host };
        let r = reads_for(0, &own, 3, 1, false, &slow);
        assert_eq!((r.all_reduce, r.all_gather, r.reduce_scatter, r.reduce, r.attach, r.slow), (NEVER, 1 << 20, NEVER, NEVER, NEVER, true));
        // over a shared threshold set by hand, and "off" too
        let both = ShmConfig {
            attach_min: Setting::Fixed(64 << 10),
            op_attach_min: OpAttach { all_reduce: Setting::Fixed(NEVER), reduce: Setting::Fixed(8 << 20), ..auto },
            ..host
        };
        let r = reads_for(0, &both, 2, 1, false, &slow);
        assert_eq!((r.all_reduce, r.all_gather, r.reduce_scatter, r.reduce), (NEVER, 64 << 10, 64 << 10, 8 << 20));
    }

    #[test]
    fn two_ranks_of_one_thread_whose_reads_are_slow_read_from_4_mib_in_the_four_collectives_unless_set() {
        use super::{reads_for, NEVER, PAIR_SLOW_READ_MIN};
        use crate::config::OpAttach;
        let host = ShmConfig { attach_min: Setting::Auto, op_attach_min: OpAttach::AUTO, gather_push: true, ..Config::get().shm };
        let (slow, fast) = (|| Some((1e9, 2e9)), || Some((2e9, 2e9)));
        let r = reads_for(0, &host, 2, 1, false, &slow);
        let m = PAIR_SLOW_READ_MIN;
        assert_eq!((r.all_reduce, r.all_gather, r.reduce_scatter, r.reduce, r.attach, r.slow), (m, m, m, m, NEVER, true));
        // fast reads keep the host's thresholds; 3 slow ranks read none
        let r = reads_for(0, &host, 2, 1, false, &fast);
        assert!(!r.slow && r.all_gather > m && r.all_reduce > m);
        assert_eq!(reads_for(0, &host, 3, 1, false, &slow).all_gather, NEVER);
        // a setting wins: the shared one, or the op's own
        let set = ShmConfig { attach_min: Setting::Fixed(NEVER - 1), ..host };
        assert_eq!(reads_for(0, &set, 2, 1, false, &slow).all_gather, NEVER - 1);
        let own = ShmConfig { op_attach_min: OpAttach { reduce: Setting::Fixed(NEVER), ..OpAttach::AUTO }, ..host };
        let r = reads_for(0, &own, 2, 1, false, &slow);
        assert_eq!((r.reduce, r.all_gather), (NEVER, m));
    }

    #[test]
    fn a_scatter_root_of_one_thread_writes_1_over_n_of_a_block_others_half_unless_set() {
        let host = ShmConfig { scatter_root_share: Setting::Auto, ..Config::get().shm };
        // 16 ranks on 16 cores (root 1 thread): 1/16; 8 ranks on 16 cores
        // (root 8): half; the 2-core VM's 2 ranks (root 1): half; 3 ranks
        // of one thread: a third; 64 ranks of one: the header's limit
        assert_eq!((scatter_root_share(&host, 16, 1), scatter_root_share(&host, 8, 8), scatter_root_share(&host, 2, 1)), (16, 2, 2));
        assert_eq!((scatter_root_share(&host, 3, 1), scatter_root_share(&host, 64, 1)), (3, 31));
        // a setting wins, clamped to 2..=31
        let set = |v| ShmConfig { scatter_root_share: Setting::Fixed(v), ..host };
        assert_eq!((scatter_root_share(&set(4), 16, 1), scatter_root_share(&set(1), 2, 8), scatter_root_share(&set(99), 8, 8)), (4, 2, 31));
    }

    #[test]
    fn a_gather_root_reads_a_quarter_of_the_pushed_block_with_2_one_thread_ranks_else_none_unless_set() {
        let host = ShmConfig { gather_root_share: Setting::Auto, ..Config::get().shm };
        assert_eq!(
            (
                gather_root_share(&host, 2, 1),
                gather_root_share(&host, 2, 2),
                gather_root_share(&host, 3, 1),
                gather_root_share(&host, 16, 1)
            ),
            (4, 1, 1, 1)
        );
        let set = |v| ShmConfig { gather_root_share: Setting::Fixed(v), ..host };
        assert_eq!((gather_root_share(&set(1), 2, 1), gather_root_share(&set(3), 16, 1), gather_root_share(&set(99), 8, 8)), (1, 3, 31));
    }

    #[test]
    fn blocks_go_through_slots_up_to_4_mib_with_2_ranks_2_mib_with_3_to_4_where_reads_are_fast() {
        use super::{agreed_blocks, BlockReads, NO_COLLECTIVE_READS, SINGLE_READER_MIN};
        let fast = |n| agreed_blocks(0, ATTACH_MIN, SINGLE_READER_MIN, n).block_min;
        assert_eq!((fast(2), fast(3), fast(4), fast(5)), (4 << 20, 2 << 20, 2 << 20, SINGLE_READER_MIN));
        // slow reads: single readers' threshold; with more than 8 ranks
        // scatter reads and gather pushes smaller blocks
        let slow = |n| agreed_blocks(0, NO_COLLECTIVE_READS, SINGLE_READER_MIN, n);
        assert_eq!(
            slow(4),
            BlockReads { block_min: SINGLE_READER_MIN, scatter_block_min: SINGLE_READER_MIN, gather_block_min: SINGLE_READER_MIN }
        );
        assert_eq!(slow(9), BlockReads { block_min: SINGLE_READER_MIN, scatter_block_min: 16 << 10, gather_block_min: 64 << 10 });
        // a setting wins everywhere
        assert_eq!(agreed_blocks(1 << 20, NO_COLLECTIVE_READS, SINGLE_READER_MIN, 16).scatter_block_min, 1 << 20);
    }
}
