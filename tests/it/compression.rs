//! Compressed all-reduce between simulated hosts: every rank gets the same
//! bits, equal to a local reference of the same quantisation (each host's
//! exact partial sum encoded, decoded and summed in host order), within the
//! codec's error bound of the exact sum; error feedback keeps the running
//! sum on track; other ops, dtypes and single-host groups stay exact.

use crate::common::auto0;
use std::time::Duration;

use crate::common;
use crate::common::*;
use rustccl::collectives::compress::codec::{Codec, INT8_BLOCK};
use rustccl::comm::compression::{set_next, Setting};
use rustccl::config::{ShmConfig, TransportMode};
use rustccl::{Communicator, DType, OpKind, ReduceOp};

const SHM: ShmConfig = ShmConfig { threads: auto0(2), ..common::TINY_SHM };

fn comms(layout: &[usize]) -> Vec<Communicator> {
    hosts_comms(layout, tiny_algo(), Duration::from_secs(60), TransportMode::Auto, SHM)
}

/// Quarter-integers: every partial sum is exact in f32 in any order.
fn vals(r: usize, n: usize, step: usize) -> Vec<f64> {
    (0..n).map(|i| (((r * 131 + i * 37 + step * 17) % 201) as f64 - 100.0) * 0.25 * if i / 600 % 2 == 0 { 1.0 } else { 40.0 }).collect()
}

/// Ranks grouped by host, hosts in order of their lowest rank.
fn hosts_of(layout: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = Vec::new();
    for &h in layout {
        if !order.contains(&h) {
            order.push(h);
        }
    }
    order.iter().map(|h| (0..layout.len()).filter(|r| layout[*r] == *h).collect()).collect()
}

/// What the engine must produce: each host's exact partial, through the
/// codec, decoded and summed in host order (f32), AVG divided once.
fn reference(codec: Codec, layout: &[usize], contribs: &[Vec<f64>], avg: bool) -> (Vec<f32>, Vec<f64>) {
    let n = contribs[0].len();
    let mut acc = vec![0f32; n];
    let mut bound = vec![0f64; n];
    for (k, h) in hosts_of(layout).iter().enumerate() {
        let partial: Vec<f32> = (0..n).map(|i| h.iter().map(|&r| contribs[r][i]).sum::<f64>() as f32).collect();
        let mut p = vec![0u8; codec.payload_len(n)];
        codec.encode(&partial, &mut p).unwrap();
        codec.decode(&p, &mut acc, k > 0).unwrap();
        for (b, blk) in partial.chunks(INT8_BLOCK).enumerate() {
            let m = blk.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            for (j, v) in blk.iter().enumerate() {
                bound[b * INT8_BLOCK + j] += match codec {
                    Codec::Int8 => m / 254.0 * 1.001,
                    Codec::Bf16 => v.abs() as f64 * 2f64.powi(-8),
                    Codec::Fp16 => v.abs() as f64 * 2f64.powi(-11),
                };
            }
        }
    }
    if avg {
        let m = layout.len() as f32;
        acc.iter_mut().for_each(|v| *v /= m);
    }
    (acc, bound)
}

fn all_reduce(c: &Communicator, b: &std::sync::Arc<rustccl::tensor::SharedBuf>, op: ReduceOp) {
    let mut s = spec(OpKind::AllReduce);
    s.reduce_op = op as i32;
    s.inputs = vec![t(b)];
    run(c, s);
}

#[test]
fn compressed_all_reduce_matches_reference_on_every_rank() {
    for layout in [vec![0, 0, 1, 1], vec![0, 1, 0, 1, 1], vec![0, 1], vec![0, 0, 1, 2, 2]] {
        let cs = comms(&layout);
        for codec in [Codec::Int8, Codec::Bf16, Codec::Fp16] {
            cs.iter().for_each(|c| c.set_compression(Some(Setting { codec, feedback: false })));
            for (n, avg) in [(1usize, false), (255, true), (1000, false), (70_001, true), (600_001, false)] {
                let contribs: Vec<Vec<f64>> = (0..layout.len()).map(|r| vals(r, n, 0)).collect();
                let op = if avg { ReduceOp::Avg } else { ReduceOp::Sum };
                let got = on_ranks(&cs, |r, c| {
                    let b = buf(DType::F32, &contribs[r]);
                    all_reduce(c, &b, op);
                    b.to_vec::<f32>().unwrap()
                });
                let (want, bound) = reference(codec, &layout, &contribs, avg);
                let exact = common::reference(DType::F32, op, &contribs);
                let m = if avg { layout.len() as f64 } else { 1.0 };
                for (r, g) in got.iter().enumerate() {
                    assert!(
                        g.iter().zip(&got[0]).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{layout:?} {codec:?} n={n}: rank {r} differs from rank 0"
                    );
                }
                for i in 0..n {
                    assert_eq!(got[0][i], want[i], "{layout:?} {codec:?} n={n} i={i}: engine vs reference");
                    let err = (got[0][i] as f64 - exact[i]).abs();
                    assert!(
                        err <= bound[i] / m + exact[i].abs() * 1e-6,
                        "{layout:?} {codec:?} n={n} i={i}: error {err} > bound {}",
                        bound[i] / m
                    );
                }
            }
            let st = cs[0].stats().snapshot()["all_reduce"].clone();
            assert_eq!((st.algorithm, st.codec), ("hierarchical_compressed", codec.name()), "{layout:?}");
        }
    }
}

