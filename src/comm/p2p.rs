//! Point-to-point engine: send / recv with tags, recv from any source.
//!
//! One event-loop thread per communicator (started on first use) owns the
//! point-to-point connections. Sends queue per peer and are written in
//! order. Every incoming message (24-byte header with tag and length) is
//! matched against posted receives in posting order; a match is read
//! straight into the receiver's tensor, anything else into an "unexpected"
//! buffer that a later receive copies from. So a send never waits for its
//! receive to be posted, and messages between two ranks with the same tag
//! arrive in order (MPI matching rules).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::bootstrap::Conn;
use crate::collectives::Op;
use crate::config::LogLevel;
use crate::error::{Error, OpSite, Result};
use crate::log_at;
use crate::tensor::HostTensor;
use crate::transport::frame::{P2pHeader, P2P_HEADER_LEN};
use crate::types::Rank;
use crate::work::Work;

enum Req {
    Send { peer: Rank, tag: i64, buf: HostTensor, work: Work, deadline: Instant },
    Recv { peer: Option<Rank>, tag: i64, buf: HostTensor, work: Work, deadline: Instant },
}

struct Posted {
    posted_at: Instant,
    peer: Option<Rank>,
    tag: i64,
    buf: HostTensor,
    work: Work,
    deadline: Instant,
}

struct Outgoing {
    hdr: [u8; P2P_HEADER_LEN],
    hdr_done: usize,
    body_done: usize,
    buf: HostTensor,
    work: Work,
    deadline: Instant,
}

enum Sink {
    Posted(Posted),
    Buffer(Vec<u8>),
    Discard(Vec<u8>),
}

enum Incoming {
    Header { hdr: [u8; P2P_HEADER_LEN], done: usize },
    Body { tag: i64, done: usize, sink: Sink },
}

struct Peer {
    stream: TcpStream,
    addr: String,
    dead: Option<String>,
    out: VecDeque<Outgoing>,
    inc: Incoming,
}

struct Running {
    tx: mpsc::Sender<Req>,
    waker: Arc<Waker>,
    handle: Option<JoinHandle<()>>,
}

enum State {
    Idle(Vec<Option<Conn>>),
    Running(Running),
    Closed,
}

pub struct P2pEngine {
    rank: Rank,
    size: usize,
    group: String,
    state: Mutex<State>,
    seq: Mutex<u64>,
}

const WAKE: Token = Token(usize::MAX);

impl P2pEngine {
    pub fn new(rank: Rank, size: usize, group: String, conns: Vec<Option<Conn>>) -> P2pEngine {
        P2pEngine { rank, size, group, state: Mutex::new(State::Idle(conns)), seq: Mutex::new(0) }
    }

    fn start(&self, conns: Vec<Option<Conn>>) -> Result<Running> {
        let poll = Poll::new().map_err(|e| Error::Internal(format!("p2p poll: {e}")))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE).map_err(|e| Error::Internal(format!("p2p waker: {e}")))?);
        let mut peers = Vec::with_capacity(self.size);
        for (p, c) in conns.into_iter().enumerate() {
            peers.push(match c {
                Some((s, addr)) => {
                    s.set_nonblocking(true).map_err(|e| Error::Internal(e.to_string()))?;
                    let mut stream = TcpStream::from_std(s);
                    poll.registry()
                        .register(&mut stream, Token(p), Interest::READABLE | Interest::WRITABLE)
                        .map_err(|e| Error::Internal(e.to_string()))?;
                    Some(Peer {
                        stream,
                        addr,
                        dead: None,
                        out: VecDeque::new(),
                        inc: Incoming::Header { hdr: [0; P2P_HEADER_LEN], done: 0 },
                    })
                }
                None => None,
            });
        }
        let (tx, rx) = mpsc::channel();
        let mut ev = EventLoop {
            rank: self.rank,
            group: self.group.clone(),
            poll,
            peers,
            posted: Vec::new(),
            unexpected: VecDeque::new(),
            rx,
        };
        let handle = std::thread::Builder::new()
            .name(format!("rustccl-p2p-{}-r{}", self.group, self.rank))
            .spawn(move || ev.run())
            .map_err(|e| Error::Internal(format!("cannot start the p2p thread: {e}")))?;
        Ok(Running { tx, waker, handle: Some(handle) })
    }

    /// Hands a validated send or receive to the event loop.
    pub fn submit(&self, op: Op<HostTensor>, timeout: Duration, prepare: impl FnOnce(&Work)) -> Result<Work> {
        let kind = op.kind().name();
        let seq = {
            let mut s = self.seq.lock().unwrap_or_else(|p| p.into_inner());
            *s += 1;
            *s
        };
        let work = Work::new(kind, seq);
        work.mark_started();
        prepare(&work);
        let deadline = Instant::now() + timeout;
        let req = match op {
            Op::Send { buf, peer, tag } => Req::Send { peer, tag, buf, work: work.clone(), deadline },
            Op::Recv { buf, peer, tag } => Req::Recv { peer, tag, buf, work: work.clone(), deadline },
            _ => return Err(Error::Internal("collective reached the p2p engine".into())),
        };
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let State::Idle(conns) = &mut *st {
            let conns = std::mem::take(conns);
            *st = State::Running(self.start(conns)?);
        }
        match &*st {
            State::Running(r) => {
                r.tx.send(req).map_err(|_| Error::Closed { op: kind, how: "shut down" })?;
                let _ = r.waker.wake();
                Ok(work)
            }
            _ => Err(Error::Closed { op: kind, how: "shut down" }),
        }
    }

    /// Stops the event loop; pending sends and receives fail with
    /// `Error::Closed`.
    pub fn shutdown(&self) {
        let prev = std::mem::replace(&mut *self.state.lock().unwrap_or_else(|p| p.into_inner()), State::Closed);
        if let State::Running(mut r) = prev {
            drop(r.tx);
            let _ = r.waker.wake();
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
            if let State::Running(r) = &*st {
                let _ = r.waker.wake();
            }
            *st = State::Closed;
        }
    }
}

