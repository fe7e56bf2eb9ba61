//! The one-step shared-memory collectives (all_reduce, broadcast,
//! all_gather, barrier through the two small slots; all_to_all, gather and
//! scatter when every rank's blocks fit its small slot): back to back with
//! ranks that run ahead of each other, mixed with the multi-step
//! algorithms and with calls where only some ranks' blocks fit, against
//! local references; ranks that disagree on the size, so that some
//! would take one step and others several; and ranks that name different
//! roots, on every shared-memory path of the rooted collectives.

use crate::common::auto0;
use std::time::Duration;

use crate::common;
use crate::common::*;
use rustccl::config::{Setting, ShmConfig, TransportMode};
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
        assert!(matches!(e, Error::Mismatch { .. }), "{s}");
        assert!(s.contains("broadcast") && s.contains("different tensors"), "{s}");
    }
}

/// Shared memory that reads peers' tensors from `attach_min` bytes, with
/// 256-byte small slots (192 bytes of blocks with 3 ranks).
fn attach_comms(n: usize, attach_min: usize) -> Vec<Communicator> {
    let shm = ShmConfig { threads: auto0(2), attach_min: Setting::Fixed(attach_min), ..common::TINY_SHM };
    mesh_comms(n, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm)
}

/// all_to_all with `lens[src][dst]` u8 elements from src to dst, values
/// naming (iteration, src, dst, index); checks what rank `r` got.
fn all_to_all_check(c: &Communicator, r: usize, i: usize, lens: &[Vec<usize>]) {
    let n = lens.len();
    let v = |src: usize, dst: usize, k: usize| ((i * 5 + src * 17 + dst * 3 + k) % 251) as f64;
    let flat_in: Vec<f64> = (0..n).flat_map(|d| (0..lens[r][d]).map(move |k| v(r, d, k))).collect();
    let want: Vec<f64> = (0..n).flat_map(|s| (0..lens[s][r]).map(move |k| v(s, r, k))).collect();
    let ib = buf(DType::U8, &flat_in);
    let ob = buf(DType::U8, &vec![0.0; want.len()]);
    let mut s = spec(OpKind::AllToAll);
    s.in_splits = lens[r].iter().map(|&l| l as i64).collect();
    s.out_splits = (0..n).map(|src| lens[src][r] as i64).collect();
    s.inputs = vec![t(&ib)];
    s.outputs = vec![t(&ob)];
    run(c, s);
    assert_eq!(read(DType::U8, &ob), want, "all_to_all iteration {i} rank {r} lens {lens:?}");
}

#[test]
fn blocks_in_small_slots_back_to_back_and_mixed_with_larger_ones() {
    let n = 3;
    // attach from 0: blocks that do not fit a small slot are read from the
    // sender's tensor; from 1 MiB: through its input slots
    for attach_min in [0, 1 << 20] {
        let comms = attach_comms(n, attach_min);
        on_ranks(&comms, |r, c| {
            for i in 0..300 {
                stagger(r, i);
                let root = i % n;
                match i % 4 {
                    // every rank's blocks fit: one step
                    0 => all_to_all_check(c, r, i, &vec![vec![1 + i % 20; n]; n]),
                    // rank `root` sends 300-byte blocks (not in its slot),
                    // the others a few bytes (in theirs): the blocks come
                    // from both places and the call takes both steps
                    1 => all_to_all_check(c, r, i, &(0..n).map(|s| vec![if s == root { 300 } else { 1 + s }; n]).collect::<Vec<_>>()),
                    2 => {
                        let len = if i % 8 == 2 { 150 } else { 1 + i % 40 };
                        let input = buf(DType::U8, &vals(r, i, len));
                        let outs: Vec<_> = if r == root { (0..n).map(|_| buf(DType::U8, &vec![0.0; len])).collect() } else { vec![] };
                        gather(c, &input, &outs, root);
                        for (p, o) in outs.iter().enumerate() {
                            assert_eq!(read(DType::U8, o), vals(p, i, len), "gather iteration {i} from {p}");
                        }
                    }
                    _ => {
                        // 2 x 150 bytes do not fit the root's slot
                        let len = if i % 8 == 3 { 150 } else { 1 + i % 40 };
                        let ins: Vec<_> = if r == root { (0..n).map(|p| buf(DType::U8, &vals(p, i, len))).collect() } else { vec![] };
                        let out = buf(DType::U8, &vec![0.0; len]);
                        scatter(c, &ins, &out, root);
                        assert_eq!(read(DType::U8, &out), vals(r, i, len), "scatter iteration {i} rank {r}");
                    }
                }
            }
        });
    }
}

#[test]
fn a_block_size_mismatch_in_a_small_slot_names_the_sender_and_the_group_goes_on() {
    // one-float blocks, in the senders' small slots; rank 2 expects 2
    // from rank 0
    let errs = all_to_all_one_short(&attach_comms(3, 0), 1);
    assert!(errs[0].is_none() && errs[1].is_none(), "{errs:?}");
    let e = errs[2].as_deref().expect("rank 2 sees the mismatch");
    assert!(e.contains("rustccl") && e.contains("all_to_all") && e.contains("expects 8 bytes from rank 0, which sends 4"), "{e}");
}

/// Ranks 0 and 1 name root 0, rank 2 names root 1: every rank must fail at
/// the check of the first step, whatever algorithm its size picks.
fn roots_disagree(comms: &[Communicator], kind: OpKind, len: usize, what: &str) {
    let errs = on_ranks(comms, |r, c| {
        let root = if r == 2 { 1 } else { 0 };
        let b = buf(DType::F32, &vec![r as f64; len]);
        let outs: Vec<_> = (0..3).map(|_| buf(DType::F32, &vec![0.0; len])).collect();
        let mut s = spec(kind);
        s.root = root as i64;
        match kind {
            OpKind::Gather => {
                s.inputs = vec![t(&b)];
                s.outputs = if r == root { outs.iter().map(t).collect() } else { vec![] };
            }
            OpKind::Scatter => {
                s.inputs = if r == root { outs.iter().map(t).collect() } else { vec![] };
                s.outputs = vec![t(&b)];
            }
            _ => s.inputs = vec![t(&b)],
        }
        c.submit(vec![s], None, None).unwrap().wait(None).unwrap_err()
    });
    for e in errs {
        let s = e.to_string();
        // every algorithm finds it at its first step's check: still in step
        assert!(matches!(e, Error::Mismatch { .. }) && s.contains("different roots"), "{what}: {s}");
    }
}

#[test]
fn ranks_that_name_different_roots_fail_together() {
    // 256-byte small slots: 10 floats take one step, 1000 several
    for (kind, len, what) in [
        (OpKind::Broadcast, 10, "one-step broadcast"),
        (OpKind::Broadcast, 1000, "broadcast in rounds"),
        (OpKind::Reduce, 10, "one-round reduce"),
        (OpKind::Reduce, 1000, "pipelined reduce"),
    ] {
        roots_disagree(&shm_comms(3, tiny_algo(), Duration::from_secs(10)), kind, len, what);
    }
    for (kind, len, what) in [
        (OpKind::Broadcast, 1000, "broadcast read from the root's tensor"),
        (OpKind::Reduce, 1000, "reduce reading the peers' tensors"),
        (OpKind::Gather, 4, "gather through small slots"),
        (OpKind::Gather, 1000, "gather read from tensors"),
        (OpKind::Scatter, 4, "scatter through the root's small slot"),
        (OpKind::Scatter, 1000, "scatter read from the root's tensors"),
    ] {
        roots_disagree(&attach_comms(3, 0), kind, len, what);
    }
}
