//! Split sends: a rendezvous message that its receiver reads from the
//! sender's tensor (`rendezvous.rs`) is shared between the two when the
//! receiver asks for it (`ShmLocal::split_send_min`, its choice). The
//! sender is idle until the ack otherwise; so the receiver, on taking the
//! message, first sends a *push request* (kind PushRequest, the id as tag:
//! where in its buffer the second half goes, and where in the message it
//! starts), then reads the first half, while the sender's threads write the
//! second half into the receiver's buffer (`Attach::write`) and answer with
//! *pushed* (kind Pushed, the id as tag, error text as body). The receive
//! is finished, and the ack sent, once both halves are in; so the send
//! still completes on the ack, and its tensor stays held until then.
//!
//! Until pushed arrives the receiver holds its buffer, even past the
//! receive's deadline (the sender may still be writing into it); only the
//! sender's death lets it go sooner.
#![forbid(unsafe_code)]

use std::time::Instant;

use super::event_loop::{site, EventLoop};
use super::rendezvous::pull;
use super::{route, Posted, Rdv, Split};
use crate::error::Error;
use crate::transport::frame::{rendezvous_body, rendezvous_parse as parse, P2pKind};
use crate::transport::shm::split_point;
use crate::types::Rank;

impl EventLoop {
    /// Where a rendezvous message `rdv` from `p` is split, when this rank
    /// splits it: from `ShmLocal::split_send_min` bytes, from a live sender,
    /// read through the kernel (a tensor in the sender's shared arena is read with a plain
    /// copy instead, which its sender's writes would not beat), at half
    /// the message rounded up to a cache line (`split_point`).
    pub(super) fn split_from(&self, p: Rank, rdv: &Rdv) -> Option<usize> {
        let local = self.attach.as_ref()?;
        let (a, i) = (local.attach.as_ref()?, local.local_index(p)?);
        let gone = self.peers[p].as_ref().is_none_or(|x| x.dead.is_some());
        if gone || rdv.staged || rdv.len < local.split_send_min || a.peek(i, rdv.addr, rdv.len).is_some() {
            return None;
        }
        let from = split_point(rdv.len);
        (from > 0 && from < rdv.len).then_some(from)
    }

    /// Takes rendezvous message `rdv` of `p` into the receive `r` (of the
    /// same size), split at `from`: asks `p` for the bytes from `from` on,
    /// reads those before, and keeps the receive until `p` says they are
    /// written ([`EventLoop::on_pushed`]).
    pub(super) fn take_split(&mut self, p: Rank, rdv: Rdv, r: Posted, from: usize) {
        let Posted { posted_at, tag, mut buf, work, deadline, .. } = r;
        let Some(local) = self.attach.clone() else { return };
        let dst = buf.bytes_mut()[from..].as_mut_ptr() as u64;
        let span = deadline.saturating_duration_since(posted_at);
        let body = rendezvous_body(dst, from as u64);
        self.queue_control(p, P2pKind::PushRequest, rdv.id, (rdv.len - from) as u64, body, Instant::now() + span);
        let read = match (local.attach.as_ref(), local.local_index(p)) {
            (Some(a), Some(i)) => {
                pull(&local.workers, &|at, d| a.read(i, at, d), rdv.addr, &mut buf.bytes_mut()[..from]).map_err(|e| e.to_string())
            }
            _ => Err(format!("rank {p} is not a rank of this host with cross-memory attach")),
        };
        let read = read.map_err(|e| self.read_failed(p, &rdv, tag, &work, e));
        if let Some(why) = self.peers[p].as_ref().and_then(|x| x.dead.clone()) {
            // Found dead meanwhile (writing the request, say): it will
            // not answer, nor write.
            let e = self.lost(p, &work, &why);
            drop(buf);
            work.finish(Err(e));
            return;
        }
        self.splits.push(Split { peer: p, id: rdv.id, tag, buf, work: Some(work), read, posted_at, deadline });
    }

    /// `p` asks for the last `len` bytes of our rendezvous send `id`, from
    /// `data`'s offset on, at `data`'s address in its memory: written on
    /// our threads, then answered (pushed, with the error if any).
    pub(super) fn on_push_request(&mut self, p: Rank, id: u64, len: u64, data: &[u8]) {
        let (dst, from) = parse(data);
        let send = self.peers[p].as_ref().and_then(|x| x.awaiting.iter().find(|a| a.id == id));
        let span = send.map(|a| a.deadline.saturating_duration_since(a.posted_at));
        let work = send.and_then(|a| a.work.clone());
        let text = match self.push_tail(p, id, dst, from as usize, len as usize) {
            Ok(()) => {
                if let Some(w) = work {
                    w.set_route(route::SPLIT);
                }
                String::new()
            }
            Err(e) => e,
        };
        // A send that is gone (the text names that) answers within the
        // group's timeout, as its receive would have.
        let deadline = Instant::now() + span.unwrap_or(self.timeout);
        self.queue_control(p, P2pKind::Pushed, id, text.len() as u64, text.into_bytes(), deadline);
    }

