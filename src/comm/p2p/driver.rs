//! A thread waiting for a point-to-point work runs the engine's passes
//! itself (`work::Progress`), between the engine thread's.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, TryLockError, Weak};
use std::time::Duration;

use super::event_loop::EventLoop;
use super::link::Driving;
use super::Req;
use crate::transport::shm::{Channel, ShmLocal};
use crate::work::Progress;

/// Lets a thread waiting for a point-to-point work run passes itself
/// (`work::Progress`): a message that arrives while it waits is read and
/// its receive finished on that thread, without a hand-off from the
/// engine's thread. Holds the loop and the shared-memory links weakly: a
/// work kept after shutdown keeps nothing alive.
pub(super) struct Driver(pub(super) Weak<Mutex<EventLoop>>, pub(super) Weak<ShmLocal>, pub(super) Arc<Driving>);

impl Driver {
    /// Runs `f` with `arg` on the loop on the calling thread, unless
    /// another thread holds the loop (then `arg` comes back); after it,
    /// wakes a waiter asleep on the word (`Work::wait`) whose work `f`
    /// finished, as after the engine thread's passes.
    fn on_loop<T, R>(&self, arg: T, f: impl FnOnce(&mut EventLoop, T) -> R) -> std::result::Result<R, T> {
        let Some(ev) = self.0.upgrade() else { return Err(arg) };
        let mut e = match ev.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(arg),
        };
        let r = f(&mut e, arg);
        drop(e);
        if let Some(local) = self.1.upgrade() {
            local.mine().wake_if_asleep_on(Channel::P2p);
        }
        Ok(r)
    }

    /// Runs a pass on the calling thread unless another thread is running
    /// one; true when it ran.
    pub(super) fn try_pass(&self) -> bool {
        self.on_loop((), |e, ()| {
            e.pass();
        })
        .is_ok()
    }

    /// Takes a receive from a peer of this host on the calling thread,
    /// unless another thread holds the loop: requests already in the
    /// channel first (posting order), then this one, then a look at that
    /// peer's ring only, not the whole pass's round of every peer, deaths
    /// and deadlines, which the engine's thread and waiting threads run.
    /// The request comes back when it was not taken.
    pub(super) fn try_recv_now(&self, req: Req) -> Option<Req> {
        let Req::Recv { peer: Some(p), .. } = &req else { return Some(req) };
        let p = *p;
        self.on_loop(req, |e, req| {
            if e.exited || !e.shm.get(p).copied().unwrap_or(false) || e.take_requests().is_none() {
                return Some(req);
            }
            e.handle(req);
            if !e.posted.is_empty() {
                e.pump_in(p);
            }
            None
        })
        .unwrap_or_else(Some)
    }

    /// A request went into the channel that no pass took (`Driving::request`).
    pub(super) fn request(&self) {
        self.2.request();
    }

    /// Whether the engine's thread has anything to do: works not finished,
    /// messages queued (true when another thread holds the loop).
    fn busy(&self) -> bool {
        let Some(ev) = self.0.upgrade() else { return false };
        let e = match ev.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return true,
        };
        e.busy()
    }
}

impl Progress for Driver {
    fn progress(&self) {
        self.try_pass();
    }

    fn driving(&self, on: bool) {
        if on {
            self.2.begin();
        } else {
            self.2.end(|| self.busy());
        }
    }

    fn pause(&self) {
        match self.1.upgrade() {
            Some(local) => local.pause(),
            None => std::thread::yield_now(),
        }
    }

    fn cores_taken(&self) -> bool {
        self.1.upgrade().is_some_and(|local| local.cores_taken())
    }

    fn spin(&self) -> Duration {
        self.1.upgrade().map_or(Duration::ZERO, |local| local.spin_for())
    }

    fn signal(&self) -> Option<u32> {
        self.1.upgrade().map(|local| local.mine().signal_of(Channel::P2p).load(Ordering::Acquire))
    }

    fn sleep_unless(&self, seen: u32, max: Duration, done: &dyn Fn() -> bool) {
        if let Some(local) = self.1.upgrade() {
            local.mine().sleep_unless_on(Channel::P2p, seen, max, done);
        }
    }
}
