//! The shared-memory transport's sizes, threads and spinning where the
//! settings leave them to rustccl: pure functions of the settings, the
//! group (local ranks) and the host ([`HostFacts`]), gathered by
//! [`choose`] (the single-copy thresholds: `reads.rs`).
#![forbid(unsafe_code)]

use std::time::Duration;

use super::reads::{gather_root_share, reads_for, scatter_root_share, scatter_split_max, Reads};
use super::HostFacts;
use crate::config::{Setting, ShmConfig};
use crate::types::Rank;

/// Everything the shared-memory transport takes from the settings and the
/// rules, for one rank of a group with `local_ranks` on this host.
#[derive(Debug, Clone)]
pub struct ShmChoice {
    pub threads: usize,
    pub root_threads: usize,
    /// Smallest piece the rank's workers split off (reductions take half).
    pub min_piece: usize,
    pub spin: Duration,
    /// A fixed polling window; None: the adaptive one (`WaitWindow`).
    pub wait_spin: Option<Duration>,
    pub quick_threads: usize,
    pub quick_leads: bool,
    pub quick_bytes: usize,
    pub quick_min_piece: usize,
    pub quick_all_to_all_bytes: usize,
    /// Each small slot's size, and the one-round all-reduce limit.
    pub small_bytes: usize,
    pub one_round_max: usize,
    pub slot_bytes: usize,
    /// The staging area's size before the group's agreement (0: none).
    pub stage_bytes: usize,
    pub reads: Reads,
    pub scatter_split_max: usize,
    pub scatter_root_share: usize,
    pub gather_root_share: usize,
}

/// The choices of rank `me` among `local_ranks` ranks of this host:
/// `shared`, whether its tensors live in the shared arena; `read_speed`
/// times a read through the kernel against a copy (bytes/s each), called
/// only where the rule needs it.
pub fn choose(
    me: Rank,
    sizes: &ShmConfig,
    host: HostFacts,
    local_ranks: usize,
    shared: bool,
    read_speed: &dyn Fn() -> Option<(f64, f64)>,
) -> ShmChoice {
    let n = local_ranks;
    let threads = threads_for(sizes, n, host.cores);
    let root_threads = root_threads_for(sizes, n, threads, host.cores);
    let min_piece = sizes.min_piece.or_auto(|| MIN_PIECE.min(sizes.segment_bytes));
    let quick_leads = quick_leads_for(sizes.quick_leads, n);
    let quick_threads = quick_threads_for(sizes, n, threads, quick_leads, host.cores);
    let quick_bytes = sizes.quick_bytes.or_auto(|| QUICK_BYTES_PER_THREAD);
    // Where the quick team leads the larger phases, all_to_all's copies
    // need no limit of their own.
    let team_leads = quick_leads && quick_threads >= 2;
    let quick_all_to_all_bytes =
        sizes.quick_all_to_all_bytes.or_auto(|| if team_leads { quick_bytes } else { QUICK_ALL_TO_ALL_BYTES_PER_THREAD });
    let one_round_max = one_round_max(sizes.small_bytes, n, host.l2_bytes);
    let reads = reads_for(me, sizes, n, threads, shared, read_speed);
    // No staging area where nothing is read: staged sends replace reads.
    let stage_bytes = match sizes.staged_max {
        _ if sizes.attach_off() => 0,
        Setting::Auto if reads.slow => 0,
        Setting::Auto => stage_for(threads),
        Setting::Fixed(set) => set,
    };
    ShmChoice {
        threads,
        root_threads,
        min_piece,
        spin: spin_for(sizes, n, threads, host.cores),
        wait_spin: sizes.wait_spin_us.fixed().map(|us| Duration::from_micros(us as u64)),
        quick_threads,
        quick_leads,
        quick_bytes,
        quick_min_piece: sizes.quick_min_piece.or_auto(|| QUICK_MIN_PIECE.min(min_piece)),
        quick_all_to_all_bytes,
        small_bytes: sizes.small_bytes.or_auto(|| one_round_max.max(SMALL_SLOT)),
        one_round_max,
        slot_bytes: slot_bytes_for(sizes, n, threads),
        stage_bytes,
        scatter_split_max: scatter_split_max(sizes),
        scatter_root_share: scatter_root_share(sizes, n, root_threads),
        gather_root_share: gather_root_share(sizes, n, threads),
        reads,
    }
}

