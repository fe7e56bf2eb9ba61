//! The point-to-point engine's thread: matches incoming messages with
//! posted receives (MPI rules: by source and tag, in posting order; the
//! rest waits in an "unexpected" queue) and writes queued sends in order,
//! over whichever link a peer has (`link.rs`); large messages to ranks of
//! this host by rendezvous (`rendezvous.rs`).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::link::Waiter;
use super::{Incoming, Outgoing, Peer, Posted, Req, Sink, Split, Unexpected};
use crate::error::{Error, OpSite, Result};
use crate::tensor::CpuTensor;
use crate::transport::frame::{self, P2pHeader, P2pKind, P2P_HEADER_LEN};
use crate::transport::shm::{Channel, ShmLocal};
use crate::types::Rank;
use crate::work::Work;

pub(super) struct EventLoop {
    pub(super) rank: Rank,
    pub(super) group: String,
    pub(super) peers: Vec<Option<Peer>>,
    pub(super) posted: Vec<Posted>,
    pub(super) unexpected: VecDeque<(Rank, i64, Unexpected)>,
    rx: mpsc::Receiver<Req>,
    /// This host's ranks, when cross-memory attach is on (rendezvous).
    pub(super) attach: Option<Arc<ShmLocal>>,
    /// Our staged send (peer, id, whether it was one by value) whose
    /// receiver has not acked yet: our staging area is theirs until then.
    pub(super) staged: Option<(Rank, u64, bool)>,
    /// The number of our last staged send (`ShmLocal::stage_in`).
    pub(super) stage_seq: u64,
    /// Receives whose second half their sender is writing (`split.rs`).
    pub(super) splits: Vec<Split>,
    /// Peers to read from / write to on the next pass (besides every
    /// shared-memory peer), and those whose connection to look at.
    pump_in: Vec<bool>,
    pump_out: Vec<bool>,
    pub(super) watch: Vec<bool>,
    pub(super) shm: Vec<bool>,
    /// The engine shut down: everything pending has failed.
    pub(super) exited: bool,
    /// The group's timeout (`P2pEngine::new`).
    pub(super) timeout: Duration,
}

/// What one pass did.
pub(super) enum Pass {
    Moved,
    Idle,
    Exit,
}

pub(super) fn site(work: &Work, group: &str) -> OpSite {
    OpSite { op: work.op(), seq: work.seq(), group: group.into() }
}

fn lock(ev: &Mutex<EventLoop>) -> MutexGuard<'_, EventLoop> {
    // A pass that panicked left the state as it was between two steps;
    // recover the guard regardless.
    ev.lock().unwrap_or_else(|p| p.into_inner())
}

/// The engine's thread: passes while something moves, sleeps on `waiter`
/// when nothing does. Threads waiting for a point-to-point work run passes
/// too (`driver::Driver`), between the thread's.
pub(super) fn run(ev: Arc<Mutex<EventLoop>>, mut waiter: Waiter) {
    let mut ready = vec![false; lock(&ev).peers.len()];
    let wake = waiter.shm();
    loop {
        waiter.arm();
        let (pass, deadline, busy) = {
            let mut e = lock(&ev);
            for (p, r) in ready.iter_mut().enumerate() {
                // Any event (readable, writable, closed, error): both
                // pumps find out which.
                if std::mem::take(r) {
                    e.pump_in[p] = true;
                    e.pump_out[p] = true;
                }
            }
            let e = &mut *e;
            waiter.take_ready(&mut e.pump_in, &mut e.pump_out, &mut e.watch);
            (e.pass(), e.next_deadline(), e.busy())
        };
        if let Some(local) = &wake {
            // A waiter that drives the loop itself while the cores are
            // taken sleeps on this word (`Work::wait`): wake it for the
            // work this pass may have finished.
            local.mine().wake_if_asleep_on(Channel::P2p);
        }
        match pass {
            Pass::Exit => return,
            Pass::Moved if !waiter.defers(busy) => {}
            Pass::Moved | Pass::Idle => waiter.wait(deadline.map(|d| d.saturating_duration_since(Instant::now())), &mut ready, busy),
        }
    }
}

