//! Point-to-point matching over real sockets, and the failure paths:
//! mismatched calls, timeouts and lost peers become errors that name the
//! collective, the sequence number and the peer.

use crate::common::auto0;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;
use rustccl::config::{AlgoConfig, FaultSpec, Setting, ShmConfig, TransportMode};
use rustccl::transport::shm;
use rustccl::{DType, Error, OpKind, ReduceOp};

/// Point-to-point tests run over TCP and over shared memory (tiny rings,
/// so messages wrap them many times).
fn both(n: usize, timeout: Duration) -> [Vec<rustccl::Communicator>; 2] {
    [tcp_comms(n, AlgoConfig::default(), timeout), shm_comms(n, AlgoConfig::default(), timeout)]
}

#[test]
fn tags_match_out_of_order_and_fifo_within_a_tag() {
    for comms in both(2, Duration::from_secs(20)) {
        assert_eq!(comms[0].link_kinds()[1], comms[1].link_kinds()[0]);
        tags(&comms);
    }
}

fn tags(comms: &[rustccl::Communicator]) {
    on_ranks(comms, |r, c| {
        if r == 0 {
            // tag 5 twice, then tag 3; plus a big message.
            let a = buf(DType::I32, &[1.0, 2.0]);
            let b = buf(DType::I32, &[3.0, 4.0]);
            let d = buf(DType::I32, &[9.0]);
            let big = buf(DType::F32, &(0..(3 << 20)).map(|i| i as f64).collect::<Vec<_>>());
            for w in [send(c, &a, 1, 5), send(c, &b, 1, 5), send(c, &d, 1, 3), send(c, &big, 1, 7)] {
                w.wait(None).unwrap();
            }
        } else {
            std::thread::sleep(Duration::from_millis(50)); // let everything arrive unexpected
            let d = buf(DType::I32, &[0.0]);
            recv(c, &d, Some(0), 3).wait(None).unwrap();
            assert_eq!(read(DType::I32, &d), vec![9.0]);
            let first = buf(DType::I32, &[0.0, 0.0]);
            let second = buf(DType::I32, &[0.0, 0.0]);
            let w2 = recv(c, &first, Some(0), 5);
            let w3 = recv(c, &second, None, 5);
            w2.wait(None).unwrap();
            w3.wait(None).unwrap();
            assert_eq!(read(DType::I32, &first), vec![1.0, 2.0]);
            assert_eq!(read(DType::I32, &second), vec![3.0, 4.0]);
            assert_eq!(w3.source(), Some(0));
            let big = buf(DType::F32, &vec![0.0; 3 << 20]);
            recv(c, &big, Some(0), 7).wait(None).unwrap();
            assert!(read(DType::F32, &big).iter().enumerate().all(|(i, &v)| v == i as f64));
        }
    });
}

#[test]
fn simultaneous_large_exchange_does_not_deadlock() {
    // Every rank posts big sends to every other rank before any receive.
    let n = 3;
    let len = 1 << 21;
    for comms in both(n, Duration::from_secs(20)) {
        large_exchange(&comms, n, len);
    }
}

fn large_exchange(comms: &[rustccl::Communicator], n: usize, len: usize) {
    on_ranks(comms, |r, c| {
        let srcs: Vec<_> = (0..n).map(|p| buf(DType::F32, &vec![(r * 10 + p) as f64; len])).collect();
        let sends: Vec<_> = (0..n).filter(|&p| p != r).map(|p| send(c, &srcs[p], p, r as i64)).collect();
        let dsts: Vec<_> = (0..n).map(|_| buf(DType::F32, &vec![0.0; len])).collect();
        let recvs: Vec<_> = (0..n).filter(|&p| p != r).map(|p| (p, recv(c, &dsts[p], Some(p), p as i64))).collect();
        for w in sends {
            w.wait(None).unwrap();
        }
        for (p, w) in recvs {
            w.wait(None).unwrap();
            assert!(read(DType::F32, &dsts[p]).iter().all(|&v| v == (p * 10 + r) as f64), "from {p}");
        }
    });
}

#[test]
fn recv_size_mismatch_is_an_error_and_the_link_keeps_working() {
    for comms in both(2, Duration::from_secs(20)) {
        size_mismatch(&comms);
    }
}

