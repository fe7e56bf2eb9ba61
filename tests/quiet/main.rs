//! Tests that measure the engine's own CPU use. They are a binary of their
//! own because cargo runs test binaries one after another: while these run,
//! no other test keeps the cores busy, so a share of CPU time measures the
//! engine and not the suite around it.

#[allow(dead_code)] // helpers the `it` modules use
#[path = "../it/common.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use rustccl::config::AlgoConfig;
use rustccl::DType;

/// CPU time so far of the point-to-point engine threads of group `g`
/// (`rustccl-p2p-{g}-r{rank}`, 15 characters of it: a group of 3, so that
/// other tests' groups running meanwhile do not count), from the
/// scheduler's nanosecond counts, and how many there are.
fn p2p_threads_cpu(g: &str) -> (Duration, usize) {
    let (mut ns, mut threads) = (0u64, 0);
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != format!("rustccl-p2p-{g}") {
            continue;
        }
        threads += 1;
        // schedstat: nanoseconds on a CPU, nanoseconds waiting, slices.
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    (Duration::from_nanos(ns), threads)
}

#[test]
fn the_engine_threads_sleep_while_their_callers_drive_a_ping_pong() {
    // Each rank waits for its own receive and reads the ring itself; the
    // engine's threads have nothing to do. Polling beside the callers (or
    // woken by every message) they took a core's worth of time. Where the
    // cores are taken, waits sleep on the ring's word and the engine's
    // thread is woken with them, as it should be: so the quietest of
    // several batches counts, and batches run until one is quiet.
    const GROUP: &str = "pp2";
    const BATCHES: usize = 20;
    const ROUNDS: usize = 4000;
    let comms = shm_comms_with(2, AlgoConfig::default(), Duration::from_secs(30), |_, o| o.group = GROUP.into());
    let ping = |r: usize, c: &rustccl::Communicator, k: usize| {
        let (mine, got) = (buf(DType::F32, &[(k * 2 + r) as f64]), buf(DType::F32, &[-1.0]));
        if r == 0 {
            send(c, &mine, 1, 5).wait(None).unwrap();
            recv(c, &got, Some(1), 5).wait(None).unwrap();
        } else {
            recv(c, &got, Some(0), 5).wait(None).unwrap();
            send(c, &mine, 0, 5).wait(None).unwrap();
        }
        assert_eq!(read(DType::F32, &got), vec![(k * 2 + 1 - r) as f64], "message {k} to rank {r}");
    };
    on_ranks(&comms, |r, c| (0..200).for_each(|k| ping(r, c, k)));
    let mut shares = Vec::new();
    for b in 0..BATCHES {
        let ((cpu0, _), t0) = (p2p_threads_cpu(GROUP), Instant::now());
        let first = 200 + b * ROUNDS;
        on_ranks(&comms, |r, c| (first..first + ROUNDS).for_each(|k| ping(r, c, k)));
        let ((cpu1, threads), wall) = (p2p_threads_cpu(GROUP), t0.elapsed());
        assert_eq!(threads, 2, "the two ranks' engine threads");
        shares.push((cpu1 - cpu0).as_secs_f64() / wall.as_secs_f64());
        if shares[b] < 0.25 {
            break;
        }
    }
    let least = shares.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(least < 0.25, "the engine threads' CPU time / wall time in each batch of {ROUNDS} ping-pongs: {shares:?}");
}
