//! The communicator's transport: one link per peer, TCP (any host) or
//! shared memory (same host), driven by one progress loop on the worker
//! thread.
//!
//! `exchange` steps every transfer it can; when nothing moved it waits:
//! in `mio::Poll` for TCP links, spinning briefly then sleeping on this
//! rank's futex word for shared-memory links (with short polls when both
//! kinds are pending), always bounded by the operation's deadline. Errors
//! name both ends of the link.
#![forbid(unsafe_code)]

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::frame::{Header, Seen, HEADER_LEN};
use super::shm::{self, Blocked, PhaseWait, ShmLink, ShmLocal, ShmSetup, WaitWindow, Window};
use super::tcp::TcpLink;
use super::{check_peers, interrupted_error, timeout_error, Interrupter, OpCtx, Progress, Step, Transport, Xfer};
use crate::bootstrap::Conn;
use crate::error::{Error, OpSite, Result};
use crate::types::Rank;

mod abort;
mod wait;

pub enum Link {
    Tcp(TcpLink),
    Shm(ShmLink),
}

const WAKE: Token = Token(usize::MAX);
/// How often waits check that shared-memory peers are still alive.
const ALIVE_EVERY: Duration = Duration::from_millis(50);

pub struct Mesh {
    rank: Rank,
    size: usize,
    links: Vec<Option<Link>>,
    addrs: Vec<String>,
    poll: Poll,
    events: Events,
    ctx: OpCtx,
    interrupt: Interrupter,
    local: Option<Arc<ShmLocal>>,
    /// Every rank agreed to use shared memory (see `agree_shm`).
    shm_agreed: bool,
    hosts: Arc<Vec<Vec<Rank>>>,
    kind: &'static str,
    last_alive: Instant,
    /// Our segment's `blocked` word is set (cleared when the wait ends).
    blocked: bool,
    /// We gave the group up ([`Transport::give_up`]): the word says so for good.
    gone: bool,
    /// This operation's wait saw a peer that gave the group up (it fails
    /// the next time: `publish_blocked`).
    gone_seen: bool,
    /// How long a wait for local peers polls, yielding the core between
    /// looks, before it sleeps on the futex word: a peer a few
    /// microseconds behind costs no sleep / wake-up pair. No pure
    /// spinning: with as many ranks as cores, a spinning rank holds the
    /// core its peer needs.
    window: WaitWindow,
    /// Payload bytes of a frame of a collective given up that are still to
    /// be skipped on each peer's link before its next header.
    skip: Vec<u64>,
    /// Where skipped bytes go.
    sink: Vec<u8>,
}

