//! Moving bytes between the ranks of one communicator.
//!
//! A [`Transport`] owns one connection per peer (`tcp::TcpLink`, `shm::ShmLink`) and drives a
//! set of transfers ([`Xfer`]) to completion at once, so an algorithm can
//! send to one neighbour while it receives from another without threads.
//! Every message carries a small header (`frame`) with the operation's
//! sequence number, its roots, what it is (kind, reduce op, dtype, count)
//! and its length, so ranks that disagree about the collective, its root,
//! its dtype or its size get an error instead of garbage.
//!
//! Implementations: [`mesh::Mesh`], the real one, over a TCP link
//! (`tcp`, any host) or a shared-memory link (`shm`, same host) per peer;
//! `sub` (a subgroup's view of a mesh, for the steps between hosts) and
//! `loopback` (in-process, for tests).
// `unsafe` lives only in `shm` (shared memory).
#![deny(unsafe_code)]

pub mod frame;
pub mod loopback;
pub mod mesh;
pub mod shm;
pub mod sub;
pub mod tcp;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, OpSite, Result};
use crate::types::Rank;

/// Progress of one transfer within an `exchange`: its header (built for
/// sends, filled for receives) and how much of header and payload moved.
#[derive(Clone, Copy)]
pub struct Progress {
    pub hdr: [u8; frame::HEADER_LEN],
    pub hdr_done: usize,
    pub body_done: usize,
    pub checked: bool,
    pub done: bool,
}

impl Progress {
    pub fn new(hdr: [u8; frame::HEADER_LEN]) -> Progress {
        Progress { hdr, hdr_done: 0, body_done: 0, checked: false, done: false }
    }

    /// Accounts `k` bytes moved: header first, then payload.
    pub fn advance(&mut self, mut k: usize) {
        let h = (frame::HEADER_LEN - self.hdr_done).min(k);
        self.hdr_done += h;
        k -= h;
        self.body_done += k;
    }
}

/// What one step on a link achieved.
pub enum Step {
    Done,
    /// Would block; `true` if some bytes moved before it did.
    Blocked(bool),
}

/// One transfer of a step: a whole message to or from one peer.
pub enum Xfer<'a> {
    Send { peer: Rank, data: &'a [u8] },
    Recv { peer: Rank, data: &'a mut [u8] },
}

impl Xfer<'_> {
    pub fn peer(&self) -> Rank {
        match self {
            Xfer::Send { peer, .. } | Xfer::Recv { peer, .. } => *peer,
        }
    }
}

/// The operation a transport is working for: names it in errors and bounds
/// it in time.
#[derive(Debug, Clone)]
pub struct OpCtx {
    pub site: OpSite,
    pub started: Instant,
    pub deadline: Instant,
    /// Its roots as carried in message headers (`frame::roots_tag`).
    pub roots: u16,
    /// What it is (kind, reduce op, dtype, count), as carried in message
    /// headers.
    pub what: frame::What,
}

impl OpCtx {
    pub fn new(site: OpSite, timeout: Duration) -> OpCtx {
        OpCtx::started_at(site, timeout, Instant::now())
    }

    /// As [`OpCtx::new`], for an operation that started at `started`.
    pub fn started_at(site: OpSite, timeout: Duration, started: Instant) -> OpCtx {
        OpCtx { site, started, deadline: started + timeout, roots: 0, what: frame::What::default() }
    }

    /// The operation's roots (`frame::roots_tag`), which every message of
    /// it carries: a peer that names other roots fails the receive.
    pub fn with_roots(self, roots: u16) -> OpCtx {
        OpCtx { roots, ..self }
    }

    /// What the operation is (`frame::What`), which every message of it
    /// carries: a peer that describes it otherwise fails the receive.
    pub fn with_what(self, what: frame::What) -> OpCtx {
        OpCtx { what, ..self }
    }

    /// Sequence number as carried in message headers.
    pub fn wire_seq(&self) -> u32 {
        self.site.seq as u32
    }

    /// What message headers of this operation carry besides the length.
    pub fn wire(&self) -> frame::Wire {
        frame::Wire { seq: self.wire_seq(), roots: self.roots, what: self.what }
    }
}