fn size_mismatch(comms: &[rustccl::Communicator]) {
    on_ranks(comms, |r, c| {
        if r == 0 {
            send(c, &buf(DType::I64, &[1.0, 2.0, 3.0]), 1, 0).wait(None).unwrap();
            send(c, &buf(DType::I64, &[4.0]), 1, 0).wait(None).unwrap();
        } else {
            let small = buf(DType::I64, &[0.0]);
            let e = recv(c, &small, Some(0), 0).wait(None).unwrap_err();
            assert!(e.to_string().contains("is 1 x int64 (8 bytes) but rank 0 sent 3 x int64 (24 bytes)"), "{e}");
            let ok = buf(DType::I64, &[0.0]);
            recv(c, &ok, Some(0), 0).wait(None).unwrap();
            assert_eq!(read(DType::I64, &ok), vec![4.0]);
        }
    });
}

#[test]
fn mismatched_sizes_fail_and_the_group_goes_on() {
    for comms in
        [tcp_comms(2, AlgoConfig::default(), Duration::from_secs(10)), shm_comms(2, AlgoConfig::default(), Duration::from_secs(10))]
    {
        mismatched(&comms);
    }
}

fn mismatched(comms: &[rustccl::Communicator]) {
    let errs = on_ranks(comms, |r, c| {
        let b = buf(DType::F32, &vec![1.0; 10 + r]);
        let mut s = spec(OpKind::AllReduce);
        s.inputs = vec![t(&b)];
        let e = c.submit(vec![s], None, None).unwrap().wait(None).unwrap_err();
        // the ranks are still in step: a later collective works
        let b2 = buf(DType::F32, &[1.0 + r as f64]);
        let mut s = spec(OpKind::AllReduce);
        s.inputs = vec![t(&b2)];
        c.submit(vec![s], None, None).unwrap().wait(None).unwrap();
        assert_eq!(read(DType::F32, &b2), vec![3.0]);
        e
    });
    for e in errs {
        let s = e.to_string();
        assert!(matches!(e, Error::Mismatch { .. }) && s.contains("the group stays usable"), "{s}");
        let named = s.contains("of 10 x float32") && s.contains("of 11 x float32") && s.contains("different dtypes, sizes");
        assert!(s.contains("rustccl all_reduce (seq 0") && (named || s.contains("different tensors")), "{s}");
    }
}

#[test]
fn a_missing_rank_times_out_naming_it() {
    missing_rank(tcp_comms(3, AlgoConfig::default(), Duration::from_millis(700)), false);
    missing_rank(shm_comms(3, AlgoConfig::default(), Duration::from_millis(700)), true);
}

/// `kept`: the operation's tensors stay with the engine after the timeout
/// (never released), as peers of this host that the rank gave up on might
/// still write into them; over TCP they are the caller's again.
fn missing_rank(comms: Vec<rustccl::Communicator>, kept: bool) {
    let t0 = Instant::now();
    let errs = on_ranks(&comms, |r, c| {
        if r == 2 {
            return None; // never joins
        }
        let b = buf(DType::F32, &[1.0; 4]);
        let mut s = spec(OpKind::AllReduce);
        s.inputs = vec![t(&b)];
        let e = c.submit(vec![s], None, None).unwrap().wait(None).unwrap_err();
        assert_eq!(b.to_vec::<f32>().is_none(), kept, "rank {r}: the tensor kept after the timeout");
        Some(e)
    });
    assert!(t0.elapsed() < Duration::from_secs(5), "timeout took {:?}", t0.elapsed());
    for e in errs.into_iter().flatten() {
        let s = e.to_string();
        assert!(matches!(e, Error::Timeout { .. }), "{s}");
        assert!(s.contains(" Timed out ") && s.contains("rustccl all_reduce (seq 0"), "{s}");
    }
}

#[test]
fn a_dead_peer_fails_the_collective_promptly() {
    dead_peer(tcp_comms(2, AlgoConfig::default(), Duration::from_secs(30)));
    dead_peer(shm_comms(2, AlgoConfig::default(), Duration::from_secs(30)));
}

