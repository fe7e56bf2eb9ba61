//! Large point-to-point messages between ranks of one host with
//! cross-memory attach on go by rendezvous (the receiver reads the
//! sender's tensor): the same results, matching, ordering and errors as
//! over TCP (eager), which every test also runs. The threshold is 4 KiB
//! here, so test sizes take both paths. With a staging area (`Staged`,
//! 64 KiB here) sends up to its size are copied through the sender's
//! shared memory instead, one at a time: the same tests, plus the
//! staged sends' own rules.

use std::sync::Barrier;
use std::time::Duration;

use crate::common;
use crate::common::*;
use rustccl::config::{AlgoConfig, Setting, ShmConfig, TransportMode};
use rustccl::{Communicator, DType, Error};

const ATTACH_MIN: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Shared memory with cross-memory attach from `ATTACH_MIN` bytes.
    Rendezvous,
    /// The same with a staging area of `STAGE` bytes.
    Staged,
    /// Rendezvous, every message from `ATTACH_MIN` bytes split: the
    /// receiver reads the first half, the sender writes the second.
    Split,
    Tcp,
}

const MODES: [Mode; 4] = [Mode::Rendezvous, Mode::Staged, Mode::Split, Mode::Tcp];
const STAGE: usize = 64 << 10;

fn shm_cfg(staged_max: usize, split_send_min: usize) -> ShmConfig {
    ShmConfig {
        threads: Setting::Fixed(3),
        attach_min: Setting::Fixed(ATTACH_MIN),
        staged_max: Setting::Fixed(staged_max),
        split_send_min: Setting::Fixed(split_send_min),
        ..common::TINY_SHM
    }
}

fn comms_on(mode: Mode, hosts: &[usize], timeout: Duration) -> Vec<Communicator> {
    let (t, stage, split) = match mode {
        Mode::Rendezvous => (TransportMode::Auto, 0, usize::MAX),
        Mode::Staged => (TransportMode::Auto, STAGE, usize::MAX),
        Mode::Split => (TransportMode::Auto, 0, ATTACH_MIN),
        Mode::Tcp => (TransportMode::Tcp, 0, usize::MAX),
    };
    hosts_comms(hosts, AlgoConfig::default(), timeout, t, shm_cfg(stage, split))
}

fn comms(mode: Mode, n: usize) -> Vec<Communicator> {
    comms_on(mode, &vec![0; n], Duration::from_secs(30))
}

fn pattern(seed: usize, n: usize) -> Vec<f64> {
    (0..n).map(|i| ((seed * 7919 + i * 31) % 1000) as f64).collect()
}

#[test]
fn the_rendezvous_config_really_uses_shared_memory_links() {
    for (mode, stage, split) in
        [(Mode::Rendezvous, 0, u64::MAX), (Mode::Staged, STAGE as u64, u64::MAX), (Mode::Split, 0, ATTACH_MIN as u64)]
    {
        let c = comms(mode, 2);
        assert_eq!(c[0].link_kinds(), &["", "shm"]);
        assert_eq!(
            threshold(&c[0], "shm_attach_min_bytes"),
            Some(ATTACH_MIN as u64),
            "cross-memory attach must be on for these tests to mean anything"
        );
        assert_eq!(threshold(&c[0], "shm_staged_send_max_bytes"), Some(stage), "{mode:?}");
        assert_eq!(threshold(&c[0], "shm_split_send_min_bytes"), Some(split), "{mode:?}");
    }
}