impl EventLoop {
    pub(super) fn new(
        rank: Rank,
        group: String,
        peers: Vec<Option<Peer>>,
        rx: mpsc::Receiver<Req>,
        attach: Option<Arc<ShmLocal>>,
        timeout: Duration,
    ) -> EventLoop {
        let n = peers.len();
        let shm = peers.iter().map(|p| p.as_ref().is_some_and(|p| p.link.is_shm())).collect();
        EventLoop {
            rank,
            group,
            peers,
            posted: Vec::new(),
            unexpected: VecDeque::new(),
            rx,
            attach,
            staged: None,
            stage_seq: 0,
            splits: Vec::new(),
            pump_in: vec![true; n],
            pump_out: vec![true; n],
            watch: vec![false; n],
            shm,
            exited: false,
            timeout,
        }
    }

    /// Anything left for the engine's thread: receives posted, messages
    /// queued or awaiting their acks, split receives, a staged send.
    /// (A request still in the channel was announced to the thread:
    /// `P2pEngine::submit`, `Driving::request`.)
    pub(super) fn busy(&self) -> bool {
        let peers = self.peers.iter().flatten().any(|p| !p.out.is_empty() || !p.awaiting.is_empty());
        !self.posted.is_empty() || peers || !self.splits.is_empty() || self.staged.is_some()
    }

    /// One pass: new requests, then the peers with something to do: those
    /// the poll reported (mio is edge-triggered, and both pumps go on until
    /// `WouldBlock`), those a new send was queued for, and every
    /// shared-memory peer (a look at its ring is one atomic load), so a
    /// pass costs system calls for the active TCP peers, not for the whole
    /// group; then deaths and deadlines.
    pub(super) fn pass(&mut self) -> Pass {
        if self.exited {
            return Pass::Exit;
        }
        let Some(mut moved) = self.take_requests() else { return Pass::Exit };
        for p in 0..self.peers.len() {
            if std::mem::take(&mut self.pump_out[p]) || self.shm[p] {
                moved |= self.pump_out(p);
            }
            if std::mem::take(&mut self.pump_in[p]) || self.shm[p] {
                moved |= self.pump_in(p);
            }
        }
        self.check_alive();
        self.expire();
        if moved {
            Pass::Moved
        } else {
            Pass::Idle
        }
    }

    /// Handles the requests in the channel, in order: whether there were
    /// any; None once the engine shut down (the channel closed), when
    /// everything pending failed.
    pub(super) fn take_requests(&mut self) -> Option<bool> {
        let mut took = false;
        loop {
            match self.rx.try_recv() {
                Ok(req) => {
                    took = true;
                    if let Req::Send { peer, .. } = &req {
                        self.pump_out[*peer] = true;
                    }
                    self.handle(req);
                }
                Err(mpsc::TryRecvError::Empty) => return Some(took),
                Err(mpsc::TryRecvError::Disconnected) => {
                    // Acks and answers already queued go out first (as far
                    // as the links take them now): their senders wait.
                    for p in 0..self.peers.len() {
                        self.pump_out(p);
                    }
                    self.fail_all();
                    self.exited = true;
                    return None;
                }
            }
        }
    }