/// Largest gather or scatter block that goes through the small slots in
/// one step (`collectives::shm::one_round`) where the rings would take it
/// otherwise (reads are slow: `Window::one_round_blocks`): every rank
/// writes, publishes, waits for the rest and reads, where the rings let
/// a receiver copy a message out while its sender still writes it
/// (`docs/decisions/0004`).
pub const ONE_ROUND_BLOCK_MAX: usize = 2 << 10;

/// Below this many bytes per thread the pool is not started (unless the
/// shared-memory segment setting is smaller, as in tests): waking sleeping
/// threads costs about as long as one core needs to copy a piece this
/// size (`docs/decisions/0004`).
pub const MIN_PIECE: usize = 256 << 10;

/// Bytes a phase may hold per thread of a quick team to run there, and
/// the smallest piece the team takes: its threads spin, so small pieces
/// cost no wake-up; larger phases go to the workers, which a quick team's
/// few threads would hold up on a quiet host (`docs/decisions/0004`).
pub const QUICK_BYTES_PER_THREAD: usize = 256 << 10;
/// The quick team's smallest piece (see [`QUICK_BYTES_PER_THREAD`]).
pub const QUICK_MIN_PIECE: usize = 32 << 10;
/// Bytes per thread of the largest phase of all_to_all's block copies
/// (into the sender's slots, out of them) the quick team takes
/// ((`Workers::with_quick_bytes`)) where it does not lead the larger
/// phases (`Workers::add_quick`; where it does, they keep
/// [`QUICK_BYTES_PER_THREAD`]): sent to sleeping workers, every rank of
/// an all_to_all waits for the rank whose workers wake last. The copies
/// of other collectives keep [`QUICK_BYTES_PER_THREAD`], where the larger
/// limit made them slower (`docs/decisions/0004`).
pub const QUICK_ALL_TO_ALL_BYTES_PER_THREAD: usize = 1 << 20;

/// Threads per rank: the setting, or the cores left per local rank (at
/// most 8), so a 2-core machine keeps one and a 64-core host uses several.
/// Fewer, to leave cores free where the ranks take every one, helped only
/// under heavy steal and cost time on a quiet host (`docs/decisions/0004`).
fn threads_for(sizes: &ShmConfig, local_ranks: usize, cores: usize) -> usize {
    sizes.threads.or_auto(|| (cores / local_ranks.max(1)).clamp(1, 8))
}

/// Bytes of each input / output slot (`Layout`): `segment_bytes` per
/// thread, at least the setting (`ShmConfig::slot_min`) or, left to the
/// host, [`FEW_RANKS_SLOT`] with 2 local ranks, or 3-4 of 4 threads or
/// more (from 8 threads, `segment_bytes` x threads is that already).
fn slot_bytes_for(sizes: &ShmConfig, local_ranks: usize, threads: usize) -> usize {
    let few = local_ranks == 2 || ((3..=4).contains(&local_ranks) && threads >= FEW_RANKS_SLOT_THREADS);
    let min = sizes.slot_min.or_auto(|| if few { FEW_RANKS_SLOT } else { 0 });
    sizes.segment_bytes.saturating_mul(threads).max(min)
}

