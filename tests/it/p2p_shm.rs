//! Point-to-point over shared memory between ranks of one host (and TCP
//! to other hosts in the same group): ordering, tags (any i64), any-source
//! receives across both kinds of link, messages far larger than the rings,
//! and the failure paths (dead peer, timeout).

use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;
use rustccl::config::{AlgoConfig, ShmConfig, TransportMode};
use rustccl::{DType, Error};

fn tiny_shm() -> ShmConfig {
    common::TINY_SHM
}

fn pattern(seed: usize, n: usize) -> Vec<f64> {
    (0..n).map(|i| ((seed * 7919 + i * 31) % 1000) as f64).collect()
}

#[test]
fn the_links_of_one_host_are_shared_memory() {
    let comms = hosts_comms(&[0, 0, 1], AlgoConfig::default(), Duration::from_secs(10), TransportMode::Auto, tiny_shm());
    assert_eq!(comms[0].link_kinds(), &["", "shm", "tcp"]);
    assert_eq!(comms[2].link_kinds(), &["tcp", "tcp", ""]);
}

#[test]
fn many_messages_keep_their_order_per_tag_across_ring_wraps() {
    // Sizes from 0 bytes to many times the 4 KiB ring, two tags interleaved;
    // the receiver takes tag 2 first, then tag 1, so tag 1 waits unexpected.
    let sizes = [0usize, 1, 3, 1000, 1024, 1025, 5000, 70_000, 1, 0, 300_000, 2];
    let comms = shm_comms(2, AlgoConfig::default(), Duration::from_secs(30));
    on_ranks(&comms, |r, c| {
        if r == 0 {
            let bufs: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| buf(DType::F32, &pattern(i, n))).collect();
            let ws: Vec<_> = bufs.iter().enumerate().map(|(i, b)| send(c, b, 1, 1 + (i % 2) as i64)).collect();
            ws.into_iter().for_each(|w| w.wait(None).unwrap());
        } else {
            for tag in [2usize, 1] {
                let idx: Vec<usize> = (0..sizes.len()).filter(|i| 1 + i % 2 == tag).collect();
                let bufs: Vec<_> = idx.iter().map(|&i| buf(DType::F32, &vec![-1.0; sizes[i]])).collect();
                let ws: Vec<_> = bufs.iter().map(|b| recv(c, b, Some(0), tag as i64)).collect();
                for ((w, b), &i) in ws.into_iter().zip(&bufs).zip(&idx) {
                    w.wait(None).unwrap();
                    assert_eq!(read(DType::F32, b), pattern(i, sizes[i]), "message {i} (tag {tag})");
                }
            }
        }
    });
}

#[test]
fn any_source_reports_the_sender_over_shm_and_tcp() {
    // Ranks 0-2 share a host, rank 3 is alone: rank 0 hears from both kinds.
    let comms = hosts_comms(&[0, 0, 0, 1], AlgoConfig::default(), Duration::from_secs(20), TransportMode::Auto, tiny_shm());
    on_ranks(&comms, |r, c| {
        if r == 0 {
            let mut seen = Vec::new();
            for _ in 0..6 {
                let b = buf(DType::I64, &[0.0; 3000]);
                let w = recv(c, &b, None, 9);
                w.wait(None).unwrap();
                let src = w.source().unwrap();
                let got = read(DType::I64, &b);
                assert!(got.iter().all(|&v| v == got[0]), "one sender per message");
                assert_eq!(got[0] as usize % 10, src, "source {src} reported for a message of rank {}", got[0] as usize % 10);
                seen.push((src, got[0] as usize / 10));
            }
            seen.sort_unstable();
            // two messages from each sender, in the order each sent them
            assert_eq!(seen, vec![(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]);
        } else {
            for k in 0..2 {
                send(c, &buf(DType::I64, &[(k * 10 + r) as f64; 3000]), 0, 9).wait(None).unwrap();
            }
        }
    });
}

#[test]
fn reserved_tags_outside_the_int32_range_work() {
    let comms = shm_comms(2, AlgoConfig::default(), Duration::from_secs(10));
    let tags = [i64::MIN, i64::MIN + 0x6e63636c, -1, i64::MAX];
    on_ranks(&comms, |r, c| {
        if r == 0 {
            for (k, &tag) in tags.iter().enumerate() {
                send(c, &buf(DType::U8, &[k as f64; 128]), 1, tag).wait(None).unwrap();
            }
        } else {
            for (k, &tag) in tags.iter().enumerate().rev() {
                let b = buf(DType::U8, &[0.0; 128]);
                recv(c, &b, Some(0), tag).wait(None).unwrap();
                assert_eq!(read(DType::U8, &b), vec![k as f64; 128], "tag {tag}");
            }
        }
    });
}

#[test]
fn a_dead_shm_peer_fails_pending_sends_and_receives_promptly() {
    let mut comms = shm_comms(3, AlgoConfig::default(), Duration::from_secs(60));
    let dead = comms.pop().unwrap();
    let c = &comms[0];
    let t0 = Instant::now();
    // a receive it never sends to, and a send far larger than the ring
    let r = recv(c, &buf(DType::F32, &[0.0; 16]), Some(2), 3);
    let s = send(c, &buf(DType::F32, &vec![1.0; 1 << 16]), 2, 3);
    // the surviving pair keeps working before and after
    let ok = buf(DType::F32, &[0.0; 8]);
    let w = recv(&comms[1], &ok, Some(0), 4);
    send(c, &buf(DType::F32, &[5.0; 8]), 1, 4).wait(None).unwrap();
    w.wait(None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    dead.shutdown(true);
    drop(dead);
    for w in [r, s] {
        let e = w.wait(None).unwrap_err();
        assert!(matches!(e, Error::PeerLost { peer: 2, .. }), "{e}");
        assert!(e.to_string().contains("rank 0 (this process) <-> rank 2"), "{e}");
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?} (timeout 60 s)", t0.elapsed());
    assert_eq!(read(DType::F32, &ok), vec![5.0; 8]);
    let again = buf(DType::F32, &[0.0; 8]);
    let w = recv(&comms[1], &again, Some(0), 4);
    send(c, &buf(DType::F32, &[6.0; 8]), 1, 4).wait(None).unwrap();
    w.wait(None).unwrap();
    assert_eq!(read(DType::F32, &again), vec![6.0; 8]);
}

#[test]
fn a_receive_nobody_sends_times_out_naming_the_peer() {
    let comms = shm_comms(2, AlgoConfig::default(), Duration::from_millis(500));
    let e = recv(&comms[0], &buf(DType::F32, &[0.0; 4]), Some(1), 1).wait(None).unwrap_err();
    assert!(matches!(e, Error::Timeout { ref waiting, .. } if waiting == &vec![1]), "{e}");
    assert!(e.to_string().contains(" Timed out "), "{e}");
}
