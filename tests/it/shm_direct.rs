//! The shared-memory direct collectives (broadcast, all_gather,
//! reduce_scatter, all_reduce one-round and pipelined) against local
//! references, with tiny areas so inputs take many rounds, and the
//! thresholds they run under.

use crate::common;
use crate::common::auto0;
use crate::common::*;
use rustccl::config::{AlgoConfig, Setting, ShmConfig, TransportMode};
use rustccl::{Communicator, DType, OpKind, ReduceOp};

/// 200 bf16 values (400 bytes, two 256-byte pieces): a broadcast in two
/// one-piece steps.
fn lens(n: usize) -> Vec<usize> {
    vec![0, 1, n - 1, n + 1, 97, 200, 1000, 5003]
}

fn algorithm(c: &Communicator, op: &str) -> &'static str {
    c.stats().snapshot()[op].algorithm
}

/// An all_gather of `values(dtype, Sum, r, len)` from every rank: the parts.
fn all_gather_values(c: &Communicator, dt: DType, r: usize, n: usize, len: usize) -> Vec<Vec<f64>> {
    let input = buf(dt, &values(dt, ReduceOp::Sum, r, len));
    let outs: Vec<_> = (0..n).map(|_| buf(dt, &vec![0.0; len])).collect();
    let mut s = spec(OpKind::AllGather);
    s.inputs = vec![t(&input)];
    s.outputs = outs.iter().map(t).collect();
    run(c, s);
    outs.iter().map(|o| read(dt, o)).collect()
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
                let expect: Vec<Vec<f64>> = (0..n).map(|p| values(dt, ReduceOp::Sum, p, len)).collect();
                assert_eq!(all_gather_values(c, dt, r, n, len), expect, "all_gather n={n} len={len}");
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
    let shm = |small| ShmConfig { small_bytes: auto0(small), segment_bytes: 4096, threads: auto0(2), ..common::TINY_SHM };
    let algo = AlgoConfig::default();
    let set = mesh_comms(3, algo, std::time::Duration::from_secs(30), TransportMode::Shm, shm(1000));
    assert_eq!(threshold(&set[0], "shm_one_round_max_bytes"), Some(1000));
    assert_eq!(threshold(&set[0], "shm_small_slot_bytes"), Some(1024), "the setting, in whole cache lines");
    assert_eq!(threshold(&set[0], "shm_threads"), Some(2));
    assert_eq!(threshold(&set[0], "local_ranks"), Some(3));
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
    let v = threshold(&auto[0], "shm_one_round_max_bytes").unwrap();
    assert!(((16 << 10)..=(256 << 10)).contains(&v), "auto one-round limit {v}");
    assert_eq!(threshold(&auto[0], "shm_small_slot_bytes"), Some(256 << 10));
    // The worker threads' smallest piece: the segment here (under 256 KiB),
    // or the setting; the reducing algorithms' copies take half of it, their
    // reductions 1/n (n local ranks).
    assert_eq!(threshold(&auto[0], "shm_min_piece_bytes"), Some(4096));
    assert_eq!(threshold(&auto[0], "shm_reduce_min_piece_bytes"), Some(2048));
    assert_eq!(threshold(&auto[0], "shm_sum_min_piece_bytes"), Some(1024));
    let pieces =
        mesh_comms(2, algo, std::time::Duration::from_secs(30), TransportMode::Shm, ShmConfig { min_piece: auto0(1000), ..shm(0) });
    assert_eq!(threshold(&pieces[0], "shm_min_piece_bytes"), Some(1000));
    assert_eq!(threshold(&pieces[0], "shm_reduce_min_piece_bytes"), Some(500));
    assert_eq!(threshold(&pieces[0], "shm_sum_min_piece_bytes"), Some(500));
    let tcp = tcp_comms(2, algo, std::time::Duration::from_secs(30));
    assert_eq!(threshold(&tcp[0], "shm_one_round_max_bytes"), None);
    assert_eq!(threshold(&tcp[0], "segment_bytes"), Some(algo.segment_bytes as u64));
}