#[test]
fn other_dtypes_ops_and_single_host_stay_exact() {
    let layout = [0, 0, 1, 1];
    let cs = comms(&layout);
    cs.iter().for_each(|c| c.set_compression(Some(Setting { codec: Codec::Int8, feedback: true })));
    for (dtype, op) in [
        (DType::F32, ReduceOp::Max),
        (DType::F32, ReduceOp::Min),
        (DType::I32, ReduceOp::Sum),
        (DType::I64, ReduceOp::Avg),
        (DType::F32, ReduceOp::Product),
    ] {
        let contribs: Vec<Vec<f64>> = (0..4).map(|r| values(dtype, op, r, 3001)).collect();
        let want = common::reference(dtype, op, &contribs);
        on_ranks(&cs, |r, c| {
            let b = buf(dtype, &contribs[r]);
            all_reduce(c, &b, op);
            assert_eq!(read(dtype, &b), want, "{dtype} {op:?} rank {r}");
        });
        let st = cs[0].stats().snapshot()["all_reduce"].clone();
        assert_eq!(st.algorithm, "hierarchical", "{dtype} {op:?}");
    }
    // One host: nothing crosses hosts, nothing is compressed.
    let one = comms(&[0, 0]);
    one.iter().for_each(|c| c.set_compression(Some(Setting { codec: Codec::Int8, feedback: true })));
    let contribs: Vec<Vec<f64>> = (0..2).map(|r| vals(r, 5000, 1).iter().map(|v| (v * 1.001) as f32 as f64).collect()).collect();
    let want = common::reference(DType::F32, ReduceOp::Sum, &contribs);
    on_ranks(&one, |r, c| {
        let b = buf(DType::F32, &contribs[r]);
        all_reduce(c, &b, ReduceOp::Sum);
        let got = read(DType::F32, &b);
        assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= w.abs() * 1e-6), "single host must stay exact");
    });
    // Off again: exact.
    cs.iter().for_each(|c| c.set_compression(None));
    let contribs: Vec<Vec<f64>> = (0..4).map(|r| vals(r, 5000, 2)).collect();
    let want = common::reference(DType::F32, ReduceOp::Sum, &contribs);
    on_ranks(&cs, |r, c| {
        let b = buf(DType::F32, &contribs[r]);
        all_reduce(c, &b, ReduceOp::Sum);
        assert_eq!(read(DType::F32, &b), want);
    });
}

#[test]
fn half_and_double_inputs_compress() {
    let layout = [0, 0, 1, 1];
    let cs = comms(&layout);
    cs.iter().for_each(|c| c.set_compression(Some(Setting { codec: Codec::Int8, feedback: false })));
    for dtype in [DType::F64, DType::BF16, DType::F16] {
        // Quarter-integers up to 12.5: inputs and partial sums exact in bf16 too.
        let contribs: Vec<Vec<f64>> =
            (0..4).map(|r| (0..2000).map(|i| (((r * 131 + i * 37) % 101) as f64 - 50.0) * 0.25).collect()).collect();
        let exact = common::reference(DType::F64, ReduceOp::Sum, &contribs);
        let (want, bound) = reference(Codec::Int8, &layout, &contribs, false);
        let got = on_ranks(&cs, |r, c| {
            let b = buf(dtype, &contribs[r]);
            all_reduce(c, &b, ReduceOp::Sum);
            read(dtype, &b)
        });
        let out_round = if dtype == DType::F64 { 0.0 } else { 2f64.powi(-7) };
        for g in &got {
            assert_eq!(g, &got[0], "{dtype}: ranks differ");
        }
        for i in 0..2000 {
            let w = want[i] as f64;
            assert!((got[0][i] - w).abs() <= w.abs() * out_round, "{dtype} i={i}: {} vs reference {w}", got[0][i]);
            assert!((got[0][i] - exact[i]).abs() <= bound[i] + exact[i].abs() * out_round + 1e-9, "{dtype} i={i}");
        }
    }
}

