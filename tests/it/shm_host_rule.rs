//! The single-copy thresholds the host picks when they are left to it
//! (`RUSTCCL_SHM_ATTACH_MIN_BYTES=auto`): every rank ends with the same
//! ones, and the collectives pick their algorithms by them (the
//! all_reduce's 4 MiB per local rank, the reduce's read threshold where
//! its root takes pushes). Ranks are threads of this process, so the
//! reads go through process_vm_readv on our own pid, the same system call
//! as between processes. The thresholds set by hand: `shm_attach.rs`.

use crate::common::auto0;
use std::time::Duration;

use crate::common;
use crate::common::*;
use rustccl::config::{Setting, ShmConfig, TransportMode};
use rustccl::{Communicator, DType, ReduceOp};

/// `auto`: every rank measures for itself, and all end with the same
/// thresholds, one of the two the host rule gives; with two threads per
/// rank, the fast one (16 MiB / 256 KiB / blocks over 2 MiB, over 4 MiB
/// with 2 ranks; reduce 8 MiB with 3 ranks) without measuring. Slow reads read gather / scatter /
/// all_to_all blocks over 256 KiB, as sends, whatever the ranks.
#[test]
fn the_host_rule_gives_every_rank_the_same_thresholds() {
    for (n, threads) in [(2, 1), (3, 1), (2, 2), (3, 2)] {
        let shm = ShmConfig { threads: auto0(threads), attach_min: Setting::Auto, broadcast_min: Setting::Auto, ..common::TINY_SHM };
        let comms = mesh_comms(n, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm);
        let th = |c: &Communicator| -> (Option<u64>, Option<u64>, Option<u64>) {
            let get = |k: &str| threshold(c, k);
            (get("shm_attach_min_bytes"), get("shm_single_reader_min_bytes"), get("shm_block_read_min_bytes"))
        };
        let all: Vec<_> = comms.iter().map(th).collect();
        assert!(all.iter().all(|x| *x == all[0]), "{all:?}");
        // slow reads: no buffer-wide collective reads; blocks and sends over
        // 256 KiB do
        let fast = (Some(16u64 << 20), Some(256u64 << 10), Some(if n == 2 { 4u64 << 20 } else { 2 << 20 }));
        let slow = (Some(u64::MAX), Some(256u64 << 10), Some(256u64 << 10));
        if threads == 2 {
            assert_eq!(all[0], fast);
            // reduce (its root taking pushes) reads from 8 MiB with 3-4
            // ranks of few threads, from the collectives' 16 MiB with 2
            let red: Vec<_> = comms.iter().map(|c| threshold(c, "shm_reduce_attach_min_bytes")).collect();
            let want = if n == 2 { 16u64 << 20 } else { 8 << 20 };
            assert!(red.iter().all(|r| *r == Some(want)), "n={n}: {red:?}");
        } else {
            assert!(all[0] == fast || all[0] == slow, "n={n}: {all:?}");
        }
        // broadcast reads the root only where reads are slow and 2 ranks
        // share the copy (from 1 MiB), else never by default
        let bc: Vec<_> = comms.iter().map(|c| threshold(c, "shm_broadcast_attach_min_bytes")).collect();
        let want = if all[0] == slow && n == 2 { 1u64 << 20 } else { u64::MAX };
        assert!(bc.iter().all(|b| *b == Some(want)), "n={n} threads={threads}: {bc:?}");
    }
}