fn dead_peer(mut comms: Vec<rustccl::Communicator>) {
    let dead = comms.pop().unwrap();
    let c = &comms[0];
    let t0 = Instant::now();
    let b = buf(DType::F32, &vec![1.0; 1 << 20]);
    let mut s = spec(OpKind::AllReduce);
    s.reduce_op = ReduceOp::Sum as i32;
    s.inputs = vec![t(&b)];
    let w = c.submit(vec![s], None, None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    dead.shutdown(true);
    drop(dead);
    let e = w.wait(None).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    assert!(matches!(e, Error::PeerLost { peer: 1, .. }), "{e}");
    assert!(e.to_string().contains("rank 0 (this process) <-> rank 1"), "{e}");
}

#[test]
fn bad_input_is_rejected_before_sending_and_the_group_keeps_working() {
    let comms = tcp_comms(2, AlgoConfig::default(), Duration::from_secs(10));
    on_ranks(&comms, |r, c| {
        // root out of range
        let b = buf(DType::F32, &[1.0]);
        let mut s = spec(OpKind::Broadcast);
        s.root = 7;
        s.inputs = vec![t(&b)];
        let e = c.submit(vec![s], None, None).err().unwrap();
        assert!(e.to_string().contains("rustccl broadcast: root 7 is out of range"), "{e}");
        // bitwise op on floats
        let mut s = spec(OpKind::AllReduce);
        s.reduce_op = ReduceOp::BAnd as i32;
        s.inputs = vec![t(&b)];
        let e = c.submit(vec![s], None, None).err().unwrap();
        assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("BAND"), "{e}");
        // the group still works, and no sequence number was used up
        assert_eq!(c.seq(), 0);
        let mut s = spec(OpKind::AllReduce);
        s.inputs = vec![t(&b)];
        run(c, s);
        assert_eq!(read(DType::F32, &b), vec![2.0]);
        let _ = r;
    });
}

/// Over TCP, ranks 0 and 1 name root 0 and rank 2 root 1. Messages carry
/// their collective's root, so a rank that receives from a peer with
/// another root fails naming the cause, rather than taking the data (before,
/// all three broadcasts returned success, and rank 2's message to the root
/// stayed in the stream). Ranks that never hear from such a peer cannot
/// tell: they finish (with their root's data) or time out.
#[test]
fn different_roots_over_tcp_are_named_where_they_meet() {
    for kind in [OpKind::Broadcast, OpKind::Reduce] {
        let comms = tcp_comms(3, AlgoConfig::default(), Duration::from_secs(2));
        let res = on_ranks(&comms, |r, c| {
            let root = if r == 2 { 1 } else { 0 };
            let b = buf(DType::F32, &vec![(r + 1) as f64; 100_000]);
            let mut s = spec(kind);
            s.root = root;
            s.inputs = vec![t(&b)];
            c.submit(vec![s], None, None).unwrap().wait(None).map(|_| read(DType::F32, &b)[0]).map_err(|e| e.to_string())
        });
        let named = res.iter().filter(|r| r.as_ref().is_err_and(|e| e.contains("the ranks passed different roots"))).count();
        assert!(named >= 1, "{kind:?}: {res:?}");
        for (r, got) in res.iter().enumerate() {
            if let Ok(v) = got {
                // broadcast: rank 1 with root 0's value; reduce: rank 1, a
                // non-root, with its own (no root can have a right sum)
                let ok = match kind {
                    OpKind::Broadcast => r != 2 && *v == 1.0,
                    _ => r == 1 && *v == 2.0,
                };
                assert!(ok, "{kind:?} rank {r} returned {v} ({res:?})");
            }
        }
    }
}

#[test]
fn a_message_that_arrived_before_its_sender_left_is_still_received() {
    // A script's last send followed by destroy_process_group: the bytes
    // were all written, so the receive posted afterwards gets them (it
    // used to fail with "connection closed by peer" once the receiver's
    // engine had read the message and then the peer's departure).
    for mut comms in both(2, Duration::from_secs(30)) {
        let gone = comms.pop().unwrap();
        let c = &comms[0];
        // rank 0's engine runs from here on, reading whatever arrives
        let first = recv(c, &buf(DType::F32, &[0.0]), Some(1), 1);
        send(&gone, &buf(DType::F32, &[5.0]), 0, 1).wait(None).unwrap();
        first.wait(None).unwrap();
        let want: Vec<f64> = (0..500).map(|i| i as f64).collect();
        send(&gone, &buf(DType::F32, &want), 0, 2).wait(None).unwrap();
        gone.shutdown(false);
        drop(gone);
        std::thread::sleep(Duration::from_millis(300));
        let b = buf(DType::F32, &[0.0; 500]);
        recv(c, &b, Some(1), 2).wait(None).unwrap();
        assert_eq!(read(DType::F32, &b), want);
        // nothing else is coming from the lost peer
        let e = recv(c, &buf(DType::F32, &[0.0]), Some(1), 3).wait(None).unwrap_err();
        assert!(matches!(e, Error::PeerLost { peer: 1, .. }), "{e}");
    }
}