impl Mesh {
    /// TCP links for every peer in `tcp` that has no shared-memory link.
    /// `hosts`: every rank grouped by host.
    pub fn new(rank: Rank, size: usize, tcp: Vec<Option<Conn>>, shm: Option<ShmSetup>, hosts: Vec<Vec<Rank>>) -> io::Result<Mesh> {
        let poll = Poll::new()?;
        let mut links: Vec<Option<Link>> = (0..size).map(|_| None).collect();
        let mut addrs = vec![String::new(); size];
        let (local, shm_links) = match shm {
            Some(s) => (Some(s.local), s.links),
            None => (None, Vec::new()),
        };
        let n_shm = shm_links.len();
        for (r, link) in shm_links {
            links[r] = Some(Link::Shm(link));
        }
        let mut n_tcp = 0;
        for (p, c) in tcp.into_iter().enumerate() {
            if let Some(c) = c {
                addrs[p] = c.addr.clone();
                if links[p].is_none() {
                    let mut l = TcpLink::new(c.stream, c.addr, c.tls)?;
                    l.register(poll.registry(), Token(p))?;
                    links[p] = Some(Link::Tcp(l));
                    n_tcp += 1;
                }
            }
        }
        let kind = match (n_shm > 0, n_tcp > 0) {
            (true, true) => "shm+tcp",
            (true, false) => "shm",
            _ => "tcp",
        };
        for (p, a) in addrs.iter_mut().enumerate() {
            if matches!(links[p], Some(Link::Shm(_))) {
                *a = format!("shm:{a}");
            }
        }
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKE)?);
        let ctx = OpCtx::new(OpSite { op: "none", seq: 0, group: "".into() }, Duration::from_secs(1));
        // Without local peers nothing polls for them.
        let window = local.as_ref().map_or(WaitWindow::new(None, 1, 1, 1), |l| l.wait_window);
        Ok(Mesh {
            rank,
            size,
            links,
            addrs,
            poll,
            events: Events::with_capacity(64),
            ctx,
            interrupt: Interrupter::new(Some(waker)),
            local,
            shm_agreed: false,
            hosts: Arc::new(hosts),
            kind,
            last_alive: Instant::now(),
            blocked: false,
            gone: false,
            gone_seen: false,
            window,
            skip: vec![0; size],
            sink: Vec::new(),
        })
    }

    /// The kind of link to each peer ("shm", "tcp", "" for ourselves).
    pub fn link_kinds(&self) -> Vec<&'static str> {
        self.links
            .iter()
            .map(|l| match l {
                Some(Link::Shm(_)) => "shm",
                Some(Link::Tcp(l)) if l.is_tls() => "tls",
                Some(Link::Tcp(_)) => "tcp",
                None => "",
            })
            .collect()
    }

    /// All ranks agree whether shared-memory algorithms are usable: each
    /// says whether every link to its own host's ranks is shared memory,
    /// and they are used only if all say yes (so no rank runs a direct
    /// algorithm while another runs a link-based one).
    pub fn agree_shm(&mut self, timeout: Duration) -> crate::error::Result<bool> {
        let alone = self.hosts.iter().any(|h| h.len() == 1 && h[0] == self.rank);
        let mine = (alone || self.local.as_ref().is_some_and(|l| l.complete)) as u8;
        self.begin(OpCtx::new(OpSite { op: "setup", seq: u32::MAX as u64, group: "".into() }, timeout));
        let mut got = vec![[0u8; 1]; self.size];
        let me = [mine];
        {
            let mut x: Vec<Xfer> = Vec::new();
            for p in (0..self.size).filter(|&p| p != self.rank) {
                x.push(Xfer::Send { peer: p, data: &me });
            }
            for (p, g) in got.iter_mut().enumerate().filter(|(p, _)| *p != self.rank) {
                x.push(Xfer::Recv { peer: p, data: g });
            }
            self.exchange(&mut x)?;
        }
        let all = mine == 1 && got.iter().enumerate().all(|(p, g)| p == self.rank || g[0] == 1);
        self.shm_agreed = all;
        Ok(all)
    }

    fn lost(&self, peer: Rank, detail: String) -> Error {
        Error::PeerLost { site: self.ctx.site.clone(), rank: self.rank, peer, addr: self.addrs[peer].clone(), detail }
    }

    fn io_lost(&self, peer: Rank, e: &io::Error, what: &str) -> Error {
        // A peer closes its links when it exits and when it gives the
        // group up (`Transport::give_up`): say both.
        const WHY: &str = "the peer exited, or gave the group up after an error of its own: its log names the cause";
        let detail = match e.kind() {
            io::ErrorKind::UnexpectedEof => format!("connection closed by peer while {what} ({WHY})"),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionAborted => {
                format!("{what} failed: {e} ({WHY})")
            }
            _ => format!("{what} failed: {e}"),
        };
        self.lost(peer, detail)
    }

    fn protocol(&self, peer: Rank, detail: String) -> Error {
        Error::Protocol { site: self.ctx.site.clone(), rank: self.rank, peer, addr: self.addrs[peer].clone(), detail }
    }

    fn send_step(&mut self, peer: Rank, data: &[u8], st: &mut Progress) -> Result<Step> {
        match self.links[peer].as_mut() {
            Some(Link::Tcp(l)) => l.send_step(data, st).map_err(|e| self.io_lost(peer, &e, "sending")),
            Some(Link::Shm(l)) => {
                let mut moved = false;
                while st.hdr_done < HEADER_LEN {
                    let k = l.push(&st.hdr[st.hdr_done..]);
                    if k == 0 {
                        return Ok(Step::Blocked(moved));
                    }
                    moved = true;
                    st.advance(k);
                }
                while st.body_done < data.len() {
                    let k = l.push(&data[st.body_done..]);
                    if k == 0 {
                        return Ok(Step::Blocked(moved));
                    }
                    moved = true;
                    st.advance(k);
                }
                Ok(Step::Done)
            }
            None => Err(Error::Internal(format!("no link to rank {peer}"))),
        }
    }

    fn recv_step(&mut self, peer: Rank, data: &mut [u8], st: &mut Progress) -> Result<Step> {
        let mut moved = false;
        loop {
            if self.skip[peer] > 0 && !self.skip_step(peer, &mut moved)? {
                return Ok(Step::Blocked(moved));
            }
            let (want, len) = (self.ctx.wire(), data.len());
            let mut check = |h: &[u8; HEADER_LEN]| Header::classify(h, want, len);
            let seen = match self.links[peer].as_mut() {
                Some(Link::Tcp(l)) => match l.recv_step(data, st, &mut check) {
                    Ok(Ok(Step::Blocked(m))) => return Ok(Step::Blocked(m || moved)),
                    Ok(Ok(s)) => return Ok(s),
                    Ok(Err(seen)) => seen,
                    Err(e) => return Err(self.io_lost(peer, &e, "receiving")),
                },
                Some(Link::Shm(l)) => {
                    while st.hdr_done < HEADER_LEN {
                        let k = l.pull(&mut st.hdr[st.hdr_done..]);
                        if k == 0 {
                            return Ok(Step::Blocked(moved));
                        }
                        moved = true;
                        st.advance(k);
                    }
                    match if st.checked { Seen::Expected } else { check(&st.hdr) } {
                        Seen::Expected => {
                            st.checked = true;
                            while st.body_done < data.len() {
                                let k = l.pull(&mut data[st.body_done..]);
                                if k == 0 {
                                    return Ok(Step::Blocked(moved));
                                }
                                moved = true;
                                st.advance(k);
                            }
                            return Ok(Step::Done);
                        }
                        other => other,
                    }
                }
                None => return Err(Error::Internal(format!("no link to rank {peer}"))),
            };
            moved = true;
            self.not_expected(peer, seen, data, st)?;
        }
    }

    fn signal(&self) -> u32 {
        self.local.as_ref().map_or(0, |l| l.mine().signal().load(Ordering::Acquire))
    }

    /// Fails if one of `peers` reached over shared memory has died.
    fn check_alive(&mut self, peers: &[Rank]) -> Result<()> {
        if self.last_alive.elapsed() < ALIVE_EVERY {
            return Ok(());
        }
        self.last_alive = Instant::now();
        for &p in peers {
            if let Some(Link::Shm(l)) = &self.links[p] {
                if let Err(why) = l.alive() {
                    return Err(self.lost(p, why));
                }
            }
        }
        Ok(())
    }

    /// Before sleeping: publishes that this rank waits, at this operation,
    /// for `peers` (in a shared-memory step for phase `phase`, or for
    /// messages when None), and fails if one of those waits for this rank
    /// the other way, or gave this operation up for that reason ([`Blocked`]):
    /// the two picked different algorithms and would wait until the
    /// timeout. Then marks this rank's word `Failed`, so that its other
    /// local peers of this operation stop waiting for it too. Fails too,
    /// as a lost peer, where one of them gave the group up (`Gone`).
    fn publish_blocked(&mut self, phase: Option<u64>, peers: impl IntoIterator<Item = Rank>) -> Result<()> {
        if self.gone {
            return Ok(());
        }
        let Some(local) = self.local.clone() else { return Ok(()) };
        let idx: Vec<usize> = peers.into_iter().filter_map(|r| local.local_index(r)).collect();
        let (seq, me) = (self.ctx.wire_seq(), local.me);
        // A peer we wait for gave the group up: it publishes no phase and
        // writes no message again (any rank index: no mask needed). What it
        // did before is visible to us now, so the wait takes one more pass
        // over it before this fails (it may have been the last we needed).
        // One that gave up after finding this operation's ranks waiting the
        // two ways is left to the check below, which names that cause.
        let gone = |i: usize| match Blocked::decode(local.segs[i].blocked().load(Ordering::Acquire)) {
            Some(Blocked::Gone { seq: s, failed }) if !(failed && s == seq) => Some(s),
            _ => None,
        };
        if let Some((i, s)) = idx.iter().find_map(|&i| gone(i).map(|s| (i, s))) {
            if !std::mem::replace(&mut self.gone_seen, true) {
                return Ok(());
            }
            return Err(self.lost(local.ranks[i], format!(
                "the peer gave the group up at its operation seq {s} (an error of its own, or an abort: its log names the cause) and takes no further step"
            )));
        }
        let Some(on) = Blocked::mask(idx.iter().copied()).filter(|&m| m != 0 && me < shm::BLOCKED_RANKS) else { return Ok(()) };
        let mine = match phase {
            Some(target) => Blocked::phase(seq, target),
            None => Blocked::Message { seq, on },
        };
        local.mine().blocked().store(mine.encode(), Ordering::Release);
        self.blocked = true;
        for i in idx {
            let theirs = match Blocked::decode(local.segs[i].blocked().load(Ordering::Acquire)) {
                // It gave the group up after it found this operation's
                // ranks waiting for each other the two ways: that cause.
                Some(Blocked::Gone { seq: s, failed: true }) if s == seq => Some(Blocked::Failed { seq: s }),
                t => t,
            };
            let my_phase = local.mine().phase().load(Ordering::Acquire);
            // Bytes still in a ring between us mean a word older than them:
            // a peer that waits for our messages has not taken those we
            // pushed, and one that went on to a step after pushing the last
            // of its messages to us (its word is read after them) left us
            // those to take before we wait for it.
            let (unread, readable) = match &self.links[local.ranks[i]] {
                Some(Link::Shm(l)) => (l.unread(), l.readable()),
                _ => (false, false),
            };
            // A peer that published the phase we wait for and then went on
            // to wait for our messages (a step, then messages, in one
            // operation) set its word after that phase: read after the
            // word, the phase shows it, and our wait is over, not stuck.
            let reached = phase.is_some_and(|target| local.segs[i].phase().load(Ordering::Acquire) >= target);
            let in_flight = |b: &Blocked| match b {
                Blocked::Message { .. } => unread || reached,
                Blocked::Phase { .. } => readable,
                _ => false,
            };
            if theirs.is_some_and(|b| b.stuck_with(mine, me, my_phase, i) && !in_flight(&b)) {
                local.mine().blocked().store(Blocked::Failed { seq }.encode(), Ordering::Release);
                self.blocked = false; // left set: the peers of this operation read it
                let detail = match theirs {
                    Some(Blocked::Failed { .. }) => "peer gave this collective up: two of its ranks picked different algorithms for it".to_string(),
                    _ => format!(
                        "this rank waits for the peer's {} while the peer waits for this rank's {}: the ranks picked different algorithms for this collective (sizes on both sides of a threshold, e.g. gather / scatter blocks around RUSTCCL_SHM_SINGLE_READER_MIN_BYTES)",
                        if phase.is_some() { "shared-memory step" } else { "messages" },
                        if phase.is_some() { "messages" } else { "shared-memory step" }
                    ),
                };
                return Err(self.mismatch(local.ranks[i], detail));
            }
        }
        Ok(())
    }

    /// The wait that published [`Mesh::publish_blocked`] ended.
    fn clear_blocked(&mut self) {
        if std::mem::take(&mut self.blocked) && !self.gone {
            if let Some(l) = &self.local {
                l.mine().blocked().store(0, Ordering::Release);
            }
        }
    }

    /// Waits for something to happen on the pending links (`sig0`: our
    /// futex word before the pass that made no progress).
    fn wait(&mut self, pending: Vec<Rank>, tcp_pending: bool, shm_pending: bool, sig0: u32) -> Result<()> {
        if self.interrupt.is_set() {
            return Err(interrupted_error(self));
        }
        let now = Instant::now();
        if now >= self.ctx.deadline {
            return Err(timeout_error(self, pending));
        }
        if !shm_pending {
            return self.poll_for(Some(self.ctx.deadline - now));
        }
        // With TCP links pending too, the sockets are polled only after
        // this: no longer than the window's least.
        let window = if tcp_pending { self.window.least() } else { self.window.get() };
        let t0 = Instant::now();
        loop {
            if self.signal() != sig0 {
                return Ok(());
            }
            match &self.local {
                Some(l) if t0.elapsed() < window && !l.cores_taken() => l.pause(),
                None if t0.elapsed() < window => std::thread::yield_now(),
                _ => break,
            }
        }
        self.check_alive(&pending)?;
        self.publish_blocked(None, pending)?;
        let r = if tcp_pending {
            self.poll_for(Some(Duration::from_micros(100)))
        } else {
            let left = self.ctx.deadline.saturating_duration_since(Instant::now());
            if let Some(l) = &self.local {
                l.mine().sleep(sig0, left.min(Duration::from_millis(2)));
            }
            self.window.slept(t0.elapsed());
            Ok(())
        };
        // Awake: whatever we wait for may have come (the word would be stale).
        self.clear_blocked();
        r
    }

    fn poll_for(&mut self, timeout: Option<Duration>) -> Result<()> {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(Error::Internal(format!("poll failed: {e}"))),
        }
    }
}