/// `auto` with two threads per rank and 5 ranks: all_reduce reads its
/// peers only from 4 MiB per rank (20 MiB; it reads every peer twice),
/// the collectives that read once from 16 MiB, reduce (whose root takes
/// pushes) from 4 MiB (5-8 ranks of at most 2 threads), and all_to_all /
/// gather / scatter blocks over 256 KiB (2 MiB only up to 4 ranks: the
/// all_to_all test above has 3); at 16 MiB all_reduce keeps two copies
/// while reduce_scatter reads, a 4 MiB reduce reads (and pushes) and a
/// smaller one copies, and all give
/// the reference result.
#[test]
fn the_host_rule_reads_for_all_reduce_only_from_4_mib_per_rank() {
    let shm = ShmConfig { threads: auto0(2), attach_min: Setting::Auto, ..common::TINY_SHM };
    let comms = mesh_comms(5, tiny_algo(), Duration::from_secs(120), TransportMode::Shm, shm);
    for c in &comms {
        let get = |k: &str| threshold(c, k);
        assert_eq!(get("shm_attach_min_bytes"), Some(16 << 20));
        assert_eq!(get("shm_all_reduce_attach_min_bytes"), Some(20 << 20));
        assert_eq!(get("shm_reduce_scatter_attach_min_bytes"), Some(16 << 20));
        assert_eq!(get("shm_block_read_min_bytes"), Some(256 << 10));
        assert_eq!(get("shm_reduce_attach_min_bytes"), Some(4 << 20));
    }
    let len = 4 << 20; // floats: 16 MiB
    on_ranks(&comms, |r, c| {
        let b = buf(DType::F32, &vec![(r + 1) as f64; len]);
        all_reduce(c, &b, ReduceOp::Sum);
        assert!(read(DType::F32, &b).iter().all(|&v| v == 15.0), "all_reduce");
        assert_eq!(algorithm(c, "all_reduce"), "shm_pipelined");
        check_reduce_scatter_flat(c, r, 5, DType::F32, ReduceOp::Sum, len / 5 + 1, "16 MiB reduce_scatter");
        assert_eq!(algorithm(c, "reduce_scatter"), "shm_attach");
        for (floats, algo) in [(1 << 20, "shm_attach"), ((1 << 20) - 1, "shm_pipelined")] {
            check_reduce(c, r, 5, DType::F32, ReduceOp::Sum, 3, floats, &format!("reduce of {floats} floats"));
            assert_eq!(algorithm(c, "reduce"), algo, "reduce of {floats} floats");
        }
    });
}

/// `auto` with 9 ranks of two threads (more than 8 of at most 2): all_reduce
/// reads its peers from 16 MiB and reduce_scatter from 8 MiB (instead of
/// 4 MiB per rank and 16 MiB), a byte below each keeps the copies through
/// shared memory, and all give the reference result.
#[test]
fn more_than_8_ranks_of_few_threads_read_from_16_mib_in_all_reduce_and_8_mib_in_reduce_scatter() {
    let n = 9;
    let shm = ShmConfig { threads: auto0(2), attach_min: Setting::Auto, ..common::TINY_SHM };
    let comms = mesh_comms(n, tiny_algo(), Duration::from_secs(120), TransportMode::Shm, shm);
    for c in &comms {
        assert_eq!(threshold(c, "shm_all_reduce_attach_min_bytes"), Some(16 << 20));
        assert_eq!(threshold(c, "shm_reduce_scatter_attach_min_bytes"), Some(8 << 20));
    }
    on_ranks(&comms, |r, c| {
        for (floats, algo) in [(4 << 20, "shm_attach"), ((4 << 20) - 1, "shm_pipelined")] {
            let b = buf(DType::F32, &vec![(r + 1) as f64; floats]);
            all_reduce(c, &b, ReduceOp::Sum);
            assert!(read(DType::F32, &b).iter().all(|&v| v == 45.0), "all_reduce of {floats} floats");
            assert_eq!(algorithm(c, "all_reduce"), algo, "all_reduce of {floats} floats");
        }
        // each rank's output: a ninth of 8 MiB, rounded up (reads) or down
        let part = (2 << 20) / n;
        for (len, algo) in [(part + 1, "shm_attach"), (part, "shm_direct")] {
            check_reduce_scatter_flat(c, r, n, DType::F32, ReduceOp::Sum, len, &format!("reduce_scatter of {len} floats a rank"));
            assert_eq!(algorithm(c, "reduce_scatter"), algo, "reduce_scatter of {len} floats a rank");
        }
    });
}
