//! [`Work`]'s own tests: waiting, callbacks, driving and joins.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn wait_callbacks_and_timeout() {
    let w = Work::new("all_reduce", 3);
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let w2 = w.clone();
    w.on_complete(Box::new(move |r, _| {
        assert!(r.is_ok());
        // The state is visible to a callback, so waiting here returns.
        assert!(w2.wait(None).is_ok());
        h.fetch_add(1, Ordering::SeqCst);
    }));
    let e = w.wait(Some(Duration::from_millis(20))).unwrap_err();
    assert!(matches!(e, Error::WaitTimeout { seq: 3, .. }), "{e}");
    let w3 = w.clone();
    let t = std::thread::spawn(move || w3.finish(Ok(())));
    assert!(w.wait(None).is_ok());
    t.join().unwrap();
    assert!(w.is_completed());
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // late registration runs at once
    let h = hits.clone();
    w.on_complete(Box::new(move |_, _| {
        h.fetch_add(1, Ordering::SeqCst);
    }));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // finishing twice keeps the first result
    w.finish(Err(Error::Internal("late".into())));
    assert!(w.wait(None).is_ok());
}

#[test]
fn every_sleeping_waiter_wakes() {
    // Waiters with and without a timeout, asleep before the finish (the
    // finish wakes only when some are counted) and arriving after it.
    for _ in 0..50 {
        let w = Work::new("broadcast", 7);
        let ts: Vec<_> = (0..6)
            .map(|i| {
                let w = w.clone();
                std::thread::spawn(move || w.wait(if i % 2 == 0 { None } else { Some(Duration::from_secs(30)) }))
            })
            .collect();
        std::thread::sleep(Duration::from_micros(200));
        w.finish(Ok(()));
        for t in ts {
            assert!(t.join().unwrap().is_ok());
        }
        assert!(w.wait(Some(Duration::ZERO)).is_ok());
    }
}

/// Finishes its work on the third pass.
struct Third(Mutex<(u32, Option<Work>)>);

impl Progress for Third {
    fn progress(&self) {
        let mut s = self.0.lock().unwrap();
        s.0 += 1;
        if s.0 == 3 {
            if let Some(w) = s.1.take() {
                w.finish(Ok(()));
            }
        }
    }
}

#[test]
fn wait_drives_the_engine() {
    // The waiting thread itself finishes the work through its Progress
    // (no other thread exists), and a joined work inherits it.
    let w = Work::new("recv", 1);
    let p = Arc::new(Third(Mutex::new((0, Some(w.clone())))));
    w.set_progress(p.clone());
    let j = join("batch", 0, vec![w.clone()]);
    // (`wait` drives for only 60 us, too short for a loaded machine.)
    assert!(j.drive(Duration::from_secs(30)));
    assert!(j.wait(None).is_ok());
    assert_eq!(p.0.lock().unwrap().0, 3);
    assert!(w.drive_briefly());
    // Without one, drive only reports.
    let plain = Work::new("send", 2);
    assert!(!plain.drive(Duration::from_millis(1)));
    plain.finish(Ok(()));
    assert!(plain.drive(Duration::ZERO));
}

#[test]
fn join_reports_first_error() {
    let a = Work::new("send", 1);
    let b = Work::new("recv", 2);
    let j = join("batch", 0, vec![a.clone(), b.clone()]);
    a.finish(Err(Error::Internal("boom".into())));
    assert!(!j.is_completed());
    b.finish(Ok(()));
    assert!(j.wait(None).unwrap_err().to_string().contains("boom"));
    assert!(join("empty", 0, vec![]).wait(None).is_ok());
}
