//! Keeping this rank's polling thread off the CPU another rank's polls on.
//!
//! rustccl's waits poll, yielding between looks, for tens of microseconds
//! before they sleep. Two ranks' polling threads on one CPU take turns
//! only when the scheduler lets them: on EEVDF (Linux 6.6 on) a thread
//! that yields keeps its CPU until the other one is eligible to run, so a
//! message that has arrived waits a scheduler slice to be seen (and
//! sleeping on the futex word instead is slower still).
//! The scheduler puts them together (a woken thread goes near its waker)
//! and does not separate two threads that both poll within a few
//! milliseconds; gloo's rounds between rustccl's in the A/B benchmark left
//! them together nearly every time
//! (`docs/decisions/0004`).
//!
//! So each rank publishes, in its segment, the CPU its polling thread was
//! last seen on and when ([`Segment::poller`]). A thread that polls and has
//! found, for [`TOGETHER_FOR`], a fresh word of a rank with a smaller local
//! index naming its own CPU moves to an allowed CPU on which no local rank
//! polls: it narrows its affinity to that CPU and puts back the mask it
//! had at once (the kernel migrates a running thread before the first
//! call returns; the second leaves it where it is). The user's mask is
//! kept: a thread allowed on one CPU never moves, nor one whose every
//! allowed CPU has a poller; at most one move per [`MOVE_EVERY`] per thread.
//! `RUSTCCL_SHM_KEEP_APART=0` turns it off.
//!
//! Only threads waiting for their own operations look (`ShmLocal::pause`:
//! a thread driving a point-to-point work, a collective's waits), not the
//! point-to-point engine's thread: where it moved too, it chased the
//! waiting threads, and small ping-pongs got slower than without any
//! moves (`docs/decisions/0004`).
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::Pid;

use super::Segment;

/// A poller word names the CPU in its low 16 bits (+1; 0: none) and the
/// time of the look above them, in ticks of 2^14 ns (16 us).
const TICK_SHIFT: u32 = 14;
/// A word older than this many ticks (~260 us) is stale: that thread has
/// stopped polling. A thread kept off its CPU by another's polling last
/// wrote its word when it last ran, tens of microseconds before.
const FRESH_TICKS: u64 = 16;
/// How long two threads must have been seen on one CPU before one moves
/// (a wait that ends sooner costs no more than the move would).
pub const TOGETHER_FOR: Duration = Duration::from_micros(15);
/// The least time between two moves of one thread.
pub const MOVE_EVERY: Duration = Duration::from_millis(2);

#[derive(Clone, Copy)]
struct Seen {
    /// Since when this thread has found a peer's poller on its CPU.
    together_since: Option<Instant>,
    last_move: Option<Instant>,
    /// The thread's mask allows no other CPU (checked at its first move).
    stuck: bool,
}

/// Moves made by this process's threads.
static MOVES: AtomicU64 = AtomicU64::new(0);

/// How many times this process's waiting threads moved off a CPU another
/// local rank's polling thread shared (`stats()["thread_moves"]`).
pub fn moves() -> u64 {
    MOVES.load(Ordering::Relaxed)
}

thread_local! {
    static SEEN: Cell<Seen> = const { Cell::new(Seen { together_since: None, last_move: None, stuck: false }) };
}

fn now_ticks() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| ((t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64) >> TICK_SHIFT)
}

/// The CPU a fresh word names (None for a stale or empty word).
fn fresh_cpu(word: u64, now: u64) -> Option<usize> {
    let cpu = (word & 0xffff) as usize;
    (cpu != 0 && now.saturating_sub(word >> 16) <= FRESH_TICKS).then(|| cpu - 1)
}