struct EventLoop {
    rank: Rank,
    group: String,
    poll: Poll,
    peers: Vec<Option<Peer>>,
    posted: Vec<Posted>,
    unexpected: VecDeque<(Rank, i64, Vec<u8>)>,
    rx: mpsc::Receiver<Req>,
}

fn site(work: &Work, group: &str) -> OpSite {
    OpSite { op: work.op(), seq: work.seq(), group: group.to_string() }
}

impl EventLoop {
    /// Only peers with something to do are pumped: those the poll reported
    /// (mio is edge-triggered, and both pumps go on until `WouldBlock`) and
    /// those a new send was queued for, so an iteration costs system calls
    /// for the active peers, not for the whole group.
    fn run(&mut self) {
        let mut events = Events::with_capacity(64);
        let n = self.peers.len();
        let (mut pump_in, mut pump_out) = (vec![true; n], vec![true; n]);
        loop {
            let mut moved = false;
            loop {
                match self.rx.try_recv() {
                    Ok(req) => {
                        moved = true;
                        if let Req::Send { peer, .. } = &req {
                            pump_out[*peer] = true;
                        }
                        self.handle(req);
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.fail_all();
                        return;
                    }
                }
            }
            for p in 0..n {
                if std::mem::take(&mut pump_out[p]) {
                    moved |= self.pump_out(p);
                }
                if std::mem::take(&mut pump_in[p]) {
                    moved |= self.pump_in(p);
                }
            }
            self.expire();
            if !moved {
                let timeout = self.next_deadline().map(|d| d.saturating_duration_since(Instant::now()));
                match self.poll.poll(&mut events, timeout) {
                    Ok(()) => {
                        for ev in events.iter() {
                            let p = ev.token().0;
                            if p < n {
                                // Any event (readable, writable, closed, error):
                                // both pumps find out which.
                                pump_in[p] = true;
                                pump_out[p] = true;
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        log_at!(LogLevel::Warn, "p2p poll failed: {e}");
                        std::thread::sleep(Duration::from_millis(1));
                        pump_in.fill(true);
                        pump_out.fill(true);
                    }
                }
            }
        }
    }

    fn lost(&self, p: Rank, work: &Work, why: &str) -> Error {
        Error::PeerLost {
            site: site(work, &self.group),
            rank: self.rank,
            peer: p,
            addr: self.peers[p].as_ref().map(|x| x.addr.clone()).unwrap_or_default(),
            detail: why.to_string(),
        }
    }

    fn handle(&mut self, req: Req) {
        match req {
            Req::Send { peer, tag, buf, work, deadline } => {
                let dead = self.peers[peer].as_ref().and_then(|p| p.dead.clone());
                if let Some(why) = dead {
                    let e = self.lost(peer, &work, &why);
                    drop(buf);
                    work.finish(Err(e));
                    return;
                }
                let hdr = P2pHeader { tag, len: buf.nbytes() as u64 }.encode();
                if let Some(p) = self.peers[peer].as_mut() {
                    p.out.push_back(Outgoing { hdr, hdr_done: 0, body_done: 0, buf, work, deadline });
                }
            }
            Req::Recv { peer, tag, mut buf, work, deadline } => {
                if let Some(q) = peer {
                    let dead = self.peers[q].as_ref().and_then(|p| p.dead.clone());
                    if let Some(why) = dead {
                        let e = self.lost(q, &work, &why);
                        drop(buf);
                        work.finish(Err(e));
                        return;
                    }
                }
                let found = self.unexpected.iter().position(|(p, t, _)| *t == tag && peer.is_none_or(|q| q == *p));
                match found {
                    Some(i) => {
                        let (p, _, data) = self.unexpected.remove(i).expect("index from position");
                        let r = deliver(&mut buf, &data, p, tag);
                        drop(buf);
                        work.set_source(p);
                        work.finish(r);
                    }
                    None => self.posted.push(Posted { posted_at: Instant::now(), peer, tag, buf, work, deadline }),
                }
            }
        }
    }

    fn pump_out(&mut self, p: Rank) -> bool {
        let mut moved = false;
        loop {
            let Some(peer) = self.peers[p].as_mut() else { return moved };
            if peer.dead.is_some() {
                return moved;
            }
            let Some(o) = peer.out.front_mut() else { return moved };
            let body = o.buf.bytes();
            let bufs = [IoSlice::new(&o.hdr[o.hdr_done..]), IoSlice::new(&body[o.body_done..])];
            match peer.stream.write_vectored(&bufs) {
                Ok(0) => return self.kill(p, "connection closed (wrote 0 bytes)".into()) || moved,
                Ok(mut k) => {
                    moved = true;
                    let h = (P2P_HEADER_LEN - o.hdr_done).min(k);
                    o.hdr_done += h;
                    k -= h;
                    o.body_done += k;
                    if o.hdr_done == P2P_HEADER_LEN && o.body_done == body.len() {
                        let o = peer.out.pop_front().expect("front exists");
                        drop(o.buf);
                        o.work.finish(Ok(()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return moved,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.kill(p, format!("sending failed: {e}")) || moved,
            }
        }
    }

    fn pump_in(&mut self, p: Rank) -> bool {
        let mut moved = false;
        loop {
            let Some(peer) = self.peers[p].as_mut() else { return moved };
            if peer.dead.is_some() {
                return moved;
            }
            let r = match &mut peer.inc {
                Incoming::Header { hdr, done } => peer.stream.read(&mut hdr[*done..]),
                Incoming::Body { done, sink, .. } => {
                    let target: &mut [u8] = match sink {
                        Sink::Posted(r) => r.buf.bytes_mut(),
                        Sink::Buffer(v) | Sink::Discard(v) => v,
                    };
                    if *done == target.len() {
                        Ok(0) // unreachable in practice: completed bodies are popped at once
                    } else {
                        peer.stream.read(&mut target[*done..])
                    }
                }
            };
            match r {
                Ok(0) => return self.kill(p, "connection closed by peer".into()) || moved,
                Ok(k) => {
                    moved = true;
                    if let Err(why) = self.advance(p, k) {
                        return self.kill(p, why) || moved;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return moved,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.kill(p, format!("receiving failed: {e}")) || moved,
            }
        }
    }

    /// Accounts for `k` bytes read from peer `p` and moves its incoming
    /// state machine on.
    fn advance(&mut self, p: Rank, k: usize) -> std::result::Result<(), String> {
        let peer = self.peers[p].as_mut().expect("live peer");
        match &mut peer.inc {
            Incoming::Header { hdr, done } => {
                *done += k;
                if *done < P2P_HEADER_LEN {
                    return Ok(());
                }
                let h = P2pHeader::decode(hdr)?;
                let len = h.len as usize;
                let found = self.posted.iter().position(|r| r.tag == h.tag && r.peer.is_none_or(|q| q == p));
                let sink = match found {
                    Some(i) => {
                        let r = self.posted.remove(i);
                        if r.buf.nbytes() != len {
                            let e = size_mismatch(r.work.op(), r.buf.nbytes(), len, p, h.tag);
                            drop(r.buf);
                            r.work.finish(Err(e));
                            Sink::Discard(vec![0; len])
                        } else {
                            Sink::Posted(r)
                        }
                    }
                    None => Sink::Buffer(vec![0; len]),
                };
                self.peers[p].as_mut().expect("live peer").inc = Incoming::Body { tag: h.tag, done: 0, sink };
                self.maybe_finish_body(p);
            }
            Incoming::Body { done, .. } => {
                *done += k;
                self.maybe_finish_body(p);
            }
        }
        Ok(())
    }

    fn maybe_finish_body(&mut self, p: Rank) {
        let peer = self.peers[p].as_mut().expect("live peer");
        let Incoming::Body { tag, done, sink } = &peer.inc else { return };
        let len = match sink {
            Sink::Posted(r) => r.buf.nbytes(),
            Sink::Buffer(v) | Sink::Discard(v) => v.len(),
        };
        if *done < len {
            return;
        }
        let tag = *tag;
        let inc = std::mem::replace(&mut peer.inc, Incoming::Header { hdr: [0; P2P_HEADER_LEN], done: 0 });
        let Incoming::Body { sink, .. } = inc else { return };
        match sink {
            Sink::Posted(r) => {
                drop(r.buf);
                r.work.set_source(p);
                r.work.finish(Ok(()));
            }
            Sink::Buffer(data) => {
                let found = self.posted.iter().position(|r| r.tag == tag && r.peer.is_none_or(|q| q == p));
                match found {
                    Some(i) => {
                        let mut r = self.posted.remove(i);
                        let res = deliver(&mut r.buf, &data, p, tag);
                        drop(r.buf);
                        r.work.set_source(p);
                        r.work.finish(res);
                    }
                    None => self.unexpected.push_back((p, tag, data)),
                }
            }
            Sink::Discard(_) => {}
        }
    }

    /// Marks peer `p` dead and fails everything waiting on it. Returns true.
    fn kill(&mut self, p: Rank, why: String) -> bool {
        log_at!(LogLevel::Warn, "p2p rank {} <-> rank {p}: {why}", self.rank);
        let Some(peer) = self.peers[p].as_mut() else { return true };
        peer.dead = Some(why.clone());
        let outs: Vec<Outgoing> = peer.out.drain(..).collect();
        let inc = std::mem::replace(&mut peer.inc, Incoming::Header { hdr: [0; P2P_HEADER_LEN], done: 0 });
        for o in outs {
            let e = self.lost(p, &o.work, &why);
            drop(o.buf);
            o.work.finish(Err(e));
        }
        if let Incoming::Body { sink: Sink::Posted(r), .. } = inc {
            let e = self.lost(p, &r.work, &why);
            drop(r.buf);
            r.work.finish(Err(e));
        }
        let (dead, keep): (Vec<Posted>, Vec<Posted>) =
            std::mem::take(&mut self.posted).into_iter().partition(|r| r.peer == Some(p));
        self.posted = keep;
        for r in dead {
            let e = self.lost(p, &r.work, &why);
            drop(r.buf);
            r.work.finish(Err(e));
        }
        true
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let (late, keep): (Vec<Posted>, Vec<Posted>) =
            std::mem::take(&mut self.posted).into_iter().partition(|r| r.deadline <= now);
        self.posted = keep;
        for r in late {
            let waiting = match r.peer {
                Some(q) => vec![q],
                None => (0..self.peers.len()).filter(|&q| q != self.rank).collect(),
            };
            let e = Error::Timeout {
                site: site(&r.work, &self.group),
                rank: self.rank,
                waiting,
                elapsed: now.saturating_duration_since(r.posted_at),
            };
            drop(r.buf);
            r.work.finish(Err(e));
        }
        for p in 0..self.peers.len() {
            let stuck = self.peers[p]
                .as_ref()
                .and_then(|x| x.out.front())
                .is_some_and(|o| o.deadline <= now);
            if stuck {
                self.kill(p, "send Timed out (the peer is not reading)".into());
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let posted = self.posted.iter().map(|r| r.deadline);
        let outs = self.peers.iter().flatten().filter_map(|p| p.out.front().map(|o| o.deadline));
        posted.chain(outs).min()
    }

    fn fail_all(&mut self) {
        for r in std::mem::take(&mut self.posted) {
            drop(r.buf);
            r.work.finish(Err(Error::Closed { op: "recv", how: "shut down" }));
        }
        for peer in self.peers.iter_mut().flatten() {
            for o in peer.out.drain(..) {
                drop(o.buf);
                o.work.finish(Err(Error::Closed { op: "send", how: "shut down" }));
            }
            let inc = std::mem::replace(&mut peer.inc, Incoming::Header { hdr: [0; P2P_HEADER_LEN], done: 0 });
            if let Incoming::Body { sink: Sink::Posted(r), .. } = inc {
                drop(r.buf);
                r.work.finish(Err(Error::Closed { op: "recv", how: "shut down" }));
            }
        }
    }
}

fn size_mismatch(op: &'static str, want: usize, got: usize, from: Rank, tag: i64) -> Error {
    Error::invalid(
        op,
        format!("the receive buffer has {want} bytes but rank {from} sent {got} bytes (tag {tag})"),
    )
}

fn deliver(buf: &mut HostTensor, data: &[u8], from: Rank, tag: i64) -> Result<()> {
    if buf.nbytes() != data.len() {
        return Err(size_mismatch("recv", buf.nbytes(), data.len(), from, tag));
    }
    buf.bytes_mut().copy_from_slice(data);
    Ok(())
}