#[test]
fn large_and_small_messages_with_one_tag_keep_their_order() {
    // f32 elements: 1 KiB, 400 KiB, 4 B, 0 B, 16 KiB, 4 KiB (the threshold), 36 B.
    let sizes = [256usize, 100_000, 1, 0, 4096, 1024, 9];
    for mode in MODES {
        let c = comms(mode, 2);
        on_ranks(&c, |r, c| {
            if r == 0 {
                let bufs: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| buf(DType::F32, &pattern(i, n))).collect();
                let ws: Vec<_> = bufs.iter().map(|b| send(c, b, 1, 5)).collect();
                ws.into_iter().for_each(|w| w.wait(None).unwrap());
            } else {
                let bufs: Vec<_> = sizes.iter().map(|&n| buf(DType::F32, &vec![-1.0; n])).collect();
                let ws: Vec<_> = bufs.iter().map(|b| recv(c, b, Some(0), 5)).collect();
                for (i, (w, b)) in ws.into_iter().zip(&bufs).enumerate() {
                    w.wait(None).unwrap();
                    assert_eq!(read(DType::F32, b), pattern(i, sizes[i]), "{mode:?}: message {i}");
                }
            }
        });
    }
}

#[test]
fn an_unexpected_large_send_waits_for_its_receive() {
    for mode in MODES {
        let c = comms(mode, 2);
        let posted = Barrier::new(2);
        on_ranks(&c, |r, c| {
            if r == 0 {
                send(c, &buf(DType::U8, &[1.0]), 1, 99).wait(None).unwrap();
                let b = buf(DType::F64, &pattern(3, 50_000));
                let small = buf(DType::F64, &pattern(4, 10));
                let w = send(c, &b, 1, 8);
                let ws = send(c, &small, 1, 8);
                // Only the receiver's ack completes a rendezvous send, and
                // rank 1 has not posted its receive yet (a panic here would
                // leave rank 1 at the barrier: assert after it).
                std::thread::sleep(Duration::from_millis(30));
                let early = w.is_completed();
                posted.wait();
                assert!(mode == Mode::Tcp || !early, "{mode:?}: send completed before its receive was posted");
                w.wait(None).unwrap();
                ws.wait(None).unwrap();
                assert_eq!(read(DType::F64, &b), pattern(3, 50_000), "the send's tensor is unchanged");
            } else {
                // (the engine runs from its first operation: this one)
                recv(c, &buf(DType::U8, &[0.0]), Some(0), 99).wait(None).unwrap();
                posted.wait();
                // both messages are unexpected by now (or on their way): the
                // large one first, then the small one, by the tag's order
                let big = buf(DType::F64, &vec![0.0; 50_000]);
                let small = buf(DType::F64, &[0.0; 10]);
                recv(c, &big, Some(0), 8).wait(None).unwrap();
                recv(c, &small, Some(0), 8).wait(None).unwrap();
                assert_eq!(read(DType::F64, &big), pattern(3, 50_000), "{mode:?}");
                assert_eq!(read(DType::F64, &small), pattern(4, 10), "{mode:?}");
            }
        });
    }
}

#[test]
fn any_source_receives_take_rendezvous_and_tcp_messages() {
    // Ranks 0-2 share a host, rank 3 is alone: rank 0 hears from both kinds.
    for mode in MODES {
        let c = comms_on(mode, &[0, 0, 0, 1], Duration::from_secs(30));
        let n = 5000;
        on_ranks(&c, |r, c| {
            if r == 0 {
                let mut seen = Vec::new();
                for _ in 0..6 {
                    let b = buf(DType::I32, &vec![0.0; n]);
                    let w = recv(c, &b, None, 2);
                    w.wait(None).unwrap();
                    let src = w.source().unwrap();
                    let got = read(DType::I32, &b);
                    assert!(got.iter().all(|&v| v == got[0]), "{mode:?}: one sender per message");
                    assert_eq!(got[0] as usize % 10, src, "{mode:?}: source {src} reported for rank {}'s message", got[0] as usize % 10);
                    seen.push((src, got[0] as usize / 10));
                }
                seen.sort_unstable();
                assert_eq!(seen, vec![(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)], "{mode:?}");
            } else {
                let bufs: Vec<_> = (0..2).map(|k| buf(DType::I32, &vec![(k * 10 + r) as f64; n])).collect();
                let ws: Vec<_> = bufs.iter().map(|b| send(c, b, 0, 2)).collect();
                ws.into_iter().for_each(|w| w.wait(None).unwrap());
            }
        });
    }
}