/// A local peer whose connection closes during shared-memory setup breaks
/// the setup off: the group cannot be built over connections that are out
/// of step (the peer might still wait for setup bytes on them), so this
/// is not the "no shared memory here, use TCP" outcome; and this rank's
/// segment is gone.
#[test]
fn shared_memory_setup_that_breaks_off_is_not_taken_for_unavailable() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    drop(l.accept().unwrap());
    let token = format!("broken-setup-{}", std::process::id());
    let mut conns = vec![None, Some(rustccl::bootstrap::Conn { stream: client, addr: "peer".to_string(), tls: None })];
    let r = shm::connect(0, &[0, 1], &token, TINY_SHM, &mut conns, Instant::now() + Duration::from_secs(5));
    assert!(matches!(r, Err(shm::SetupError::Broken(_))), "{:?}", r.err());
    assert!(!std::path::Path::new(&format!("/dev/shm/rustccl-{token}-0")).exists());
}

/// An operation aborted while it waits for a peer of this host (which
/// might still write into its tensors once it comes) keeps them for good;
/// over TCP they are the caller's again.
#[test]
fn an_aborted_operation_keeps_its_tensors_where_peers_share_the_host() {
    for (comms, kept) in [
        (tcp_comms(2, AlgoConfig::default(), Duration::from_secs(30)), false),
        (shm_comms(2, AlgoConfig::default(), Duration::from_secs(30)), true),
    ] {
        let b = buf(DType::F32, &vec![1.0; 1 << 16]);
        let mut s = spec(OpKind::AllReduce);
        s.inputs = vec![t(&b)];
        let w = comms[0].submit(vec![s], None, None).unwrap(); // rank 1 never joins
        std::thread::sleep(Duration::from_millis(100));
        comms[0].shutdown(true);
        let e = w.wait(None).unwrap_err();
        assert!(matches!(e, Error::Closed { .. }), "{e}");
        assert_eq!(b.to_vec::<f32>().is_none(), kept, "{e}");
    }
}

/// An all_reduce of `len` ones on a fresh buffer (a failed call's buffer
/// is kept), waited.
fn ones_all_reduce(c: &rustccl::Communicator, len: usize) -> Result<(), Error> {
    let b = buf(DType::F32, &vec![1.0; len]);
    let mut s = spec(OpKind::AllReduce);
    s.inputs = vec![t(&b)];
    c.submit(vec![s], None, None).unwrap().wait(None)
}

/// Every rank runs all_reduce seq 0 (which succeeds), seq 1 and one more
/// (which fail): their errors.
fn seq1_and_later_errors(comms: &[rustccl::Communicator]) -> Vec<(Error, Error)> {
    on_ranks(comms, |_, c| {
        ones_all_reduce(c, 64).unwrap(); // seq 0
        let first = ones_all_reduce(c, 64).unwrap_err();
        let later = ones_all_reduce(c, 64).unwrap_err();
        (first, later)
    })
}

/// A rank that an error poisons says so in its segment, so that its peers
/// on the host fail at once where they wait for its next step, naming it,
/// instead of at their timeout (30 s here). Rank 1's all_reduce seq 1
/// fails before it starts (`RUSTCCL_FAULT` drop), as a failed read or a
/// timeout of its own would fail it; ranks 0 and 2 wait for its step.
/// Their own next call fails at once as well (they are poisoned now).
#[test]
fn peers_of_a_rank_that_gave_the_group_up_fail_at_once() {
    let fault = FaultSpec::parse("drop:rank=1:seq=1").unwrap();
    let comms = shm_comms_with(3, AlgoConfig::default(), Duration::from_secs(30), |_, o| o.fault = Some(fault.clone()));
    let t0 = Instant::now();
    let errs = seq1_and_later_errors(&comms);
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    assert!(errs[1].0.to_string().contains("RUSTCCL_FAULT: rank 1 dropped"), "{}", errs[1].0);
    for r in [0, 2] {
        let (first, later) = (&errs[r].0, &errs[r].1);
        let s = first.to_string();
        assert!(matches!(first, Error::PeerLost { peer: 1, .. }), "rank {r}: {s}");
        assert!(s.contains("rustccl all_reduce (seq 1") && s.contains("gave the group up at its operation seq 1"), "rank {r}: {s}");
        assert!(matches!(later, Error::Poisoned { .. }), "rank {r}: {later}");
    }
}

