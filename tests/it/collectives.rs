//! Every collective against a locally computed reference, sweeping world
//! sizes 1-5 and sizes around the world size (0, 1, n-1, n+1, ...), with tiny
//! algorithm thresholds so small inputs reach multi-segment ring paths.

use crate::common;
use crate::common::auto0;
use crate::common::*;
use rustccl::{Communicator, DType, OpKind, ReduceOp};

fn sizes(n: usize) -> Vec<usize> {
    let mut v = vec![0, 1, n.saturating_sub(1), n + 1, 37, 100, 1000];
    v.sort_unstable();
    v.dedup();
    v
}

fn all_reduce_sweep(comms: &[Communicator], dtypes: &[DType], sizes: &[usize]) {
    let n = comms.len();
    on_ranks(comms, |r, c| {
        for &dt in dtypes {
            for op in ALL_OPS {
                if !supported(dt, op) {
                    continue;
                }
                for &len in sizes {
                    let b = buf(dt, &values(dt, op, r, len));
                    all_reduce(c, &b, op);
                    let contribs: Vec<Vec<f64>> = (0..n).map(|p| values(dt, op, p, len)).collect();
                    let want = reference(dt, op, &contribs);
                    assert_close(dt, op, &read(dt, &b), &want, &format!("all_reduce {dt} {op:?} n={n} len={len} rank {r}"));
                }
            }
        }
    });
}

#[test]
fn all_reduce_every_dtype_and_op_loopback() {
    for n in 1..=5 {
        let comms = loopback_comms(n, tiny_algo());
        all_reduce_sweep(&comms, &ALL_DTYPES, &sizes(n));
    }
}

#[test]
fn all_reduce_bitwise_identical_on_every_rank() {
    // Floats with non-integer values: every rank must hold the same bits.
    for n in [3, 4, 5] {
        let comms = loopback_comms(n, tiny_algo());
        for len in [10usize, 1000] {
            let got = on_ranks(&comms, |r, c| {
                let vals: Vec<f64> = (0..len).map(|i| ((r * 31 + i * 17) % 97) as f64 / 7.3).collect();
                let b = buf(DType::F32, &vals);
                let mut s = spec(OpKind::AllReduce);
                s.inputs = vec![t(&b)];
                run(c, s);
                b.to_vec::<u32>().unwrap()
            });
            for r in 1..n {
                assert_eq!(got[r], got[0], "n={n} len={len}: rank {r} differs from rank 0");
            }
        }
    }
}