#[test]
fn batched_sends_and_receives_both_ways_at_once() {
    // The shape of batch_isend_irecv: every rank posts all its sends and
    // receives, then waits; three tags, sizes on both sides of the threshold.
    let sizes = [3000usize, 17, 40_000];
    for mode in MODES {
        let c = comms(mode, 2);
        on_ranks(&c, |r, c| {
            let peer = 1 - r;
            let outs: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| buf(DType::F32, &pattern(10 * r + i, n))).collect();
            let ins: Vec<_> = sizes.iter().map(|&n| buf(DType::F32, &vec![0.0; n])).collect();
            let mut ws = Vec::new();
            for (i, (o, inb)) in outs.iter().zip(&ins).enumerate().rev() {
                ws.push(recv(c, inb, Some(peer), i as i64));
                ws.push(send(c, o, peer, i as i64));
            }
            ws.into_iter().for_each(|w| w.wait(None).unwrap());
            for (i, b) in ins.iter().enumerate() {
                assert_eq!(read(DType::F32, b), pattern(10 * peer + i, sizes[i]), "{mode:?}: rank {r}, tag {i}");
            }
        });
    }
}

#[test]
fn a_receive_smaller_than_the_message_fails_and_the_pair_keeps_working() {
    for mode in MODES {
        let c = comms(mode, 2);
        on_ranks(&c, |r, c| {
            if r == 0 {
                let res = send(c, &buf(DType::F32, &[1.0; 8000]), 1, 4).wait(None);
                match mode {
                    // the sender learns it from the receiver's ack (32000
                    // bytes: staged, with a staging area)
                    Mode::Rendezvous | Mode::Split => {
                        let e = res.unwrap_err();
                        assert!(matches!(e, Error::Protocol { peer: 1, .. }), "{e}");
                        let s = e.to_string();
                        assert!(
                            s.starts_with("rustccl send")
                                && s.contains("matching receive is 4000 x float32 (16000 bytes) but this send is float32 (32000 bytes)"),
                            "{s}"
                        );
                    }
                    // eager, or staged: the bytes left, the send is done
                    Mode::Staged | Mode::Tcp => res.unwrap(),
                }
                send(c, &buf(DType::F32, &pattern(1, 8000)), 1, 4).wait(None).unwrap();
            } else {
                let e = recv(c, &buf(DType::F32, &[0.0; 4000]), Some(0), 4).wait(None).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument { .. }), "{mode:?}: {e}");
                assert!(
                    e.to_string()
                        .contains("receive buffer is 4000 x float32 (16000 bytes) but rank 0 sent 8000 x float32 (32000 bytes) (tag 4)"),
                    "{e}"
                );
                let b = buf(DType::F32, &[0.0; 8000]);
                recv(c, &b, Some(0), 4).wait(None).unwrap();
                assert_eq!(read(DType::F32, &b), pattern(1, 8000), "{mode:?}");
            }
        });
    }
}

#[test]
fn a_rendezvous_send_nobody_receives_times_out_and_a_dead_receiver_fails_it() {
    let c = comms_on(Mode::Rendezvous, &[0, 0], Duration::from_millis(400));
    let b = buf(DType::F32, &[2.0; 4096]);
    let e = send(&c[0], &b, 1, 1).wait(None).unwrap_err();
    assert!(matches!(e, Error::Timeout { ref waiting, .. } if waiting == &vec![1]), "{e}");

    let mut c = comms_on(Mode::Rendezvous, &[0, 0, 0], Duration::from_secs(60));
    let dead = c.pop().unwrap();
    let w = send(&c[0], &buf(DType::F32, &[3.0; 4096]), 2, 1);
    std::thread::sleep(Duration::from_millis(50));
    dead.shutdown(true);
    drop(dead);
    let e = w.wait(None).unwrap_err();
    assert!(matches!(e, Error::PeerLost { peer: 2, .. }), "{e}");
    // the surviving pair still takes rendezvous messages
    let got = buf(DType::F32, &[0.0; 4096]);
    let r = recv(&c[1], &got, Some(0), 6);
    send(&c[0], &buf(DType::F32, &pattern(2, 4096)), 1, 6).wait(None).unwrap();
    r.wait(None).unwrap();
    assert_eq!(read(DType::F32, &got), pattern(2, 4096));
}