/// The same with 31 ranks on the host, the rank that gives up at local
/// index 30: the blocked words' masks name only the first 29 local ranks,
/// so its word is read for it by index (`Blocked::Gone`). One thread a
/// rank and no quick team, to keep 31 ranks light.
#[test]
fn peers_of_a_rank_past_the_blocked_masks_that_gave_up_fail_at_once() {
    let n = 31;
    let fault = FaultSpec::parse("drop:rank=30:seq=1").unwrap();
    let shm = ShmConfig { threads: auto0(1), quick_threads: Setting::Fixed(0), ..common::TINY_SHM };
    let comms = hosts_comms_with(&vec![0; n], AlgoConfig::default(), Duration::from_secs(30), TransportMode::Shm, shm, |_, o| {
        o.fault = Some(fault.clone())
    });
    let t0 = Instant::now();
    let errs = on_ranks(&comms, |_, c| {
        ones_all_reduce(c, 16).unwrap(); // seq 0
        ones_all_reduce(c, 16).unwrap_err()
    });
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    assert!(errs[30].to_string().contains("RUSTCCL_FAULT: rank 30 dropped"), "{}", errs[30]);
    // Every other rank fails: some name rank 30 itself, the others a peer
    // that gave up in turn; none waited for its timeout.
    let named = (0..30).filter(|&r| matches!(errs[r], Error::PeerLost { peer: 30, .. })).count();
    assert!(named > 0, "{:?}", errs.iter().map(|e| e.to_string()).collect::<Vec<_>>());
    for (r, e) in errs.iter().enumerate().take(30) {
        assert!(matches!(e, Error::PeerLost { .. } | Error::Poisoned { .. }), "rank {r}: {e}");
    }
}

/// Peers over TCP are told too: the rank that gives up closes its TCP
/// links, as a crashed process's close, so a peer waiting for its next
/// step fails at once instead of at its timeout (30 s here). Ranks 0 and
/// 1 share a host (shared memory between them), rank 2 is on another
/// (TCP to both), and each of ranks 1 and 2 in turn drops its seq 1; then
/// three hosts. (After its own timeout a rank keeps its links:
/// `a_missing_rank_times_out_naming_it`.)
#[test]
fn tcp_peers_of_a_rank_that_gave_the_group_up_fail_at_once() {
    for (hosts, mode, dropper) in
        [(vec![0, 0, 1], TransportMode::Auto, 1), (vec![0, 0, 1], TransportMode::Auto, 2), (vec![0, 1, 2], TransportMode::Tcp, 1)]
    {
        let fault = FaultSpec::parse(&format!("drop:rank={dropper}:seq=1")).unwrap();
        let shm = ShmConfig { threads: auto0(1), quick_threads: Setting::Fixed(0), ..common::TINY_SHM };
        let comms =
            hosts_comms_with(&hosts, AlgoConfig::default(), Duration::from_secs(30), mode, shm, |_, o| o.fault = Some(fault.clone()));
        let t0 = Instant::now();
        let errs = seq1_and_later_errors(&comms);
        let took = t0.elapsed();
        let what = format!("hosts {hosts:?}, rank {dropper} drops: {:?}", errs.iter().map(|e| e.0.to_string()).collect::<Vec<_>>());
        assert!(took < Duration::from_secs(5), "took {took:?}; {what}");
        assert!(errs[dropper].0.to_string().contains(&format!("RUSTCCL_FAULT: rank {dropper} dropped")), "{what}");
        for r in (0..3).filter(|&r| r != dropper) {
            let (first, later) = (&errs[r].0, &errs[r].1);
            // The dropper itself, or a peer that gave up in turn.
            assert!(matches!(first, Error::PeerLost { .. }), "rank {r}: {first}; {what}");
            let s = first.to_string();
            assert!(s.contains("rustccl all_reduce (seq 1") && s.contains("gave the group up"), "rank {r}: {s}; {what}");
            assert!(matches!(later, Error::Poisoned { .. }), "rank {r}: {later}; {what}");
        }
    }
}