/// One look of a polling thread of local rank `me` (`segs`: every local
/// rank's segment): publishes where it runs and, if it has shared its CPU
/// with a lower-ranked poller for long enough, moves. True when it moved.
pub fn look(segs: &[std::sync::Arc<Segment>], me: usize) -> bool {
    // (a CPU number that does not fit the word's 16 bits: no looks)
    let Some(cpu) = sched_getcpu().ok().filter(|&c| c < 0xffff) else { return false };
    let now = now_ticks();
    let word = (now << 16) | (cpu as u64 + 1);
    let mine = segs[me].poller();
    if mine.load(Ordering::Relaxed) != word {
        mine.store(word, Ordering::Relaxed);
    }
    let together = segs[..me].iter().any(|s| fresh_cpu(s.poller().load(Ordering::Relaxed), now) == Some(cpu));
    SEEN.with(|c| {
        let mut s = c.get();
        let moved = together && decide(&mut s, Instant::now()) && move_off(cpu, segs, now, &mut s);
        if !together {
            s.together_since = None;
        }
        c.set(s);
        moved
    })
}

/// Whether a thread that shares its CPU now should move (and notes when
/// that began).
fn decide(s: &mut Seen, now: Instant) -> bool {
    if s.stuck {
        return false;
    }
    let since = *s.together_since.get_or_insert(now);
    now.duration_since(since) >= TOGETHER_FOR && s.last_move.is_none_or(|t| now.duration_since(t) >= MOVE_EVERY)
}

