//! Collectives between ranks of one host that write into a peer's buffer
//! (cross-memory attach, `process_vm_writev`) where that peer posted it: a
//! gather's senders into the root's outputs, a reduce's ranks into the
//! root's buffer, a 2-rank broadcast's root into the other's. Whether
//! anyone writes is the receiving root's choice (`RUSTCCL_SHM_GATHER_PUSH`),
//! so ranks whose settings differ still agree. Ranks are threads of this
//! process (the same system calls, on our own pid).

use crate::common;
use crate::common::auto0;
use crate::common::*;
use rustccl::config::{Setting, ShmConfig};
use rustccl::{Communicator, DType, OpKind, ReduceOp};

/// Between two ranks a broadcast that reads the root's buffer has the
/// root write the second half into the other's itself, where the root
/// takes pushes (its choice, `RUSTCCL_SHM_GATHER_PUSH`); ranks that
/// differ in it still agree, from either root, at lengths around the
/// 64-byte-aligned half and over several pieces; back to back, so a fast
/// root's next broadcast meets a peer still reading its slot's word.
#[test]
fn a_broadcast_between_two_ranks_is_split_between_them() {
    for pushing in [[true, true], [true, false], [false, true]] {
        let comms = n_comms_with(2, |r| ShmConfig {
            threads: auto0(2),
            attach_min: Setting::Fixed(0),
            broadcast_min: Setting::Fixed(0),
            gather_push: pushing[r],
            ..common::TINY_SHM
        });
        on_ranks(&comms, |r, c| {
            for len in [0usize, 1, 15, 16, 17, 33, 1000, 70_001] {
                for root in 0..2usize {
                    for k in 0..3usize {
                        let data: Vec<f64> = (0..len).map(|i| ((i * 7 + root * 3 + k) % 251) as f64).collect();
                        let b = buf(DType::F32, &if r == root { data.clone() } else { vec![-1.0; len] });
                        broadcast(c, &b, root);
                        assert_eq!(read(DType::F32, &b), data, "pushing={pushing:?} len={len} root={root} k={k} rank {r}");
                    }
                }
            }
        });
        for c in &comms {
            assert_eq!(algorithm(c, "broadcast"), "shm_attach", "pushing={pushing:?}");
        }
    }
}

/// Where tensors are read through the kernel, a gather's root posts its
/// outputs and the senders of blocks that no slot takes write them there.
/// A rank that passed another size must not write anywhere: every rank
/// fails naming the sizes (whether the root posted or not), and nothing
/// lands in the odd rank's part of the root's output; also where the root
/// reads a share of each pushed block (`gather_root_share: 2`), which
/// makes the senders wait for the root's last publish.
#[test]
fn gather_ranks_with_other_sizes_than_the_root_fail_everywhere_and_write_nothing() {
    // 256-byte small slots: 40 floats fit after the header, 1000 do not.
    let (small, large) = (40usize, 1000usize);
    for (share, (odd, rest)) in [1, 2].into_iter().flat_map(|s| [(small, large), (large, small)].map(|c| (s, c))) {
        let shm = ShmConfig {
            threads: auto0(3),
            attach_min: Setting::Fixed(0),
            root_threads: auto0(5),
            broadcast_min: Setting::Fixed(0),
            gather_root_share: auto0(share),
            ..common::TINY_SHM
        };
        let comms = mesh_comms(3, tiny_algo(), std::time::Duration::from_secs(60), rustccl::config::TransportMode::Shm, shm);
        let guard: Vec<f64> = vec![-7.0; rest];
        let errs = on_ranks(&comms, |r, c| {
            let mine = if r == 0 { odd } else { rest };
            let input = buf(DType::F32, &vec![r as f64 + 1.0; mine]);
            let outs: Vec<_> = if r == 1 { (0..3).map(|_| buf(DType::F32, &guard)).collect() } else { vec![] };
            let mut s = spec(OpKind::Gather);
            s.root = 1;
            s.inputs = vec![t(&input)];
            s.outputs = outs.iter().map(t).collect();
            let e = c.submit(vec![s], None, None).unwrap().wait(None).err().map(|e| e.to_string());
            if r == 1 {
                assert_eq!(read(DType::F32, &outs[0]), guard, "odd={odd}: rank 0's part of the root's output");
            }
            e
        });
        // Every rank announces its block's size: all of them find the
        // difference before any byte moves, rank 2 too.
        let what = format!("share {share}, rank 0 {odd} floats, others {rest}: {errs:?}");
        for (r, e) in errs.iter().enumerate() {
            let e = e.as_deref().unwrap_or_else(|| panic!("rank {r} must fail: {what}"));
            assert!(e.contains("rustccl gather") && e.contains(&format!("gather of {} bytes", 4 * odd)), "rank {r}: {what}");
        }
    }
}

