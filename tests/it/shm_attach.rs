//! The single-copy collectives (ranks read each other's tensors through
//! cross-memory attach) against local references: every collective,
//! uneven and empty parts, every root, several dtypes and ops; the
//! threshold that picks them; and a size mismatch that fails cleanly and
//! leaves the group usable. Ranks are threads of this process, so the
//! reads go through process_vm_readv on our own pid, the same system call
//! as between processes.

use crate::common::auto0;
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use crate::common::*;
use rustccl::config::{Setting, ShmConfig, TransportMode};
use rustccl::tensor::SharedBuf;
use rustccl::{Communicator, DType, OpKind, ReduceOp};

/// Sizes around the worker pieces (256-byte minimum here), the 768-byte
/// slots (with the threshold at 1 MiB, blocks of up to one slot go
/// through the sender's input slots, packed one after the other, and with
/// 2 ranks blocks of up to both: 175 f32 all_to_all elements make blocks
/// of 0, 700 and 1400 bytes, slots and reads mixed in one call with 3
/// ranks; a 1000-byte gather block of 2 ranks fills both of its sender's
/// slots; 700-byte gather / scatter blocks are two pieces each, copied by
/// the worker threads) and the 64 KiB reduction block.
fn lens(n: usize) -> Vec<usize> {
    vec![0, 1, n + 1, 175, 700, 1000, 40_000]
}

/// With the threshold at 0 every collective reads directly; at 1 MiB the
/// buffer-wide ones keep their two-copy algorithms and all_to_all, gather
/// and scatter pass the blocks that fit the sender's input slots (768
/// bytes each with 3 ranks, both, 1536, with 2) through them and read
/// the others.
#[test]
fn every_collective_reads_the_peers_directly() {
    for (n, attach_min) in [(2, 0), (3, 0), (5, 0), (3, 1 << 20), (2, 1 << 20)] {
        let comms = attach_comms(n, attach_min);
        on_ranks(&comms, |r, c| {
            for len in lens(n) {
                for (dt, op) in
                    [(DType::F32, ReduceOp::Sum), (DType::BF16, ReduceOp::Max), (DType::I64, ReduceOp::Sum), (DType::F64, ReduceOp::Avg)]
                {
                    let b = buf(dt, &values(dt, op, r, len));
                    all_reduce(c, &b, op);
                    let contribs: Vec<Vec<f64>> = (0..n).map(|p| values(dt, op, p, len)).collect();
                    assert_close(
                        dt,
                        op,
                        &read(dt, &b),
                        &reference(dt, op, &contribs),
                        &format!("all_reduce {dt:?} {op:?} n={n} len={len}"),
                    );

                    check_reduce_scatter_flat(c, r, n, dt, op, len, &format!("reduce_scatter {dt:?} {op:?} n={n} len={len}"));
                }
                for root in 0..n {
                    let dt = DType::F32;
                    let b = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                    broadcast(c, &b, root);
                    assert_eq!(read(dt, &b), values(dt, ReduceOp::Sum, root, len), "broadcast n={n} root={root} len={len}");

                    for (dt, op) in [(DType::F32, ReduceOp::Max), (DType::F64, ReduceOp::Avg)] {
                        check_reduce(c, r, n, dt, op, root, len, &format!("reduce {dt:?} {op:?} n={n} root={root} len={len}"));
                    }

                    let input = buf(DType::U8, &values(DType::U8, ReduceOp::Sum, r, len));
                    let outs: Vec<_> = if r == root { (0..n).map(|_| buf(DType::U8, &vec![0.0; len])).collect() } else { vec![] };
                    let mut s = spec(OpKind::Gather);
                    s.root = root as i64;
                    s.inputs = vec![t(&input)];
                    s.outputs = outs.iter().map(t).collect();
                    run(c, s);
                    for (p, o) in outs.iter().enumerate() {
                        assert_eq!(read(DType::U8, o), values(DType::U8, ReduceOp::Sum, p, len), "gather n={n} root={root} from {p}");
                    }

                    let ins: Vec<_> = if r == root {
                        (0..n).map(|p| buf(DType::U8, &values(DType::U8, ReduceOp::Max, p, len))).collect()
                    } else {
                        vec![]
                    };
                    let out = buf(DType::U8, &vec![0.0; len]);
                    scatter(c, &ins, &out, root);
                    assert_eq!(read(DType::U8, &out), values(DType::U8, ReduceOp::Max, r, len), "scatter n={n} root={root}");
                }
                let dt = DType::I64;
                let expect: Vec<f64> = (0..n).flat_map(|p| values(dt, ReduceOp::Sum, p, len)).collect();
                let input = buf(dt, &values(dt, ReduceOp::Sum, r, len));
                let out = buf(dt, &vec![0.0; n * len]);
                let mut s = spec(OpKind::AllGather);
                s.inputs = vec![t(&input)];
                s.outputs = vec![t(&out)];
                run(c, s);
                assert_eq!(read(dt, &out), expect, "all_gather n={n} len={len}");

                // all_to_all with uneven (and empty) blocks: rank src sends
                // dst (src + dst) % 3 * len elements.
                let count = |src: usize, dst: usize| (src + dst) % 3 * len;
                let block =
                    |src: usize, dst: usize| -> Vec<f64> { (0..count(src, dst)).map(|i| ((src * 7 + dst * 3 + i) % 251) as f64).collect() };
                let ib = buf(DType::F32, &(0..n).flat_map(|p| block(r, p)).collect::<Vec<_>>());
                let expect: Vec<f64> = (0..n).flat_map(|p| block(p, r)).collect();
                let ob = buf(DType::F32, &vec![-1.0; expect.len()]);
                let mut s = spec(OpKind::AllToAll);
                s.in_splits = (0..n).map(|p| count(r, p) as i64).collect();
                s.out_splits = (0..n).map(|p| count(p, r) as i64).collect();
                s.inputs = vec![t(&ib)];
                s.outputs = vec![t(&ob)];
                run(c, s);
                assert_eq!(read(DType::F32, &ob), expect, "all_to_all n={n} len={len}");
            }
        });
        for c in &comms {
            for op in ["gather", "scatter", "all_to_all"] {
                assert_eq!(algorithm(c, op), "shm_attach", "{op} n={n}");
            }
            for op in ["all_reduce", "reduce_scatter", "broadcast", "reduce", "all_gather"] {
                assert_eq!(algorithm(c, op) == "shm_attach", attach_min == 0, "{op} n={n} attach_min={attach_min}");
            }
            if attach_min != 0 {
                // The last reduce (40 000 doubles) is over the tiny one-round size.
                assert_eq!(algorithm(c, "reduce"), "shm_pipelined", "n={n}");
            }
        }
    }
}