#[test]
fn a_staged_send_completes_before_its_receive_and_one_at_a_time() {
    let c = comms(Mode::Staged, 2);
    let posted = Barrier::new(2);
    let soon = Some(Duration::from_secs(5));
    on_ranks(&c, |r, c| {
        if r == 0 {
            // 32000 bytes: staged, so done with no receive posted and the
            // tensor given back (read panics otherwise), then freed: the
            // receiver must take the bytes from the staging area. (Asserts
            // after the barrier: a panic before it would leave rank 1 there.)
            let a = buf(DType::F64, &pattern(5, 4000));
            let w1 = send(c, &a, 1, 3);
            let staged = w1.wait(soon).is_ok() && read(DType::F64, &a) == pattern(5, 4000);
            drop(a);
            // The area is the first send's until its ack: this one is read
            // from its tensor, so it waits for its receive.
            let b = buf(DType::F64, &pattern(6, 4000));
            let w2 = send(c, &b, 1, 3);
            std::thread::sleep(Duration::from_millis(30));
            let early = w2.is_completed();
            posted.wait();
            w1.wait(None).unwrap();
            w2.wait(None).unwrap();
            assert!(staged, "the first send waited for its receive");
            assert!(!early, "the second send completed before its receive was posted");
            // acked: staged again
            let d = buf(DType::F64, &pattern(7, 4000));
            let again = send(c, &d, 1, 4).wait(soon).is_ok();
            posted.wait();
            assert!(again, "the staging area was not freed by the ack");
        } else {
            posted.wait();
            for seed in [5, 6] {
                let got = buf(DType::F64, &vec![0.0; 4000]);
                recv(c, &got, Some(0), 3).wait(None).unwrap();
                assert_eq!(read(DType::F64, &got), pattern(seed, 4000), "message {seed}");
            }
            posted.wait();
            let got = buf(DType::F64, &vec![0.0; 4000]);
            recv(c, &got, Some(0), 4).wait(None).unwrap();
            assert_eq!(read(DType::F64, &got), pattern(7, 4000));
        }
    });
}

/// A send small enough to go by value (through the ring) but over
/// `staged_min` is staged too while the area is free, and completes
/// before its receive is posted. Seen from the next send, of rendezvous
/// size, while the receiver's point-to-point thread has not started (it
/// starts with the rank's first send or receive, after the barrier here),
/// so nothing frees the area or drains the 4 KiB ring: with the area
/// taken by the small one, the large one goes by value (by rendezvous it
/// would wait for its receive where it used to be staged) and cannot
/// complete until the receiver drains the ring; with `staged_min` above
/// the small one's size the small one went through the ring and the
/// large one is staged, done at once.
#[test]
fn a_send_by_value_is_staged_while_the_area_is_free() {
    for (staged_min, small_staged) in [(0, true), (4000, false)] {
        let shm = ShmConfig { staged_min, ..shm_cfg(STAGE, usize::MAX) };
        let c = hosts_comms(&[0, 0], AlgoConfig::default(), Duration::from_secs(30), TransportMode::Auto, shm);
        assert_eq!(threshold(&c[0], "shm_staged_send_min_bytes"), Some(staged_min as u64));
        let posted = Barrier::new(2);
        let soon = Some(Duration::from_secs(5));
        // 2000 bytes (by value: under ATTACH_MIN), 32000 (rendezvous size)
        let sizes = [250, 4000];
        on_ranks(&c, |r, c| {
            if r == 0 {
                let small = send(c, &buf(DType::F64, &pattern(1, sizes[0])), 1, 7).wait(soon).is_ok();
                let w = send(c, &buf(DType::F64, &pattern(2, sizes[1])), 1, 7);
                let large_early = if small_staged {
                    std::thread::sleep(Duration::from_millis(30));
                    w.is_completed()
                } else {
                    w.wait(soon).is_ok()
                };
                posted.wait();
                w.wait(None).unwrap();
                assert!(small, "the small send waited for its receive");
                assert_eq!(
                    large_early, !small_staged,
                    "staged_min {staged_min}: the large send completed before its receive: {large_early}"
                );
            } else {
                posted.wait();
                for (seed, n) in sizes.iter().enumerate() {
                    let got = buf(DType::F64, &vec![0.0; *n]);
                    recv(c, &got, Some(0), 7).wait(None).unwrap();
                    assert_eq!(read(DType::F64, &got), pattern(seed + 1, *n), "message {}", seed + 1);
                }
            }
        });
    }
}