    pub(super) fn handle(&mut self, req: Req) {
        match req {
            Req::Send { peer, tag, buf, work, deadline } => {
                let dead = self.peers[peer].as_ref().and_then(|p| p.dead.clone());
                if let Some(why) = dead {
                    let e = self.lost(peer, &work, &why);
                    drop(buf);
                    work.finish(Err(e));
                    return;
                }
                let (rdv, seq) = self.route_send(peer, buf.bytes());
                if let Some(r) = self.route_of(peer, rdv, seq.is_some()) {
                    work.set_route(r);
                }
                let now = Instant::now();
                let mut to_stage = None;
                if let Some(p) = self.peers[peer].as_mut() {
                    let len = buf.nbytes() as u64;
                    let dtype = frame::dtype_code(buf.dtype());
                    let o = if rdv || seq.is_some() {
                        let id = p.next_id;
                        p.next_id += 1;
                        if let Some(seq) = seq {
                            // The bytes go to our staging area (ours again
                            // on the ack) right after this message: the
                            // send completes once both are done.
                            self.staged = Some((peer, id, !rdv));
                            let hdr = P2pHeader { kind: P2pKind::Staged, dtype, tag, len }.encode();
                            let ctl = frame::rendezvous_body(seq, id);
                            to_stage = Some((seq, buf, work));
                            Outgoing {
                                hdr,
                                hdr_done: 0,
                                body_done: 0,
                                ctl: Some(ctl),
                                buf: None,
                                work: None,
                                rdv: None,
                                staged: true,
                                posted_at: now,
                                deadline,
                            }
                        } else {
                            let hdr = P2pHeader { kind: P2pKind::Rendezvous, dtype, tag, len }.encode();
                            let ctl = frame::rendezvous_body(buf.bytes().as_ptr() as u64, id);
                            Outgoing {
                                hdr,
                                hdr_done: 0,
                                body_done: 0,
                                ctl: Some(ctl),
                                buf: Some(buf),
                                work: Some(work),
                                rdv: Some(id),
                                staged: false,
                                posted_at: now,
                                deadline,
                            }
                        }
                    } else {
                        let hdr = P2pHeader { kind: P2pKind::Data, dtype, tag, len }.encode();
                        Outgoing {
                            hdr,
                            hdr_done: 0,
                            body_done: 0,
                            ctl: None,
                            buf: Some(buf),
                            work: Some(work),
                            rdv: None,
                            staged: false,
                            posted_at: now,
                            deadline,
                        }
                    };
                    p.out.push_back(o);
                }
                if let Some((seq, buf, work)) = to_stage {
                    self.stage_send(peer, seq, buf, work);
                }
            }
            Req::Recv { peer, tag, mut buf, work, deadline } => {
                // What a peer sent before it left is still received (a
                // script's last send, then its exit); only then does a
                // receive from it fail.
                let found = self.unexpected.iter().position(|(p, t, _)| *t == tag && peer.is_none_or(|q| q == *p));
                if let (None, Some(q)) = (found, peer) {
                    let dead = self.peers[q].as_ref().and_then(|p| p.dead.clone());
                    if let Some(why) = dead {
                        let e = self.lost(q, &work, &why);
                        drop(buf);
                        work.finish(Err(e));
                        return;
                    }
                }
                let now = Instant::now();
                match found {
                    Some(i) => match self.unexpected.remove(i).expect("index from position") {
                        (p, _, Unexpected::Data(data, dtype, how)) => {
                            let r = deliver(&mut buf, &data, dtype, p, tag);
                            drop(buf);
                            work.arrived(p, how);
                            work.finish(r);
                        }
                        (p, _, Unexpected::Rendezvous(rdv)) => {
                            let posted = Posted { posted_at: now, peer, tag, buf, work, deadline };
                            self.take(p, rdv, posted);
                        }
                    },
                    None => self.posted.push(Posted { posted_at: now, peer, tag, buf, work, deadline }),
                }
            }
        }
    }

