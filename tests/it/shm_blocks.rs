//! Blocks of all_to_all, gather and scatter streamed through their
//! senders' input slots (`collectives::shm::blocks`): the sender copies a
//! block in after the operation's first step, flagging every 16 KiB
//! chunk, while its receivers copy each chunk out once flagged. Against
//! local references, with blocks of many chunks, chunk boundaries inside
//! packed blocks, several blocks a sender, and new values every round (a
//! receiver that took an earlier operation's flag as ready would copy
//! the earlier round's bytes); and with receivers that hand every wait
//! to the calling thread at once (`block_wait_us: 0`).

use crate::common::auto0;
use std::sync::Arc;

use crate::common;
use crate::common::*;
use rustccl::config::{Setting, ShmConfig};
use rustccl::tensor::SharedBuf;
use rustccl::{Communicator, DType, OpKind};

const CHUNK: usize = 16 << 10;

/// Slots of 160 KiB (10 chunks), small slots too small for the blocks,
/// attach on (blocks up to the host's block-read threshold, 2 MiB here,
/// go through the slots while they fit), 3 worker threads a rank.
fn streamed(n: usize, block_wait_us: usize) -> Vec<Communicator> {
    n_comms_with(n, |_| ShmConfig {
        threads: auto0(3),
        attach_min: Setting::Fixed(1 << 20),
        small_bytes: auto0(256),
        segment_bytes: 160 << 10,
        block_wait_us,
        ..common::TINY_SHM
    })
}

/// Block lengths in i32 elements around chunk boundaries: empty, one
/// element, a chunk less 4 bytes, a chunk, a chunk and 68 bytes, 3.05
/// chunks, 6.1 chunks.
const ELEMS: [usize; 7] = [0, 1, CHUNK / 4 - 1, CHUNK / 4, CHUNK / 4 + 17, 12_500, 25_000];

/// Element `i` of the block rank `from` sends rank `to` in round `round`.
fn value(from: usize, to: usize, i: usize, round: usize) -> f64 {
    ((from * 1_000_003 + to * 10_007 + i * 7 + round * 100_019) % 2_000_000_000) as f64
}

fn block(from: usize, to: usize, len: usize, round: usize) -> Vec<f64> {
    (0..len).map(|i| value(from, to, i, round)).collect()
}

fn i32s(v: &[f64]) -> Arc<SharedBuf> {
    buf(DType::I32, v)
}

/// all_to_all where rank r sends rank p a block of `ELEMS[(r + 2p + round) % 7]`
/// elements: every sender has blocks of several lengths, packed in its
/// slots one after the other (a chunk boundary falls inside most), those
/// that no longer fit read from its tensor.
fn all_to_all_rounds(comms: &[Communicator], rounds: usize) {
    let n = comms.len();
    let count = |r: usize, p: usize, round: usize| ELEMS[(r + 2 * p + round) % ELEMS.len()];
    on_ranks(comms, |r, c| {
        for round in 0..rounds {
            let ins: Vec<f64> = (0..n).flat_map(|p| block(r, p, count(r, p, round), round)).collect();
            let want: Vec<f64> = (0..n).flat_map(|p| block(p, r, count(p, r, round), round)).collect();
            let (ib, ob) = (i32s(&ins), i32s(&vec![-1.0; want.len()]));
            let mut s = spec(OpKind::AllToAll);
            s.inputs = vec![t(&ib)];
            s.outputs = vec![t(&ob)];
            s.in_splits = (0..n).map(|p| count(r, p, round) as i64).collect();
            s.out_splits = (0..n).map(|p| count(p, r, round) as i64).collect();
            run(c, s);
            assert_eq!(read(DType::I32, &ob), want, "all_to_all n={n} rank {r} round {round}");
            assert_eq!(algorithm(c, "all_to_all"), "shm_attach");
        }
    });
}

