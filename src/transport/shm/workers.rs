//! Threads that split one rank's memory work (copies into and out of
//! shared memory, reductions) in the direct algorithms, so that a rank on a
//! many-core host is not limited to one core's memory bandwidth.
#![forbid(unsafe_code)]

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::team::Team;
use super::wait_window::Contention;

/// The threads beside the caller's.
#[derive(Clone)]
enum Pool {
    /// Spinning when idle, where the host has cores to spare.
    Team(Arc<Team>),
    /// Sleeping soon when idle: on a host whose cores are all taken, a
    /// spinning team takes the cores the ranks need, and a team that
    /// yields and sleeps did worse than rayon (`docs/decisions/0004`).
    Rayon(Arc<rayon::ThreadPool>),
}

pub struct Workers {
    pool: Option<Pool>,
    /// A small spinning team for phases of at most `max_bytes`, beside a
    /// pool whose threads sleep when idle (`Workers::add_quick`).
    quick: Option<Quick>,
    threads: usize,
    min_piece: usize,
    spin: Duration,
    /// Where the host's cores are found taken (`WaitWindow`'s
    /// `Contention`), phases run on the calling thread alone.
    contention: Option<Arc<Contention>>,
}

#[derive(Clone)]
struct Quick {
    /// A [`Pool::Team`].
    pool: Pool,
    threads: usize,
    max_bytes: usize,
    /// Smallest piece of a phase the team takes: its threads spin, so a
    /// piece need not pay for a wake-up.
    min_piece: usize,
    /// A larger phase starts on the team at once while the workers wake
    /// and join it (`Workers::add_quick`).
    leads: bool,
}