#[test]
fn the_threshold_picks_direct_reads_from_its_size_on() {
    let comms = attach_comms(3, 4096);
    let th = threshold(&comms[0], "shm_attach_min_bytes");
    assert_eq!(th, Some(4096));
    for (len, want) in [(1023usize, "shm_pipelined"), (1024, "shm_attach")] {
        let got = on_ranks(&comms, |r, c| {
            let b = buf(DType::F32, &(0..len).map(|i| (i * (r + 1)) as f64).collect::<Vec<_>>());
            all_reduce(c, &b, ReduceOp::Sum);
            assert_eq!(read(DType::F32, &b), (0..len).map(|i| (6 * i) as f64).collect::<Vec<_>>());
            algorithm(c, "all_reduce")
        });
        assert!(got.iter().all(|a| *a == want), "{len} floats: {got:?}");
    }
    // all_gather compares each rank's part (3 x 4092 bytes in all: slots)
    for (len, want) in [(1023usize, "shm_direct"), (1024, "shm_attach")] {
        let got = on_ranks(&comms, |r, c| {
            let input = buf(DType::F32, &(0..len).map(|i| (i + r * len) as f64).collect::<Vec<_>>());
            let out = buf(DType::F32, &vec![0.0; 3 * len]);
            let mut s = spec(OpKind::AllGather);
            s.inputs = vec![t(&input)];
            s.outputs = vec![t(&out)];
            run(c, s);
            assert_eq!(read(DType::F32, &out), (0..3 * len).map(|i| i as f64).collect::<Vec<_>>());
            algorithm(c, "all_gather")
        });
        assert!(got.iter().all(|a| *a == want), "all_gather of {len} floats per rank: {got:?}");
    }
    let off = attach_comms(2, usize::MAX);
    let th = threshold(&off[0], "shm_attach_min_bytes");
    assert_eq!(th, Some(u64::MAX), "off: not even probed");
}

