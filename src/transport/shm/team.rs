//! A rank's team of helper threads for its shared-memory copies and
//! reductions where the host has cores to spare (`tuning::shm`; else
//! the workers use rayon's pool): the calling thread and up to `helpers`
//! threads run one job (a closure that takes pieces of work from a shared
//! counter, `Workers`), and the call returns once the caller's own run of
//! it has returned (no piece left to take) and every helper that joined
//! has finished its run. Once the caller's run returns the job is closed:
//! a helper that had not joined yet (still waking up, or its core taken
//! by the hypervisor) does not join, and nobody waits for it, so one
//! helper slow to wake cannot hold up a phase whose work is done.
//!
//! Idle helpers spin on the team's state word for `spin` before they
//! sleep (park), and the caller spins while it waits for the last of them.
//! On a VM, waking a sleeping thread costs as much as copying a few
//! hundred KiB (the hypervisor delivers the wake-up interrupt). A pool
//! whose threads fall asleep between rounds, with a caller that sleeps on
//! a latch for the helpers' last piece (rayon's, used before), spent most
//! of each small round waking threads (`examples/wake_probe.rs`,
//! `docs/decisions/0004`).
//!
//! One job at a time: a call made while another thread's job runs (the
//! point-to-point engine's staging copies beside a collective) runs its
//! job on its own thread alone, as a job does that calls the team again.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

type Job = &'static (dyn Fn() + Sync);

/// How many looks a spinning thread takes between reads of the clock; it
/// yields there too, so that a thread of another rank that needs this
/// core (more threads than cores) gets it within microseconds.
const LOOKS_PER_CLOCK: u32 = 64;
/// Yields of a waiting thread after its spin, before it sleeps (as
/// rayon's idle threads do): with no spin, the only wait before sleeping,
/// which gives the core away to any other thread that wants it.
const YIELDS: u32 = 32;

struct Shared {
    /// `generation << 16 | helpers wanted`, bumped for every job: helper
    /// `i` runs the job of a new generation when `i` < wanted. On a cache
    /// line of its own: idle helpers spin reading it, and writes to the
    /// fields beside it (`done` as each helper finishes) would take the
    /// line from all of them.
    state: CachePadded<AtomicU64>,
    /// The job of the current generation, while its call runs.
    job: Mutex<Option<Job>>,
    /// Helpers running the current generation's job (the caller, once its
    /// own run has returned, waits until none is).
    active: CachePadded<AtomicUsize>,
    /// The thread waiting for them (unparked by the last one).
    caller: Mutex<Option<Thread>>,
    panicked: AtomicBool,
    stop: AtomicBool,
    spin: Duration,
}

fn generation(state: u64) -> u64 {
    state >> 16
}

fn wanted(state: u64) -> usize {
    (state & 0xffff) as usize
}

pub struct Team {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    busy: Mutex<()>,
}

