//! The one-step shared-memory collectives (all_reduce, broadcast,
//! all_gather, barrier through the two small slots): back to back with
//! ranks that run ahead of each other, mixed with the multi-step
//! algorithms, against local references; and ranks that disagree on the
//! size, so that some would take one step and others several.

mod common;

use std::time::Duration;

use common::*;
use rustccl::error::Error;
use rustccl::{Communicator, DType, OpKind, ReduceOp};

fn algorithm(c: &Communicator, op: &str) -> &'static str {
    c.stats().snapshot()[op].algorithm
}

/// A few microseconds of busy work, different per rank and iteration, so
/// that ranks leave each step at different times and the fast ones write
/// the next operation's data while the slow ones still read this one's.
fn stagger(r: usize, i: usize) {
    let spins = ((r * 7 + i * 13) % 5) * 3000;
    let mut x = 0u64;
    for k in 0..spins {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(k as u64));
    }
    if (r + i) % 3 == 0 {
        std::thread::yield_now();
    }
}

/// Rank `r`'s values in iteration `i`: every iteration and rank differs,
/// so data of another operation or rank shows.
fn vals(r: usize, i: usize, len: usize) -> Vec<f64> {
    (0..len).map(|k| ((r * 31 + i * 7 + k) % 97) as f64).collect()
}

#[test]
fn one_step_operations_back_to_back_with_ranks_out_of_step() {
    // small slots of 256 bytes: every operation below fits one, except
    // the 100-float broadcast and all-reduce, which take the multi-step
    // algorithms in between
    let n = 4;
    let comms = shm_comms(n, tiny_algo(), Duration::from_secs(60));
    on_ranks(&comms, |r, c| {
        for i in 0..600 {
            stagger(r, i);
            let what = format!("iteration {i} rank {r}");
            match i % 5 {
                0 => {
                    let len = 1 + i % 60;
                    let b = buf(DType::F32, &vals(r, i, len));
                    all_reduce(c, &b, ReduceOp::Sum);
                    let want: Vec<f64> = (0..len).map(|k| (0..n).map(|p| vals(p, i, len)[k]).sum()).collect();
                    assert_eq!(read(DType::F32, &b), want, "all_reduce {what}");
                }
                1 => {
                    let (len, root) = (if i % 4 == 1 { 100 } else { 1 + i % 30 }, i % n);
                    let b = buf(DType::I64, &vals(r, i, len));
                    broadcast(c, &b, root);
                    assert_eq!(read(DType::I64, &b), vals(root, i, len), "broadcast {what}");
                }
                2 => {
                    let len = 1 + i % 7;
                    let input = buf(DType::I64, &vals(r, i, len));
                    let outs: Vec<_> = (0..n).map(|_| buf(DType::I64, &vec![0.0; len])).collect();
                    let mut s = spec(OpKind::AllGather);
                    s.inputs = vec![t(&input)];
                    s.outputs = outs.iter().map(t).collect();
                    run(c, s);
                    for (p, o) in outs.iter().enumerate() {
                        assert_eq!(read(DType::I64, o), vals(p, i, len), "all_gather part {p} {what}");
                    }
                }
                3 => run(c, spec(OpKind::Barrier)),
                _ => {
                    let b = buf(DType::F32, &vals(r, i, 100));
                    all_reduce(c, &b, ReduceOp::Max);
                    let want: Vec<f64> = (0..100).map(|k| (0..n).map(|p| vals(p, i, 100)[k]).fold(f64::MIN, f64::max)).collect();
                    assert_eq!(read(DType::F32, &b), want, "all_reduce max {what}");
                }
            }
        }
    });
    for c in &comms {
        for op in ["broadcast", "all_gather", "barrier"] {
            assert_eq!(algorithm(c, op), "shm_one_round", "{op}");
        }
        assert_eq!(algorithm(c, "all_reduce"), "shm_pipelined");
    }
}

#[test]
fn a_barrier_waits_for_the_last_rank() {
    let comms = shm_comms(3, tiny_algo(), Duration::from_secs(30));
    let arrived = std::sync::atomic::AtomicUsize::new(0);
    on_ranks(&comms, |r, c| {
        for round in 0..20 {
            if r == round % 3 {
                std::thread::sleep(Duration::from_millis(2));
            }
            arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            run(c, spec(OpKind::Barrier));
            let seen = arrived.load(std::sync::atomic::Ordering::SeqCst);
            assert!(seen >= 3 * (round + 1), "round {round}: left the barrier with {seen} arrivals");
            run(c, spec(OpKind::Barrier)); // nobody starts the next round before all checked
        }
    });
    assert_eq!(algorithm(&comms[0], "barrier"), "shm_one_round");
}

#[test]
fn ranks_that_would_take_one_step_and_several_fail_together() {
    // rank 0's broadcast fits a small slot (256 bytes here), rank 1's does
    // not: both must fail at the size check, not hang or mix data
    let comms = shm_comms(2, tiny_algo(), Duration::from_secs(10));
    let errs = on_ranks(&comms, |r, c| {
        let b = buf(DType::U8, &vec![1.0; if r == 0 { 200 } else { 300 }]);
        let mut s = spec(OpKind::Broadcast);
        s.inputs = vec![t(&b)];
        c.submit(vec![s], None, None).unwrap().wait(None).unwrap_err()
    });
    for e in errs {
        let s = e.to_string();
        assert!(matches!(e, Error::Protocol { .. }), "{s}");
        assert!(s.contains("broadcast") && s.contains("different tensors"), "{s}");
    }
}