/// Whether senders push is the root's choice (`RUSTCCL_SHM_GATHER_PUSH`),
/// said in its header: ranks with the setting on and off gather
/// correctly from every root, blocks in slots, read and pushed; and
/// reduce from every root, its parts pushed into the root's buffer or
/// read by the root (Max and Avg over uneven chunks, pieces of several
/// pushes each).
#[test]
fn gather_push_is_the_roots_choice_and_ranks_may_differ() {
    for pushing in [[true, false, true], [false, true, false]] {
        let comms =
            comms_with(|r| ShmConfig { threads: auto0(2), attach_min: Setting::Fixed(0), gather_push: pushing[r], ..common::TINY_SHM });
        assert!(comms
            .iter()
            .enumerate()
            .all(|(r, c)| c.thresholds().iter().any(|(k, v)| *k == "shm_gather_push" && *v == pushing[r] as u64)));
        on_ranks(&comms, |r, c| {
            for len in [30usize, 1000, 70_000] {
                for root in 0..3usize {
                    let input = buf(DType::F32, &vec![(10 * r + root) as f64; len]);
                    let outs: Vec<_> = if r == root { (0..3).map(|_| buf(DType::F32, &vec![0.0; len])).collect() } else { vec![] };
                    let mut s = spec(OpKind::Gather);
                    s.root = root as i64;
                    s.inputs = vec![t(&input)];
                    s.outputs = outs.iter().map(t).collect();
                    c.submit(vec![s], None, None).unwrap().wait(None).unwrap();
                    for (p, o) in outs.iter().enumerate() {
                        assert_eq!(
                            read(DType::F32, o),
                            vec![(10 * p + root) as f64; len],
                            "pushing={pushing:?} root={root} len={len} from {p}"
                        );
                    }
                    for (dt, op) in [(DType::F32, ReduceOp::Max), (DType::F64, ReduceOp::Avg)] {
                        check_reduce(
                            c,
                            r,
                            3,
                            dt,
                            op,
                            root,
                            len + 1,
                            &format!("reduce {dt:?} {op:?} pushing={pushing:?} root={root} len={len}"),
                        );
                    }
                }
            }
        });
    }
}

/// A scatter block that its receiver reads from the root's tensor is split
/// where the root takes pushes: the receiver reads the first part while
/// the root writes the last 1 / share (half by default) into its output,
/// for blocks up to the root's largest split. Ranks that differ in any of
/// the three settings still agree (the root decides), from every root, at
/// block lengths around the 64-byte-aligned cut, back to back.
#[test]
fn a_scatter_block_is_split_between_its_receiver_and_the_root() {
    let caps = [[0, 0, 0], [usize::MAX, 4096, 64]];
    let shares = [[0, 0, 0], [16, 3, 31]];
    let settings = caps.into_iter().flat_map(|c| shares.map(|s| (c, s)));
    for (pushing, (cap, share)) in
        [[true, true, true], [true, false, false], [false, true, true]].into_iter().flat_map(|p| settings.clone().map(move |cs| (p, cs)))
    {
        let comms = n_comms_with(3, |r| ShmConfig {
            threads: auto0(2),
            attach_min: Setting::Fixed(0),
            gather_push: pushing[r],
            scatter_split_max: auto0(cap[r]),
            scatter_root_share: auto0(share[r]),
            ..common::TINY_SHM
        });
        on_ranks(&comms, |r, c| {
            for len in [1usize, 16, 17, 33, 1000, 70_001] {
                for root in 0..3usize {
                    for k in 0..2usize {
                        let block = |p: usize| -> Vec<f64> { (0..len).map(|i| ((i * 5 + p * 11 + root * 3 + k) % 251) as f64).collect() };
                        let ins: Vec<_> = if r == root { (0..3).map(|p| buf(DType::F32, &block(p))).collect() } else { vec![] };
                        let out = buf(DType::F32, &vec![-1.0; len]);
                        scatter(c, &ins, &out, root);
                        assert_eq!(
                            read(DType::F32, &out),
                            block(r),
                            "pushing={pushing:?} cap={cap:?} share={share:?} len={len} root={root} k={k} rank {r}"
                        );
                    }
                }
            }
        });
        for c in &comms {
            assert_eq!(algorithm(c, "scatter"), "shm_attach", "pushing={pushing:?}");
        }
    }
}

/// Floats in a block of the half-failed scatters below: 32 KiB, 8 pages.
const HALF_FAILED_LEN: usize = 8192;