    pub(super) fn pump_out(&mut self, p: Rank) -> bool {
        let mut moved = false;
        loop {
            let Some(peer) = self.peers[p].as_mut() else { return moved };
            if peer.dead.is_some() {
                return moved;
            }
            let Some(o) = peer.out.front_mut() else {
                // Through TLS, the last message's sealed records may still
                // wait for room in the socket.
                return match peer.link.flushed() {
                    Ok(_) => moved,
                    Err(e) => self.kill(p, format!("sending failed: {e}")) || moved,
                };
            };
            let body: &[u8] = match (&o.ctl, &o.buf) {
                (Some(c), _) => c,
                (None, Some(b)) => b.bytes(),
                (None, None) => &[],
            };
            match peer.link.write_some(&o.hdr[o.hdr_done..], &body[o.body_done..]) {
                Ok(0) => return self.kill(p, "connection closed (wrote 0 bytes)".into()) || moved,
                Ok(mut k) => {
                    moved = true;
                    let h = (P2P_HEADER_LEN - o.hdr_done).min(k);
                    o.hdr_done += h;
                    k -= h;
                    o.body_done += k;
                    if o.hdr_done == P2P_HEADER_LEN && o.body_done == body.len() {
                        let o = peer.out.pop_front().expect("front exists");
                        peer.link.written();
                        match (o.rdv, o.buf) {
                            (Some(id), Some(buf)) => {
                                let (work, posted_at, deadline) = (o.work, o.posted_at, o.deadline);
                                peer.awaiting.push(super::Awaiting { id, buf, work, posted_at, deadline });
                            }
                            (_, buf) => {
                                drop(buf);
                                if let Some(w) = o.work {
                                    w.finish(Ok(()));
                                }
                            }
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return moved,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.kill(p, format!("sending failed: {e}")) || moved,
            }
        }
    }

    pub(super) fn pump_in(&mut self, p: Rank) -> bool {
        let mut moved = false;
        loop {
            let Some(peer) = self.peers[p].as_mut() else { return moved };
            if peer.dead.is_some() {
                return moved;
            }
            let r = match &mut peer.inc {
                Incoming::Header { hdr, done } => peer.link.read_some(&mut hdr[*done..]),
                Incoming::Body { done, sink, .. } => {
                    let target: &mut [u8] = match sink {
                        Sink::Posted(r) => r.buf.bytes_mut(),
                        Sink::Buffer(v, _) | Sink::Discard(v) | Sink::Control { data: v, .. } => v,
                    };
                    if *done == target.len() {
                        Ok(0) // unreachable in practice: completed bodies are popped at once
                    } else {
                        peer.link.read_some(&mut target[*done..])
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
                let sink = match h.kind {
                    P2pKind::Rendezvous | P2pKind::Staged | P2pKind::PushRequest => {
                        Sink::Control { kind: h.kind, len: h.len, dtype: h.dtype, data: vec![0; frame::RENDEZVOUS_BODY_LEN] }
                    }
                    P2pKind::Ack | P2pKind::Pushed if len <= frame::ACK_MAX => {
                        Sink::Control { kind: h.kind, len: h.len, dtype: 0, data: vec![0; len] }
                    }
                    P2pKind::Ack | P2pKind::Pushed => return Err(format!("bad point-to-point {:?} ({len} bytes of text)", h.kind)),
                    P2pKind::Data => match found {
                        Some(i) => {
                            let r = self.posted.remove(i);
                            if let Some(e) = mismatch(r.work.op(), &r.buf, len, h.dtype, p, h.tag) {
                                drop(r.buf);
                                r.work.finish(Err(e));
                                Sink::Discard(vec![0; len])
                            } else {
                                Sink::Posted(r)
                            }
                        }
                        None => Sink::Buffer(vec![0; len], h.dtype),
                    },
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
            Sink::Buffer(v, _) | Sink::Discard(v) | Sink::Control { data: v, .. } => v.len(),
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
                r.work.arrived(p, self.route_of(p, false, false));
                r.work.finish(Ok(()));
            }
            Sink::Buffer(data, dtype) => {
                let found = self.posted.iter().position(|r| r.tag == tag && r.peer.is_none_or(|q| q == p));
                match found {
                    Some(i) => {
                        let mut r = self.posted.remove(i);
                        let res = deliver(&mut r.buf, &data, dtype, p, tag);
                        drop(r.buf);
                        r.work.arrived(p, self.route_of(p, false, false));
                        r.work.finish(res);
                    }
                    None => self.unexpected.push_back((p, tag, Unexpected::Data(data, dtype, self.route_of(p, false, false)))),
                }
            }
            Sink::Discard(_) => {}
            Sink::Control { kind: k @ (P2pKind::Rendezvous | P2pKind::Staged), len, dtype, data } => {
                self.on_rendezvous(p, tag, len, dtype, &data, k == P2pKind::Staged)
            }
            Sink::Control { kind: P2pKind::PushRequest, len, data, .. } => self.on_push_request(p, tag as u64, len, &data),
            Sink::Control { kind: P2pKind::Pushed, data, .. } => self.on_pushed(p, tag as u64, data),
            Sink::Control { data, .. } => self.on_ack(p, tag as u64, data),
        }
    }
}

/// The error of a receive into `buf` of a message of `got` bytes of dtype
/// `dtype` (`frame::dtype_code`) from `from`, where they do not match.
pub(super) fn mismatch(op: &'static str, buf: &CpuTensor, got: usize, dtype: u8, from: Rank, tag: i64) -> Option<Error> {
    let want = frame::dtype_code(buf.dtype());
    if buf.nbytes() == got && want == dtype {
        return None;
    }
    let sent = match frame::dtype_from_code(dtype).and_then(|d| got.checked_div(d.size())) {
        Some(n) => format!("{n} x {} ({got} bytes)", frame::dtype_name(dtype)),
        None => format!("{} ({got} bytes)", frame::dtype_name(dtype)),
    };
    Some(Error::invalid(
        op,
        format!(
            "the receive buffer is {} x {} ({} bytes) but rank {from} sent {sent} (tag {tag}): pass the same dtype and number of elements to the send and the recv",
            buf.numel(),
            buf.dtype().name(),
            buf.nbytes()
        ),
    ))
}

fn deliver(buf: &mut CpuTensor, data: &[u8], dtype: u8, from: Rank, tag: i64) -> Result<()> {
    if let Some(e) = mismatch("recv", buf, data.len(), dtype, from, tag) {
        return Err(e);
    }
    buf.bytes_mut().copy_from_slice(data);
    Ok(())
}