impl Transport for Mesh {
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn peer_addr(&self, peer: Rank) -> String {
        self.addrs.get(peer).cloned().unwrap_or_default()
    }
    fn begin(&mut self, ctx: OpCtx) {
        self.ctx = ctx;
        self.gone_seen = false;
    }
    fn ctx(&self) -> &OpCtx {
        &self.ctx
    }
    fn interrupter(&self) -> Interrupter {
        self.interrupt.clone()
    }

    fn sever(&mut self) {
        for l in self.links.iter().flatten() {
            match l {
                Link::Tcp(t) => t.shutdown(),
                Link::Shm(s) => s.shutdown(),
            }
        }
    }

    fn give_up(&mut self, seq: u64, close_tcp: bool) {
        if let Some(l) = &self.local {
            let seq = seq as u32;
            let failed =
                matches!(Blocked::decode(l.mine().blocked().load(Ordering::Acquire)), Some(Blocked::Failed { seq: s }) if s == seq);
            l.mine().blocked().store(Blocked::Gone { seq, failed }.encode(), Ordering::Release);
            self.gone = true;
        }
        // Peers on other hosts learn it from our TCP links closing, as
        // from a crashed process's: the group never uses them again here
        // (its later operations fail as poisoned), and shrinking it goes
        // over the point-to-point links.
        if close_tcp {
            for l in self.links.iter().flatten() {
                if let Link::Tcp(t) = l {
                    t.shutdown();
                }
            }
        }
    }