#[test]
fn broadcast_and_reduce_from_every_root() {
    for n in 1..=5 {
        let comms = loopback_comms(n, tiny_algo());
        on_ranks(&comms, |r, c| {
            for root in 0..n {
                for len in sizes(n) {
                    for dt in [DType::F32, DType::I64, DType::BF16] {
                        let mine = values(dt, ReduceOp::Sum, r, len);
                        let b = buf(dt, &mine);
                        let mut s = spec(OpKind::Broadcast);
                        s.root = root as i64;
                        s.inputs = vec![t(&b)];
                        run(c, s);
                        assert_eq!(read(dt, &b), values(dt, ReduceOp::Sum, root, len), "broadcast n={n} root={root} len={len}");

                        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                            check_reduce(c, r, n, dt, op, root, len, &format!("reduce {op:?} n={n} root={root} len={len}"));
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn all_gather_and_reduce_scatter_list_and_flat() {
    for n in 1..=5 {
        let comms = loopback_comms(n, tiny_algo());
        on_ranks(&comms, |r, c| {
            for len in sizes(n) {
                let dt = DType::I32;
                let mine = values(dt, ReduceOp::Sum, r, len);
                let expect: Vec<f64> = (0..n).flat_map(|p| values(dt, ReduceOp::Sum, p, len)).collect();
                // list outputs
                let input = buf(dt, &mine);
                let outs: Vec<_> = (0..n).map(|_| buf(dt, &vec![0.0; len])).collect();
                let mut s = spec(OpKind::AllGather);
                s.inputs = vec![t(&input)];
                s.outputs = outs.iter().map(t).collect();
                run(c, s);
                let got: Vec<f64> = outs.iter().flat_map(|o| read(dt, o)).collect();
                assert_eq!(got, expect, "all_gather list n={n} len={len}");
                // flat output
                let input = buf(dt, &mine);
                let out = buf(dt, &vec![0.0; len * n]);
                let mut s = spec(OpKind::AllGather);
                s.inputs = vec![t(&input)];
                s.outputs = vec![t(&out)];
                run(c, s);
                assert_eq!(read(dt, &out), expect, "all_gather flat n={n} len={len}");

                for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Avg] {
                    let dt = DType::F32;
                    // rank r contributes values(op, r*n + p, len) to rank p
                    let part = |src: usize, dst: usize| rs_part(dt, op, n, src, dst, len);
                    let contribs: Vec<Vec<f64>> = (0..n).map(|src| part(src, r)).collect();
                    let want = reference(dt, op, &contribs);
                    // list inputs
                    let ins: Vec<_> = (0..n).map(|p| buf(dt, &part(r, p))).collect();
                    let out = buf(dt, &vec![0.0; len]);
                    let mut s = spec(OpKind::ReduceScatter);
                    s.reduce_op = op as i32;
                    s.inputs = ins.iter().map(t).collect();
                    s.outputs = vec![t(&out)];
                    run(c, s);
                    assert_close(dt, op, &read(dt, &out), &want, &format!("reduce_scatter list {op:?} n={n} len={len}"));
                    for (p, i) in ins.iter().enumerate() {
                        assert_eq!(read(dt, i), part(r, p), "reduce_scatter must not modify its inputs");
                    }
                    // flat input
                    check_reduce_scatter_flat(c, r, n, dt, op, len, &format!("reduce_scatter flat {op:?} n={n} len={len}"));
                }
            }
        });
    }
}

#[test]
fn all_to_all_even_uneven_and_list() {
    for n in 1..=5 {
        let comms = loopback_comms(n, tiny_algo());
        on_ranks(&comms, |r, c| {
            let dt = DType::F64;
            // Rank src sends (src + 1) * (dst + 1) % 4 rows to dst (some empty).
            let rows = |src: usize, dst: usize| ((src + 1) * (dst + 1)) % 4;
            let cols = 3;
            let block =
                |src: usize, dst: usize| -> Vec<f64> { (0..rows(src, dst) * cols).map(|i| (src * 1000 + dst * 100 + i) as f64).collect() };
            let input: Vec<f64> = (0..n).flat_map(|p| block(r, p)).collect();
            let expect: Vec<f64> = (0..n).flat_map(|p| block(p, r)).collect();
            let ib = buf(dt, &input);
            let ob = buf(dt, &vec![-1.0; expect.len()]);
            let mut s = spec(OpKind::AllToAll);
            // 1-D tensors: splits in elements (rows * cols)
            s.in_splits = (0..n).map(|p| (rows(r, p) * cols) as i64).collect();
            s.out_splits = (0..n).map(|p| (rows(p, r) * cols) as i64).collect();
            s.inputs = vec![t(&ib)];
            s.outputs = vec![t(&ob)];
            run(c, s);
            assert_eq!(read(dt, &ob), expect, "all_to_all uneven n={n}");

            // even split, no split sizes
            let len = 2;
            let input: Vec<f64> = (0..n * len).map(|i| (r * 100 + i) as f64).collect();
            let expect: Vec<f64> = (0..n).flat_map(|p| (0..len).map(move |k| (p * 100 + r * len + k) as f64)).collect();
            let ib = buf(dt, &input);
            let ob = buf(dt, &vec![0.0; n * len]);
            let mut s = spec(OpKind::AllToAll);
            s.inputs = vec![t(&ib)];
            s.outputs = vec![t(&ob)];
            run(c, s);
            assert_eq!(read(dt, &ob), expect, "all_to_all even n={n}");

            // lists
            if n > 1 {
                let ins: Vec<_> = (0..n).map(|p| buf(dt, &block(r, p))).collect();
                let outs: Vec<_> = (0..n).map(|p| buf(dt, &vec![0.0; rows(p, r) * cols])).collect();
                let mut s = spec(OpKind::AllToAll);
                s.inputs = ins.iter().map(t).collect();
                s.outputs = outs.iter().map(t).collect();
                run(c, s);
                for (p, o) in outs.iter().enumerate() {
                    assert_eq!(read(dt, o), block(p, r), "all_to_all list n={n} from {p}");
                }
            }
        });
    }
}

#[test]
fn gather_scatter_barrier_every_root() {
    for n in 1..=5 {
        let comms = loopback_comms(n, tiny_algo());
        on_ranks(&comms, |r, c| {
            let dt = DType::U8;
            for root in 0..n {
                for len in [0usize, 1, 7, 300] {
                    let input = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                    let outs: Vec<_> = if r == root { (0..n).map(|_| buf(dt, &vec![0.0; len])).collect() } else { vec![] };
                    gather(c, &input, &outs, root);
                    for (p, o) in outs.iter().enumerate() {
                        assert_eq!(read(dt, o), values(dt, ReduceOp::Sum, p, len), "gather n={n} root={root} from {p}");
                    }

                    let ins: Vec<_> =
                        if r == root { (0..n).map(|p| buf(dt, &values(dt, ReduceOp::Max, p, len))).collect() } else { vec![] };
                    let out = buf(dt, &vec![0.0; len]);
                    let mut s = spec(OpKind::Scatter);
                    s.root = root as i64;
                    s.inputs = ins.iter().map(t).collect();
                    s.outputs = vec![t(&out)];
                    run(c, s);
                    assert_eq!(read(dt, &out), values(dt, ReduceOp::Max, r, len), "scatter n={n} root={root}");
                }
                run(c, spec(OpKind::Barrier));
            }
        });
    }
}

#[test]
fn coalesced_all_reduce_packed_and_mixed() {
    for n in [1, 2, 3, 4] {
        let comms = loopback_comms(n, tiny_algo());
        on_ranks(&comms, |r, c| {
            for dts in [[DType::F32, DType::F32, DType::F32], [DType::F32, DType::I64, DType::F16]] {
                let lens = [5usize, 0, 130];
                let bufs: Vec<_> = dts.iter().zip(lens).map(|(&dt, l)| buf(dt, &values(dt, ReduceOp::Sum, r, l))).collect();
                let mut s = spec(OpKind::AllReduce);
                s.inputs = bufs.iter().map(t).collect();
                run(c, s);
                for ((&dt, l), b) in dts.iter().zip(lens).zip(&bufs) {
                    let contribs: Vec<Vec<f64>> = (0..n).map(|p| values(dt, ReduceOp::Sum, p, l)).collect();
                    assert_close(dt, ReduceOp::Sum, &read(dt, b), &reference(dt, ReduceOp::Sum, &contribs), "coalesced");
                }
            }
        });
    }
}

#[test]
fn many_in_flight_complete_in_order() {
    let n = 3;
    let comms = loopback_comms(n, tiny_algo());
    on_ranks(&comms, |r, c| {
        let k = 40;
        let bufs: Vec<_> = (0..k).map(|j| buf(DType::I64, &vec![(r * 1000 + j) as f64; 50 + j])).collect();
        let works: Vec<_> = bufs
            .iter()
            .map(|b| {
                let mut s = spec(OpKind::AllReduce);
                s.inputs = vec![t(b)];
                c.submit(vec![s], None, None).unwrap()
            })
            .collect();
        // Completion order follows submission order.
        for (j, w) in works.iter().enumerate().rev() {
            w.wait(None).unwrap();
            for earlier in &works[..j] {
                assert!(earlier.is_completed(), "work {j} finished before an earlier one");
            }
        }
        for (j, b) in bufs.iter().enumerate() {
            let want = (0..n).map(|p| (p * 1000 + j) as f64).sum::<f64>();
            assert!(read(DType::I64, b).iter().all(|&v| v == want));
        }
        assert_eq!(c.seq(), k as u64);
    });
}

/// Small-message algorithms up to 4 KiB, 64 KiB segments: the sweeps'
/// large buffers take many segments.
fn large_buffer_algo() -> rustccl::config::AlgoConfig {
    rustccl::config::AlgoConfig { small_allreduce_bytes: 4096, small_broadcast_bytes: 4096, segment_bytes: 64 << 10, ..Default::default() }
}

#[test]
fn tcp_sweep_with_large_buffers() {
    // Real sockets: recursive doubling, multi-segment ring and chain paths,
    // buffers larger than the kernel's socket buffers.
    for n in [2, 3, 4] {
        mesh_sweep(&tcp_comms(n, large_buffer_algo(), std::time::Duration::from_secs(60)));
    }
}

#[test]
fn shm_sweep_with_large_buffers() {
    // Shared memory with 4 KiB rings and 256-byte pipeline pieces: ring
    // wrap-around, one-round and many-round direct all_reduce.
    for n in [2, 3, 4] {
        let comms = shm_comms(n, large_buffer_algo(), std::time::Duration::from_secs(60));
        assert_eq!(comms[0].transport_kind(), "shm");
        mesh_sweep(&comms);
    }
}

#[test]
fn shm_all_reduce_every_dtype_and_op() {
    for n in [2, 3, 5] {
        let comms = shm_comms(n, tiny_algo(), std::time::Duration::from_secs(60));
        all_reduce_sweep(&comms, &ALL_DTYPES, &sizes(n));
        // bitwise identical results on every rank
        let got = on_ranks(&comms, |r, c| {
            let vals: Vec<f64> = (0..1001).map(|i| ((r * 31 + i * 17) % 97) as f64 / 7.3).collect();
            let b = buf(DType::F32, &vals);
            let mut s = spec(OpKind::AllReduce);
            s.inputs = vec![t(&b)];
            run(c, s);
            b.to_vec::<u32>().unwrap()
        });
        assert!(got.iter().all(|g| g == &got[0]), "n={n}: ranks differ");
    }
}

#[test]
fn hosts_mix_shared_memory_and_tcp() {
    // Simulated hosts: shared memory within a host, TCP across, the
    // hierarchical all_reduce, and every other collective over mixed links.
    let shm = rustccl::config::ShmConfig { threads: auto0(2), ..common::TINY_SHM };
    for layout in [vec![0, 0, 1, 1], vec![0, 1, 0, 1, 1], vec![0, 0, 1]] {
        let comms = hosts_comms(&layout, tiny_algo(), std::time::Duration::from_secs(60), rustccl::config::TransportMode::Auto, shm);
        assert_eq!(comms[0].transport_kind(), "shm+tcp", "{layout:?}");
        all_reduce_sweep(&comms, &[DType::F32, DType::I32, DType::BF16], &sizes(layout.len()));
        mesh_sweep(&comms);
        let algos: Vec<_> = comms.iter().map(|c| c.stats().snapshot()["all_reduce"].algorithm).collect();
        assert!(algos.iter().all(|a| *a == "hierarchical"), "{layout:?}: {algos:?}");
    }
}

fn mesh_sweep(comms: &[rustccl::Communicator]) {
    let n = comms.len();
    {
        all_reduce_sweep(comms, &[DType::F32, DType::BF16, DType::I64], &[0, 1, 1000, 300_001]);
        on_ranks(comms, |r, c| {
            let len = 1 << 20;
            let dt = DType::F32;
            for root in [0, n - 1] {
                let b = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                let mut s = spec(OpKind::Broadcast);
                s.root = root as i64;
                s.inputs = vec![t(&b)];
                run(c, s);
                assert_eq!(read(dt, &b), values(dt, ReduceOp::Sum, root, len));
            }
            let input = buf(dt, &values(dt, ReduceOp::Sum, r, len / 4));
            let out = buf(dt, &vec![0.0; len / 4 * n]);
            let mut s = spec(OpKind::AllGather);
            s.inputs = vec![t(&input)];
            s.outputs = vec![t(&out)];
            run(c, s);
            let expect: Vec<f64> = (0..n).flat_map(|p| values(dt, ReduceOp::Sum, p, len / 4)).collect();
            assert_eq!(read(dt, &out), expect);
            run(c, spec(OpKind::Barrier));
        });
    }
}