/// Smallest slot with 2 local ranks, and with 3-4 of several threads
/// ([`slot_bytes_for`]), where ranks of fewer than 8 threads would have
/// less (with 8, `segment_bytes` x threads is this already): an 8 MiB
/// scatter's 2 MiB blocks then go through one of the root's slots each,
/// and an all_reduce's 2 MiB chunks take one round. Every round is three
/// phase waits, and each wait is a sleep and a wake-up where the cores are
/// taken (and a chance to stall on a VM): with one-thread ranks' 256 KiB
/// slots a 2 MiB all_reduce would take four rounds (`docs/decisions/0004`,
/// `0008`). Every rank's segment grows by (n + 1) x the difference (2
/// ranks of one thread: about 5 MiB).
const FEW_RANKS_SLOT: usize = 2 << 20;

/// Fewest threads 3-4 local ranks need for [`FEW_RANKS_SLOT`]: four ranks
/// of one thread would each grow by about 9 MiB, to about 60 MiB in all, a
/// container's default `/dev/shm` being 64 MiB (with staging areas they
/// outgrow it, and the ranks fall back to TCP).
const FEW_RANKS_SLOT_THREADS: usize = 4;

/// How long a rank's idle worker threads spin before they sleep: the
/// setting, or [`SPIN`] where the local ranks' threads take at most a
/// quarter of the host's cores, else none (rayon's pool then: its idle
/// threads look for work a few dozen times, yielding, and sleep). Spinning
/// saves the wake-ups where cores are free, and costs far more where every
/// core is busy or where a hypervisor takes the spinning threads' time away,
/// so the rule stays at a quarter (`docs/decisions/0004`).
fn spin_for(sizes: &ShmConfig, local_ranks: usize, threads: usize, cores: usize) -> Duration {
    match sizes.spin_us {
        Setting::Fixed(us) => Duration::from_micros(us as u64),
        Setting::Auto if room_to_spin(local_ranks, threads, cores) => SPIN,
        Setting::Auto => Duration::ZERO,
    }
}