/// Scatters `block(p)` from rank 0 to every rank of `comms` with a whole
/// page of the second half (from 16 KiB) of rank 1's output read-only, so
/// the root cannot write it (the root must write halves,
/// `scatter_root_share: 2`, whatever the host's cores would give); per
/// rank, the error and the block received.
fn scatter_with_a_read_only_half(comms: &[Communicator], block: impl Fn(usize) -> Vec<f64> + Sync) -> Vec<(Option<String>, Vec<f64>)> {
    const LEN: usize = HALF_FAILED_LEN;
    let n = comms.len();
    on_ranks(comms, |r, c| {
        let ins: Vec<_> = if r == 0 { (0..n).map(|p| buf(DType::F32, &block(p))).collect() } else { vec![] };
        let out = buf(DType::F32, &vec![-1.0; LEN]);
        let page = (out.tensor().expect("not lent").addr() + 2 * LEN).next_multiple_of(4096) + 4096;
        protect(r == 1, page, libc::PROT_READ);
        let mut s = spec(OpKind::Scatter);
        s.inputs = ins.iter().map(t).collect();
        s.outputs = vec![t(&out)];
        let res = c.submit(vec![s], None, None).unwrap().wait(None);
        protect(r == 1, page, libc::PROT_READ | libc::PROT_WRITE);
        // (a rank that failed keeps its tensors lent: peers might still write them)
        let got = if res.is_ok() { read(DType::F32, &out) } else { vec![] };
        (res.err().map(|e| e.to_string()), got)
    })
}

/// A scatter root that could not write one receiver's second half (rank
/// 1's here: a page of that half of its output is read-only) fails that
/// receiver and itself, naming the cause, and no other: rank 2, whose
/// half it wrote, returns its block (the root says whose halves it
/// missed, not only that it failed). Through the workers (3 threads) and
/// on the caller alone (1).
/// Blocks read by their receivers, every scatter block split, the root
/// writing half of each.
fn split_scatter_shm(threads: usize) -> ShmConfig {
    ShmConfig {
        threads: auto0(threads),
        attach_min: Setting::Fixed(0),
        gather_push: true,
        scatter_split_max: Setting::Fixed(usize::MAX),
        scatter_root_share: Setting::Fixed(2),
        ..common::TINY_SHM
    }
}

#[test]
fn a_scatter_root_that_could_not_write_one_half_fails_only_that_receiver() {
    let block = |p: usize| -> Vec<f64> { (0..HALF_FAILED_LEN).map(|i| ((i * 5 + p * 11) % 251) as f64).collect() };
    for threads in [3, 1] {
        let comms = n_comms_with(3, |_| split_scatter_shm(threads));
        let got = scatter_with_a_read_only_half(&comms, block);
        let what = format!("threads={threads}: {:?}", got.iter().map(|g| &g.0).collect::<Vec<_>>());
        let err = |r: usize| got[r].0.as_deref().unwrap_or_else(|| panic!("rank {r} must fail: {what}"));
        assert!(err(0).contains("rustccl scatter") && err(0).contains("rank 1") && err(0).contains("Bad address"), "{what}");
        assert!(err(1).contains("rustccl scatter") && err(1).contains("its share of this rank's scatter block"), "{what}");
        assert!(got[2].0.is_none(), "rank 2's half was written: {what}");
        assert_eq!(got[2].1, block(2), "{what}");
        assert_eq!(algorithm(&comms[2], "scatter"), "shm_attach", "{what}");
    }
}

/// The same failure where the root's small slot has no room after its
/// header for the word that names the receivers it missed (64 bytes with 3
/// local ranks: the header takes them all): every split receiver fails,
/// rank 2 too, naming the root, since none can tell whether its own half
/// was written.
#[test]
fn a_scatter_root_with_no_room_to_name_whom_it_missed_fails_every_split_receiver() {
    let block = |p: usize| -> Vec<f64> { (0..HALF_FAILED_LEN).map(|i| ((i * 7 + p * 13) % 251) as f64).collect() };
    let comms = n_comms_with(3, |_| ShmConfig { small_bytes: auto0(64), ..split_scatter_shm(3) });
    let got = scatter_with_a_read_only_half(&comms, block);
    let what = format!("{:?}", got.iter().map(|g| &g.0).collect::<Vec<_>>());
    let err = |r: usize| got[r].0.as_deref().unwrap_or_else(|| panic!("rank {r} must fail: {what}"));
    assert!(err(0).contains("rustccl scatter") && err(0).contains("rank 1") && err(0).contains("Bad address"), "{what}");
    for r in [1, 2] {
        assert!(err(r).contains("rustccl scatter") && err(r).contains("its share of this rank's scatter block"), "rank {r}: {what}");
    }
}