/// Broadcast reads the root's tensor only from its own setting on: with
/// attach on for every other collective and the broadcast setting at its
/// default (off), a buffer of many steps goes through the root's shared
/// memory; with the setting, from its size on, it is read directly.
#[test]
fn broadcast_reads_the_root_only_from_its_own_setting() {
    for (broadcast_min, want) in [(usize::MAX, "shm_direct"), (1024, "shm_attach")] {
        let shm = ShmConfig {
            threads: auto0(3),
            attach_min: Setting::Fixed(0),
            broadcast_min: Setting::Fixed(broadcast_min),
            ..common::TINY_SHM
        };
        let comms = mesh_comms(3, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm);
        let th = threshold(&comms[0], "shm_broadcast_attach_min_bytes");
        assert_eq!(th, Some(broadcast_min as u64));
        for root in 0..3 {
            let got = on_ranks(&comms, |r, c| {
                let b = buf(DType::F32, &values(DType::F32, ReduceOp::Sum, r, 5003));
                broadcast(c, &b, root);
                assert_eq!(read(DType::F32, &b), values(DType::F32, ReduceOp::Sum, root, 5003), "root {root}");
                algorithm(c, "broadcast")
            });
            assert!(got.iter().all(|a| *a == want), "broadcast_min {broadcast_min}: {got:?}");
        }
    }
}

#[test]
fn a_size_mismatch_fails_on_the_rank_that_sees_it_and_the_group_goes_on() {
    // blocks of 100 floats, too large for the small slots: read from the
    // tensors; rank 2 expects 101 from rank 0
    let errs = all_to_all_one_short(&attach_comms(3, 0), 100);
    assert!(errs[0].is_none() && errs[1].is_none(), "{errs:?}");
    let e = errs[2].as_deref().expect("rank 2 sees the mismatch");
    assert!(
        e.contains("rustccl") && e.contains("all_to_all") && e.contains("from rank 0, which sends 400") && e.contains("expects 404 bytes"),
        "{e}"
    );
}

/// A rank that cannot reduce its part of an all_reduce or reduce (here
/// rank 1, which cannot read its part of rank 2's tensor: a page of it is
/// PROT_NONE) fails, and so does every rank that would take that part
/// from it (all_reduce: every other rank; reduce: the root, whether the
/// others write their parts into its buffer or it reads them), instead of
/// returning its half-reduced values as if all went well. A failed read
/// poisons the group (as every transport error does): every rank that
/// failed fails its next operation too.
#[test]
fn a_part_its_rank_could_not_reduce_fails_every_rank_that_takes_it() {
    const CHUNK: usize = 4096; // floats per rank's part: 16 KiB, 4 pages
    for push in [true, false] {
        for kind in [OpKind::AllReduce, OpKind::Reduce] {
            let shm = ShmConfig {
                threads: auto0(3),
                attach_min: Setting::Fixed(0),
                root_threads: auto0(5),
                broadcast_min: Setting::Fixed(0),
                gather_push: push,
                ..common::TINY_SHM
            };
            let comms = mesh_comms(3, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm);
            let errs = on_ranks(&comms, |r, c| {
                let b = buf(DType::F32, &vec![r as f64 + 1.0; 3 * CHUNK]);
                // rank 2: the second whole page of rank 1's part (protected
                // before rank 2 posts the buffer; the operation ends on
                // rank 2 once no rank reads it any more)
                let page = (b.tensor().expect("not lent").addr() + 4 * CHUNK).next_multiple_of(4096) + 4096;
                let op = |b: &Arc<SharedBuf>| {
                    let mut s = spec(kind);
                    s.reduce_op = ReduceOp::Sum as i32;
                    s.inputs = vec![t(b)];
                    c.submit(vec![s], None, None).unwrap().wait(None)
                };
                // the same operation, whole, first: the single-copy algorithm
                op(&buf(DType::F32, &[1.0; 3 * CHUNK])).unwrap();
                assert_eq!(algorithm(c, if kind == OpKind::AllReduce { "all_reduce" } else { "reduce" }), "shm_attach");
                protect(r == 2, page, libc::PROT_NONE);
                let res = op(&b);
                protect(r == 2, page, libc::PROT_READ | libc::PROT_WRITE);
                // (a rank whose part was fine would wait for the failed ones)
                let next_fails = res.is_err() && c.submit(vec![spec(OpKind::Barrier)], None, None).and_then(|w| w.wait(None)).is_err();
                (res.err().map(|e| e.to_string()), next_fails)
            });
            let what = format!("push={push} {kind:?}: {errs:?}");
            assert!(errs[1].0.as_deref().is_some_and(|e| e.contains("Bad address")), "{what}");
            let takers: &[usize] = if kind == OpKind::AllReduce { &[0, 2] } else { &[0] };
            for &r in takers {
                let e = errs[r].0.as_deref().unwrap_or_else(|| panic!("rank {r} took rank 1's part: {what}"));
                assert!(e.contains("rustccl") && e.contains("could not reduce its part"), "{what}");
            }
            for (r, (e, next_failed)) in errs.iter().enumerate() {
                assert_eq!(e.is_some(), *next_failed, "rank {r}: a failed rank fails its next operation: {what}");
            }
            if kind == OpKind::Reduce {
                assert!(errs[2].0.is_none(), "rank 2's part was fine: {what}");
            }
        }
    }
}

