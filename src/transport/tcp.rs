//! TCP transport: one non-blocking connection per peer, driven by one
//! `mio::Poll` on the communicator's worker thread.
//!
//! `exchange` makes progress on every transfer it can (a send writes its
//! header and payload with one vectored write, a receive reads header and
//! payload with one vectored read straight into the caller's buffer) and
//! sleeps in `poll` only when nothing moved, until the operation's deadline.
//! A closed or reset connection becomes `Error::PeerLost` naming both ends.
#![forbid(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use super::frame::{Header, HEADER_LEN};
use super::{check_peers, interrupted_error, timeout_error, Interrupter, OpCtx, Transport, Xfer};
use crate::error::{Error, OpSite, Result};
use crate::types::Rank;

struct Link {
    stream: TcpStream,
    addr: String,
}

pub struct TcpTransport {
    rank: Rank,
    size: usize,
    links: Vec<Option<Link>>,
    poll: Poll,
    events: Events,
    ctx: OpCtx,
    interrupt: Interrupter,
}

const WAKE: Token = Token(usize::MAX);

/// Progress of one transfer within an `exchange`.
#[derive(Clone, Copy)]
struct Progress {
    hdr: [u8; HEADER_LEN],
    hdr_done: usize,
    body_done: usize,
    checked: bool,
    done: bool,
}

enum Step {
    Done,
    /// Would block; `true` if some bytes moved before it did.
    Blocked(bool),
}

impl TcpTransport {
    /// Wraps connected streams (`streams[p]` for each peer p, `None` for
    /// ourselves) and registers them with a fresh poller.
    pub fn new(rank: Rank, size: usize, streams: Vec<Option<(std::net::TcpStream, String)>>) -> io::Result<Self> {
        let poll = Poll::new()?;
        let mut links = Vec::with_capacity(size);
        for (p, s) in streams.into_iter().enumerate() {
            match s {
                Some((std_stream, addr)) => {
                    std_stream.set_nonblocking(true)?;
                    std_stream.set_nodelay(true)?;
                    let mut stream = TcpStream::from_std(std_stream);
                    poll.registry().register(&mut stream, Token(p), Interest::READABLE | Interest::WRITABLE)?;
                    links.push(Some(Link { stream, addr }));
                }
                None => links.push(None),
            }
        }
        let ctx = OpCtx::new(
            OpSite { op: "none", seq: 0, group: String::new() },
            std::time::Duration::from_secs(1),
        );
        let waker = std::sync::Arc::new(mio::Waker::new(poll.registry(), WAKE)?);
        let interrupt = Interrupter::new(Some(waker));
        Ok(TcpTransport { rank, size, links, poll, events: Events::with_capacity(64), ctx, interrupt })
    }