/// Two ranks that both send a staged message by value, then one of
/// rendezvous size, and only then receive both. The second finds the area
/// still held (the receiver copies the first out and acks it as it
/// arrives, but usually after the second was submitted) and goes by
/// value, or is staged if the ack came first; either way neither send
/// waits for its receive. By rendezvous it would, and both ranks would
/// wait in it until the timeout. The receivers also check the bytes of
/// the first message, copied out before its receive was posted.
#[test]
fn staged_sends_by_value_free_the_area_before_their_receive() {
    let shm = ShmConfig { staged_min: 0, ..shm_cfg(STAGE, usize::MAX) };
    let c = hosts_comms(&[0, 0], AlgoConfig::default(), Duration::from_secs(5), TransportMode::Auto, shm);
    let sizes = [250, 4000];
    let errs = on_ranks(&c, |r, c| {
        let peer = 1 - r;
        for (k, n) in sizes.iter().enumerate() {
            send(c, &buf(DType::F64, &pattern(10 * r + k, *n)), peer, 9).wait(None)?;
        }
        for (k, n) in sizes.iter().enumerate() {
            let got = buf(DType::F64, &vec![0.0; *n]);
            recv(c, &got, Some(peer), 9).wait(None)?;
            assert_eq!(read(DType::F64, &got), pattern(10 * peer + k, *n), "rank {r}, message {k}");
        }
        Ok::<(), Error>(())
    });
    for (r, e) in errs.iter().enumerate() {
        assert!(e.is_ok(), "rank {r}: {:?}", e.as_ref().err().map(|e| e.to_string()));
    }
}

#[test]
fn a_lost_receiver_frees_the_staging_area() {
    let mut c = comms_on(Mode::Staged, &[0, 0, 0], Duration::from_secs(60));
    let soon = Some(Duration::from_secs(5));
    let dead = c.pop().unwrap();
    // staged towards rank 2, which never receives it and dies
    send(&c[0], &buf(DType::F32, &[3.0; 4096]), 2, 1).wait(soon).expect("staged: done without its receive");
    let noticed = recv(&c[0], &buf(DType::F32, &[0.0; 4]), Some(2), 9);
    dead.shutdown(true);
    drop(dead);
    let e = noticed.wait(None).unwrap_err();
    assert!(matches!(e, Error::PeerLost { peer: 2, .. }), "{e}");
    // rank 0's area is free again: a send to rank 1 is staged, done
    // before rank 1 posts its receive
    send(&c[0], &buf(DType::F32, &pattern(8, 4096)), 1, 6).wait(soon).expect("staged again after the receiver's loss");
    let got = buf(DType::F32, &[0.0; 4096]);
    recv(&c[1], &got, Some(0), 6).wait(None).unwrap();
    assert_eq!(read(DType::F32, &got), pattern(8, 4096));
}