/// Ranks given different thresholds (or attach off on one of them) still
/// agree: off anywhere means off everywhere, otherwise the largest
/// threshold applies to all (no rank waits for another at setup or picks
/// another algorithm).
#[test]
fn ranks_with_different_settings_agree() {
    let with = |mins: [usize; 3]| comms_with(|r| ShmConfig { threads: auto0(2), attach_min: Setting::Fixed(mins[r]), ..common::TINY_SHM });
    let th = |c: &Communicator| threshold(c, "shm_attach_min_bytes");
    for (mins, want) in [([0, 4096, 64], Some(4096u64)), ([0, usize::MAX, 0], Some(u64::MAX))] {
        let comms = with(mins);
        assert!(comms.iter().all(|c| th(c) == want), "{mins:?}: {:?}", comms.iter().map(th).collect::<Vec<_>>());
        // and they run the same algorithm on either side of the threshold
        on_ranks(&comms, |r, c| {
            for len in [1000usize, 1024] {
                let b = buf(DType::F32, &vec![(r + 1) as f64; len]);
                all_reduce(c, &b, ReduceOp::Sum);
                assert_eq!(read(DType::F32, &b), vec![6.0; len]);
            }
        });
    }
}

/// Where one thread per rank reads slowly, the host rule reads no
/// buffer-wide collective's buffers, only single-reader transfers and
/// blocks over 256 KiB; here the same shape set by hand (collectives from
/// 2^40 bytes, single readers over 512 KiB): gathers / scatters of smaller
/// blocks go as messages, larger ones read the sender's tensor;
/// all_to_all runs the single-copy algorithm whatever its blocks (small
/// ones through the slots), all_reduce its two-copy one; sends of either
/// size arrive, and the thresholds say so.
#[test]
fn slow_reads_leave_only_blocks_single_reader_transfers_and_all_to_all_to_attach() {
    let shm = ShmConfig { attach_min: Setting::Fixed(1 << 40), single_min: auto0(512 << 10), ..common::TINY_SHM };
    let comms = mesh_comms(3, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm);
    for c in &comms {
        assert_eq!(threshold(c, "shm_attach_min_bytes"), Some(1 << 40));
        assert_eq!(threshold(c, "shm_single_reader_min_bytes"), Some(512 << 10));
    }
    // 128 Ki floats = 512 KiB per block (not over the threshold), 160 Ki over it
    for (len, want) in [(128usize << 10, "direct"), (160 << 10, "shm_attach")] {
        let got = on_ranks(&comms, |r, c| {
            let input = buf(DType::F32, &values(DType::F32, ReduceOp::Sum, r, len));
            let outs: Vec<_> = if r == 1 { (0..3).map(|_| buf(DType::F32, &vec![0.0; len])).collect() } else { vec![] };
            gather(c, &input, &outs, 1);
            for (p, o) in outs.iter().enumerate() {
                assert_eq!(read(DType::F32, o), values(DType::F32, ReduceOp::Sum, p, len), "gather {len} from {p}");
            }
            let ins: Vec<_> =
                if r == 2 { (0..3).map(|p| buf(DType::F32, &values(DType::F32, ReduceOp::Max, p, len))).collect() } else { vec![] };
            let out = buf(DType::F32, &vec![0.0; len]);
            scatter(c, &ins, &out, 2);
            assert_eq!(read(DType::F32, &out), values(DType::F32, ReduceOp::Max, r, len), "scatter {len}");
            // all_to_all: on the single-copy algorithm, whatever its blocks
            let ib = buf(DType::F32, &(0..3 * len).map(|i| ((r * 7 + i) % 251) as f64).collect::<Vec<_>>());
            let ob = buf(DType::F32, &vec![0.0; 3 * len]);
            let mut s = spec(OpKind::AllToAll);
            s.inputs = vec![t(&ib)];
            s.outputs = vec![t(&ob)];
            run(c, s);
            let want_a2a: Vec<f64> = (0..3).flat_map(|p| (0..len).map(move |i| ((p * 7 + r * len + i) % 251) as f64)).collect();
            assert_eq!(read(DType::F32, &ob), want_a2a, "all_to_all {len}");
            // a send of each size around the ring
            let b = buf(DType::F32, &vec![r as f64; len]);
            let got = buf(DType::F32, &vec![-1.0; len]);
            let w = send(c, &b, (r + 1) % 3, 5);
            recv(c, &got, Some((r + 2) % 3), 5).wait(None).unwrap();
            w.wait(None).unwrap();
            assert_eq!(read(DType::F32, &got), vec![((r + 2) % 3) as f64; len], "send {len}");
            // the buffer-wide collectives keep their two-copy algorithms
            let a = buf(DType::F32, &vec![1.0; len]);
            all_reduce(c, &a, ReduceOp::Sum);
            assert_eq!(read(DType::F32, &a), vec![3.0; len]);
            (algorithm(c, "gather"), algorithm(c, "scatter"), algorithm(c, "all_to_all"), algorithm(c, "all_reduce"))
        });
        for g in got {
            assert_eq!((g.0, g.1), (want, want), "{len} floats");
            assert_eq!(g.2, "shm_attach", "{len} floats");
            assert_ne!(g.3, "shm_attach");
        }
    }
}