/// gather and scatter from every root, blocks of every length in turn.
fn rooted_rounds(comms: &[Communicator]) {
    let n = comms.len();
    on_ranks(comms, |r, c| {
        for (round, &len) in ELEMS.iter().enumerate() {
            for root in 0..n {
                let input = i32s(&block(r, root, len, round));
                let outs: Vec<_> = if r == root { (0..n).map(|_| i32s(&vec![-1.0; len])).collect() } else { vec![] };
                gather(c, &input, &outs, root);
                for (p, o) in outs.iter().enumerate() {
                    assert_eq!(read(DType::I32, o), block(p, root, len, round), "gather n={n} root {root} from {p} len {len}");
                }

                let ins: Vec<_> = if r == root { (0..n).map(|p| i32s(&block(root, p, len, round + 1))).collect() } else { vec![] };
                let out = i32s(&vec![-1.0; len]);
                scatter(c, &ins, &out, root);
                assert_eq!(read(DType::I32, &out), block(root, r, len, round + 1), "scatter n={n} root {root} to {r} len {len}");
                // Blocks that fit the 256-byte small slots (a scatter's
                // all together) take the one-step algorithm.
                let path = |count: usize| if count * 4 * len <= 256 { "shm_one_round" } else { "shm_attach" };
                assert_eq!((algorithm(c, "gather"), algorithm(c, "scatter")), (path(1), path(n)), "len {len}");
            }
        }
    });
}

#[test]
fn blocks_of_many_chunks_stream_through_the_slots_round_after_round() {
    for n in [2, 3, 4] {
        let comms = streamed(n, 20_000);
        all_to_all_rounds(&comms, 10);
        rooted_rounds(&comms);
    }
}

/// A receiving thread that does not find its chunk flagged at once hands
/// the wait to the rank's own thread, which waits for the sender's whole
/// block (with the group's timeout and dead-peer checks) and copies it
/// again: the same bytes arrive.
#[test]
fn receivers_that_hand_every_wait_over_still_get_every_block() {
    for n in [2, 3] {
        let comms = streamed(n, 0);
        let waits = |c: &Communicator| threshold(c, "shm_block_wait_us");
        assert!(comms.iter().all(|c| waits(c) == Some(0)));
        all_to_all_rounds(&comms, 10);
        rooted_rounds(&comms);
    }
    let comms = streamed(2, 20_000);
    assert_eq!(threshold(&comms[0], "shm_block_wait_us"), Some(20_000));
}

/// A receiver that expects another length from a sender fails with an
/// error naming both, moves nothing of that sender's, and the group goes
/// on: the sender still streamed its other blocks (whose receivers wait
/// for them) and the next operation runs.
#[test]
fn a_size_mismatch_of_a_streamed_block_fails_only_its_receiver() {
    let comms = streamed(3, 20_000);
    let len = 3 * CHUNK / 4 + 5;
    let errs = on_ranks(&comms, |r, c| {
        let ins: Vec<f64> = (0..3).flat_map(|p| block(r, p, len, 0)).collect();
        // rank 2 expects one element more from rank 0
        let from0 = if r == 2 { len + 1 } else { len };
        let want: Vec<f64> = (0..3).flat_map(|p| block(p, r, if p == 0 { from0 } else { len }, 0)).collect();
        let (ib, ob) = (i32s(&ins), i32s(&vec![-1.0; want.len()]));
        let mut s = spec(OpKind::AllToAll);
        s.inputs = vec![t(&ib)];
        s.outputs = vec![t(&ob)];
        s.in_splits = vec![len as i64; 3];
        s.out_splits = vec![from0 as i64, len as i64, len as i64];
        let e = c.submit(vec![s], None, None).unwrap().wait(None).err().map(|e| e.to_string());
        if e.is_none() {
            assert_eq!(read(DType::I32, &ob), want, "rank {r}");
        }
        e
    });
    assert!(errs[0].is_none() && errs[1].is_none(), "{errs:?}");
    let e = errs[2].as_deref().expect("rank 2 sees the mismatch");
    assert!(
        e.contains("rustccl") && e.contains("all_to_all") && e.contains("which sends 49172") && e.contains("expects 49176 bytes"),
        "{e}"
    );
    all_to_all_rounds(&comms, 2);
}
