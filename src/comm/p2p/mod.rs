//! Point-to-point engine: send / recv with tags, recv from any source.
//!
//! One event loop per communicator (started on first use) owns the
//! point-to-point links: shared-memory rings to the ranks of this host,
//! TCP to the others (`link.rs`). Its state sits behind a mutex: its own
//! thread runs passes over it, and so does a thread waiting for one of
//! its works (`driver::Driver`). Sends queue per peer and are written in
//! order. Every incoming message (24-byte header with tag and length) is
//! matched against posted receives in posting order; a match is read
//! straight into the receiver's tensor, anything else into an "unexpected"
//! buffer that a later receive copies from. So a send never waits for its
//! receive to be posted, and messages between two ranks with the same tag
//! arrive in order (MPI matching rules).
//!
//! Large messages to a rank of this host when cross-memory attach is on
//! (`ShmLocal::attach`, from its threshold up) go by rendezvous instead
//! (`rendezvous.rs`): only a header with the tensor's address travels
//! through the ring; the receiver, once a receive matches it (the same
//! rules; unmatched, only the header waits), reads the bytes straight from
//! the sender's tensor and acks; the send completes on the ack, so it
//! waits for its receive, as gloo's sends do. Between the staging bounds
//! (`ShmLocal::stage_min`, `stage_capacity`) such a send is *staged* instead when the
//! sender's staging area is free: the sender writes its message, then its
//! threads copy the bytes there chunk by chunk and the send completes; the
//! receiver's threads copy each chunk out as soon as it is in (the two
//! copies overlap when the receive is already posted), and the ack frees
//! the area (user-space copies by several threads beat several threads
//! reading another process through the kernel at these sizes). A tensor
//! in our shared arena (`RUSTCCL_SHM_TENSORS`) is not staged: the receiver
//! copies it straight out of it, unless `ShmLocal::stage_shared`. A send
//! that would go by value but is over `stage_min` is staged the same way
//! while the area is free (`rendezvous::stages_by_value`), and goes
//! through the ring while it is busy; its receiver copies it out at once,
//! and a send of rendezvous size that finds the area held by one goes by
//! value too, so that no send waits for its receive where it did not
//! before.
//!
//! A send to a rank of this host that goes by value (not rendezvous) is
//! written into the ring by the calling thread itself when nothing is
//! queued before it and it fits (`link::ShmTx`); the work is then
//! finished before `submit` returns. The ring publishes a message every
//! 8 KiB as it goes in (`RingTx::push_parts`), so a receiver polling it
//! copies the first bytes out while the rest are written. A receive from
//! a rank of this host is posted by the calling thread itself while no
//! other thread holds the loop (`Driver::try_recv_now`), and finished
//! there if its message is in.
#![forbid(unsafe_code)]

mod driver;
mod event_loop;
mod failure;
mod link;
mod rendezvous;
mod split;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Waker};

use crate::bootstrap::Conn;
use crate::collectives::Op;
use crate::error::{Error, Result};
use crate::tensor::CpuTensor;
use crate::tls::Socket;
use crate::transport::frame::P2pHeader;
use crate::transport::frame::{self, P2pKind, P2P_HEADER_LEN};
use crate::transport::shm::{RingRx, ShmLink, ShmLocal};
use crate::types::Rank;
use crate::work::Work;

use driver::Driver;
use event_loop::EventLoop;
use link::{Driving, PeerLink, ShmTx, Waiter, Wake, WAKE};

/// Shared-memory links of the point-to-point channel, by global rank.
pub type ShmP2p = (Arc<ShmLocal>, Vec<(Rank, ShmLink)>);

enum Req {
    Send { peer: Rank, tag: i64, buf: CpuTensor, work: Work, deadline: Instant },
    Recv { peer: Option<Rank>, tag: i64, buf: CpuTensor, work: Work, deadline: Instant },
}

struct Posted {
    posted_at: Instant,
    peer: Option<Rank>,
    tag: i64,
    buf: CpuTensor,
    work: Work,
    deadline: Instant,
}

struct Outgoing {
    hdr: [u8; P2P_HEADER_LEN],
    hdr_done: usize,
    body_done: usize,
    /// The body of a control message (rendezvous, ack); None: the
    /// tensor's bytes follow the header.
    ctl: Option<Vec<u8>>,
    /// The send's tensor (None for an ack).
    buf: Option<CpuTensor>,
    /// The send's Work (None for an ack).
    work: Option<Work>,
    /// Rendezvous: once written, the send waits for the ack with this id.
    rdv: Option<u64>,
    /// Our staged message (at most one is outstanding).
    staged: bool,
    posted_at: Instant,
    deadline: Instant,
}