    fn link(&mut self, peer: Rank) -> Result<&mut Link> {
        self.links
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Internal(format!("tcp: no link to rank {peer}")))
    }

    fn io_error(&self, peer: Rank, e: &io::Error, what: &str) -> Error {
        let detail = match e.kind() {
            io::ErrorKind::UnexpectedEof => format!("connection closed by peer while {what}"),
            _ => format!("{what} failed: {e}"),
        };
        Error::PeerLost {
            site: self.ctx.site.clone(),
            rank: self.rank,
            peer,
            addr: self.peer_addr(peer),
            detail,
        }
    }

    fn drive_send(&mut self, peer: Rank, data: &[u8], st: &mut Progress) -> Result<Step> {
        let mut moved = false;
        loop {
            let link = self.link(peer)?;
            let bufs = [IoSlice::new(&st.hdr[st.hdr_done..]), IoSlice::new(&data[st.body_done..])];
            match link.stream.write_vectored(&bufs) {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes");
                    return Err(self.io_error(peer, &e, "sending"));
                }
                Ok(mut k) => {
                    moved = true;
                    let h = (HEADER_LEN - st.hdr_done).min(k);
                    st.hdr_done += h;
                    k -= h;
                    st.body_done += k;
                    if st.hdr_done == HEADER_LEN && st.body_done == data.len() {
                        return Ok(Step::Done);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Blocked(moved)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(peer, &e, "sending")),
            }
        }
    }

    fn drive_recv(&mut self, peer: Rank, data: &mut [u8], st: &mut Progress) -> Result<Step> {
        let mut moved = false;
        loop {
            let link = self.link(peer)?;
            let r = {
                let mut bufs = [IoSliceMut::new(&mut st.hdr[st.hdr_done..]), IoSliceMut::new(&mut data[st.body_done..])];
                link.stream.read_vectored(&mut bufs)
            };
            match r {
                Ok(0) => {
                    let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                    return Err(self.io_error(peer, &e, "receiving"));
                }
                Ok(mut k) => {
                    moved = true;
                    let h = (HEADER_LEN - st.hdr_done).min(k);
                    st.hdr_done += h;
                    k -= h;
                    st.body_done += k;
                    if st.hdr_done == HEADER_LEN && !st.checked {
                        self.check_header(peer, &st.hdr, data.len())?;
                        st.checked = true;
                    }
                    if st.checked && st.body_done == data.len() {
                        return Ok(Step::Done);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Blocked(moved)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(peer, &e, "receiving")),
            }
        }
    }

    fn check_header(&self, peer: Rank, hdr: &[u8; HEADER_LEN], len: usize) -> Result<()> {
        Header::decode(hdr)
            .and_then(|h| h.expect(self.ctx.wire_seq(), len))
            .map_err(|detail| Error::Protocol {
                site: self.ctx.site.clone(),
                rank: self.rank,
                peer,
                addr: self.peer_addr(peer),
                detail,
            })
    }

    fn wait(&mut self, pending: Vec<Rank>) -> Result<()> {
        if self.interrupt.is_set() {
            return Err(interrupted_error(self));
        }
        let now = Instant::now();
        if now >= self.ctx.deadline {
            return Err(timeout_error(self, pending));
        }
        match self.poll.poll(&mut self.events, Some(self.ctx.deadline - now)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(Error::Internal(format!("tcp: poll failed: {e}"))),
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn kind(&self) -> &'static str {
        "tcp"
    }
    fn peer_addr(&self, peer: Rank) -> String {
        self.links.get(peer).and_then(Option::as_ref).map(|l| l.addr.clone()).unwrap_or_default()
    }
    fn begin(&mut self, ctx: OpCtx) {
        self.ctx = ctx;
    }
    fn ctx(&self) -> &OpCtx {
        &self.ctx
    }
    fn interrupter(&self) -> Interrupter {
        self.interrupt.clone()
    }

    fn exchange(&mut self, xfers: &mut [Xfer<'_>]) -> Result<()> {
        check_peers(self, xfers)?;
        if self.interrupt.is_set() {
            return Err(interrupted_error(self));
        }
        let seq = self.ctx.wire_seq();
        let mut st: Vec<Progress> = xfers
            .iter()
            .map(|x| {
                let hdr = match x {
                    Xfer::Send { data, .. } => Header { flags: 0, seq, len: data.len() as u64 }.encode(),
                    Xfer::Recv { .. } => [0; HEADER_LEN],
                };
                Progress { hdr, hdr_done: 0, body_done: 0, checked: false, done: false }
            })
            .collect();
        // Per peer: is an earlier send / receive still unfinished this pass?
        let mut send_busy = vec![false; self.size];
        let mut recv_busy = vec![false; self.size];
        loop {
            send_busy.iter_mut().for_each(|b| *b = false);
            recv_busy.iter_mut().for_each(|b| *b = false);
            let mut moved = false;
            let mut pending = Vec::new();
            for (x, s) in xfers.iter_mut().zip(st.iter_mut()) {
                if s.done {
                    continue;
                }
                let step = match x {
                    Xfer::Send { peer, data } => {
                        if std::mem::replace(&mut send_busy[*peer], true) {
                            pending.push(*peer);
                            continue;
                        }
                        self.drive_send(*peer, data, s)?
                    }
                    Xfer::Recv { peer, data } => {
                        if std::mem::replace(&mut recv_busy[*peer], true) {
                            pending.push(*peer);
                            continue;
                        }
                        self.drive_recv(*peer, data, s)?
                    }
                };
                match step {
                    Step::Done => {
                        s.done = true;
                        moved = true;
                        send_busy[x.peer()] &= !matches!(x, Xfer::Send { .. });
                        recv_busy[x.peer()] &= !matches!(x, Xfer::Recv { .. });
                    }
                    Step::Blocked(m) => {
                        moved |= m;
                        pending.push(x.peer());
                    }
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if !moved {
                self.wait(pending)?;
            }
        }
    }
}
