//! How the point-to-point engine reaches one peer, and how its thread
//! waits for something to do.
//!
//! A peer on another host (or any peer with `RUSTCCL_TRANSPORT=tcp`) is a
//! TCP stream. A peer on this host is a pair of shared-memory rings of the
//! point-to-point channel, plus the (otherwise idle) TCP connection, kept
//! only to learn at once that the peer died.
//!
//! The ring towards a shared-memory peer is shared with the callers'
//! threads ([`ShmTx`]): a small send that fits and has nothing queued
//! before it is written by the calling thread itself, one thread hand-off
//! (and, on a sleeping engine thread, one wake-up) less per message.
//!
//! Waiting: with TCP peers only, the thread sleeps in `mio::Poll` (requests
//! wake it through a `mio::Waker`), as before. With shared-memory peers, it
//! sleeps on the point-to-point futex word of this rank's segment, which
//! the peers' producers and consumers, new requests, and a small watcher
//! thread bump; the watcher sleeps in `mio::Poll` over the TCP connections
//! and flags the peers it saw events for. While a caller drives the engine
//! (waits for its own send or receive and runs the passes itself), and
//! for a moment after when nothing is left to do, the thread sleeps deaf
//! to that word instead ([`Driving`]): the callers read the rings, and a
//! thread polling beside them, or woken by each message, took a core.
#![forbid(unsafe_code)]

use std::io::{self, IoSlice};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Poll, Token, Waker};

use crate::config::log_at;
use crate::config::LogLevel;
use crate::tls::Socket;
use crate::transport::shm::{Channel, RingRx, RingTx, ShmLocal};

pub const WAKE: Token = Token(usize::MAX);
/// How long the thread yields between looks before it sleeps on the futex
/// word (as the collective waits do: no pure spinning).
const YIELD_FOR: Duration = Duration::from_micros(60);
/// How often shared-memory peers are checked for life when nothing else
/// (the watcher) says they died.
pub const ALIVE_EVERY: Duration = Duration::from_millis(50);
/// The longest the thread sleeps deaf to pushes while a caller drives the
/// engine ([`Driving`]): a message with no receive posted waits at most
/// this long in its ring after the last driver left. Each timed wake-up
/// takes a core from a rank that drives; on a host with as many ranks as
/// cores it preempts one (decision 0011).
const DEAF_FOR: Duration = Duration::from_millis(10);

/// The threads driving the engine themselves right now (`Work::wait`
/// through `driver::Driver`), and whether the engine's thread sleeps
/// deaf to pushes meanwhile. A driver reads the rings in its own passes,
/// so the engine's thread need not: polling beside it, or woken by each
/// message, it took a core from the driver or its peer (on a VM with as
/// many cores as ranks, a context switch a message).
pub struct Driving {
    /// Every peer is on this host: a driver's passes read every link. (A
    /// TCP peer's socket events reach only the engine's thread, through
    /// the watcher, so with one the thread never sleeps deaf.)
    local_only: bool,
    count: AtomicU32,
    deaf: AtomicBool,
    /// The engine's thread, which parks while deaf.
    thread: OnceLock<Thread>,
    epoch: Instant,
    /// When the last driver stopped (nanoseconds after `epoch`).
    last_end: AtomicU64,
    /// A request waits in the channel that no pass took yet.
    requested: AtomicBool,
}

impl Driving {
    /// `local_only`: every peer of the engine is on this host.
    pub fn new(local_only: bool) -> Driving {
        Driving {
            local_only,
            count: AtomicU32::new(0),
            deaf: AtomicBool::new(false),
            thread: OnceLock::new(),
            epoch: Instant::now(),
            last_end: AtomicU64::new(0),
            requested: AtomicBool::new(false),
        }
    }

    /// Wakes the thread from its deaf sleep (or the next one, at once).
    fn rouse(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// A request went into the channel and no pass took it: the thread
    /// must not sleep deaf before its next pass (woken if it does).
    pub fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
        self.watched();
    }

    /// The watcher flagged peers with socket events (a TCP peer's message,
    /// a death), which only the engine's thread takes, or a request was
    /// stored: wake the thread if deaf.
    fn watched(&self) {
        // Pairs with the fence in `Waiter::wait`: either the thread sees
        // the flags (or the request), or this load sees it deaf.
        fence(Ordering::SeqCst);
        if self.deaf.load(Ordering::SeqCst) {
            self.rouse();
        }
    }

