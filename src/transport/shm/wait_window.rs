//! How long a rank's waiting thread polls for its local peers (yielding
//! its core between looks) before it sleeps on its futex word: a window
//! that adapts to how long the waits last.
//!
//! A sleeper costs its waker a futex wake-up, and on a VM a wake-up that
//! must start a halted virtual CPU is slow. Where every rank waits a
//! little longer than the window, every rank sleeps in every phase, every
//! phase then costs a wake-up, and the ranks stay that far apart: a
//! convoy that lasts as long as the loop. A long window for every wait
//! would keep a rank that waits for a slower peer (one still computing)
//! on its core for nothing, so the window grows only after a wait that
//! slept and still ended soon, to a little more than that wait took (at
//! most [`MAX`]), and shrinks back after waits longer than `MAX`.
//!
//! Only ranks of one thread adapt it (a rank per core, as
//! `torchrun --nproc_per_node=$(nproc)` gives), where the local ranks have
//! a core each. Where they outnumber the cores a rank polling holds a core
//! a peer needs; ranks with worker threads (and a quick team that spins)
//! keep [`MIN`]: their waits showed no convoy, and a growing window took
//! cores their threads needed. The measurements behind both rules:
//! `docs/decisions/0004`.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The window to start with, and the least it shrinks to (the fixed
/// window before it adapted).
pub const MIN: Duration = Duration::from_micros(60);

/// The most it grows to.
pub const MAX: Duration = Duration::from_micros(500);

/// A waiting thread's polling window (one per communicator's transport).
#[derive(Debug, Clone, Copy)]
pub struct WaitWindow {
    now: Duration,
    min: Duration,
    max: Duration,
}

impl WaitWindow {
    /// `fixed`: the window set by hand (`RUSTCCL_SHM_WAIT_SPIN_US`), else
    /// adaptive between [`MIN`] and [`MAX`] where the `local_ranks` have
    /// one thread each (`threads`) and a core each (`cores`), [`MIN`]
    /// elsewhere.
    pub fn new(fixed: Option<Duration>, local_ranks: usize, threads: usize, cores: usize) -> WaitWindow {
        let (min, max) = match fixed {
            Some(d) => (d, d),
            None if threads == 1 && local_ranks <= cores => (MIN, MAX),
            None => (MIN, MIN),
        };
        WaitWindow { now: min, min, max }
    }

    /// How long to poll before sleeping.
    pub fn get(&self) -> Duration {
        self.now
    }

    /// The least it shrinks to.
    pub fn least(&self) -> Duration {
        self.min
    }

    /// The most the window grows to.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// A wait that outlasted the window and slept ended after `waited`
    /// in all: a window a quarter longer would have spared that sleep,
    /// if the window may grow so far; else the wait was for a peer that
    /// is busy elsewhere, and the window halves.
    pub fn slept(&mut self, waited: Duration) {
        self.now = if waited <= self.max { (self.now * 2).max(waited + waited / 4).min(self.max) } else { (self.now / 2).max(self.min) };
    }
}

/// How long a wait spins on its core, without yielding, before the window's
/// polling begins (not while the cores are taken): a peer that publishes
/// within it is seen at once, where a yield (a system call, and on a VM
/// often longer) would see it only after the call returns, and a peer
/// waiting in turn for this rank's next publish would wait that long too.
pub const SPIN: Duration = Duration::from_micros(3);

/// A pause (a yield of the core between two looks) that took longer than
/// this ran another task on the core.
pub const TAKEN_AFTER: Duration = Duration::from_micros(40);

/// So many such pauses in a row (no quick one between them) mean that
/// the host's cores are taken; one alone may be a hypervisor's or a
/// short-lived task's.
pub const TAKEN_IN_A_ROW: u32 = 3;

/// How long waits sleep at once once the cores are found taken, before
/// one polls (and so looks) again; while pauses stay long, that look
/// finds them taken again at once.
pub const TAKEN_FOR: Duration = Duration::from_millis(200);

