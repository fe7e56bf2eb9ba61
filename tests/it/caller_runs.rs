//! Who runs a CPU collective (`comm::cpu`): for a blocking call (the
//! caller waits at once), its caller's thread, inside the submit if the
//! engine is idle, else in its wait when that comes within the grace
//! (`AlgoConfig::caller_runs_us`); for async work, and blocking calls
//! whose caller did not come, the engine's worker. Either way in
//! submission order with the same results.

use std::time::{Duration, Instant};

use crate::common::*;
use rustccl::config::AlgoConfig;
use rustccl::{Communicator, DType, OpKind, ReduceOp};

fn comms(grace_us: u64) -> Vec<Communicator> {
    // Three ranks over shared memory.
    shm_comms(3, AlgoConfig { caller_runs_us: grace_us, ..tiny_algo() }, Duration::from_secs(30))
}

/// Submits an all_reduce (sum) of `vals` on `c` without waiting; `blocking`:
/// marked as a call whose caller waits at once (torch's `asyncOp=False`).
fn submit_sum(c: &Communicator, vals: &[f64], blocking: bool) -> (std::sync::Arc<rustccl::tensor::SharedBuf>, rustccl::Work) {
    let b = buf(DType::F32, vals);
    let mut s = spec(OpKind::AllReduce);
    s.reduce_op = ReduceOp::Sum as i32;
    s.inputs = vec![t(&b)];
    s.sync = blocking;
    let w = c.submit(vec![s], None, None).unwrap();
    (b, w)
}

/// Keeps the engine of ranks 0 and 1 busy until `late`: an async
/// all_reduce (sum of 1.0) that they submit at once and rank 2 only after
/// `late`, which their workers run meanwhile, so that their blocking
/// calls queue behind it. Rank 2's engine is idle again soon after.
fn busy_until(r: usize, c: &Communicator, late: Duration) -> (std::sync::Arc<rustccl::tensor::SharedBuf>, rustccl::Work) {
    if r == 2 {
        std::thread::sleep(late);
    }
    submit_sum(c, &[1.0], false)
}

fn by_caller(c: &Communicator) -> (u64, u64) {
    let s = c.stats().snapshot();
    let a = &s["all_reduce"];
    (a.calls, a.by_caller)
}

#[test]
fn a_waited_collective_runs_on_the_waiting_thread() {
    let cs = comms(1_000_000); // the worker would wait a second
    let got = on_ranks(&cs, |r, c| {
        let mut sums = Vec::new();
        for k in 0..20 {
            let (b, w) = submit_sum(c, &[(r * 10 + k) as f64, 1.0], true);
            w.wait(None).unwrap();
            sums.push(read(DType::F32, &b));
        }
        (sums, by_caller(c))
    });
    for (sums, counts) in got {
        for (k, s) in sums.iter().enumerate() {
            assert_eq!(s, &vec![(30 + 3 * k) as f64, 3.0]); // 0+10+20 + 3k
        }
        assert_eq!(counts, (20, 20));
    }
}

#[test]
fn a_blocking_call_on_an_idle_engine_finishes_in_its_submit() {
    let cs = comms(1_000_000);
    let got = on_ranks(&cs, |r, c| {
        let mut sums = Vec::new();
        for k in 0..10 {
            let (b, w) = submit_sum(c, &[(r + k) as f64], true);
            assert!(w.is_completed(), "a blocking call on an idle engine returned from its submit unfinished");
            sums.push(read(DType::F32, &b)[0]);
        }
        (sums, c.worker_wakes(), by_caller(c))
    });
    for (sums, wakes, counts) in got {
        assert_eq!(sums, (0..10).map(|k| (3 + 3 * k) as f64).collect::<Vec<_>>());
        assert_eq!(wakes, 0, "the worker was woken for calls that ran on their caller");
        assert_eq!(counts, (10, 10));
    }
}

#[test]
fn blocking_calls_nobody_waits_for_run_on_the_worker() {
    let cs = comms(20);
    let got = on_ranks(&cs, |r, c| {
        let busy = busy_until(r, c, Duration::from_millis(200));
        let subs: Vec<_> = (0..5).map(|k| submit_sum(c, &[(r + k) as f64], true)).collect();
        let t0 = Instant::now();
        while !subs.iter().all(|(_, w)| w.is_completed()) {
            assert!(t0.elapsed() < Duration::from_secs(20), "unwaited collectives did not run");
            std::thread::sleep(Duration::from_millis(1));
        }
        busy.1.wait(None).unwrap();
        let vals: Vec<f64> = subs
            .iter()
            .map(|(b, w)| {
                w.result().unwrap().unwrap();
                read(DType::F32, b)[0]
            })
            .collect();
        (r, read(DType::F32, &busy.0)[0], vals, by_caller(c))
    });
    for (r, busy, vals, counts) in got {
        assert_eq!(busy, 3.0);
        assert_eq!(vals, (0..5).map(|k| (3 + 3 * k) as f64).collect::<Vec<_>>());
        if r < 2 {
            assert_eq!(counts, (6, 0), "rank {r}: queued blocking calls nobody waited for ran on a caller");
        }
    }
}