/// Where no collective reads (set by hand here, as the host rule does for
/// one thread a rank) and more than 8 ranks share the host, scatter blocks
/// over 16 KiB are read from the root's tensor and gather blocks over
/// 64 KiB written into (or read by) the root, where all_to_all keeps the
/// general threshold (256 KiB); smaller blocks go as messages. With 8
/// ranks scatter and gather keep the general threshold too. Both give the
/// root's / senders' blocks, and the thresholds say so.
#[test]
fn slow_reads_on_many_ranks_read_scatter_blocks_from_16_kib_and_gather_blocks_from_64_kib() {
    for (n, scatter_min, gather_min) in [(9usize, 16u64 << 10, 64u64 << 10), (8, 256 << 10, 256 << 10)] {
        let shm = ShmConfig { attach_min: Setting::Fixed(1 << 40), ..common::TINY_SHM };
        let comms = mesh_comms(n, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm);
        for c in &comms {
            let th = |k| threshold(c, k);
            let got = (th("shm_block_read_min_bytes"), th("shm_scatter_block_read_min_bytes"), th("shm_gather_block_read_min_bytes"));
            assert_eq!(got, (Some(256 << 10), Some(scatter_min), Some(gather_min)), "n={n}");
        }
        // 4 Ki floats = 16 KiB a block (not over), 5 Ki over it; 16 Ki =
        // 64 KiB (not over), 17 Ki over it
        for len in [4usize << 10, 5 << 10, 16 << 10, 17 << 10] {
            let got = on_ranks(&comms, |r, c| {
                let ins: Vec<_> =
                    if r == 3 { (0..n).map(|p| buf(DType::F32, &values(DType::F32, ReduceOp::Max, p, len))).collect() } else { vec![] };
                let out = buf(DType::F32, &vec![-1.0; len]);
                scatter(c, &ins, &out, 3);
                assert_eq!(read(DType::F32, &out), values(DType::F32, ReduceOp::Max, r, len), "n={n} scatter {len}");
                let input = buf(DType::F32, &values(DType::F32, ReduceOp::Sum, r, len));
                let outs: Vec<_> = if r == 0 { (0..n).map(|_| buf(DType::F32, &vec![0.0; len])).collect() } else { vec![] };
                gather(c, &input, &outs, 0);
                for (p, o) in outs.iter().enumerate() {
                    assert_eq!(read(DType::F32, o), values(DType::F32, ReduceOp::Sum, p, len), "n={n} gather {len} from {p}");
                }
                (algorithm(c, "scatter"), algorithm(c, "gather"))
            });
            let how = |read: bool| if read { "shm_attach" } else { "direct" };
            for g in got {
                assert_eq!(g, (how(n > 8 && len > 4 << 10), how(n > 8 && len > 16 << 10)), "n={n} {len} floats");
            }
        }
    }
}