/// Moves the calling thread off `cpu` to an allowed CPU no local rank's
/// fresh poller word names (the next one up, wrapping), keeping its mask.
fn move_off(cpu: usize, segs: &[std::sync::Arc<Segment>], now: u64, s: &mut Seen) -> bool {
    s.last_move = Some(Instant::now());
    s.together_since = None;
    let me = Pid::from_raw(0);
    let Ok(mask) = sched_getaffinity(me) else { return false };
    let allowed = |c: usize| mask.is_set(c).unwrap_or(false);
    let n = CpuSet::count();
    if (0..n).filter(|&c| allowed(c)).nth(1).is_none() {
        s.stuck = true;
        return false;
    }
    let busy: Vec<usize> = segs.iter().filter_map(|s| fresh_cpu(s.poller().load(Ordering::Relaxed), now)).collect();
    let Some(to) = (1..n).map(|d| (cpu + d) % n).find(|&c| allowed(c) && !busy.contains(&c)) else { return false };
    let mut one = CpuSet::new();
    if one.set(to).is_err() || sched_setaffinity(me, &one).is_err() {
        return false;
    }
    // Back to the user's mask; the thread stays on `to`. Should this fail
    // the thread would stay pinned, so it is retried once.
    if sched_setaffinity(me, &mask).is_err() {
        let _ = sched_setaffinity(me, &mask);
    }
    MOVES.fetch_add(1, Ordering::Relaxed);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::Layout;
    use std::path::PathBuf;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn segments(n: usize, tag: &str) -> Vec<Arc<Segment>> {
        (0..n)
            .map(|i| {
                let path = PathBuf::from(format!("/dev/shm/rustccl-place-test-{}-{tag}-{i}", std::process::id()));
                let seg = Segment::create(&path, Layout::new(n, 4096, 256, 256)).unwrap();
                seg.unlink();
                Arc::new(seg)
            })
            .collect()
    }

    fn only(cpu: usize) -> CpuSet {
        let mut one = CpuSet::new();
        one.set(cpu).unwrap();
        one
    }

    fn cpus(mask: &CpuSet) -> Vec<usize> {
        (0..CpuSet::count()).filter(|&c| mask.is_set(c).unwrap()).collect()
    }

    /// Local rank 0's poller stays on CPU `c` (pinned there) until `stop`.
    fn poll_on(c: usize, segs: Vec<Arc<Segment>>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            sched_setaffinity(Pid::from_raw(0), &only(c)).unwrap();
            while !stop.load(Ordering::Relaxed) {
                look(&segs, 0);
                std::thread::yield_now();
            }
        })
    }

    #[test]
    fn a_poller_on_a_lower_ranks_cpu_moves_off_it_and_keeps_its_mask() {
        let all = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let allowed = cpus(&all);
        if allowed.len() < 2 {
            eprintln!("one CPU allowed: nothing to move to, not tested");
            return;
        }
        let c = allowed[0];
        let segs = segments(2, "move");
        let stop = Arc::new(AtomicBool::new(false));
        let a = poll_on(c, segs.clone(), stop.clone());
        let b = std::thread::spawn(move || {
            let me = Pid::from_raw(0);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if sched_getcpu().unwrap() != c {
                    // onto rank 0's CPU, with the whole mask back (the
                    // scheduler may also have separated them meanwhile)
                    sched_setaffinity(me, &only(c)).unwrap();
                    sched_setaffinity(me, &all).unwrap();
                }
                if look(&segs, 1) {
                    return (true, sched_getcpu().unwrap(), cpus(&sched_getaffinity(me).unwrap()));
                }
                std::thread::yield_now();
            }
            (false, c, vec![])
        });
        let (moved, now_on, mask) = b.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        a.join().unwrap();
        assert!(moved, "local rank 1 shared CPU {c} with rank 0's poller for 5 s and never moved");
        assert_ne!(now_on, c, "moved off CPU {c}");
        assert_eq!(mask, allowed, "the thread's mask is the one it had");
    }

    #[test]
    fn lower_ranks_and_pinned_threads_stay() {
        let allowed = cpus(&sched_getaffinity(Pid::from_raw(0)).unwrap());
        let c = allowed[0];
        let segs = segments(2, "stay");
        let stop = Arc::new(AtomicBool::new(false));
        let a = poll_on(c, segs.clone(), stop.clone());
        let (s1, s0) = (segs.clone(), segs.clone());
        // rank 1 pinned to the same CPU: nowhere to go
        let pinned = std::thread::spawn(move || {
            sched_setaffinity(Pid::from_raw(0), &only(c)).unwrap();
            let t0 = Instant::now();
            let mut moved = false;
            while t0.elapsed() < Duration::from_millis(100) {
                moved |= look(&s1, 1);
                std::thread::yield_now();
            }
            (moved, cpus(&sched_getaffinity(Pid::from_raw(0)).unwrap()))
        });
        let (moved, mask) = pinned.join().unwrap();
        assert!(!moved && mask == vec![c], "a thread allowed on one CPU stays: moved {moved}, mask {mask:?}");
        // rank 0 seeing rank 1 on its CPU does not move (the higher one does)
        s0[1].poller().store((now_ticks() << 16) | (c as u64 + 1), Ordering::Relaxed);
        let low = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut moved = false;
            while t0.elapsed() < Duration::from_millis(50) {
                s0[1].poller().store((now_ticks() << 16) | (sched_getcpu().unwrap() as u64 + 1), Ordering::Relaxed);
                moved |= look(&s0, 0);
                std::thread::yield_now();
            }
            moved
        });
        assert!(!low.join().unwrap(), "local rank 0 never moves for rank 1");
        stop.store(true, Ordering::Relaxed);
        a.join().unwrap();
    }

    #[test]
    fn words_go_stale() {
        let w = (1000u64 << 16) | 4;
        assert_eq!(fresh_cpu(w, 1000), Some(3));
        assert_eq!(fresh_cpu(w, 1000 + FRESH_TICKS), Some(3));
        assert_eq!(fresh_cpu(w, 1001 + FRESH_TICKS), None);
        assert_eq!(fresh_cpu(1000 << 16, 1000), None, "cpu 0 means nobody");
    }

    #[test]
    fn moves_only_after_a_while_and_not_too_often() {
        let t0 = Instant::now();
        let mut s = Seen { together_since: None, last_move: None, stuck: false };
        assert!(!decide(&mut s, t0));
        assert!(decide(&mut s, t0 + TOGETHER_FOR));
        s.last_move = Some(t0 + TOGETHER_FOR);
        s.together_since = Some(t0);
        assert!(!decide(&mut s, t0 + TOGETHER_FOR + MOVE_EVERY / 2));
        assert!(decide(&mut s, t0 + TOGETHER_FOR + MOVE_EVERY));
        s.stuck = true;
        assert!(!decide(&mut s, t0 + TOGETHER_FOR * 100 + MOVE_EVERY));
    }
}