/// A gather block its sender pushes is split where the root reads a share
/// (`RUSTCCL_SHM_GATHER_ROOT_SHARE`): the sender writes the first part
/// into the root's output while the root reads the last 1 / share from
/// the sender's input. Ranks that differ in the share or in pushing agree
/// (the root decides), from every root, at block lengths around the
/// 64-byte-aligned cut, back to back; 2 ranks of one thread read a
/// quarter where left to the host, ranks with threads or more ranks none.
#[test]
fn a_pushed_gather_block_is_split_between_its_sender_and_the_root() {
    for (n, threads, host) in [(2, 1, 4), (2, 2, 1), (3, 1, 1)] {
        let comms = n_comms_with(n, |_| ShmConfig {
            threads: auto0(threads),
            attach_min: Setting::Fixed(0),
            gather_push: true,
            ..common::TINY_SHM
        });
        assert!(comms.iter().all(|c| threshold(c, "shm_gather_root_share") == Some(host)), "n={n} threads={threads}");
    }
    let shares = [[0, 0, 0], [2, 1, 31], [3, 16, 0]];
    for (n, pushing, share) in
        [2, 3].into_iter().flat_map(|n| [[true, true, true], [false, true, true]].into_iter().flat_map(move |p| shares.map(|s| (n, p, s))))
    {
        let comms = n_comms_with(n, |r| ShmConfig {
            threads: auto0(1),
            attach_min: Setting::Fixed(0),
            gather_push: pushing[r],
            gather_root_share: auto0(share[r]),
            ..common::TINY_SHM
        });
        on_ranks(&comms, |r, c| {
            for len in [1usize, 16, 17, 33, 1000, 70_001] {
                for root in 0..n {
                    for k in 0..2usize {
                        let block = |p: usize| -> Vec<f64> { (0..len).map(|i| ((i * 7 + p * 13 + root * 3 + k) % 251) as f64).collect() };
                        let input = buf(DType::F32, &block(r));
                        let outs: Vec<_> = if r == root { (0..n).map(|_| buf(DType::F32, &vec![-1.0; len])).collect() } else { vec![] };
                        gather(c, &input, &outs, root);
                        for (p, o) in outs.iter().enumerate() {
                            assert_eq!(
                                read(DType::F32, o),
                                block(p),
                                "n={n} pushing={pushing:?} share={share:?} len={len} root={root} k={k} from {p}"
                            );
                        }
                    }
                }
            }
        });
        for c in &comms {
            assert_eq!(algorithm(c, "gather"), "shm_attach", "n={n} pushing={pushing:?} share={share:?}");
        }
    }
}

/// A gather root that could not read its share of one sender's block
/// (a page of rank 1's second half is unreadable) fails, naming that rank
/// and the cause; the senders, whose pushes landed, return. As after any
/// failed read of a peer's memory, the root gives the group up, and the
/// senders' next gather says so instead of waiting for it.
#[test]
fn a_gather_root_that_could_not_read_its_share_fails_and_the_senders_are_told() {
    const LEN: usize = 8192; // 32 KiB, 8 pages
    let block = |p: usize, k: usize| -> Vec<f64> { (0..LEN).map(|i| ((i * 3 + p * 17 + k) % 251) as f64).collect() };
    let comms = n_comms_with(3, |_| ShmConfig {
        threads: auto0(2),
        attach_min: Setting::Fixed(0),
        gather_push: true,
        gather_root_share: auto0(2),
        ..common::TINY_SHM
    });
    let got = on_ranks(&comms, |r, c| {
        let mut errs = Vec::new();
        for k in 0..2 {
            let input = buf(DType::F32, &block(r, k));
            let page = (input.tensor().expect("not lent").addr() + 2 * LEN).next_multiple_of(4096) + 4096;
            let spoil = r == 1 && k == 0;
            protect(spoil, page, libc::PROT_NONE);
            let outs: Vec<_> = if r == 0 { (0..3).map(|_| buf(DType::F32, &vec![-1.0; LEN])).collect() } else { vec![] };
            let mut s = spec(OpKind::Gather);
            s.inputs = vec![t(&input)];
            s.outputs = outs.iter().map(t).collect();
            let res = c.submit(vec![s], None, None).unwrap().wait(None);
            protect(spoil, page, libc::PROT_READ | libc::PROT_WRITE);
            if res.is_ok() {
                for (p, o) in outs.iter().enumerate() {
                    assert_eq!(read(DType::F32, o), block(p, k), "gather {k} from {p}");
                }
            }
            errs.push(res.err().map(|e| e.to_string()));
        }
        errs
    });
    let what = format!("{got:?}");
    let root_err = got[0][0].as_deref().unwrap_or_else(|| panic!("the root must fail: {what}"));
    assert!(root_err.contains("rustccl gather") && root_err.contains("rank 1") && root_err.contains("Bad address"), "{what}");
    assert!(got[1][0].is_none() && got[2][0].is_none(), "the senders' pushes landed: {what}");
    assert!(got[0][1].as_deref().is_some_and(|e| e.contains("unusable after an earlier error")), "{what}");
    for r in [1, 2] {
        assert!(got[r][1].as_deref().is_some_and(|e| e.contains("rustccl gather") && e.contains("gave the group up")), "rank {r}: {what}");
    }
}