/// Lets another thread stop a transport that is blocked in `exchange`
/// (shutdown, abort): the transport fails its current and later transfers
/// with `Error::Closed`.
#[derive(Clone, Default)]
pub struct Interrupter {
    flag: Arc<AtomicBool>,
    waker: Option<Arc<mio::Waker>>,
}

impl Interrupter {
    pub fn new(waker: Option<Arc<mio::Waker>>) -> Interrupter {
        Interrupter { flag: Arc::new(AtomicBool::new(false)), waker }
    }

    pub fn interrupt(&self) {
        self.flag.store(true, Ordering::SeqCst);
        if let Some(w) = &self.waker {
            let _ = w.wake();
        }
    }

    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

/// Byte transport of one communicator (see the module docs).
pub trait Transport: Send {
    fn rank(&self) -> Rank;
    fn size(&self) -> usize;
    /// Short name for logs and stats ("tcp", "loopback").
    fn kind(&self) -> &'static str;
    /// Address of a peer, for error messages.
    fn peer_addr(&self, peer: Rank) -> String;

    /// Starts work for a new operation; later errors name it.
    fn begin(&mut self, ctx: OpCtx);
    fn ctx(&self) -> &OpCtx;
    /// A handle that interrupts this transport from another thread.
    fn interrupter(&self) -> Interrupter;

    /// Closes every link at once, as a crashed process would (fault
    /// injection); peers see their connections close.
    fn sever(&mut self) {}

    /// This rank takes no further part in the group from operation `seq`
    /// on (an error poisoned it, or it was aborted): tells the peers that
    /// share its host (a word in its shared memory), so that those waiting
    /// for its next step fail at once instead of at their timeout; with
    /// `close_tcp`, closes its TCP links too, which tells the others.
    fn give_up(&mut self, _seq: u64, _close_tcp: bool) {}

    /// A window onto the shared areas of the ranks of this host, and the
    /// phase waits that order access to it (for the shared-memory
    /// algorithms of `collectives`), when every rank agreed to use it.
    fn window(&mut self) -> Option<(shm::Window, &mut dyn shm::PhaseWait)> {
        None
    }

    /// The ranks grouped by host (hosts ordered by their lowest rank), when
    /// the group spans several hosts and shared memory is in use on each.
    fn hosts(&self) -> Option<std::sync::Arc<Vec<Vec<Rank>>>> {
        None
    }

    /// Runs all transfers to completion. Transfers to the same peer in the
    /// same direction complete in order; everything else overlaps.
    fn exchange(&mut self, xfers: &mut [Xfer<'_>]) -> Result<()>;

    fn send(&mut self, peer: Rank, data: &[u8]) -> Result<()> {
        self.exchange(&mut [Xfer::Send { peer, data }])
    }

    fn recv(&mut self, peer: Rank, data: &mut [u8]) -> Result<()> {
        self.exchange(&mut [Xfer::Recv { peer, data }])
    }

    /// Send to `to` while receiving from `from`.
    fn sendrecv(&mut self, to: Rank, sdata: &[u8], from: Rank, rdata: &mut [u8]) -> Result<()> {
        self.exchange(&mut [Xfer::Send { peer: to, data: sdata }, Xfer::Recv { peer: from, data: rdata }])
    }
}

/// Checks that every transfer names a real peer other than ourselves.
pub fn check_peers(t: &dyn Transport, xfers: &[Xfer<'_>]) -> Result<()> {
    for x in xfers {
        let p = x.peer();
        if p >= t.size() || p == t.rank() {
            return Err(Error::Internal(format!("{}: transfer with rank {p} from rank {} of {}", t.ctx().site, t.rank(), t.size())));
        }
    }
    Ok(())
}

/// The error of an interrupted transport.
pub fn interrupted_error(t: &dyn Transport) -> Error {
    Error::Closed { op: t.ctx().site.op, how: "shut down or aborted while this operation was running" }
}

/// A timeout error for the current operation, waiting on `peers`.
pub fn timeout_error(t: &dyn Transport, mut peers: Vec<Rank>) -> Error {
    peers.sort_unstable();
    peers.dedup();
    let ctx = t.ctx();
    Error::Timeout { site: ctx.site.clone(), rank: t.rank(), waiting: peers, elapsed: ctx.started.elapsed() }
}