/// Phases too large for the quick team led by it while the sleeping
/// workers join (`RUSTCCL_SHM_QUICK_LEADS`): a team of 2 that takes 64
/// bytes a thread, so nearly every phase is led; with the two-copy
/// algorithms and with single-copy reads, every collective against the
/// local reference, many times over (a worker that joins late or never
/// must not lose or repeat a piece).
#[test]
fn collectives_whose_phases_the_quick_team_leads_match_the_reference() {
    for attach_min in [usize::MAX, 0] {
        let shm = ShmConfig {
            threads: auto0(3),
            quick_threads: Setting::Fixed(2),
            quick_bytes: auto0(64),
            quick_all_to_all_bytes: auto0(64),
            quick_min_piece: auto0(64),
            min_piece: auto0(64),
            spin_us: Setting::Fixed(0),
            quick_leads: Setting::Fixed(true),
            attach_min: Setting::Fixed(attach_min),
            broadcast_min: Setting::Fixed(attach_min),
            ..common::TINY_SHM
        };
        for n in [2, 4] {
            let comms = mesh_comms(n, tiny_algo(), std::time::Duration::from_secs(60), TransportMode::Shm, shm);
            assert_eq!(threshold(&comms[0], "shm_quick_leads"), Some(1));
            on_ranks(&comms, |r, c| {
                for round in 0..5 {
                    for len in [1000, 5003, 20000] {
                        let what = format!("attach_min={attach_min} n={n} len={len} round={round}");
                        let dt = DType::F32;
                        let b = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                        all_reduce(c, &b, ReduceOp::Sum);
                        let contribs: Vec<Vec<f64>> = (0..n).map(|p| values(dt, ReduceOp::Sum, p, len)).collect();
                        assert_close(
                            dt,
                            ReduceOp::Sum,
                            &read(dt, &b),
                            &reference(dt, ReduceOp::Sum, &contribs),
                            &format!("all_reduce {what}"),
                        );
                        check_reduce_scatter_flat(c, r, n, dt, ReduceOp::Sum, len, &format!("reduce_scatter {what}"));
                        check_reduce(c, r, n, dt, ReduceOp::Max, round % n, len, &format!("reduce {what}"));
                        let root = (round + 1) % n;
                        let b = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                        broadcast(c, &b, root);
                        assert_eq!(read(dt, &b), values(dt, ReduceOp::Sum, root, len), "broadcast {what}");
                        // all_gather, all_to_all (block of rank p for rank q: values(p * n + q)), gather, scatter
                        let input = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                        let all: Vec<Vec<f64>> = (0..n).map(|p| values(dt, ReduceOp::Sum, p, len)).collect();
                        assert_eq!(all_gather_values(c, dt, r, n, len), all, "all_gather {what}");
                        let block = |p: usize, q: usize| values(dt, ReduceOp::Sum, p * n + q, len);
                        let ib = buf(dt, &(0..n).flat_map(|q| block(r, q)).collect::<Vec<_>>());
                        let ob = buf(dt, &vec![-1.0; n * len]);
                        let mut s = spec(OpKind::AllToAll);
                        s.in_splits = vec![len as i64; n];
                        s.out_splits = vec![len as i64; n];
                        s.inputs = vec![t(&ib)];
                        s.outputs = vec![t(&ob)];
                        run(c, s);
                        assert_eq!(read(dt, &ob), (0..n).flat_map(|p| block(p, r)).collect::<Vec<_>>(), "all_to_all {what}");
                        let outs: Vec<_> = if r == root { (0..n).map(|_| buf(dt, &vec![0.0; len])).collect() } else { vec![] };
                        gather(c, &input, &outs, root);
                        if r == root {
                            assert_eq!(outs.iter().map(|o| read(dt, o)).collect::<Vec<_>>(), all, "gather {what}");
                        }
                        let ins: Vec<_> = if r == root { (0..n).map(|q| buf(dt, &block(root, q))).collect() } else { vec![] };
                        let out = buf(dt, &vec![0.0; len]);
                        scatter(c, &ins, &out, root);
                        assert_eq!(read(dt, &out), block(root, r), "scatter {what}");
                    }
                }
            });
        }
    }
}

/// How long a waiting thread polls for its local peers before it sleeps
/// (`RUSTCCL_SHM_WAIT_SPIN_US`): up to 500 us where the local ranks have
/// one thread and a core each, 60 where they have more threads or
/// outnumber the cores, or the setting. With
/// no window every wait sleeps at once; the phases (pipelined all_reduce,
/// reduce) and the rings (gather, which without single-copy reads goes
/// as messages) still give the reference's values on every rank.
#[test]
fn waiting_threads_poll_as_long_as_the_setting_or_the_host_allows() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let algo = AlgoConfig::default();
    let secs = std::time::Duration::from_secs(30);
    let auto = mesh_comms(2, algo, secs, TransportMode::Shm, common::TINY_SHM);
    assert_eq!(threshold(&auto[0], "shm_wait_spin_max_us"), Some(if cores >= 2 { 500 } else { 60 }));
    let threads = mesh_comms(2, algo, secs, TransportMode::Shm, ShmConfig { threads: auto0(2), ..common::TINY_SHM });
    assert_eq!(threshold(&threads[0], "shm_wait_spin_max_us"), Some(60));
    if cores < 8 {
        let crowded = mesh_comms(cores + 1, algo, secs, TransportMode::Shm, common::TINY_SHM);
        assert_eq!(threshold(&crowded[0], "shm_wait_spin_max_us"), Some(60), "{} ranks on {cores} cores", cores + 1);
    }
    let n = 3;
    let none = mesh_comms(n, tiny_algo(), secs, TransportMode::Shm, ShmConfig { wait_spin_us: Setting::Fixed(0), ..common::TINY_SHM });
    assert_eq!(threshold(&none[0], "shm_wait_spin_max_us"), Some(0));
    on_ranks(&none, |r, c| {
        for round in 0..20 {
            let (dt, len, root) = (DType::F32, 1000 + round, round % n);
            let b = buf(dt, &values(dt, ReduceOp::Sum, r, len));
            all_reduce(c, &b, ReduceOp::Sum);
            let contribs: Vec<Vec<f64>> = (0..n).map(|p| values(dt, ReduceOp::Sum, p, len)).collect();
            assert_close(dt, ReduceOp::Sum, &read(dt, &b), &reference(dt, ReduceOp::Sum, &contribs), &format!("all_reduce round {round}"));
            check_reduce(c, r, n, dt, ReduceOp::Max, root, len, &format!("reduce round {round}"));
            let input = buf(dt, &values(dt, ReduceOp::Sum, r, len));
            let outs: Vec<_> = (0..n).map(|_| buf(dt, &vec![0.0; len])).collect();
            gather(c, &input, if r == root { &outs } else { &[] }, root);
            if r == root {
                let got: Vec<Vec<f64>> = outs.iter().map(|o| read(dt, o)).collect();
                assert_eq!(got, contribs, "gather round {round}");
            }
        }
    });
    for c in &none {
        assert_eq!((algorithm(c, "all_reduce"), algorithm(c, "gather")), ("shm_pipelined", "direct"));
    }
}
