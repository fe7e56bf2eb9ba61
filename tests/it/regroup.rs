//! Groups made from groups (split, shrink) and the monitored barrier, with
//! ranks as threads over real links (shared memory and TCP).

use std::time::Duration;

use crate::common::*;
use rustccl::types::{DType, OpKind, ReduceOp};
use rustccl::Communicator;

/// All-reduce (SUM) of `rank + 1` over `c`; returns the sum every rank got.
fn sum_of_ranks(c: &Communicator, global: usize) -> f64 {
    let b = buf(DType::F32, &[global as f64 + 1.0; 3]);
    let mut s = spec(OpKind::AllReduce);
    s.reduce_op = ReduceOp::Sum as i32;
    s.inputs = vec![t(&b)];
    run(c, s);
    read(DType::F32, &b)[0]
}

fn both_transports() -> Vec<Vec<Communicator>> {
    vec![shm_comms(4, tiny_algo(), Duration::from_secs(20)), tcp_comms(4, tiny_algo(), Duration::from_secs(20))]
}

#[test]
fn split_makes_working_groups_and_keeps_the_parent() {
    for comms in both_transports() {
        let got = on_ranks(&comms, |r, c| {
            let mine: Vec<usize> = if r % 2 == 0 { vec![0, 2] } else { vec![1, 3] };
            let child = c.split(&mine, &format!("half{}", r % 2), Duration::from_secs(20)).unwrap().expect("member");
            let child_sum = sum_of_ranks(&child, r);
            // A split that leaves ranks 1..3 out: None for them.
            let only0 = c.split(&[0], "only0", Duration::from_secs(20)).unwrap();
            (child.rank(), child.size(), child_sum, only0.is_some(), sum_of_ranks(c, r))
        });
        for (r, &(rank, size, child_sum, has0, parent_sum)) in got.iter().enumerate() {
            assert_eq!((rank, size), (r / 2, 2), "rank {r}");
            assert_eq!(child_sum, if r % 2 == 0 { 1.0 + 3.0 } else { 2.0 + 4.0 }, "rank {r}");
            assert_eq!(has0, r == 0, "rank {r}");
            assert_eq!(parent_sum, 10.0, "rank {r}");
        }
    }
}

#[test]
fn split_with_disagreeing_ranks_fails_on_the_members() {
    let comms = tcp_comms(3, tiny_algo(), Duration::from_secs(20));
    let got = on_ranks(&comms, |r, c| {
        let mine: Vec<usize> = if r == 2 { vec![1, 2] } else { vec![0, 1, 2] };
        c.split(&mine, "bad", Duration::from_secs(5)).err().map(|e| e.to_string())
    });
    for (r, e) in got.iter().enumerate() {
        let e = e.as_ref().unwrap_or_else(|| panic!("rank {r} split without error"));
        assert!(e.contains("rustccl split_group") && e.contains("same split_ranks"), "rank {r}: {e}");
    }
}

#[test]
fn shrink_excludes_a_silent_rank_and_renumbers() {
    for comms in both_transports() {
        let got = on_ranks(&comms, |r, c| {
            if r == 1 {
                return None; // the excluded rank stays away
            }
            let child = c.shrink(&[1], false, Duration::from_secs(20)).unwrap();
            Some((child.rank(), child.size(), sum_of_ranks(&child, r)))
        });
        assert_eq!(got, vec![Some((0, 3, 8.0)), None, Some((1, 3, 8.0)), Some((2, 3, 8.0))]);
        // ranks 0, 2, 3 add 1 + 3 + 4
    }
}

#[test]
fn shrink_with_different_lists_fails_within_the_timeout() {
    let comms = tcp_comms(4, tiny_algo(), Duration::from_secs(20));
    let got = on_ranks(&comms, |r, c| {
        if r == 3 {
            return None;
        }
        let gone: Vec<usize> = if r == 2 { vec![1, 3] } else { vec![3] };
        let t0 = std::time::Instant::now();
        let e = c.shrink(&gone, false, Duration::from_secs(2)).err().map(|e| e.to_string());
        Some((e, t0.elapsed()))
    });
    for (r, g) in got.iter().enumerate().take(3) {
        let (e, took) = g.as_ref().unwrap();
        let e = e.as_ref().unwrap_or_else(|| panic!("rank {r} shrank without error"));
        assert!(e.contains("rustccl shrink_group"), "rank {r}: {e}");
        assert!(*took < Duration::from_secs(8), "rank {r} took {took:?}");
    }
    let disagree = got.iter().take(3).filter(|g| g.as_ref().unwrap().0.as_ref().unwrap().contains("disagree")).count();
    assert!(disagree >= 1, "{got:?}");
    // Bad input: an excluded caller, an unsorted list.
    let err = |gone: &[usize]| comms[0].shrink(gone, false, Duration::from_secs(1)).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(&[0]).contains("only survivors"));
    assert!(err(&[2, 1]).contains("sorted"));
}

#[test]
fn monitored_barrier_names_the_missing_rank() {
    let comms = shm_comms(3, tiny_algo(), Duration::from_secs(20));
    let ok = on_ranks(&comms, |_, c| c.monitored_barrier(Duration::from_secs(10), false).is_ok());
    assert_eq!(ok, vec![true; 3]);
    let got = on_ranks(&comms, |r, c| {
        if r == 2 {
            return None;
        }
        Some(c.monitored_barrier(Duration::from_millis(500), true).unwrap_err().to_string())
    });
    assert!(got[0].as_ref().unwrap().contains("Ranks 2 failed to pass monitoredBarrier in 500 ms"), "{got:?}");
    assert!(got[1].as_ref().unwrap().contains("rank 0 reported that rank(s) [2]"), "{got:?}");
    // The group still works.
    assert_eq!(on_ranks(&comms, |r, c| sum_of_ranks(c, r)), vec![6.0; 3]);
}
