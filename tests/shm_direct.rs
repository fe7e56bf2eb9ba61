//! The shared-memory direct collectives (broadcast, all_gather,
//! reduce_scatter, all_reduce one-round and pipelined) against local
//! references, with tiny areas so inputs take many rounds, and the
//! thresholds they run under.

mod common;

use common::*;
use rustccl::config::{AlgoConfig, ShmConfig, TransportMode};
use rustccl::{Communicator, DType, OpKind, ReduceOp};

fn lens(n: usize) -> Vec<usize> {
    vec![0, 1, n - 1, n + 1, 97, 1000, 5003]
}

fn algorithm(c: &Communicator, op: &str) -> &'static str {
    c.stats().snapshot()[op].algorithm
}

#[test]
fn broadcast_all_gather_and_reduce_scatter_go_direct() {
    for n in [2, 3, 5] {
        let comms = shm_comms(n, tiny_algo(), std::time::Duration::from_secs(60));
        on_ranks(&comms, |r, c| {
            for len in lens(n) {
                for root in 0..n {
                    let dt = DType::BF16;
                    let b = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                    broadcast(c, &b, root);
                    assert_eq!(read(dt, &b), values(dt, ReduceOp::Sum, root, len), "broadcast n={n} root={root} len={len}");
                }
                let dt = DType::I64;
                let expect: Vec<f64> = (0..n).flat_map(|p| values(dt, ReduceOp::Sum, p, len)).collect();
                let input = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                let outs: Vec<_> = (0..n).map(|_| buf(dt, &vec![0.0; len])).collect();
                let mut s = spec(OpKind::AllGather);
                s.inputs = vec![t(&input)];
                s.outputs = outs.iter().map(t).collect();
                run(c, s);
                assert_eq!(outs.iter().flat_map(|o| read(dt, o)).collect::<Vec<_>>(), expect, "all_gather n={n} len={len}");
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    let dt = DType::F32;
                    check_reduce_scatter_flat(c, r, n, dt, op, len, &format!("reduce_scatter {op:?} n={n} len={len}"));
                }
            }
        });
        for c in &comms {
            for op in ["broadcast", "all_gather", "reduce_scatter"] {
                assert_eq!(algorithm(c, op), "shm_direct", "{op} n={n}");
            }
        }
    }
}

#[test]
fn the_one_round_limit_follows_the_setting_or_the_host() {
    let shm = |small| ShmConfig { small_bytes: small, segment_bytes: 4096, threads: 2, ..common::TINY_SHM };
    let algo = AlgoConfig::default();
    let th = |c: &Communicator, k: &str| c.thresholds().iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let set = mesh_comms(3, algo, std::time::Duration::from_secs(30), TransportMode::Shm, shm(1000));
    assert_eq!(th(&set[0], "shm_one_round_max_bytes"), Some(1000));
    assert_eq!(th(&set[0], "shm_small_slot_bytes"), Some(1024), "the setting, in whole cache lines");
    assert_eq!(th(&set[0], "shm_threads"), Some(2));
    assert_eq!(th(&set[0], "local_ranks"), Some(3));
    // an all-reduce just above the limit is pipelined, at it one round
    for (len, want) in [(250usize, "shm_one_round"), (251, "shm_pipelined")] {
        let got = on_ranks(&set, |r, c| {
            let vals: Vec<f64> = (0..len).map(|i| (i + r) as f64).collect();
            let b = buf(DType::F32, &vals);
            let mut s = spec(OpKind::AllReduce);
            s.inputs = vec![t(&b)];
            run(c, s);
            let want: Vec<f64> = (0..len).map(|i| (3 * i + 3) as f64).collect();
            assert_eq!(read(DType::F32, &b), want);
            algorithm(c, "all_reduce")
        });
        assert!(got.iter().all(|a| *a == want), "{len} floats: {got:?}");
    }
    let auto = mesh_comms(4, algo, std::time::Duration::from_secs(30), TransportMode::Shm, shm(0));
    let v = th(&auto[0], "shm_one_round_max_bytes").unwrap();
    assert!(((16 << 10)..=(256 << 10)).contains(&v), "auto one-round limit {v}");
    assert_eq!(th(&auto[0], "shm_small_slot_bytes"), Some(256 << 10));
    // The worker threads' smallest piece: the segment here (under 256 KiB),
    // or the setting; the reducing algorithms' copies take half of it, their
    // reductions 1/n (n local ranks).
    assert_eq!(th(&auto[0], "shm_min_piece_bytes"), Some(4096));
    assert_eq!(th(&auto[0], "shm_reduce_min_piece_bytes"), Some(2048));
    assert_eq!(th(&auto[0], "shm_sum_min_piece_bytes"), Some(1024));
    let pieces = mesh_comms(2, algo, std::time::Duration::from_secs(30), TransportMode::Shm, ShmConfig { min_piece: 1000, ..shm(0) });
    assert_eq!(th(&pieces[0], "shm_min_piece_bytes"), Some(1000));
    assert_eq!(th(&pieces[0], "shm_reduce_min_piece_bytes"), Some(500));
    assert_eq!(th(&pieces[0], "shm_sum_min_piece_bytes"), Some(500));
    let tcp = tcp_comms(2, algo, std::time::Duration::from_secs(30));
    assert_eq!(th(&tcp[0], "shm_one_round_max_bytes"), None);
    assert_eq!(th(&tcp[0], "segment_bytes"), Some(algo.segment_bytes as u64));
}