#[test]
fn staged_sends_whose_receive_is_posted_are_copied_out_chunk_by_chunk_as_they_land() {
    // An 8 MiB staging area: 128 ready flags of 64 KiB, sends of 8 MB
    // (123 chunks, the last one short) split among 3 threads on each side.
    // The receives are posted first, so each receiver copies while its
    // sender is still writing: reading a chunk before its flag, or taking
    // an earlier message's flag for this one's, would give the wrong bytes.
    let shm = ShmConfig { staged_max: Setting::Fixed(8 << 20), ..shm_cfg(0, usize::MAX) };
    let c = hosts_comms(&[0, 0], AlgoConfig::default(), Duration::from_secs(30), rustccl::config::TransportMode::Auto, shm);
    assert_eq!(threshold(&c[0], "shm_staged_send_max_bytes"), Some(8 << 20));
    let posted = Barrier::new(2);
    let n = 1_000_000;
    let wrong = on_ranks(&c, |r, c| {
        let mut wrong = Vec::new();
        for round in 0..12 {
            if r == 0 {
                posted.wait();
                send(c, &buf(DType::F64, &pattern(round, n)), 1, round as i64).wait(None).unwrap();
            } else {
                let got = buf(DType::F64, &vec![-1.0; n]);
                let w = recv(c, &got, Some(0), round as i64);
                posted.wait();
                w.wait(None).unwrap();
                let bad = read(DType::F64, &got).iter().zip(pattern(round, n)).filter(|(a, b)| *a != b).count();
                if bad > 0 {
                    wrong.push((round, bad));
                }
            }
        }
        wrong
    });
    assert_eq!(wrong[1], vec![], "(round, elements received wrong)");
}

#[test]
fn split_messages_of_odd_sizes_arrive_whole_from_both_halves() {
    // Lengths around the split point (half, rounded up to 64 bytes), the
    // receive posted before and after the message came.
    let c = comms(Mode::Split, 2);
    let sizes = [4096usize, 4097, 4159, 65_537, 1 << 20];
    on_ranks(&c, |r, c| {
        for (k, &n) in sizes.iter().enumerate() {
            let data: Vec<f64> = (0..n).map(|i| ((i * 131 + k) % 251) as f64).collect();
            if r == 0 {
                send(c, &buf(DType::U8, &data), 1, k as i64).wait(None).unwrap();
            } else {
                let b = buf(DType::U8, &vec![0.0; n]);
                if k % 2 == 1 {
                    std::thread::sleep(Duration::from_millis(20));
                }
                recv(c, &b, Some(0), k as i64).wait(None).unwrap();
                assert_eq!(read(DType::U8, &b), data, "{n} bytes");
            }
        }
    });
}

#[test]
fn a_split_receive_from_a_sender_that_left_fails_and_the_others_go_on() {
    let mut c = comms_on(Mode::Split, &[0, 0, 0], Duration::from_secs(20));
    let gone = c.pop().unwrap();
    let b = buf(DType::F32, &pattern(5, 8192));
    let w = send(&gone, &b, 0, 3);
    std::thread::sleep(Duration::from_millis(50));
    gone.shutdown(true);
    drop(gone);
    let _ = w.wait(None);
    // Its message (unexpected at rank 0) cannot be taken whole any more:
    // the receive fails, naming the sender, rather than waiting for the
    // half it would have written.
    let got = buf(DType::F32, &[0.0; 8192]);
    match recv(&c[0], &got, Some(2), 3).wait(None) {
        Err(e) => assert!(matches!(e, Error::PeerLost { peer: 2, .. }), "{e}"),
        // read before the loss was noticed, and the tensor still there (threads of one process)
        Ok(()) => assert_eq!(read(DType::F32, &got), pattern(5, 8192)),
    }
    let got = buf(DType::F32, &[0.0; 8192]);
    let r = recv(&c[1], &got, Some(0), 6);
    send(&c[0], &buf(DType::F32, &pattern(2, 8192)), 1, 6).wait(None).unwrap();
    r.wait(None).unwrap();
    assert_eq!(read(DType::F32, &got), pattern(2, 8192));
}