impl Team {
    /// `helpers` threads named `{name}-{i}` that spin `spin` when idle.
    pub fn new(helpers: usize, name: &str, spin: Duration) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            state: CachePadded::new(AtomicU64::new(0)),
            job: Mutex::new(None),
            active: CachePadded::new(AtomicUsize::new(0)),
            caller: Mutex::new(None),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            spin,
        });
        let mut handles = Vec::with_capacity(helpers);
        for i in 0..helpers.min(0xffff) {
            let s = shared.clone();
            match thread::Builder::new().name(format!("{name}-{i}")).spawn(move || helper(&s, i)) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    stop_all(&shared, &mut handles);
                    return Err(e);
                }
            }
        }
        Ok(Team { shared, handles, busy: Mutex::new(()) })
    }

    /// Runs `job` on this thread and on up to `helpers` of the team's
    /// threads (at most all of them): those that join before this
    /// thread's own run of it returns. Returns when that run has returned
    /// and every helper that joined is done; a panic in any of them is
    /// raised here then. `job` must take its work from a shared source
    /// until none is left (any run may do all of it, or none).
    pub fn run(&self, helpers: usize, job: &(dyn Fn() + Sync)) {
        self.run_beside(helpers, job, job, self.shared.spin);
    }

    /// As [`Team::run`], but this thread runs `mine` instead of `job`:
    /// something that takes `job`'s work itself until none is left (the
    /// job run on another team: `Workers`' phases led by the quick team),
    /// and once it has returned, waits for the helpers that joined,
    /// spinning `wait_spin` before it sleeps (they are in their last
    /// piece). Where the team is busy or no helper is wanted, `mine` alone.
    pub fn run_beside(&self, helpers: usize, job: &(dyn Fn() + Sync), mine: &dyn Fn(), wait_spin: Duration) {
        let k = helpers.min(self.handles.len());
        let _busy = match self.busy.try_lock() {
            Ok(g) if k > 0 => g,
            Err(TryLockError::Poisoned(p)) if k > 0 => p.into_inner(),
            _ => return mine(),
        };
        let s = &*self.shared;
        // SAFETY: the 'static reference lives only in `s.job`, which a
        // helper reads only after joining (counted in `active`, with the
        // job still open) and uses until it leaves; `AllDone` does not let
        // this function return or unwind before it has closed the job and
        // no joined helper is left, and then empties the slot.
        let erased: Job = unsafe { std::mem::transmute::<&(dyn Fn() + Sync), Job>(job) };
        *lock(&s.job) = Some(erased);
        *lock(&s.caller) = Some(thread::current());
        let next = (generation(s.state.load(Ordering::Relaxed)) + 1) << 16 | k as u64;
        s.state.store(next, Ordering::SeqCst);
        for h in &self.handles[..k] {
            h.thread().unpark();
        }
        let all_done = AllDone { shared: s, open: next, spin: wait_spin };
        mine();
        drop(all_done);
        if s.panicked.swap(false, Ordering::AcqRel) {
            resume_unwind(Box::new("a rustccl shared-memory worker thread panicked"));
        }
    }

    /// How long idle helpers spin before they sleep.
    pub fn spin(&self) -> Duration {
        self.shared.spin
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        stop_all(&self.shared, &mut self.handles);
    }
}

fn stop_all(shared: &Shared, handles: &mut Vec<JoinHandle<()>>) {
    shared.stop.store(true, Ordering::Release);
    shared.state.fetch_add(1 << 16, Ordering::AcqRel);
    for h in handles.drain(..) {
        h.thread().unpark();
        let _ = h.join();
    }
}

/// On drop (so also while the caller's own run unwinds): closes the job
/// (`open`'s generation with no helper wanted: later ones do not join),
/// waits until the helpers that joined are done, then empties the slot.
struct AllDone<'a> {
    shared: &'a Shared,
    open: u64,
    /// How long to spin for the joined helpers before sleeping.
    spin: Duration,
}

impl Drop for AllDone<'_> {
    fn drop(&mut self) {
        let s = self.shared;
        // SeqCst with the helpers' join (`active` up, then the state read):
        // either a helper sees the job closed, or this thread sees it joined.
        s.state.store(self.open & !0xffff, Ordering::SeqCst);
        wait_until(self.spin, Some(Duration::from_millis(1)), || s.active.load(Ordering::SeqCst) == 0);
        *lock(&s.job) = None;
        *lock(&s.caller) = None;
    }
}

/// Waits until `ready`: spins (a yield every [`LOOKS_PER_CLOCK`] looks)
/// for `spin`, then yields [`YIELDS`] times, then parks between looks
/// (whoever makes it ready unparks this thread; `nap`: at most so long).
fn wait_until(spin: Duration, nap: Option<Duration>, ready: impl Fn() -> bool) {
    if !spin.is_zero() {
        let t0 = Instant::now();
        let mut looks = 0u32;
        loop {
            if ready() {
                return;
            }
            looks = looks.wrapping_add(1);
            if looks % LOOKS_PER_CLOCK != 0 {
                std::hint::spin_loop();
            } else if t0.elapsed() < spin {
                thread::yield_now();
            } else {
                break;
            }
        }
    }
    for _ in 0..YIELDS {
        if ready() {
            return;
        }
        thread::yield_now();
    }
    while !ready() {
        match nap {
            Some(d) => thread::park_timeout(d),
            None => thread::park(),
        }
    }
}