#[test]
fn a_caller_runs_the_collectives_queued_before_its_own_in_order() {
    // Ranks 0 and 1 queue four blocking calls behind busy work, which ends
    // once rank 2 comes (100 ms); their grace (1 s) has not ended when
    // they wait for the third, 300 ms in: that wait runs the first three.
    let cs = comms(1_000_000);
    let got = on_ranks(&cs, |r, c| {
        let busy = busy_until(r, c, Duration::from_millis(100));
        let subs: Vec<_> = (0..4).map(|k| submit_sum(c, &[(r * k) as f64], true)).collect();
        if r < 2 {
            std::thread::sleep(Duration::from_millis(300));
        }
        subs[2].1.wait(None).unwrap();
        let done: Vec<bool> = subs.iter().map(|(_, w)| w.is_completed()).collect();
        let ends: Vec<Instant> = subs[..3].iter().map(|(_, w)| w.times().1.unwrap()).collect();
        subs[3].1.wait(None).unwrap();
        busy.1.wait(None).unwrap();
        let vals: Vec<f64> = subs.iter().map(|(b, _)| read(DType::F32, b)[0]).collect();
        (r, done, ends, vals, by_caller(c))
    });
    for (r, done, ends, vals, counts) in got {
        assert!(ends.windows(2).all(|p| p[0] <= p[1]), "finished out of order");
        assert_eq!(vals, vec![0.0, 3.0, 6.0, 9.0]); // (0+1+2) k
        if r < 2 {
            assert_eq!(done, vec![true, true, true, false], "rank {r}");
            assert_eq!(counts, (5, 4), "rank {r}: the waits ran the blocking calls");
        }
    }
}

#[test]
fn a_wait_with_a_deadline_hands_the_collective_to_the_worker() {
    // A bounded wait must not run the collective itself (that could
    // overshoot its deadline), nor leave it queued for the grace (10 s
    // here): it hands it to the worker at once, which finishes it after
    // the busy work (200 ms), well within the 5 s the wait allows.
    let cs = comms(10_000_000);
    let got = on_ranks(&cs, |r, c| {
        let busy = busy_until(r, c, Duration::from_millis(200));
        let (b, w) = submit_sum(c, &[r as f64 + 1.0], true);
        let done = w.wait(Some(Duration::from_secs(5)));
        busy.1.wait(None).unwrap();
        (r, done.is_ok(), read(DType::F32, &b)[0], by_caller(c))
    });
    for (r, done, val, counts) in got {
        assert!(done, "a bounded wait left the collective queued for its 10 s grace");
        assert_eq!(val, 6.0);
        if r < 2 {
            assert_eq!(counts, (2, 0), "rank {r}: a bounded wait ran the collective itself");
        }
    }
}

#[test]
fn async_work_is_the_workers_at_once() {
    // A long grace applies to blocking calls only: async work (its caller
    // may wait through a future, which cannot run it) starts without it.
    let cs = comms(5_000_000);
    let got = on_ranks(&cs, |r, c| {
        let t0 = Instant::now();
        let (b, w) = submit_sum(c, &[r as f64], false);
        while !w.is_completed() {
            assert!(t0.elapsed() < Duration::from_secs(4), "async work waited for the 5 s grace");
            std::thread::yield_now();
        }
        (read(DType::F32, &b)[0], by_caller(c))
    });
    for (val, counts) in got {
        assert_eq!(val, 3.0);
        assert_eq!(counts, (1, 0));
    }
}

#[test]
fn shutdown_waits_for_a_collective_its_caller_runs() {
    // Rank 0's collective runs on a caller's thread (its peer comes 300 ms
    // late) while another thread shuts the group down without abort: as
    // when the worker ran it, shutdown returns only after it finished.
    let cs = comms(1_000_000);
    let got = on_ranks(&cs, |r, c| {
        if r == 1 || r == 2 {
            std::thread::sleep(Duration::from_millis(300));
            let (b, w) = submit_sum(c, &[1.0], true);
            w.wait(None).unwrap();
            return (read(DType::F32, &b)[0], true);
        }
        std::thread::scope(|s| {
            let runner = s.spawn(move || {
                let (b, w) = submit_sum(c, &[1.0], true);
                w.wait(None).unwrap();
                b
            });
            std::thread::sleep(Duration::from_millis(50)); // the caller is inside it
            let early = c.stats().snapshot().get("all_reduce").map_or(0, |a| a.calls);
            assert_eq!(early, 0, "finished before its peers came");
            c.shutdown(false);
            let done_at_shutdown = c.stats().snapshot().get("all_reduce").is_some_and(|a| a.calls == 1);
            let b = runner.join().unwrap();
            (read(DType::F32, &b)[0], done_at_shutdown)
        })
    });
    for (val, done) in got {
        assert_eq!(val, 3.0);
        assert!(done, "shutdown returned while a caller still ran the collective");
    }
}

#[test]
fn a_loop_of_blocking_calls_wakes_the_worker_once_a_grace() {
    // Each call's caller runs it, so the worker has nothing to do. Woken
    // by every submit, it would find the job gone and sleep until the next
    // submit woke it again: a wake-up a call, on some rank's core. It
    // sleeps a grace instead once calls came, and a submit (due a grace
    // later) wakes it only from a sleep with no end.
    const GRACE: Duration = Duration::from_millis(20);
    const CALLS: usize = 2000;
    let cs = comms(GRACE.as_micros() as u64);
    let got = on_ranks(&cs, |r, c| {
        let t0 = Instant::now();
        let mut sums = Vec::new();
        for k in 0..CALLS {
            let (b, w) = submit_sum(c, &[(r + k) as f64], true);
            w.wait(None).unwrap();
            sums.push(read(DType::F32, &b)[0]);
        }
        (sums, t0.elapsed(), c.worker_wakes(), by_caller(c))
    });
    for (sums, took, wakes, counts) in got {
        assert_eq!(sums, (0..CALLS).map(|k| (3 + 3 * k) as f64).collect::<Vec<_>>());
        assert_eq!(counts, (CALLS as u64, CALLS as u64), "every call ran on its caller");
        let most = 2 + (took.as_micros() / GRACE.as_micros()) as u64;
        assert!(wakes <= most, "{wakes} wake-ups of the worker in {took:?} of {CALLS} calls (at most {most})");
    }
}
