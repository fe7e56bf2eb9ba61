//! How the point-to-point engine fails what waits: a peer whose link
//! closed is dead and everything waiting on it fails with the cause;
//! receives and sends past their deadline time out; a shut-down engine
//! fails everything pending.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::event_loop::{site, EventLoop};
use super::{Incoming, Outgoing, Posted, Sink};
use crate::config::log_at;
use crate::config::LogLevel;
use crate::error::Error;
use crate::transport::frame::P2P_HEADER_LEN;
use crate::types::Rank;
use crate::work::Work;

impl EventLoop {
    /// Shared-memory peers whose watched connection reported something (or
    /// all of them, now and then): one that closed is dead. Runs after the
    /// pumps, so what a peer wrote before it died is still delivered.
    pub(super) fn check_alive(&mut self) {
        for p in 0..self.watch.len() {
            if !std::mem::take(&mut self.watch[p]) {
                continue;
            }
            let why = match &self.peers[p] {
                Some(peer) if peer.dead.is_none() => peer.link.alive().err(),
                _ => None,
            };
            if let Some(why) = why {
                // What the peer wrote into its ring before it left may
                // have landed after this pass read the ring: read it first.
                self.pump_in(p);
                if self.peers[p].as_ref().is_some_and(|x| x.dead.is_none()) {
                    self.kill(p, why);
                }
            }
        }
    }

    pub(super) fn lost(&self, p: Rank, work: &Work, why: &str) -> Error {
        Error::PeerLost {
            site: site(work, &self.group),
            rank: self.rank,
            peer: p,
            addr: self.peers[p].as_ref().map(|x| x.addr.clone()).unwrap_or_default(),
            detail: why.to_string(),
        }
    }

    /// Marks peer `p` dead and fails everything waiting on it. Returns true.
    pub(super) fn kill(&mut self, p: Rank, why: String) -> bool {
        log_at!(LogLevel::Warn, "p2p rank {} <-> rank {p}: {why}", self.rank);
        let Some(peer) = self.peers[p].as_mut() else { return true };
        peer.dead = Some(why.clone());
        peer.link.close();
        if self.staged.is_some_and(|(q, _, _)| q == p) {
            // It will never read (or ack) our staged send.
            self.staged = None;
        }
        let outs: Vec<Outgoing> = peer.out.drain(..).collect();
        let awaiting = std::mem::take(&mut peer.awaiting);
        let inc = std::mem::replace(&mut peer.inc, Incoming::Header { hdr: [0; P2P_HEADER_LEN], done: 0 });
        let sends = outs.into_iter().map(|o| (o.buf, o.work)).chain(awaiting.into_iter().map(|a| (Some(a.buf), a.work)));
        for (buf, work) in sends {
            drop(buf);
            if let Some(w) = work {
                let e = self.lost(p, &w, &why);
                w.finish(Err(e));
            }
        }
        if let Incoming::Body { sink: Sink::Posted(r), .. } = inc {
            let e = self.lost(p, &r.work, &why);
            drop(r.buf);
            r.work.finish(Err(e));
        }
        self.drop_splits_of(p, &why);
        let (dead, keep): (Vec<Posted>, Vec<Posted>) = std::mem::take(&mut self.posted).into_iter().partition(|r| r.peer == Some(p));
        self.posted = keep;
        for r in dead {
            let e = self.lost(p, &r.work, &why);
            drop(r.buf);
            r.work.finish(Err(e));
        }
        true
    }

    pub(super) fn expire(&mut self) {
        let now = Instant::now();
        // Runs on every pass (waiting callers' too): allocates only when
        // something expired.
        if !self.posted.iter().any(|r| r.deadline <= now) {
            self.expire_sends(now);
            return;
        }
        let (late, keep): (Vec<Posted>, Vec<Posted>) = std::mem::take(&mut self.posted).into_iter().partition(|r| r.deadline <= now);
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
        self.expire_sends(now);
    }

    /// Sends whose peer stopped reading, and rendezvous sends never acked.
    pub(super) fn expire_sends(&mut self, now: Instant) {
        for p in 0..self.peers.len() {
            let stuck = self.peers[p].as_ref().and_then(|x| x.out.front()).is_some_and(|o| o.deadline <= now);
            if stuck {
                self.kill(p, "send Timed out (the peer is not reading)".into());
            }
        }
        self.expire_rendezvous(now);
        self.expire_splits(now);
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let posted = self.posted.iter().map(|r| r.deadline);
        let outs = self.peers.iter().flatten().filter_map(|p| p.out.front().map(|o| o.deadline));
        let acks = self.peers.iter().flatten().flat_map(|p| p.awaiting.iter().filter(|a| a.work.is_some()).map(|a| a.deadline));
        posted.chain(outs).chain(acks).chain(self.next_split_deadline()).min()
    }

    pub(super) fn fail_all(&mut self) {
        self.close_splits();
        for r in std::mem::take(&mut self.posted) {
            drop(r.buf);
            r.work.finish(Err(Error::Closed { op: "recv", how: "shut down" }));
        }
        for peer in self.peers.iter_mut().flatten() {
            peer.link.close();
            let awaiting = std::mem::take(&mut peer.awaiting).into_iter().map(|a| (Some(a.buf), a.work));
            for (buf, work) in peer.out.drain(..).map(|o| (o.buf, o.work)).chain(awaiting) {
                drop(buf);
                if let Some(w) = work {
                    w.finish(Err(Error::Closed { op: "send", how: "shut down" }));
                }
            }
            let inc = std::mem::replace(&mut peer.inc, Incoming::Header { hdr: [0; P2P_HEADER_LEN], done: 0 });
            if let Incoming::Body { sink: Sink::Posted(r), .. } = inc {
                drop(r.buf);
                r.work.finish(Err(Error::Closed { op: "recv", how: "shut down" }));
            }
        }
    }
}