impl Workers {
    /// `threads` <= 1: everything runs on the caller's thread; otherwise
    /// the caller and `threads - 1` threads named `{name}-{i}`: with a
    /// `spin`, a team whose idle threads spin that long before they sleep
    /// (`team.rs`); without, rayon's pool, whose idle threads look for
    /// work a few dozen times, yielding, and sleep. Pieces are at least
    /// `min_piece` bytes (a quick team's own, where it takes them:
    /// [`Workers::add_quick`]).
    pub fn new(threads: usize, name: &str, min_piece: usize, spin: Duration) -> io::Result<Workers> {
        let pool = match threads {
            0 | 1 => None,
            _ if spin.is_zero() => Some(Pool::Rayon(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads - 1)
                    .thread_name({
                        let name = name.to_string();
                        move |i| format!("{name}-{i}")
                    })
                    .build()
                    .map_err(io::Error::other)?,
            ))),
            _ => Some(Pool::Team(Arc::new(Team::new(threads - 1, name, spin)?))),
        };
        Ok(Workers { pool, quick: None, threads: threads.max(1), min_piece: min_piece.max(64), spin, contention: None })
    }

    /// Runs every phase on the calling thread alone while `contention`
    /// says the host's cores are taken: a helper then wakes a scheduler
    /// slice late, or is descheduled holding a piece the phase waits for,
    /// while the caller alone only copies at one core's speed.
    pub fn alone_when_taken(mut self, contention: Arc<Contention>) -> Workers {
        self.contention = Some(contention);
        self
    }

    /// Gives these workers a quick team of `threads` threads (the
    /// caller's included; none below 2) that spin `spin` when idle and run
    /// every phase of at most `threads` x `bytes_per_thread` bytes, cut
    /// into pieces of at least `min_piece` (and 64 bytes): where
    /// the workers' own threads sleep when idle, waking them costs tens of
    /// microseconds a phase on a VM, more than a few spinning threads need
    /// for such a phase (`tuning::shm`). With `leads`, a
    /// larger phase starts on the team at once while the workers wake, and
    /// those that woke before its last piece was taken join it; it ends
    /// without waiting for the others (the workers then run as a
    /// [`Team`] that does not spin, instead of rayon's pool, whose scope
    /// waits for every thread it asked for). On an error (no threads to
    /// be had) the workers stay as they were.
    pub fn add_quick(
        &mut self,
        threads: usize,
        name: &str,
        spin: Duration,
        bytes_per_thread: usize,
        min_piece: usize,
        leads: bool,
    ) -> io::Result<()> {
        if threads >= 2 {
            let pool = Pool::Team(Arc::new(Team::new(threads - 1, &format!("{name}-q"), spin)?));
            if leads && matches!(self.pool, Some(Pool::Rayon(_))) {
                self.pool = Some(Pool::Team(Arc::new(Team::new(self.threads - 1, name, self.spin)?)));
            }
            self.quick =
                Some(Quick { pool, threads, max_bytes: threads.saturating_mul(bytes_per_thread), min_piece: min_piece.max(64), leads });
        }
        Ok(())
    }

    /// Whether phases too large for the quick team start on it while the
    /// workers wake (`add_quick`'s `leads`).
    pub fn quick_leads(&self) -> bool {
        self.quick.as_ref().is_some_and(|q| q.leads)
    }

    /// The quick team's largest phase and smallest piece (0, 0: no team).
    pub fn quick_limits(&self) -> (usize, usize) {
        self.quick.as_ref().map_or((0, 0), |q| (q.max_bytes, q.min_piece))
    }

    /// The quick team, when it takes a phase of `bytes`.
    fn quick_for(&self, bytes: usize) -> Option<&Quick> {
        self.quick.as_ref().filter(|q| bytes <= q.max_bytes)
    }

    /// Threads of the quick team (0: none).
    pub fn quick_threads(&self) -> usize {
        self.quick.as_ref().map_or(0, |q| q.threads)
    }

    pub fn min_piece(&self) -> usize {
        self.min_piece
    }

    /// How long idle threads spin before they sleep.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// The same threads, splitting work into pieces of at least `min_piece`
    /// (the quick team keeps its own).
    pub fn with_min_piece(&self, min_piece: usize) -> Workers {
        Workers {
            pool: self.pool.clone(),
            quick: self.quick.clone(),
            threads: self.threads,
            min_piece: min_piece.max(64),
            spin: self.spin,
            contention: self.contention.clone(),
        }
    }

    /// The same threads, whose quick team (if any) takes phases of up to
    /// `bytes_per_thread` for each of its threads.
    pub fn with_quick_bytes(&self, bytes_per_thread: usize) -> Workers {
        let quick = self.quick.clone().map(|q| Quick { max_bytes: q.threads.saturating_mul(bytes_per_thread), ..q });
        Workers { quick, ..self.with_min_piece(self.min_piece) }
    }

    /// The same threads for the reductions of `inputs` buffers (at least
    /// 2): a byte of such a phase reads `inputs` bytes, so its pieces may
    /// be that much smaller for the same work, and only a phase that much
    /// smaller runs on the quick team, whose few threads would otherwise
    /// take reductions that read far more than they write
    /// (`docs/decisions/0004`).
    pub fn reducing(&self, inputs: usize) -> Workers {
        let inputs = inputs.max(2);
        let quick = self.quick.clone().map(|q| Quick { max_bytes: q.max_bytes / inputs, min_piece: (q.min_piece / inputs).max(64), ..q });
        Workers { quick, ..self.with_min_piece(self.min_piece / inputs) }
    }

    /// Consecutive pieces of `0..len` (one per thread, at most: the
    /// workers' or, where it would take them, the quick team's).
    pub fn ranges(&self, len: usize) -> Vec<Range<usize>> {
        self.ranges_aligned(len, 1)
    }

    /// As [`Workers::ranges`], with every boundary a multiple of `align`.
    pub fn ranges_aligned(&self, len: usize, align: usize) -> Vec<Range<usize>> {
        let piece = self.aligned_piece(len, align);
        (0..len).step_by(piece).map(|s| s..(s + piece).min(len)).collect()
    }

    /// `buf` cut into the pieces of [`Workers::ranges`]: (offset, piece),
    /// for gathering several buffers' pieces into one parallel phase.
    pub fn pieces_mut<'a>(&self, buf: &'a mut [u8]) -> impl Iterator<Item = (usize, &'a mut [u8])> {
        self.pieces_aligned_mut(buf, 1)
    }

    /// `buf` cut into the pieces of [`Workers::ranges_aligned`].
    pub fn pieces_aligned_mut<'a>(&self, buf: &'a mut [u8], align: usize) -> impl Iterator<Item = (usize, &'a mut [u8])> {
        let piece = self.aligned_piece(buf.len(), align);
        buf.chunks_mut(piece).enumerate().map(move |(i, c)| (i * piece, c))
    }

    /// A piece's size ([`Workers::piece`]) rounded up to a multiple of
    /// `align` (the piece is at least 64 bytes).
    fn aligned_piece(&self, len: usize, align: usize) -> usize {
        let align = align.max(1);
        self.piece(len).div_ceil(align) * align
    }

    /// Calls `f` on every item, in parallel when they hold `bytes` of work
    /// in all and that is at least two pieces: one start of the pool for
    /// a whole phase of an algorithm, none for a phase too small to be
    /// worth it (one item per peer of a few bytes each would otherwise wake
    /// it for nothing).
    /// The pool's threads are all started at once (one job each, not
    /// rayon's chain of splits) and, with the calling thread, take items
    /// from a shared counter until none is left. A phase of at most the
    /// quick team's bytes runs on that team instead. The first error is
    /// returned.
    pub fn for_each<T: Send, E: Send>(&self, items: Vec<T>, bytes: usize, f: impl Fn(T) -> Result<(), E> + Sync + Send) -> Result<(), E> {
        let quick = self.quick_for(bytes);
        let (pool, min_piece) = match quick {
            Some(q) => (Some(&q.pool), q.min_piece),
            None => (self.pool.as_ref(), self.min_piece),
        };
        let pool = match pool {
            Some(t) if items.len() > 1 && bytes >= 2 * min_piece && !self.contention.as_ref().is_some_and(|c| c.cores_taken()) => t,
            _ => return items.into_iter().try_for_each(f),
        };
        let _t = crate::profile::start(crate::profile::Span::PoolRun);
        let n = items.len();
        let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<E>> = Mutex::new(None);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = slots.get(i) else { break };
            let item = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(Err(e)) = item.map(&f) {
                failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        };
        match (pool, self.leader(quick)) {
            // The quick team (this thread one of it) starts at once; the
            // workers, as many as make up the rank's threads, join as
            // they wake.
            (Pool::Team(team), Some((lead, q))) => {
                let helpers = (n - 1).min(self.threads.saturating_sub(q.threads).max(1));
                team.run_beside(helpers, &work, &|| lead.run(q.threads - 1, &work), lead.spin());
            }
            (Pool::Team(team), None) => team.run(n - 1, &work),
            (Pool::Rayon(pool), _) => {
                let helpers = (n - 1).min(pool.current_num_threads());
                pool.in_place_scope(|s| {
                    for _ in 0..helpers {
                        s.spawn(|_| work());
                    }
                    work();
                });
            }
        }
        failed.into_inner().unwrap_or_else(|p| p.into_inner()).map_or(Ok(()), Err)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The quick team that leads a phase the workers take (`quick`: the
    /// team when it takes the phase itself, then none leads).
    fn leader(&self, quick: Option<&Quick>) -> Option<(&Team, &Quick)> {
        match (quick, &self.quick) {
            (None, Some(q @ Quick { pool: Pool::Team(t), leads: true, .. })) => Some((&**t, q)),
            _ => None,
        }
    }

    /// Piece length for `len` bytes: one per thread, whole cache lines,
    /// at least `min_piece` (so small work stays on the caller's thread).
    /// Where the quick team would take `len` bytes, as many pieces as its
    /// threads take of its smallest piece, if that is more (so pieces may
    /// be as small as the team's): the phase the buffer is part of may
    /// still be too large for the team, and then its workers get at least
    /// their own number of pieces (cut for the quick team's threads alone,
    /// the workers would idle).
    fn piece(&self, len: usize) -> usize {
        let mut used = self.threads.min(len / self.min_piece).max(1);
        if let Some(q) = self.quick_for(len) {
            used = used.max(q.threads.min(len / q.min_piece));
        }
        len.div_ceil(used).div_ceil(64).max(1) * 64
    }

    /// Calls `f(range)` for consecutive pieces of `0..len`, in parallel.
    pub fn for_pieces<E: Send>(&self, len: usize, f: impl Fn(Range<usize>) -> Result<(), E> + Sync + Send) -> Result<(), E> {
        self.for_each(self.ranges(len), len, f)
    }

    /// Calls `f(offset, piece)` for disjoint mutable pieces of `buf`, in
    /// parallel.
    pub fn for_pieces_mut<E: Send>(&self, buf: &mut [u8], f: impl Fn(usize, &mut [u8]) -> Result<(), E> + Sync + Send) -> Result<(), E> {
        let len = buf.len();
        let pieces: Vec<_> = self.pieces_mut(buf).collect();
        self.for_each(pieces, len, |(off, piece)| f(off, piece))
    }

    /// Copies `src` into `dst` (the same length), in pieces, in parallel.
    pub fn copy(&self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "copy between buffers of different lengths");
        let Ok(()) = self.for_pieces_mut(dst, |off, piece| {
            piece.copy_from_slice(&src[off..off + piece.len()]);
            Ok::<(), std::convert::Infallible>(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::shm::QUICK_BYTES_PER_THREAD;
    use std::collections::HashSet;

    const SPIN: Duration = Duration::from_micros(100);

    /// Distinct threads that ran `items` slow items of `wk`.
    fn threads_used(wk: &Workers, items: usize) -> usize {
        let seen = Mutex::new(HashSet::new());
        let r: Result<(), ()> = wk.for_each((0..items).collect(), items * wk.min_piece(), |_| {
            seen.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        });
        r.unwrap();
        seen.into_inner().unwrap().len()
    }

    #[test]
    fn work_uses_at_most_the_workers_threads() {
        // a spinning team, and rayon's pool (no spin)
        for spin in [SPIN, Duration::ZERO] {
            assert_eq!(threads_used(&Workers::new(1, "test", 64, spin).unwrap(), 8), 1);
            assert!(threads_used(&Workers::new(2, "test", 64, spin).unwrap(), 8) <= 2);
            assert!(threads_used(&Workers::new(4, "test", 64, spin).unwrap(), 8) >= 2);
        }
    }

    /// A phase of `items` items said to hold `bytes`, item `fail` failing:
    /// every item ran once and `fail`'s error came back.
    fn each_item_once_and_the_first_error_back(wk: &Workers, items: usize, bytes: usize, fail: usize) {
        let ran = Mutex::new(Vec::new());
        let r = wk.for_each((0..items).collect(), bytes, |i| {
            ran.lock().unwrap().push(i);
            if i == fail {
                Err(i)
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err(fail));
        let mut ran = ran.into_inner().unwrap();
        ran.sort();
        assert_eq!(ran, (0..items).collect::<Vec<_>>());
    }

    #[test]
    fn every_item_runs_once_and_the_first_error_comes_back() {
        for spin in [SPIN, Duration::ZERO] {
            let wk = Workers::new(3, "test", 64, spin).unwrap();
            for _ in 0..20 {
                each_item_once_and_the_first_error_back(&wk, 10, 10 * wk.min_piece(), 7);
            }
        }
    }

    #[test]
    fn aligned_ranges_cover_everything_once_on_aligned_boundaries() {
        let wk = Workers::new(3, "test", 64, SPIN).unwrap();
        for len in [0usize, 1, 4096, 65536, 600_000, 8_000_000] {
            let rs = wk.ranges_aligned(len, 65536);
            assert!(rs.len() <= 3, "{len}: {rs:?}");
            assert_eq!(rs.iter().map(|r| r.len()).sum::<usize>(), len);
            for (a, b) in rs.iter().zip(rs.iter().skip(1)) {
                assert_eq!(a.end, b.start);
                assert_eq!(b.start % 65536, 0, "{len}: {rs:?}");
            }
        }
    }

    /// Names of the threads that ran a phase of `items` slow items said
    /// to hold `bytes`.
    fn names(wk: &Workers, items: usize, bytes: usize) -> HashSet<String> {
        let seen = Mutex::new(HashSet::new());
        let r: Result<(), ()> = wk.for_each((0..items).collect(), bytes, |_| {
            seen.lock().unwrap().insert(std::thread::current().name().unwrap_or("").to_string());
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        });
        r.unwrap();
        seen.into_inner().unwrap()
    }

    #[test]
    fn small_phases_run_on_the_quick_team_and_large_ones_on_the_workers() {
        let mut wk = Workers::new(4, "wt", 1024, Duration::ZERO).unwrap();
        wk.add_quick(2, "wt", SPIN, QUICK_BYTES_PER_THREAD, 1024, false).unwrap();
        assert_eq!(wk.quick_threads(), 2);
        let max = 2 * QUICK_BYTES_PER_THREAD;
        let me = std::thread::current().name().unwrap_or("").to_string();
        // The helper threads (not the caller) that ran 20 phases of `limit`
        // bytes, and 20 of one byte more.
        let helpers_at = |w: &Workers, limit: usize| {
            let (mut quick, mut pool) = (HashSet::new(), HashSet::new());
            for _ in 0..20 {
                quick.extend(names(w, 8, limit));
                pool.extend(names(w, 8, limit + 1));
            }
            let helpers = |seen: HashSet<String>| seen.into_iter().filter(|n| *n != me).collect::<HashSet<_>>();
            (helpers(quick), helpers(pool))
        };
        let (quick, pool) = helpers_at(&wk, max);
        assert_eq!(quick, HashSet::from(["wt-q-0".to_string()]), "a phase of {max} bytes: {quick:?}");
        assert!(!pool.is_empty() && pool.iter().all(|n| n.starts_with("wt-") && !n.starts_with("wt-q")), "larger phases: {pool:?}");
        // A reduction of 4 inputs: only a quarter of that on the quick team.
        let sum = wk.reducing(4);
        let (quick, pool) = helpers_at(&sum, max / 4);
        assert_eq!(quick, HashSet::from(["wt-q-0".to_string()]), "a reduction of {} bytes: {quick:?}", max / 4);
        assert!(!pool.is_empty() && pool.iter().all(|n| !n.starts_with("wt-q")), "larger reductions: {pool:?}");
        assert_eq!(sum.min_piece(), 256);
        // all_to_all's copies: phases of up to 4x as many bytes on the team.
        let blocks = wk.with_quick_bytes(4 * QUICK_BYTES_PER_THREAD);
        assert_eq!(blocks.quick_limits(), (4 * max, 1024));
        let (quick, pool) = helpers_at(&blocks, 4 * max);
        assert_eq!(quick, HashSet::from(["wt-q-0".to_string()]), "a block phase of {} bytes: {quick:?}", 4 * max);
        assert!(!pool.is_empty() && pool.iter().all(|n| !n.starts_with("wt-q")), "larger block phases: {pool:?}");
        assert_eq!(wk.quick_limits().0, max, "the workers themselves keep their limit");
        // The same threads under other piece sizes; none below 2 threads.
        assert_eq!(wk.with_min_piece(128).quick_threads(), 2);
        let mut one = Workers::new(4, "wt", 64, Duration::ZERO).unwrap();
        one.add_quick(1, "wt", SPIN, QUICK_BYTES_PER_THREAD, 64, false).unwrap();
        assert_eq!(one.quick_threads(), 0);
    }

    #[test]
    fn a_phase_too_large_for_a_leading_quick_team_runs_on_it_and_the_workers_that_woke() {
        // Sleeping workers (no spin: rayon's pool, replaced by a team).
        let mut wk = Workers::new(4, "wl", 1024, Duration::ZERO).unwrap();
        wk.add_quick(2, "wl", SPIN, 1024, 1024, true).unwrap();
        assert!(wk.quick_leads());
        let me = std::thread::current().name().unwrap_or("").to_string();
        let (mut quick, mut pool) = (HashSet::new(), HashSet::new());
        for _ in 0..20 {
            // 8 items of 2 ms, 8 KiB in all: over the team's 2 KiB.
            for n in names(&wk, 8, 8 << 10).into_iter().filter(|n| *n != me) {
                if n.starts_with("wl-q") {
                    quick.insert(n)
                } else {
                    pool.insert(n)
                };
            }
        }
        assert_eq!(quick, HashSet::from(["wl-q-0".to_string()]), "the quick team's helper leads every phase");
        assert!(!pool.is_empty() && pool.iter().all(|n| n.starts_with("wl-")), "workers join: {pool:?}");
        // Every item once, the first error back, also with late workers.
        for _ in 0..200 {
            each_item_once_and_the_first_error_back(&wk, 6, 6 << 10, 4);
        }
        // Without `leads` the same phase runs on the workers alone.
        let mut plain = Workers::new(4, "wn", 1024, Duration::ZERO).unwrap();
        plain.add_quick(2, "wn", SPIN, 1024, 1024, false).unwrap();
        assert!(!plain.quick_leads());
        assert!(names(&plain, 8, 8 << 10).iter().all(|n| !n.starts_with("wn-q")));
    }

    #[test]
    fn the_quick_team_cuts_its_phases_into_its_own_smaller_pieces() {
        let mut wk = Workers::new(8, "wp", 1 << 16, Duration::ZERO).unwrap();
        wk.add_quick(4, "wp", SPIN, 1 << 14, 1 << 10, false).unwrap();
        assert_eq!(wk.quick_limits(), (1 << 16, 1 << 10));
        // 12 KiB on the quick team (at most 64 KiB): 4 pieces of 3 KiB.
        assert_eq!(wk.ranges(12 << 10), (0..4).map(|i| i * 3072..(i + 1) * 3072).collect::<Vec<_>>());
        // 1 KiB: one piece (two are needed to start the team).
        assert_eq!(wk.ranges(1 << 10).len(), 1);
        // 64 KiB, the team's limit: 4 quick pieces, as the 8 workers would cut
        // it into one; over the limit: the workers' own pieces (64 KiB, 8 threads).
        assert_eq!(wk.ranges(64 << 10).len(), 4);
        assert_eq!(wk.ranges(256 << 10).len(), 4);
        assert_eq!(wk.ranges(1 << 20).len(), 8);
        let me = std::thread::current().name().unwrap_or("").to_string();
        let helpers = names(&wk, 4, 12 << 10).into_iter().filter(|n| *n != me).collect::<Vec<_>>();
        assert!(!helpers.is_empty() && helpers.iter().all(|n| n.starts_with("wp-q")), "{helpers:?}");
        // A reduction of 4 inputs: a quarter of each.
        let sum = wk.reducing(4);
        assert_eq!(sum.quick_limits(), (1 << 14, 256));
        assert_eq!(sum.ranges(4 << 10).len(), 4);
        // The workers' own smallest piece: the workers' count of pieces.
        let mut same = Workers::new(8, "wp", 1 << 16, Duration::ZERO).unwrap();
        same.add_quick(4, "wp", SPIN, 1 << 16, 1 << 16, false).unwrap();
        assert_eq!(same.quick_limits(), (1 << 18, 1 << 16));
        assert_eq!(same.ranges(128 << 10).len(), 2);
    }
}