/// Where reads are slow (no collective reads, here set by hand),
/// all_to_all of uneven blocks runs the single-copy algorithm whatever
/// its blocks (small ones through the slots, larger ones read), while
/// gathers and scatters of small blocks keep the messages; 2 ranks.
#[test]
fn slow_reads_with_two_ranks_run_all_to_all_on_attach() {
    let shm = ShmConfig { attach_min: Setting::Fixed(1 << 40), block_min: auto0(2000), ..common::TINY_SHM };
    let comms = mesh_comms(2, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm);
    // rank r sends rank p (r + 2p + round) % 3 x 300 floats: 0, 1200 or 2400 bytes
    let count = |r: usize, p: usize, round: usize| (r + 2 * p + round) % 3 * 300;
    on_ranks(&comms, |r, c| {
        for round in 0..3usize {
            let ins: Vec<f64> =
                (0..2).flat_map(|p| (0..count(r, p, round)).map(move |i| (r * 10_000 + p * 1000 + i + round) as f64)).collect();
            let want: Vec<f64> =
                (0..2).flat_map(|p| (0..count(p, r, round)).map(move |i| (p * 10_000 + r * 1000 + i + round) as f64)).collect();
            let (ib, ob) = (buf(DType::F32, &ins), buf(DType::F32, &vec![-1.0; want.len()]));
            let mut s = spec(OpKind::AllToAll);
            s.inputs = vec![t(&ib)];
            s.outputs = vec![t(&ob)];
            s.in_splits = (0..2).map(|p| count(r, p, round) as i64).collect();
            s.out_splits = (0..2).map(|p| count(p, r, round) as i64).collect();
            run(c, s);
            assert_eq!(read(DType::F32, &ob), want, "rank {r} round {round}");
            assert_eq!(algorithm(c, "all_to_all"), "shm_attach");
        }
        let input = buf(DType::F32, &vec![r as f64; 100]);
        let outs: Vec<_> = if r == 0 { (0..2).map(|_| buf(DType::F32, &vec![0.0; 100])).collect() } else { vec![] };
        gather(c, &input, &outs, 0);
        for (p, o) in outs.iter().enumerate() {
            assert_eq!(read(DType::F32, o), vec![p as f64; 100]);
        }
        assert_ne!(algorithm(c, "gather"), "shm_attach", "a 400-byte block is not read");
    });
}