/// A rendezvous send whose header went out. Its tensor stays alive until
/// the receiver's ack, even after its Work timed out (the receiver may
/// still be reading it).
struct Awaiting {
    id: u64,
    buf: CpuTensor,
    work: Option<Work>,
    posted_at: Instant,
    deadline: Instant,
}

/// A rendezvous message's header: where the sender's bytes are.
struct Rdv {
    len: usize,
    /// The sender's tensor; for a staged send, its number (`ShmLocal::stage_in`).
    addr: u64,
    id: u64,
    /// The bytes are in the sender's staging area, not at `addr`.
    staged: bool,
    /// The sender's dtype (`frame::dtype_code`).
    dtype: u8,
}

/// A receive of a split rendezvous message (`split.rs`): its first half
/// read (`read`: how that went, and the ack's text if not), the second
/// being written by the sender, which answers when done.
struct Split {
    peer: Rank,
    id: u64,
    tag: i64,
    /// Held until the sender's answer (or death): it writes into it.
    buf: CpuTensor,
    /// None once the receive timed out.
    work: Option<Work>,
    read: std::result::Result<(), (Error, String)>,
    posted_at: Instant,
    deadline: Instant,
}

/// How a message to or from a rank of this host crossed, as counted in
/// `rustccl.stats()` (`ops["send"]["algorithms"]`, `ops["recv"][...]`);
/// messages over TCP count as "direct".
mod route {
    /// By value through the ring (written in, copied out).
    pub const RING: &str = "shm_ring";
    /// Through the sender's staging area (by value or by rendezvous),
    /// or copied out of it before its receive came ([`super::Unexpected`]).
    pub const STAGED: &str = "shm_staged";
    /// Read by the receiver from the sender's tensor (rendezvous).
    pub const READ: &str = "shm_read";
    /// Read half by the receiver, the other half written by the sender.
    pub const SPLIT: &str = "shm_split";
}

/// A message no receive matched yet: its bytes, and how they came
/// ([`route`]; `None` over TCP), or a rendezvous header.
enum Unexpected {
    /// Its bytes, its dtype (`frame::dtype_code`), its route.
    Data(Vec<u8>, u8, Option<&'static str>),
    Rendezvous(Rdv),
}

enum Sink {
    Posted(Posted),
    /// An unexpected message's bytes, and its dtype.
    Buffer(Vec<u8>, u8),
    Discard(Vec<u8>),
    /// The body of a control message; `len` and `dtype` are the header's.
    Control {
        kind: P2pKind,
        len: u64,
        dtype: u8,
        data: Vec<u8>,
    },
}

enum Incoming {
    Header { hdr: [u8; P2P_HEADER_LEN], done: usize },
    Body { tag: i64, done: usize, sink: Sink },
}

struct Peer {
    link: PeerLink,
    addr: String,
    dead: Option<String>,
    out: VecDeque<Outgoing>,
    inc: Incoming,
    /// Rendezvous sends waiting for their ack.
    awaiting: Vec<Awaiting>,
    next_id: u64,
}

struct Running {
    tx: mpsc::Sender<Req>,
    wake: Wake,
    handle: Option<JoinHandle<()>>,
    /// Given to every work, when some peer is on this host (see
    /// `driver::Driver`).
    driver: Option<Arc<Driver>>,
}

/// What the event loop starts from.
struct Links {
    conns: Vec<Option<Conn>>,
    /// This host's ranks and the read ends of the shared-memory rings
    /// (their write ends are the engine's `txs`).
    shm: Option<ShmRx>,
}

/// This host's ranks and the read end of each shared-memory peer's ring.
type ShmRx = (Arc<ShmLocal>, Vec<(Rank, RingRx)>);

enum State {
    Idle(Links),
    Running(Running),
    Closed,
}

pub struct P2pEngine {
    rank: Rank,
    size: usize,
    group: String,
    state: Mutex<State>,
    seq: AtomicU64,
    /// Link kind per peer ("shm" / "tcp"), for stats.
    kinds: Vec<&'static str>,
    /// The write end of each shared-memory peer's ring, shared with the
    /// event loop.
    txs: Vec<Option<Arc<ShmTx>>>,
    /// This host's ranks when cross-memory attach is on (rendezvous).
    attach: Option<Arc<ShmLocal>>,
    /// The group's timeout, for waits that belong to no operation.
    timeout: Duration,
}

fn internal(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("p2p {what}: {e}"))
}