fn helper(s: &Shared, i: usize) {
    // Generation 0 has no job; a thread that starts after the first call
    // finds that call's generation and runs its job.
    let mut seen = 0;
    loop {
        wait_until(s.spin, None, || generation(s.state.load(Ordering::Acquire)) != seen || s.stop.load(Ordering::Acquire));
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let state = s.state.load(Ordering::Acquire);
        seen = generation(state);
        if i >= wanted(state) {
            continue;
        }
        // Join, then check that the job is still open (see `AllDone`).
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.state.load(Ordering::SeqCst) == state {
            let job = *lock(&s.job);
            if let Some(job) = job {
                if catch_unwind(AssertUnwindSafe(job)).is_err() {
                    s.panicked.store(true, Ordering::Release);
                }
            }
        }
        if s.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            if let Some(t) = lock(&s.caller).as_ref() {
                t.unpark();
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Runs a job that keeps the team open until `expect` threads have
    /// joined (at most 5 s): the threads that ran it, each once.
    fn run_counting(team: &Team, helpers: usize, expect: usize) -> HashSet<thread::ThreadId> {
        let seen = Mutex::new(HashSet::new());
        let runs = AtomicUsize::new(0);
        team.run(helpers, &|| {
            assert!(seen.lock().unwrap().insert(thread::current().id()), "a thread ran the job twice");
            runs.fetch_add(1, Ordering::SeqCst);
            let t0 = Instant::now();
            while runs.load(Ordering::SeqCst) < expect && t0.elapsed() < Duration::from_secs(5) {
                thread::yield_now();
            }
        });
        seen.into_inner().unwrap()
    }

    #[test]
    fn a_job_runs_once_on_the_caller_and_each_wanted_helper() {
        for spin in [Duration::ZERO, Duration::from_micros(200)] {
            let team = Team::new(3, "test", spin).unwrap();
            for round in 0..50 {
                let k = round % 5;
                let seen = run_counting(&team, k, 1 + k.min(3));
                assert_eq!(seen.len(), 1 + k.min(3), "round {round}");
                assert!(seen.contains(&thread::current().id()));
            }
        }
    }

    #[test]
    fn no_helper_runs_a_job_after_its_call_returned() {
        // Jobs that finish at once: helpers still waking up (no spin) or
        // late are not waited for, and must not join a closed job.
        for spin in [Duration::ZERO, Duration::from_micros(50)] {
            let team = Team::new(3, "test", spin).unwrap();
            let late = AtomicUsize::new(0);
            let (mut by_helpers, mut alone) = (0, 0);
            for _ in 0..2000 {
                let closed = AtomicBool::new(false);
                let runs = AtomicUsize::new(0);
                let next = AtomicUsize::new(0);
                team.run(3, &|| {
                    if closed.load(Ordering::SeqCst) {
                        late.fetch_add(1, Ordering::SeqCst);
                    }
                    runs.fetch_add(1, Ordering::SeqCst);
                    // 8 pieces of a few microseconds each
                    while next.fetch_add(1, Ordering::SeqCst) < 8 {
                        let t0 = Instant::now();
                        while t0.elapsed() < Duration::from_micros(3) {
                            std::hint::spin_loop();
                        }
                    }
                });
                closed.store(true, Ordering::SeqCst);
                let r = runs.load(Ordering::SeqCst);
                if r == 1 {
                    alone += 1
                } else {
                    by_helpers += 1
                }
                assert!((1..=4).contains(&r), "{r} runs");
            }
            assert_eq!(late.load(Ordering::SeqCst), 0, "a helper ran a job after its call returned");
            eprintln!("spin {spin:?}: {alone} calls ran on the caller alone, {by_helpers} with helpers");
        }
    }

    #[test]
    fn the_job_may_borrow_the_callers_stack() {
        let team = Team::new(2, "test", Duration::from_micros(50)).unwrap();
        let mut data = vec![0u64; 3];
        for _ in 0..100 {
            let cells: Vec<AtomicU64> = data.iter().map(|&v| AtomicU64::new(v)).collect();
            let next = AtomicUsize::new(0);
            team.run(2, &|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cells.get(i) else { break };
                c.fetch_add(1, Ordering::Relaxed);
            });
            data = cells.into_iter().map(|c| c.into_inner()).collect();
        }
        assert_eq!(data, vec![100, 100, 100]);
    }

    #[test]
    fn a_job_run_beside_another_team_shares_its_work_and_closes_with_it() {
        // The helpers of `workers` join a job that `lead` runs; none runs
        // it after the call returned, every piece runs once.
        for spin in [Duration::ZERO, Duration::from_micros(50)] {
            let (workers, lead) = (Team::new(3, "tw", spin).unwrap(), Team::new(1, "tl", Duration::from_micros(200)).unwrap());
            let late = AtomicUsize::new(0);
            let mut workers_joined = 0;
            for round in 0..500 {
                let closed = AtomicBool::new(false);
                let next = AtomicUsize::new(0);
                let done = AtomicUsize::new(0);
                let who = Mutex::new(HashSet::new());
                let pieces = if round % 2 == 0 { 4 } else { 64 };
                let job = || {
                    if closed.load(Ordering::SeqCst) {
                        late.fetch_add(1, Ordering::SeqCst);
                    }
                    who.lock().unwrap().insert(thread::current().name().unwrap_or("").to_string());
                    while next.fetch_add(1, Ordering::SeqCst) < pieces {
                        let t0 = Instant::now();
                        while t0.elapsed() < Duration::from_micros(20) {
                            std::hint::spin_loop();
                        }
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                };
                workers.run_beside(3, &job, &|| lead.run(1, &job), Duration::from_micros(100));
                closed.store(true, Ordering::SeqCst);
                assert_eq!(done.load(Ordering::SeqCst), pieces);
                workers_joined += who.into_inner().unwrap().iter().any(|n| n.starts_with("tw")) as usize;
            }
            assert_eq!(late.load(Ordering::SeqCst), 0, "a helper ran a job after its call returned");
            assert!(workers_joined > 0, "no worker ever joined (spin {spin:?})");
        }
    }

    #[test]
    fn a_helpers_panic_reaches_the_caller_after_all_are_done_and_the_team_goes_on() {
        let team = Team::new(2, "test", Duration::ZERO).unwrap();
        let finished = AtomicUsize::new(0);
        let joined = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.run(2, &|| {
                joined.fetch_add(1, Ordering::SeqCst);
                let t0 = Instant::now();
                while joined.load(Ordering::SeqCst) < 3 && t0.elapsed() < Duration::from_secs(5) {
                    thread::yield_now();
                }
                if thread::current().name() == Some("test-1") {
                    panic!("boom");
                }
                thread::sleep(Duration::from_millis(5));
                finished.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(r.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 2);
        assert_eq!(run_counting(&team, 2, 3).len(), 3);
    }

    #[test]
    fn a_call_while_the_team_is_busy_runs_on_its_own_thread() {
        let team = Team::new(2, "test", Duration::from_micros(100)).unwrap();
        let inner = Mutex::new(None);
        team.run(1, &|| {
            if thread::current().name() != Some("test-0") {
                *inner.lock().unwrap() = Some(run_counting(&team, 2, 1));
            }
        });
        assert_eq!(inner.into_inner().unwrap().unwrap().len(), 1);
    }
}