/// Whether the host's cores are taken by other work (a training job's
/// compute threads, other processes), as the pauses of this process's
/// polling threads find. A polling thread then sleeps at once: where
/// every core is busy, a thread that yields its core between looks gets
/// it back only after another task's time slice, while a sleeper is woken
/// by its peer's publish; and its polls would take the cores' time from
/// that work.
#[derive(Debug)]
pub struct Contention {
    epoch: Instant,
    /// Nanoseconds after `epoch` until which waits sleep at once.
    until: AtomicU64,
    /// Long pauses since the last quick one.
    long_in_a_row: AtomicU32,
}

impl Default for Contention {
    fn default() -> Contention {
        Contention { epoch: Instant::now(), until: AtomicU64::new(0), long_in_a_row: AtomicU32::new(0) }
    }
}

impl Contention {
    /// A pause that began at `started` just ended.
    pub fn paused(&self, started: Instant) {
        let now = Instant::now();
        if now.duration_since(started) <= TAKEN_AFTER {
            self.long_in_a_row.store(0, Ordering::Relaxed);
            return;
        }
        if self.long_in_a_row.fetch_add(1, Ordering::Relaxed) + 1 >= TAKEN_IN_A_ROW {
            let until = (now + TAKEN_FOR).duration_since(self.epoch).as_nanos() as u64;
            self.until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// True while waits should sleep at once rather than poll.
    pub fn cores_taken(&self) -> bool {
        let until = self.until.load(Ordering::Relaxed);
        until != 0 && (self.epoch.elapsed().as_nanos() as u64) < until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: fn(u64) -> Duration = Duration::from_micros;

    #[test]
    fn grows_past_short_waits_that_slept_and_shrinks_after_long_ones() {
        let mut w = WaitWindow::new(None, 16, 1, 16);
        assert_eq!(w.get(), MIN);
        w.slept(US(150));
        assert_eq!(w.get(), US(187) + Duration::from_nanos(500));
        w.slept(US(200));
        assert_eq!(w.get(), US(375));
        w.slept(US(450));
        assert_eq!(w.get(), MAX);
        w.slept(US(5000));
        assert_eq!(w.get(), US(250));
        for _ in 0..10 {
            w.slept(US(5000));
        }
        assert_eq!(w.get(), MIN);
    }

    #[test]
    fn long_pauses_in_a_row_mean_taken_cores_for_a_while() {
        let c = Contention::default();
        let long = || Instant::now() - 2 * TAKEN_AFTER;
        c.paused(Instant::now());
        c.paused(long());
        c.paused(long());
        c.paused(Instant::now());
        c.paused(long());
        assert!(!c.cores_taken(), "a quick pause between long ones");
        c.paused(long());
        c.paused(long());
        assert!(c.cores_taken());
        let c =
            Contention { epoch: Instant::now() - 2 * TAKEN_FOR, until: AtomicU64::new(TAKEN_FOR.as_nanos() as u64), ..Default::default() };
        assert!(!c.cores_taken(), "over after TAKEN_FOR");
        // still long at the next look: taken again at once
        c.long_in_a_row.store(TAKEN_IN_A_ROW, Ordering::Relaxed);
        c.paused(long());
        assert!(c.cores_taken());
    }

    #[test]
    fn stays_put_when_set_or_for_ranks_with_threads_or_without_a_core_each() {
        let mut w = WaitWindow::new(Some(US(300)), 16, 1, 16);
        w.slept(US(100));
        w.slept(US(9000));
        assert_eq!((w.get(), w.least(), w.max()), (US(300), US(300), US(300)));
        for (ranks, threads, cores) in [(9, 1, 2), (4, 4, 16)] {
            let mut w = WaitWindow::new(None, ranks, threads, cores);
            w.slept(US(100));
            assert_eq!((w.get(), w.max()), (MIN, MIN), "{ranks} ranks of {threads} threads on {cores} cores");
        }
    }
}