/// Where reads are slow, ranks that pass gather / scatter blocks on both
/// sides of the single-reader threshold pick different algorithms (read
/// from the tensor, or sent as messages) and would wait for each other until
/// the timeout: the waits find each other and every rank involved fails
/// with the cause, either way round.
#[test]
fn slow_reads_different_algorithms_for_one_gather_or_scatter_fail_at_once() {
    let shm = ShmConfig { attach_min: Setting::Fixed(1 << 40), single_min: auto0(512 << 10), ..common::TINY_SHM };
    // 128 Ki floats = 512 KiB (messages), 160 Ki over the threshold (read)
    let (small, large) = (128usize << 10, 160 << 10);
    let cause = "picked different algorithms";
    for gather in [true, false] {
        for (odd, rest) in [(large, small), (small, large)] {
            // a fresh group each time: the failure poisons the ranks that see it
            let comms = mesh_comms(3, tiny_algo(), Duration::from_secs(300), TransportMode::Shm, shm);
            let errs = on_ranks(&comms, |r, c| {
                // rank 0 passes `odd` where the others pass `rest`
                let mine = if r == 0 { odd } else { rest };
                let s = if gather {
                    let input = buf(DType::F32, &vec![r as f64; mine]);
                    let outs: Vec<_> = if r == 1 { (0..3).map(|_| buf(DType::F32, &vec![0.0; rest])).collect() } else { vec![] };
                    let mut s = spec(OpKind::Gather);
                    s.root = 1;
                    s.inputs = vec![t(&input)];
                    s.outputs = outs.iter().map(t).collect();
                    s
                } else {
                    let ins: Vec<_> = if r == 2 { (0..3).map(|p| buf(DType::F32, &vec![p as f64; rest])).collect() } else { vec![] };
                    let out = buf(DType::F32, &vec![-1.0; mine]);
                    let mut s = spec(OpKind::Scatter);
                    s.root = 2;
                    s.inputs = ins.iter().map(t).collect();
                    s.outputs = vec![t(&out)];
                    s
                };
                c.submit(vec![s], None, None).unwrap().wait(None).err().map(|e| e.to_string())
            });
            let what = format!("gather={gather} rank 0 {odd} floats, others {rest}: {errs:?}");
            let root = if gather { 1 } else { 2 };
            // the odd rank and the root wait for each other: both fail with the cause
            for r in [0, root] {
                let e = errs[r].as_deref().unwrap_or_else(|| panic!("rank {r} must fail: {what}"));
                let op = if gather { "rustccl gather" } else { "rustccl scatter" };
                assert!(e.contains(op) && e.contains(cause), "rank {r}: {what}");
            }
            // the third rank: failed with the cause if it waited in a step for
            // the odd rank; with messages, done, or failed with the cause if
            // the root gave up before its message was through
            let third = 3 - root;
            match (odd == large, &errs[third]) {
                (true, None) => {}
                (_, Some(e)) => assert!(e.contains(cause), "rank {third}: {what}"),
                (false, None) => panic!("rank {third}: {what}"),
            }
        }
    }
}

/// Coalesced batches that mix messages and shared-memory steps in one
/// operation (small gathers by messages; all_to_all, all_reduce and a
/// large gather in steps, where reads are slow), with rings too small for
/// a message: every rank of a step may wait for a peer still taking its
/// messages, which is not the deadlock the waits look for. All succeed,
/// with the right data.
#[test]
fn batches_mixing_messages_and_steps_are_not_taken_for_different_algorithms() {
    let shm = ShmConfig { attach_min: Setting::Fixed(1 << 40), single_min: auto0(512 << 10), ..common::TINY_SHM };
    let comms = mesh_comms(3, tiny_algo(), Duration::from_secs(120), TransportMode::Shm, shm);
    // large gather blocks over the 512 KiB threshold (read), the rest by messages
    let (small, large, a2a) = (3000usize, 160_000usize, 2000usize);
    on_ranks(&comms, |r, c| {
        for it in 0..40usize {
            // one rank late by turns: the others wait long enough to sleep
            std::thread::sleep(Duration::from_micros(if (r + it) % 3 == 0 { 3000 } else { 0 }));
            let ib = buf(DType::F32, &(0..3 * a2a).map(|i| ((r * 7 + i + it) % 251) as f64).collect::<Vec<_>>());
            let ob = buf(DType::F32, &vec![0.0; 3 * a2a]);
            let mut s1 = spec(OpKind::AllToAll);
            s1.inputs = vec![t(&ib)];
            s1.outputs = vec![t(&ob)];
            let ar = buf(DType::F32, &vec![(r + it) as f64; 5000]);
            let mut s2 = spec(OpKind::AllReduce);
            s2.inputs = vec![t(&ar)];
            let root = it % 3;
            let gs = buf(DType::F32, &vec![r as f64; small]);
            let gs_out: Vec<_> = if r == root { (0..3).map(|_| buf(DType::F32, &vec![-1.0; small])).collect() } else { vec![] };
            let mut s3 = spec(OpKind::Gather);
            s3.root = root as i64;
            s3.inputs = vec![t(&gs)];
            s3.outputs = gs_out.iter().map(t).collect();
            let gl = buf(DType::F32, &vec![(r + 10) as f64; large]);
            let gl_out: Vec<_> = if r == root { (0..3).map(|_| buf(DType::F32, &vec![-1.0; large])).collect() } else { vec![] };
            let mut s4 = spec(OpKind::Gather);
            s4.root = root as i64;
            s4.inputs = vec![t(&gl)];
            s4.outputs = gl_out.iter().map(t).collect();
            c.submit(vec![s1, s2, s3, s4], None, None).unwrap().wait(None).unwrap_or_else(|e| panic!("rank {r} batch {it}: {e}"));
            let want: Vec<f64> = (0..3).flat_map(|p| (0..a2a).map(move |i| ((p * 7 + r * a2a + i + it) % 251) as f64)).collect();
            assert_eq!(read(DType::F32, &ob), want, "all_to_all {it}");
            assert_eq!(read(DType::F32, &ar), vec![(3 + 3 * it) as f64; 5000], "all_reduce {it}");
            for (p, (s, l)) in gs_out.iter().zip(&gl_out).enumerate() {
                assert_eq!(read(DType::F32, s), vec![p as f64; small], "small gather {it}");
                assert_eq!(read(DType::F32, l), vec![(p + 10) as f64; large], "large gather {it}");
            }
        }
    });
}