#[test]
fn error_feedback_keeps_the_running_sum_on_track() {
    // The same inputs every step: without feedback the rounding error is the
    // same each step and the running sum drifts linearly; with feedback the
    // gap stays within about one step's error.
    let layout = [0, 0, 1, 1];
    let steps = 40;
    let n = 3000;
    let contribs: Vec<Vec<f64>> = (0..4).map(|r| vals(r, n, 0).iter().map(|v| v * 1.37).collect()).collect();
    let exact = common::reference(DType::F32, ReduceOp::Sum, &contribs);
    let (_, bound) = reference(Codec::Int8, &layout, &contribs, false);
    let mut gaps = Vec::new();
    for feedback in [false, true] {
        let cs = comms(&layout);
        let sums = on_ranks(&cs, |r, c| {
            let mut sum = vec![0f64; n];
            for _ in 0..steps {
                set_next("test", Some(Setting { codec: Codec::Int8, feedback }), "bucket0");
                let b = buf(DType::F32, &contribs[r]);
                all_reduce(c, &b, ReduceOp::Sum);
                sum.iter_mut().zip(read(DType::F32, &b)).for_each(|(s, v)| *s += v);
            }
            sum
        });
        assert!(sums.iter().all(|s| s == &sums[0]), "ranks differ");
        let worst = (0..n).map(|i| (sums[0][i] - steps as f64 * exact[i]).abs() / bound[i].max(1e-9)).fold(0f64, f64::max);
        gaps.push(worst);
    }
    assert!(gaps[1] <= 2.5, "with feedback the running-sum gap is {} step bounds", gaps[1]);
    assert!(gaps[0] > 4.0 * gaps[1], "without feedback the gap ({}) should grow with the steps", gaps[0]);
}

#[test]
fn stats_count_bytes_between_hosts() {
    let layout = [0, 0, 1, 1];
    let n = 100_000;
    let mut sent = Vec::new();
    for codec in [None, Some(Codec::Bf16), Some(Codec::Int8)] {
        let cs = comms(&layout);
        cs.iter().for_each(|c| c.set_compression(codec.map(|codec| Setting { codec, feedback: true })));
        on_ranks(&cs, |r, c| all_reduce(c, &buf(DType::F32, &vals(r, n, 0)), ReduceOp::Sum));
        let per_rank: Vec<u64> = cs.iter().map(|c| c.stats().snapshot()["all_reduce"].between_hosts_bytes).collect();
        assert_eq!((per_rank[1], per_rank[3]), (0, 0), "only leaders cross hosts: {per_rank:?}");
        sent.push(per_rank[0]);
    }
    assert_eq!(sent[0], 4 * n as u64, "uncompressed ring between 2 leaders sends the buffer once");
    assert_eq!(sent[1], Codec::Bf16.payload_len(n) as u64);
    assert_eq!(sent[2], Codec::Int8.payload_len(n) as u64);
}

#[test]
fn a_rejected_call_does_not_pass_its_codec_on() {
    let layout = [0, 0, 1, 1];
    let cs = comms(&layout);
    let contribs: Vec<Vec<f64>> = (0..4).map(|r| vals(r, 4000, 5)).collect();
    let want = common::reference(DType::F32, ReduceOp::Sum, &contribs);
    let (lossy, _) = reference(Codec::Int8, &layout, &contribs, false);
    assert!(lossy.iter().zip(&want).any(|(l, w)| *l as f64 != *w), "int8 would change these values");
    on_ranks(&cs, |r, c| {
        set_next("test", Some(Setting { codec: Codec::Int8, feedback: false }), "k");
        let mut bad = spec(OpKind::AllReduce);
        bad.reduce_op = 99;
        bad.inputs = vec![t(&buf(DType::F32, &contribs[r]))];
        assert!(c.submit(vec![bad], None, None).is_err());
        let b = buf(DType::F32, &contribs[r]);
        all_reduce(c, &b, ReduceOp::Sum);
        assert_eq!(read(DType::F32, &b), want, "rank {r}: compressed after all");
    });
    assert_eq!(cs[0].stats().snapshot()["all_reduce"].algorithm, "hierarchical");
}