    /// A caller starts driving the engine.
    pub fn begin(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// The calling driver stops; `busy`: whether the engine has work left
    /// (asked only when it was the last driver and the thread sleeps deaf,
    /// which is then woken).
    pub fn end(&self, busy: impl FnOnce() -> bool) {
        self.last_end.store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let last = self.count.fetch_sub(1, Ordering::SeqCst) == 1;
        // Pairs with the fence in `Waiter::wait`: either the thread sees
        // no driver, or this load sees it deaf.
        fence(Ordering::SeqCst);
        if last && self.deaf.load(Ordering::SeqCst) && busy() {
            self.rouse();
        }
    }

    fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Whether the engine's thread should leave the rings to the callers:
    /// one drives now, or one stopped less than [`DEAF_FOR`] ago and the
    /// engine has nothing left to do (`busy`), as between the calls of a
    /// ping-pong, where a thread that took a message first kept passing.
    fn defer(&self, busy: bool) -> bool {
        if !self.local_only {
            return false;
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.any() || (!busy && now < self.last_end.load(Ordering::Relaxed) + DEAF_FOR.as_nanos() as u64)
    }
}

pub enum PeerLink {
    Tcp(Socket),
    Shm { tx: Arc<ShmTx>, rx: RingRx, watch: TcpStream },
}

/// The ring towards a shared-memory peer, written by the engine's thread
/// and by callers sending small messages themselves. `queued` counts the
/// messages for the peer that the engine's thread holds or will hold
/// (handed over, being written, acks): while there are any, a caller hands
/// its message over too, so messages leave in the order they were sent and
/// never interleave.
pub struct ShmTx(Mutex<TxState>);

struct TxState {
    ring: RingTx,
    queued: usize,
    /// The peer is dead or the engine shut down: only the engine's thread
    /// (which fails the sends) takes messages.
    closed: bool,
}

impl ShmTx {
    pub fn new(ring: RingTx) -> Arc<ShmTx> {
        Arc::new(ShmTx(Mutex::new(TxState { ring, queued: 0, closed: false })))
    }

    fn lock(&self) -> MutexGuard<'_, TxState> {
        // Nothing panics while holding it (ring writes are bounds-checked
        // copies); recover the guard regardless.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `hdr` then `body` now, if nothing is queued before them, the
    /// link is open and both fit in the ring; otherwise counts one more
    /// queued message (the caller hands it to the engine's thread) and
    /// returns false.
    pub fn write_now_or_queue(&self, hdr: &[u8], body: &[u8]) -> bool {
        let mut s = self.lock();
        if s.queued == 0 && !s.closed && s.ring.free() >= hdr.len() + body.len() {
            s.ring.push_parts(&[hdr, body]);
            return true;
        }
        s.queued += 1;
        false
    }

    /// Counts a message the engine's thread is given or queues itself.
    pub fn queue(&self) {
        self.lock().queued += 1;
    }

    /// A queued message was written completely.
    pub fn written(&self) {
        let mut s = self.lock();
        s.queued = s.queued.saturating_sub(1);
    }

    /// From now on only the engine's thread takes messages.
    pub fn close(&self) {
        self.lock().closed = true;
    }
}

impl PeerLink {
    pub fn is_shm(&self) -> bool {
        matches!(self, PeerLink::Shm { .. })
    }

    /// The TCP stream to register with the poll (data, or the watch).
    pub fn stream(&mut self) -> &mut TcpStream {
        match self {
            PeerLink::Tcp(s) => s.sock(),
            PeerLink::Shm { watch, .. } => watch,
        }
    }

    /// Counts a message the engine's thread queued itself (see [`ShmTx`]).
    pub fn queue(&self) {
        if let PeerLink::Shm { tx, .. } = self {
            tx.queue();
        }
    }

    /// A queued message was written completely (see [`ShmTx`]).
    pub fn written(&self) {
        if let PeerLink::Shm { tx, .. } = self {
            tx.written();
        }
    }

    /// The peer is dead or the engine stops: callers no longer write.
    pub fn close(&self) {
        if let PeerLink::Shm { tx, .. } = self {
            tx.close();
        }
    }

    /// Writes a prefix of `head` then `body`; `WouldBlock` when nothing
    /// fits.
    pub fn write_some(&mut self, head: &[u8], body: &[u8]) -> io::Result<usize> {
        match self {
            PeerLink::Tcp(s) => s.write_vectored(&[IoSlice::new(head), IoSlice::new(body)]),
            PeerLink::Shm { tx, .. } => {
                let n = tx.lock().ring.push_parts(&[head, body]);
                if n == 0 {
                    Err(io::ErrorKind::WouldBlock.into())
                } else {
                    Ok(n)
                }
            }
        }
    }

    /// Whether every byte written so far left for the socket (through TLS,
    /// sealed records may wait for room); sends what it can of the rest.
    pub fn flushed(&mut self) -> io::Result<bool> {
        match self {
            PeerLink::Tcp(s) => s.flushed(),
            PeerLink::Shm { .. } => Ok(true),
        }
    }

    /// Reads what is there into `dst` (not empty); `WouldBlock` when
    /// nothing is.
    pub fn read_some(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match self {
            PeerLink::Tcp(s) => s.read(dst),
            PeerLink::Shm { rx, .. } => match rx.pull(dst) {
                0 => Err(io::ErrorKind::WouldBlock.into()),
                n => Ok(n),
            },
        }
    }

    /// For a shared-memory peer: Err when its watched connection closed.
    pub fn alive(&self) -> Result<(), String> {
        self.watch().map_or(Ok(()), watch_alive)
    }

    /// A shared-memory peer's watched connection.
    pub fn watch(&self) -> Option<&TcpStream> {
        match self {
            PeerLink::Shm { watch, .. } => Some(watch),
            PeerLink::Tcp(_) => None,
        }
    }
}

/// Err when a shared-memory peer's watched (otherwise idle) connection
/// closed: the peer is gone.
pub fn watch_alive(watch: &TcpStream) -> Result<(), String> {
    let mut b = [0u8; 1];
    match watch.peek(&mut b) {
        Ok(0) => Err("connection closed by peer (process exited?)".into()),
        Ok(_) => Err("unexpected bytes on the idle connection of a shared-memory peer".into()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(e) => Err(format!("connection to peer lost: {e}")),
    }
}

/// Wakes the engine's thread after a request was queued.
#[derive(Clone)]
pub enum Wake {
    Mio(Arc<Waker>),
    Futex(Arc<ShmLocal>),
}

impl Wake {
    pub fn wake(&self) {
        match self {
            Wake::Mio(w) => {
                let _ = w.wake();
            }
            Wake::Futex(l) => l.mine().notify_on(Channel::P2p),
        }
    }
}

/// A thread that sleeps in `poll` and flags the peers it saw events for,
/// then bumps the futex word the engine's thread sleeps on.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    handle: Option<JoinHandle<()>>,
}

impl Watcher {
    fn start(
        mut poll: Poll,
        local: Arc<ShmLocal>,
        ready: Arc<Vec<AtomicBool>>,
        name: String,
        driving: Arc<Driving>,
    ) -> io::Result<Watcher> {
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let handle = std::thread::Builder::new().name(name).spawn(move || {
            let mut events = Events::with_capacity(64);
            while !st.load(Ordering::Acquire) {
                match poll.poll(&mut events, None) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log_at!(LogLevel::Warn, "p2p watcher poll failed: {e}");
                        std::thread::sleep(Duration::from_millis(1));
                        ready.iter().for_each(|r| r.store(true, Ordering::Release));
                    }
                }
                for ev in events.iter() {
                    if let Some(r) = ready.get(ev.token().0) {
                        r.store(true, Ordering::Release);
                    }
                }
                local.mine().notify_on(Channel::P2p);
                // Only the engine's thread takes these flags: a deaf one too.
                driving.watched();
            }
        })?;
        Ok(Watcher { stop, waker, handle: Some(handle) })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// How the engine's thread waits (see the module docs).
pub enum Waiter {
    Mio { poll: Poll, events: Events },
    Futex { local: Arc<ShmLocal>, ready: Arc<Vec<AtomicBool>>, _watcher: Watcher, sig0: u32, last_alive: Instant, driving: Arc<Driving> },
}

impl Waiter {
    /// A futex waiter over `local`, its watcher polling `poll` for `n` peers.
    /// `driving`: the callers driving the engine (then it sleeps deaf).
    pub fn futex(poll: Poll, local: Arc<ShmLocal>, n: usize, name: String, driving: Arc<Driving>) -> io::Result<Waiter> {
        let ready: Arc<Vec<AtomicBool>> = Arc::new((0..n).map(|_| AtomicBool::new(true)).collect());
        let watcher = Watcher::start(poll, local.clone(), ready.clone(), name, driving.clone())?;
        Ok(Waiter::Futex { local, ready, _watcher: watcher, sig0: 0, last_alive: Instant::now(), driving })
    }

    /// The shared-memory links it sleeps on (None: sockets only).
    pub fn shm(&self) -> Option<Arc<ShmLocal>> {
        match self {
            Waiter::Futex { local, .. } => Some(local.clone()),
            Waiter::Mio { .. } => None,
        }
    }

    /// Called before each pass over the peers: changes after this wake a
    /// later `wait`.
    pub fn arm(&mut self) {
        if let Waiter::Futex { local, sig0, .. } = self {
            *sig0 = local.mine().signal_of(Channel::P2p).load(Ordering::Acquire);
        }
    }

    /// Peers with events since the last call (all shared-memory peers are
    /// looked at on every pass anyway): both their pumps run, as in mio
    /// mode, since the watcher does not say whether a socket became
    /// readable or writable (a send to a TCP peer that filled the socket
    /// resumes only on the writable event). `watch[p]` is set for peers
    /// whose connection reported something (a shared-memory peer's idle
    /// connection only does when it closes), or for every peer once per
    /// `ALIVE_EVERY`.
    pub fn take_ready(&mut self, pump_in: &mut [bool], pump_out: &mut [bool], watch: &mut [bool]) {
        if let Waiter::Futex { ready, last_alive, .. } = self {
            for (p, r) in ready.iter().enumerate() {
                if r.swap(false, Ordering::AcqRel) {
                    pump_in[p] = true;
                    pump_out[p] = true;
                    watch[p] = true;
                }
            }
            if last_alive.elapsed() >= ALIVE_EVERY {
                *last_alive = Instant::now();
                watch.fill(true);
            }
        }
    }

    /// After a pass that moved something: whether the thread should still
    /// wait rather than pass again, leaving the rings to the callers that
    /// drive the engine ([`Driving::defer`]; `busy`: the engine has work
    /// left).
    pub fn defers(&self, busy: bool) -> bool {
        match self {
            Waiter::Futex { driving, .. } => driving.defer(busy),
            Waiter::Mio { .. } => false,
        }
    }

    /// Sleeps until something may have happened, at most `timeout`.
    /// `ready_out[p]` is set for peers with events (mio mode). `busy`: the
    /// engine has work left.
    pub fn wait(&mut self, timeout: Option<Duration>, ready_out: &mut [bool], busy: bool) {
        match self {
            Waiter::Mio { poll, events } => match poll.poll(events, timeout) {
                Ok(()) => {
                    for ev in events.iter() {
                        if let Some(r) = ready_out.get_mut(ev.token().0) {
                            *r = true;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log_at!(LogLevel::Warn, "p2p poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                    ready_out.fill(true);
                }
            },
            Waiter::Futex { local, sig0, driving, ready, .. } => {
                let word = local.mine().signal_of(Channel::P2p);
                let t0 = Instant::now();
                while t0.elapsed() < YIELD_FOR && !driving.defer(busy) {
                    if word.load(Ordering::Acquire) != *sig0 {
                        return;
                    }
                    // Not `ShmLocal::pause`: this thread does not move
                    // (`place.rs`), the waiting threads do.
                    std::thread::yield_now();
                }
                let cap = timeout.unwrap_or(ALIVE_EVERY).min(ALIVE_EVERY);
                if driving.defer(busy) {
                    // Deaf: not on the word the pushes bump (while callers
                    // ping-pong it moves every few microseconds), but
                    // parked, until a driver or a request rouses it.
                    driving.thread.get_or_init(std::thread::current);
                    driving.deaf.store(true, Ordering::SeqCst);
                    // Pairs with the fences in `Driving::end`, `request`
                    // and `watched`.
                    fence(Ordering::SeqCst);
                    let flagged = ready.iter().any(|r| r.load(Ordering::SeqCst));
                    if driving.defer(busy) && !driving.requested.swap(false, Ordering::SeqCst) && !flagged {
                        std::thread::park_timeout(cap.min(DEAF_FOR));
                    }
                    driving.deaf.store(false, Ordering::SeqCst);
                    return;
                }
                local.mine().sleep_on(Channel::P2p, *sig0, cap);
            }
        }
    }
}