    fn window(&mut self) -> Option<(Window, &mut dyn PhaseWait)> {
        if !self.shm_agreed {
            return None;
        }
        let local = self.local.clone()?;
        Some((Window::new(local), self as &mut dyn PhaseWait))
    }

    fn hosts(&self) -> Option<Arc<Vec<Vec<Rank>>>> {
        (self.shm_agreed && self.hosts.len() > 1).then(|| self.hosts.clone())
    }

    fn exchange(&mut self, xfers: &mut [Xfer<'_>]) -> Result<()> {
        let mut st = Vec::new();
        let r = match self.exchange_all(xfers, &mut st) {
            Err(e @ Error::Mismatch { .. }) => Err(self.give_up_op(xfers, &mut st, e)),
            r => r,
        };
        self.clear_blocked();
        r
    }
}

impl Mesh {
    /// `st` receives each transfer's progress (for giving the collective up
    /// after an error).
    fn exchange_all(&mut self, xfers: &mut [Xfer<'_>], st: &mut Vec<Progress>) -> Result<()> {
        check_peers(self, xfers)?;
        if self.interrupt.is_set() {
            return Err(interrupted_error(self));
        }
        let wire = self.ctx.wire();
        st.extend(xfers.iter().map(|x| match x {
            Xfer::Send { data, .. } => Progress::new(wire.header(data.len()).encode()),
            Xfer::Recv { .. } => Progress::new([0; HEADER_LEN]),
        }));
        let mut send_busy = vec![false; self.size];
        let mut recv_busy = vec![false; self.size];
        loop {
            let sig0 = self.signal();
            send_busy.iter_mut().for_each(|b| *b = false);
            recv_busy.iter_mut().for_each(|b| *b = false);
            let (mut moved, mut tcp_pending, mut shm_pending) = (false, false, false);
            let mut pending = Vec::new();
            for (x, s) in xfers.iter_mut().zip(st.iter_mut()) {
                if s.done {
                    continue;
                }
                let peer = x.peer();
                let is_send = matches!(x, Xfer::Send { .. });
                let busy = if is_send { &mut send_busy[peer] } else { &mut recv_busy[peer] };
                let step = if std::mem::replace(busy, true) {
                    Step::Blocked(false)
                } else {
                    match x {
                        Xfer::Send { peer, data } => self.send_step(*peer, data, s)?,
                        Xfer::Recv { peer, data } => self.recv_step(*peer, data, s)?,
                    }
                };
                match step {
                    Step::Done => {
                        s.done = true;
                        moved = true;
                        if is_send {
                            send_busy[peer] = false;
                        } else {
                            recv_busy[peer] = false;
                        }
                    }
                    Step::Blocked(m) => {
                        moved |= m;
                        pending.push(peer);
                        match self.links[peer] {
                            Some(Link::Shm(_)) => shm_pending = true,
                            _ => tcp_pending = true,
                        }
                    }
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if !moved {
                self.wait(pending, tcp_pending, shm_pending, sig0)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checks_name_the_mismatch() {
        let h = Header { roots: 0, seq: 3, len: 8, what: Default::default(), abort: false }.encode();
        let want = crate::transport::frame::Wire { seq: 3, roots: 0, what: Default::default() };
        assert!(Header::decode(&h).and_then(|h| h.expect(want, 4)).unwrap_err().contains("different tensor sizes"));
    }
}