impl P2pEngine {
    /// `conns`: a TCP connection per peer; `shm`: shared-memory links to
    /// the peers of this host that have them (their TCP connection then
    /// only watches for the peer's death). `timeout`: the group's, for
    /// what the engine does for no operation of its own (acking a message
    /// it took before its receive was posted).
    pub fn new(rank: Rank, size: usize, group: String, conns: Vec<Option<Conn>>, shm: Option<ShmP2p>, timeout: Duration) -> P2pEngine {
        let mut kinds: Vec<&'static str> = conns.iter().map(|c| if c.is_some() { "tcp" } else { "" }).collect();
        kinds.resize(size, "");
        if let Some((_, links)) = &shm {
            for (r, _) in links {
                kinds[*r] = "shm";
            }
        }
        let mut txs: Vec<Option<Arc<ShmTx>>> = (0..size).map(|_| None).collect();
        let shm = shm.filter(|(_, links)| !links.is_empty()).map(|(local, links)| {
            let rxs = links
                .into_iter()
                .map(|(r, l)| {
                    let (tx, rx) = l.split();
                    txs[r] = Some(ShmTx::new(tx));
                    (r, rx)
                })
                .collect();
            (local, rxs)
        });
        let attach = shm.as_ref().map(|(l, _)| l.clone()).filter(|l| l.attach.is_some());
        let state = Mutex::new(State::Idle(Links { conns, shm }));
        P2pEngine { rank, size, group, state, seq: AtomicU64::new(0), kinds, txs, attach, timeout }
    }