    /// Writes bytes `from..from + len` of our send `id` to `p` at `dst` in
    /// `p`'s memory.
    fn push_tail(&self, p: Rank, id: u64, dst: u64, from: usize, len: usize) -> Result<(), String> {
        let local = self.attach.as_ref().ok_or("this rank has no cross-memory attach")?;
        let (Some(a), Some(i)) = (local.attach.as_ref(), local.local_index(p)) else {
            return Err(format!("rank {p} is not a rank of this host with cross-memory attach"));
        };
        let me = self.rank;
        let send = self.peers[p].as_ref().and_then(|x| x.awaiting.iter().find(|a| a.id == id));
        let Some(send) = send else {
            return Err(format!("rank {me} has no send {id} waiting for rank {p}'s receive"));
        };
        let src = send.buf.bytes();
        if from.checked_add(len) != Some(src.len()) {
            return Err(format!("rank {p} asked for bytes {from}..+{len} of rank {me}'s {}-byte send", src.len()));
        }
        let tail = &src[from..];
        local
            .workers
            .for_pieces(len, |r| a.write(i, dst + r.start as u64, &tail[r]))
            .map_err(|e| format!("rank {me} could not write the second half of its send into rank {p}'s buffer: {e}"))
    }

    /// `p` wrote (or could not write) the second half of its message `id`
    /// into our split receive: it is finished, and acked.
    pub(super) fn on_pushed(&mut self, p: Rank, id: u64, text: Vec<u8>) {
        let Some(k) = self.splits.iter().position(|s| s.peer == p && s.id == id) else { return };
        let s = self.splits.swap_remove(k);
        let (res, nack) = match s.read {
            Err((e, why)) => (Err(e), why),
            Ok(()) if text.is_empty() => (Ok(()), String::new()),
            Ok(()) => {
                let why = String::from_utf8_lossy(&text).into_owned();
                let err = s.work.as_ref().map(|w| Error::Protocol {
                    site: site(w, &self.group),
                    rank: self.rank,
                    peer: p,
                    addr: self.peers[p].as_ref().map(|x| x.addr.clone()).unwrap_or_default(),
                    detail: format!("the message (tag {}) is incomplete: {why}", s.tag),
                });
                (err.map_or(Ok(()), Err), format!("rank {} did not get the second half of this send: {why}", self.rank))
            }
        };
        drop(s.buf);
        let span = s.deadline.saturating_duration_since(s.posted_at);
        self.queue_control(p, P2pKind::Ack, id, nack.len() as u64, nack.into_bytes(), Instant::now() + span);
        if let Some(w) = s.work {
            w.arrived(p, Some(route::SPLIT));
            w.finish(res);
        }
    }

    /// `p` died: its split receives fail (it writes nothing any more).
    pub(super) fn drop_splits_of(&mut self, p: Rank, why: &str) {
        let (dead, keep): (Vec<Split>, Vec<Split>) = std::mem::take(&mut self.splits).into_iter().partition(|s| s.peer == p);
        self.splits = keep;
        for s in dead {
            drop(s.buf);
            if let Some(w) = s.work {
                let e = self.lost(p, &w, why);
                w.finish(Err(e));
            }
        }
    }

    /// Split receives past their deadline fail with `Error::Timeout`; their
    /// buffers stay held until pushed (or the sender's death).
    pub(super) fn expire_splits(&mut self, now: Instant) {
        for s in self.splits.iter_mut().filter(|s| s.deadline <= now) {
            if let Some(w) = s.work.take() {
                let e = Error::Timeout {
                    site: site(&w, &self.group),
                    rank: self.rank,
                    waiting: vec![s.peer],
                    elapsed: now.saturating_duration_since(s.posted_at),
                };
                w.finish(Err(e));
            }
        }
    }

    /// The earliest deadline of a split receive still waiting.
    pub(super) fn next_split_deadline(&self) -> Option<Instant> {
        self.splits.iter().filter(|s| s.work.is_some()).map(|s| s.deadline).min()
    }

    /// Shutdown: split receives fail. Their buffers are leaked, not freed:
    /// a live sender may still be writing into them.
    pub(super) fn close_splits(&mut self) {
        for s in std::mem::take(&mut self.splits) {
            std::mem::forget(s.buf);
            if let Some(w) = s.work {
                w.finish(Err(Error::Closed { op: "recv", how: "shut down" }));
            }
        }
    }
}