/// all_to_all blocks go through the sender's input slots while they fit
/// there up to the block-read threshold (default 2 MiB with 3-4 local
/// ranks where collectives read) and are read from its tensor above:
/// ranks given different settings take the largest, so a block one rank
/// would read is not looked for in a slot its sender left empty. Blocks
/// of 0, 400, 700 and 1400 bytes around a 500-byte threshold and the
/// 768-byte slots (3 of them a sender), in one call.
#[test]
fn all_to_all_blocks_around_the_block_read_threshold_arrive_with_settings_that_differ() {
    let with = |blocks: [usize; 3]| {
        comms_with(|r| ShmConfig {
            threads: auto0(3),
            attach_min: Setting::Fixed(1 << 20),
            block_min: auto0(blocks[r]),
            ..common::TINY_SHM
        })
    };
    let th = |c: &Communicator| threshold(c, "shm_block_read_min_bytes");
    for (blocks, want) in [([0, 0, 0], 2u64 << 20), ([500, 0, 0], 500), ([0, 0, 500], 500), ([0, 200, 500], 500)] {
        let comms = with(blocks);
        assert!(comms.iter().all(|c| th(c) == Some(want)), "{blocks:?}: {:?}", comms.iter().map(th).collect::<Vec<_>>());
        // rank r sends rank p (r + 2p) % 4 x 100 floats... in bytes 0 / 400 / 700 / 1400
        let count = |r: usize, p: usize| [0usize, 100, 175, 350][(r + 2 * p) % 4];
        on_ranks(&comms, |r, c| {
            for round in 0..3usize {
                let ins: Vec<f64> = (0..3).flat_map(|p| (0..count(r, p)).map(move |i| (r * 1000 + p * 100 + i + round) as f64)).collect();
                let want: Vec<f64> = (0..3).flat_map(|p| (0..count(p, r)).map(move |i| (p * 1000 + r * 100 + i + round) as f64)).collect();
                let (ib, ob) = (buf(DType::F32, &ins), buf(DType::F32, &vec![-1.0; want.len()]));
                let mut s = spec(OpKind::AllToAll);
                s.inputs = vec![t(&ib)];
                s.outputs = vec![t(&ob)];
                s.in_splits = (0..3).map(|p| count(r, p) as i64).collect();
                s.out_splits = (0..3).map(|p| count(p, r) as i64).collect();
                run(c, s);
                assert_eq!(read(DType::F32, &ob), want, "{blocks:?} rank {r} round {round}");
                assert_eq!(algorithm(c, "all_to_all"), "shm_attach");
            }
        });
    }
}
