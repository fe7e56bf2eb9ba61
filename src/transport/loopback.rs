//! In-process transport for tests: ranks are threads, each directed pair of
//! ranks shares a message queue. Sends never block, so any schedule that is
//! correct over real links completes here too; receives honour the
//! operation's deadline, and a dropped transport looks like a closed
//! connection to its peers.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::frame::Header;
use super::{check_peers, interrupted_error, timeout_error, Interrupter, OpCtx, Transport, Xfer};
use crate::error::{Error, OpSite, Result};
use crate::types::Rank;

#[derive(Default)]
struct Queue {
    msgs: VecDeque<(Header, Vec<u8>)>,
    closed: bool,
}

#[derive(Default)]
struct Pipe {
    q: Mutex<Queue>,
    cv: Condvar,
}

pub struct LoopbackTransport {
    rank: Rank,
    size: usize,
    /// `outbox[p]`: messages from us to p; `inbox[p]`: from p to us.
    outbox: Vec<Option<Arc<Pipe>>>,
    inbox: Vec<Option<Arc<Pipe>>>,
    ctx: OpCtx,
    interrupt: Interrupter,
}

/// A fully connected set of `n` loopback transports, one per rank.
pub fn mesh(n: usize) -> Vec<LoopbackTransport> {
    let pipes: Vec<Vec<Option<Arc<Pipe>>>> =
        (0..n).map(|i| (0..n).map(|j| (i != j).then(|| Arc::new(Pipe::default()))).collect()).collect();
    let ctx = OpCtx::new(OpSite { op: "none", seq: 0, group: "loopback".into() }, Duration::from_secs(60));
    (0..n)
        .map(|r| LoopbackTransport {
            rank: r,
            size: n,
            outbox: (0..n).map(|p| pipes[r][p].clone()).collect(),
            inbox: (0..n).map(|p| pipes[p][r].clone()).collect(),
            ctx: ctx.clone(),
            interrupt: Interrupter::new(None),
        })
        .collect()
}

impl Drop for LoopbackTransport {
    fn drop(&mut self) {
        for p in self.outbox.iter().chain(self.inbox.iter()).flatten() {
            if let Ok(mut q) = p.q.lock() {
                q.closed = true;
            }
            p.cv.notify_all();
        }
    }
}

impl LoopbackTransport {
    fn lost(&self, peer: Rank, detail: &str) -> Error {
        Error::PeerLost { site: self.ctx.site.clone(), rank: self.rank, peer, addr: self.peer_addr(peer), detail: detail.into() }
    }

    fn pipe(boxes: &[Option<Arc<Pipe>>], peer: Rank) -> Result<Arc<Pipe>> {
        boxes[peer].clone().ok_or_else(|| Error::Internal(format!("loopback: no pipe to {peer}")))
    }

    fn recv_one(&mut self, peer: Rank, data: &mut [u8], deadline: Instant) -> Result<()> {
        let pipe = Self::pipe(&self.inbox, peer)?;
        let mut q = pipe.q.lock().map_err(|_| Error::Internal("loopback lock poisoned".into()))?;
        loop {
            if let Some((h, msg)) = q.msgs.pop_front() {
                h.expect(self.ctx.wire(), data.len()).map_err(|detail| Error::Protocol {
                    site: self.ctx.site.clone(),
                    rank: self.rank,
                    peer,
                    addr: self.peer_addr(peer),
                    detail,
                })?;
                data.copy_from_slice(&msg);
                return Ok(());
            }
            if q.closed {
                return Err(self.lost(peer, "connection closed by peer"));
            }
            if self.interrupt.is_set() {
                return Err(interrupted_error(self));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(timeout_error(self, vec![peer]));
            }
            q = pipe
                .cv
                .wait_timeout(q, (deadline - now).min(Duration::from_millis(50)))
                .map_err(|_| Error::Internal("loopback lock poisoned".into()))?
                .0;
        }
    }
}

impl Transport for LoopbackTransport {
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn kind(&self) -> &'static str {
        "loopback"
    }
    fn peer_addr(&self, peer: Rank) -> String {
        format!("loopback:{peer}")
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
        for x in xfers.iter() {
            if let Xfer::Send { peer, data } = x {
                let pipe = Self::pipe(&self.outbox, *peer)?;
                let mut q = pipe.q.lock().map_err(|_| Error::Internal("loopback lock poisoned".into()))?;
                if q.closed {
                    return Err(self.lost(*peer, "connection closed by peer"));
                }
                let h = self.ctx.wire().header(data.len());
                q.msgs.push_back((h, data.to_vec()));
                pipe.cv.notify_all();
            }
        }
        let deadline = self.ctx.deadline;
        for x in xfers.iter_mut() {
            if let Xfer::Recv { peer, data } = x {
                self.recv_one(*peer, data, deadline)?;
            }
        }
        Ok(())
    }
}