/// Threads of a rank's quick team (`Workers::add_quick`): the setting,
/// or where the rank's own `threads` sleep when idle (no [`room_to_spin`],
/// and no spin set), the share of a quarter of the cores each local rank
/// may spin on (as `room_to_spin` allows), at most `threads`; 0 (none)
/// below 2. A few spinning threads beat many sleeping ones on small phases
/// (no wake-up) and lose on large ones: hence only for the small phases
/// (`docs/decisions/0004`).
/// A share of one thread (the caller alone) becomes a team of 2 where
/// the team `leads` the larger phases ([`quick_leads_for`]) or with
/// [`MANY_LOCAL_RANKS`] or more local ranks: see there.
fn quick_threads_for(sizes: &ShmConfig, local_ranks: usize, threads: usize, leads: bool, cores: usize) -> usize {
    match (sizes.quick_threads, sizes.spin_us) {
        (Setting::Fixed(set), _) => set,
        (Setting::Auto, Setting::Fixed(_)) => 0,
        (Setting::Auto, Setting::Auto) => quick_share(local_ranks, threads, cores, leads),
    }
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
/// the more ranks, the later that one; a team of 3 was no better. With
/// fewer ranks a team that does not lead takes some phases alone, on fewer
/// threads than the rank's, which evens out its gain.
///
/// Where the team leads, a phase too large for it starts on it and the
/// workers join, so it never holds such a phase alone
/// (`docs/decisions/0004`).
const MANY_LOCAL_RANKS: usize = 16;

/// Whether a phase too large for the quick team starts on it while the
/// rank's sleeping workers wake and join (`Workers::add_quick`): the
/// `setting` (`ShmConfig::quick_leads`), or with at most
/// [`LEAD_MAX_LOCAL_RANKS`] local ranks.
fn quick_leads_for(setting: Setting<bool>, local_ranks: usize) -> bool {
    setting.or_auto(|| local_ranks <= LEAD_MAX_LOCAL_RANKS)
}

/// Up to this many local ranks the quick team leads the larger phases: it
/// starts them while the workers wake. With more ranks every core is a
/// worker's, and the sleeping team that replaces rayon's pool there does
/// worse (`docs/decisions/0004`).
const LEAD_MAX_LOCAL_RANKS: usize = 4;

/// Whether `local_ranks` ranks of `threads` threads take at most a
/// quarter of `cores` (one thread a rank has nobody to spin for).
fn room_to_spin(local_ranks: usize, threads: usize, cores: usize) -> bool {
    threads > 1 && local_ranks.saturating_mul(threads).saturating_mul(4) <= cores
}

/// How long idle worker threads spin where the host has room for it (the
/// quick team's threads always do).
pub const SPIN: Duration = Duration::from_micros(200);

/// Threads of a root's solo phases: the setting, or the cores not taken
/// by the other local ranks' waiting threads (one each), at least the
/// rank's own `threads` and at most 8.
fn root_threads_for(sizes: &ShmConfig, local_ranks: usize, threads: usize, cores: usize) -> usize {
    sizes.root_threads.or_auto(|| cores.saturating_sub(local_ranks.saturating_sub(1)).clamp(threads, threads.max(8)))
}

/// The staging area's size when left to the host: none for ranks of at
/// most [`UNSTAGED_THREADS`] threads, else 2 MiB per thread of the rank,
/// at most 8 MiB. A staged send is two copies (the sender's threads in,
/// the receiver's out); unstaged, the receiver reads it from the sender's
/// tensor through the kernel, the sender writing half of it meanwhile
/// (`Reads::split_send`). Ranks with few threads copy too slowly for the
/// two copies to pay; with more, staging wins, and a larger area made
/// pipeline steps longer, since a staged send completes once copied in
/// (`docs/decisions/0004`).
fn stage_for(threads: usize) -> usize {
    if threads <= UNSTAGED_THREADS {
        return 0;
    }
    threads.saturating_mul(2 << 20).min(8 << 20)
}

/// See [`stage_for`].
const UNSTAGED_THREADS: usize = 2;

/// Largest one-round all-reduce by default, and the smallest size of each
/// of the two small slots (one-step broadcast and all_gather use them up
/// to their size: 512 KiB of shared memory per rank).
pub const SMALL_SLOT: usize = 256 << 10;

/// The one-round limit: the setting, or the core's L2 cache / (2 n^2),
/// 16 KiB to 256 KiB (2 MiB L2: 256 KiB for 2 ranks, 64 KiB for 4, 16 KiB
/// from 8). In one round every rank reads all n copies, so the all-reduce
/// costs n reads per byte where the pipelined one moves ~3, and all ranks
/// read the same slots at once: it pays only while those copies stay in
/// cache (`docs/decisions/0004`).
pub fn one_round_max(setting: Setting<usize>, local_ranks: usize, l2_bytes: usize) -> usize {
    let n = local_ranks.max(1);
    setting.or_auto(|| (l2_bytes / (2 * n * n)).clamp(16 << 10, SMALL_SLOT))
}

#[cfg(test)]
mod tests {
    use super::{quick_leads_for, quick_share, room_to_spin, slot_bytes_for, stage_for};
    use crate::config::{Config, Setting, ShmConfig};

    /// The whole choice on two hosts, with the kernel-read timing stubbed:
    /// the 2-core VM (2 ranks of one thread; reads slower than copies: no
    /// single-copy collectives, no staging) and a 64-core host (4 ranks of
    /// 8 threads: never times reads, stages 8 MiB, 2 MiB slots).
    #[test]
    fn the_choice_follows_the_host_and_times_reads_only_where_a_rule_needs_it() {
        use super::{choose, ShmChoice};
        use crate::config::NEVER;
        use crate::tuning::HostFacts;
        use std::cell::Cell;
        let sizes = ShmConfig { segment_bytes: 256 << 10, ..Config::get().shm };
        let auto = ShmConfig {
            threads: Setting::Auto,
            attach_min: Setting::Auto,
            staged_max: Setting::Auto,
            slot_min: Setting::Auto,
            spin_us: Setting::Auto,
            quick_threads: Setting::Auto,
            ..sizes
        };
        let timed = Cell::new(0);
        let slow = || {
            timed.set(timed.get() + 1);
            Some((1e9, 4e9))
        };
        let vm: ShmChoice = choose(0, &auto, HostFacts { cores: 2, l2_bytes: 512 << 10 }, 2, false, &slow);
        assert_eq!((vm.threads, vm.stage_bytes, vm.quick_threads, vm.spin), (1, 0, 0, std::time::Duration::ZERO));
        assert!(vm.reads.slow && vm.reads.attach == NEVER && timed.get() == 1, "{vm:?}");
        let big = choose(0, &auto, HostFacts { cores: 64, l2_bytes: 2 << 20 }, 4, false, &slow);
        assert_eq!((big.threads, big.stage_bytes, big.slot_bytes, timed.get()), (8, 8 << 20, 2 << 20, 1));
        assert!(!big.reads.slow && big.reads.attach < NEVER, "{big:?}");
        // a setting wins over the host
        let set = ShmConfig { threads: Setting::Fixed(3), staged_max: Setting::Fixed(0), ..auto };
        let c = choose(0, &set, HostFacts { cores: 64, l2_bytes: 2 << 20 }, 4, false, &slow);
        assert_eq!((c.threads, c.stage_bytes), (3, 0));
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
    fn slots_hold_2_mib_with_2_ranks_or_up_to_4_of_several_threads_unless_set() {
        let host = ShmConfig { segment_bytes: 256 << 10, slot_min: Setting::Auto, ..Config::get().shm };
        let slot = |sizes, n, threads| slot_bytes_for(&sizes, n, threads);
        // 16 cores: 4 ranks of 4 threads (1 MiB) and 3 of 5 get 2 MiB, as
        // do 2 ranks of 2 (a 4-core host) and of one (the 2-core VM); 2
        // ranks of 8 have it; 4 ranks of one, 3 of 3, 8 of 2 and a lone
        // rank keep segment x threads
        assert_eq!((slot(host, 4, 4), slot(host, 3, 5), slot(host, 2, 8)), (2 << 20, 2 << 20, 2 << 20));
        assert_eq!((slot(host, 2, 2), slot(host, 2, 1)), (2 << 20, 2 << 20));
        assert_eq!((slot(host, 4, 1), slot(host, 3, 3), slot(host, 8, 2), slot(host, 1, 8)), (256 << 10, 768 << 10, 512 << 10, 2 << 20));
        // a setting: that floor (0: none) whatever the ranks
        let none = ShmConfig { slot_min: Setting::Fixed(0), ..host };
        assert_eq!((slot(none, 4, 4), slot(ShmConfig { slot_min: Setting::Fixed(3 << 20), ..host }, 8, 2)), (1 << 20, 3 << 20));
    }

    #[test]
    fn the_staging_area_holds_2_mib_a_thread_up_to_8_mib_with_3_threads_or_more() {
        // the 2-core VM's one thread and 8 ranks of 2 on 16 cores: none;
        // 3 threads 6; 4 ranks of 4 on 16 cores, 8 and more: 8
        assert_eq!((stage_for(1), stage_for(2), stage_for(3)), (0, 0, 6 << 20));
        assert_eq!((stage_for(4), stage_for(8), stage_for(64)), (8 << 20, 8 << 20, 8 << 20));
    }

    #[test]
    fn the_quick_team_leads_with_up_to_four_local_ranks_unless_set() {
        assert_eq!(
            (
                quick_leads_for(Setting::Auto, 2),
                quick_leads_for(Setting::Auto, 4),
                quick_leads_for(Setting::Auto, 5),
                quick_leads_for(Setting::Auto, 16)
            ),
            (true, true, false, false)
        );
        assert_eq!((quick_leads_for(Setting::Fixed(true), 16), quick_leads_for(Setting::Fixed(false), 2)), (true, false));
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