    /// "shm" or "tcp": how messages to / from `peer` travel.
    pub fn link_kind(&self, peer: Rank) -> &'static str {
        self.kinds.get(peer).copied().unwrap_or("")
    }

    /// The link kind of an any-source receive: "shm" if every peer is.
    pub fn link_kind_any(&self) -> &'static str {
        let mut k = self.kinds.iter().enumerate().filter(|(p, _)| *p != self.rank).map(|(_, k)| *k);
        match k.next() {
            Some(first) if k.all(|x| x == first) => first,
            Some(_) => "shm+tcp",
            None => "",
        }
    }

    fn start(&self, links: Links) -> Result<Running> {
        let poll = Poll::new().map_err(internal("poll"))?;
        let mut shm_rxs: Vec<Option<RingRx>> = (0..self.size).map(|_| None).collect();
        let local = links.shm.map(|(local, v)| {
            for (r, rx) in v {
                shm_rxs[r] = Some(rx);
            }
            local
        });
        let mut peers = Vec::with_capacity(self.size);
        for (p, c) in links.conns.into_iter().enumerate() {
            peers.push(match c {
                Some(Conn { stream: s, addr, tls }) => {
                    s.set_nonblocking(true).map_err(internal("socket"))?;
                    let stream = TcpStream::from_std(s);
                    let mut link = match (shm_rxs[p].take(), &self.txs[p]) {
                        (Some(rx), Some(tx)) => PeerLink::Shm { tx: tx.clone(), rx, watch: stream },
                        _ => PeerLink::Tcp(Socket::new(stream, tls)),
                    };
                    // A shared-memory peer's connection only ever becomes readable (closed).
                    let interest = if link.is_shm() { Interest::READABLE } else { Interest::READABLE | Interest::WRITABLE };
                    poll.registry().register(link.stream(), mio::Token(p), interest).map_err(internal("register"))?;
                    let inc = Incoming::Header { hdr: [0; P2P_HEADER_LEN], done: 0 };
                    Some(Peer { link, addr, dead: None, out: VecDeque::new(), inc, awaiting: Vec::new(), next_id: 0 })
                }
                None => None,
            });
        }
        let name = |what: &str| format!("rustccl-{what}-{}-r{}", self.group, self.rank);
        let attach = self.attach.clone();
        let local_weak = local.as_ref().map(Arc::downgrade);
        let local_only = peers.iter().flatten().all(|p| p.link.is_shm());
        let driving = Arc::new(Driving::new(local_only));
        let (waiter, wake) = match local {
            Some(local) => (
                Waiter::futex(poll, local.clone(), self.size, name("p2pw"), driving.clone()).map_err(internal("watcher"))?,
                Wake::Futex(local),
            ),
            None => {
                let waker = Arc::new(Waker::new(poll.registry(), WAKE).map_err(internal("waker"))?);
                (Waiter::Mio { poll, events: Events::with_capacity(64) }, Wake::Mio(waker))
            }
        };
        let (tx, rx) = mpsc::channel();
        let any_shm = peers.iter().flatten().any(|p| p.link.is_shm());
        let ev = Arc::new(Mutex::new(EventLoop::new(self.rank, self.group.clone(), peers, rx, attach, self.timeout)));
        let driver = local_weak.filter(|_| any_shm).map(|l| Arc::new(Driver(Arc::downgrade(&ev), l, driving)));
        let handle = std::thread::Builder::new()
            .name(name("p2p"))
            .spawn(move || event_loop::run(ev, waiter))
            .map_err(|e| Error::Internal(format!("cannot start the p2p thread: {e}")))?;
        Ok(Running { tx, wake, handle: Some(handle), driver })
    }

    /// Hands a validated send or receive to the event loop.
    pub fn submit(&self, op: Op<CpuTensor>, timeout: Duration, prepare: impl FnOnce(&Work)) -> Result<Work> {
        let _t = crate::profile::start(crate::profile::Span::P2pSubmit);
        let kind = op.kind().name();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let work = Work::new(kind, seq);
        let now = Instant::now();
        work.mark_started_at(now);
        prepare(&work);
        let deadline = now + timeout;
        let req = match op {
            Op::Send { buf, peer, tag } => Req::Send { peer, tag, buf, work: work.clone(), deadline },
            Op::Recv { buf, peer, tag } => Req::Recv { peer, tag, buf, work: work.clone(), deadline },
            _ => return Err(Error::Internal("collective reached the p2p engine".into())),
        };
        if let Req::Send { peer, tag, buf, .. } = &req {
            if let Some(tx) = &self.txs[*peer] {
                let local = self.attach.as_deref();
                if rendezvous::by_rendezvous(local, true, buf.nbytes()) || rendezvous::stages_by_value(local, true, buf.bytes()) {
                    tx.queue();
                } else if matches!(*self.state.lock().unwrap_or_else(|p| p.into_inner()), State::Closed) {
                    return Err(Error::Closed { op: kind, how: "shut down" });
                } else {
                    let dtype = frame::dtype_code(buf.dtype());
                    let hdr = P2pHeader { kind: P2pKind::Data, dtype, tag: *tag, len: buf.nbytes() as u64 }.encode();
                    if tx.write_now_or_queue(&hdr, buf.bytes()) {
                        // Finished with no lock held: its callbacks may
                        // submit again.
                        drop(req);
                        work.set_route(route::RING);
                        work.finish(Ok(()));
                        return Ok(work);
                    }
                }
            }
        }
        // The state's lock is never held across a pass: a pass finishes
        // other works, whose callbacks may wait for the GIL, and a caller
        // holding it may submit (`py::PyCommunicator::run`).
        let driver = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let State::Idle(links) = &mut *st {
                let links = std::mem::replace(links, Links { conns: Vec::new(), shm: None });
                *st = State::Running(self.start(links)?);
            }
            match &*st {
                State::Running(r) => r.driver.clone(),
                _ => return Err(Error::Closed { op: kind, how: "shut down" }),
            }
        };
        if let Some(d) = &driver {
            work.set_progress(d.clone());
        }
        // A receive from a peer of this host is taken here when the loop
        // is free: no trip through the channel, and a look at that peer's
        // ring alone.
        let req = match &driver {
            Some(d) => match d.try_recv_now(req) {
                Some(req) => req,
                None => return Ok(work),
            },
            None => req,
        };
        let closed = || Error::Closed { op: kind, how: "shut down" };
        {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let State::Running(r) = &*st else { return Err(closed()) };
            r.tx.send(req).map_err(|_| closed())?;
            if driver.is_none() {
                r.wake.wake();
                return Ok(work);
            }
        }
        // The request taken in a pass of our own needs no wake-up of the
        // engine's thread: a message for it wakes that thread (or its
        // driver reads it), and its deadline is looked at within
        // `link::ALIVE_EVERY`. Else wake the thread, even one asleep deaf
        // beside a driver (`link::Driving`); after a shutdown it is gone.
        if let Some(d) = driver.filter(|d| !d.try_pass()) {
            if let State::Running(r) = &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
                r.wake.wake();
            }
            d.request();
        }
        Ok(work)
    }

    /// Stops the event loop; pending sends and receives fail with
    /// `Error::Closed`.
    pub fn shutdown(&self) {
        let prev = std::mem::replace(&mut *self.state.lock().unwrap_or_else(|p| p.into_inner()), State::Closed);
        if let State::Running(mut r) = prev {
            drop(r.tx);
            r.wake.wake();
            if let Some(h) = r.handle.take() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for P2pEngine {
    fn drop(&mut self) {
        // Closing the request channel makes the loop exit on its own.
        if let Ok(mut st) = self.state.lock() {
            let prev = std::mem::replace(&mut *st, State::Closed);
            if let State::Running(r) = prev {
                drop(r.tx);
                r.wake.wake();
            }
        }
    }
}
