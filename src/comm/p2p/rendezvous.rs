//! Rendezvous for large messages between ranks of one host, when
//! cross-memory attach is on (`transport::shm::remote`).
//!
//! Vocabulary: the *rendezvous message* is a header (kind Rendezvous, the
//! send's tag and length) and a 16-byte body (the address of the sender's
//! tensor, an id per sender and peer) pushed through the point-to-point
//! ring instead of the bytes. The send keeps its tensor and its Work open
//! (`Awaiting`). A receive matches the message by the usual rules (source,
//! tag, posting order; unmatched, only the header waits among the
//! unexpected messages); the receiver then *takes* it: reads the bytes
//! straight from the sender's tensor into its own (one copy, split over
//! this rank's shared-memory worker threads) and answers with an *ack*
//! (kind Ack, the id as tag, error text as body: none when it went well).
//! The send completes on the ack, failing with its text if there is one.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::event_loop::{mismatch, site, EventLoop};
use super::link::watch_alive;
use super::{route, Outgoing, Posted, Rdv, Unexpected};
use crate::error::Error;
use crate::tensor::CpuTensor;
use crate::transport::frame::{self, rendezvous_parse as parse, P2pHeader, P2pKind, ACK_MAX};
use crate::transport::shm::arena::Arena;
use crate::transport::shm::{ShmLocal, Workers};
use crate::types::Rank;
use crate::work::Work;

/// Reads `dst.len()` bytes at `addr` of a peer into `dst` with `read`
/// (`Attach::read`), in pieces over `workers`' threads.
pub(super) fn pull(
    workers: &Workers,
    read: &(dyn Fn(u64, &mut [u8]) -> std::io::Result<()> + Sync),
    addr: u64,
    dst: &mut [u8],
) -> std::io::Result<()> {
    workers.for_pieces_mut(dst, |off, piece| read(addr + off as u64, piece))
}

/// Whether a send of `nbytes` over a link (`shm`: shared memory) goes by
/// rendezvous, given this host's ranks when cross-memory attach is on.
pub(super) fn by_rendezvous(local: Option<&ShmLocal>, shm: bool, nbytes: usize) -> bool {
    let attach = local.and_then(|l| l.attach.as_ref());
    shm && nbytes > 0 && attach.is_some_and(|a| a.single_reader(nbytes))
}

/// Whether a send of `nbytes` that goes by value (through the ring) is
/// offered to the sender's staging area first: over `ShmLocal::stage_min`
/// and within the area. Staged, it completes once copied in, as a send by
/// value does once written, and the receiver's threads copy it out, which
/// beats the ring's copies from about the default of `stage_min`
/// (`config::STAGED_SEND_MIN`; `docs/decisions/0004`). Where the
/// area is busy the send goes through the ring as before, so a send that
/// fits the ring still never waits for its receive.
/// The receiver copies such a message out at once, matched or not
/// ([`EventLoop::on_rendezvous`]), so that the area is soon free for the
/// sender's next send: one of rendezvous size that finds it held by a
/// send by value goes by value too ([`EventLoop::route_send`]), through the
/// ring's slower copies, where it used to be staged. A tensor in our
/// shared arena is not staged (unless `stage_shared`): it keeps the ring.
pub(super) fn stages_by_value(local: Option<&ShmLocal>, shm: bool, data: &[u8]) -> bool {
    let n = data.len();
    shm && local.is_some_and(|l| n > l.stage_min && n <= l.stage_capacity() && (l.stage_shared || !Arena::owns(data.as_ptr())))
}

/// How long the p2p thread waits for the chunks of a staged message by
/// value that no receive took yet (the sender is copying them in as the
/// message arrives); then the message waits as a rendezvous one does.
const EARLY_TAKE_WAIT: Duration = Duration::from_secs(1);

impl EventLoop {
    /// Whether a send of `nbytes` to `peer` goes by rendezvous.
    pub(super) fn rendezvous_to(&self, peer: Rank, nbytes: usize) -> bool {
        let shm = self.peers[peer].as_ref().is_some_and(|p| p.link.is_shm());
        by_rendezvous(self.attach.as_deref(), shm, nbytes)
    }

    /// How a message to or from `peer` crosses ([`route`]): by rendezvous
    /// (`rdv`) or by value, `staged` or not; `None` over TCP.
    pub(super) fn route_of(&self, peer: Rank, rdv: bool, staged: bool) -> Option<&'static str> {
        let shm = self.peers[peer].as_ref().is_some_and(|p| p.link.is_shm());
        shm.then_some(match (staged, rdv) {
            (true, _) => route::STAGED,
            (false, true) => route::READ,
            (false, false) => route::RING,
        })
    }

    /// How a send of `data` to `peer` goes: by rendezvous (true) or by
    /// value, and staged (its staging number) or not. A tensor in our
    /// shared arena goes by rendezvous unstaged, the receiver copying it
    /// straight out of it (unless `RUSTCCL_SHM_STAGE_SHARED_SENDS`).
    pub(super) fn route_send(&mut self, peer: Rank, data: &[u8]) -> (bool, Option<u64>) {
        let rdv = self.rendezvous_to(peer, data.len());
        let stage_shared = self.attach.as_ref().is_some_and(|l| l.stage_shared);
        let shared = !stage_shared && Arena::owns(data.as_ptr());
        let shm = self.peers[peer].as_ref().is_some_and(|p| p.link.is_shm());
        let by_value = stages_by_value(self.attach.as_deref(), shm, data);
        let seq = if (rdv || by_value) && !shared { self.next_stage(peer, data.len()) } else { None };
        // One that the area would take (`by_value` implies not `shared`)
        // but finds it held by a send by value (staged, not through the
        // ring) goes by value too: by rendezvous it would wait for its
        // receive.
        let held_by_value = self.staged.is_some_and(|s| s.2);
        (rdv && !(seq.is_none() && by_value && held_by_value), seq)
    }

    /// A rendezvous message from `p` arrived: taken at once by a matching
    /// receive, or kept (its header only) until one is posted; a staged
    /// one of a size that goes by value (the local ranks agree on that
    /// threshold) is copied out at once if none matches, as a message
    /// through the ring would be ([`stages_by_value`]).
    /// `staged`: the bytes wait in `p`'s staging area.
    pub(super) fn on_rendezvous(&mut self, p: Rank, tag: i64, len: u64, dtype: u8, data: &[u8], staged: bool) {
        let (addr, id) = parse(data);
        let rdv = Rdv { len: len as usize, addr, id, staged, dtype };
        match self.posted.iter().position(|r| r.tag == tag && r.peer.is_none_or(|q| q == p)) {
            Some(i) => {
                let posted = self.posted.remove(i);
                self.take(p, rdv, posted);
            }
            None if staged && !by_rendezvous(self.attach.as_deref(), true, rdv.len) => self.take_early(p, tag, rdv),
            None => self.unexpected.push_back((p, tag, Unexpected::Rendezvous(rdv))),
        }
    }

    /// Copies staged message `rdv` of `p` (tag `tag`), sent by value and
    /// not yet received, into an unexpected buffer and acks it, freeing the
    /// sender's area (the ack may wait the group's timeout for room in
    /// the sender's ring, as a receive's ack waits the receive's; with
    /// [`EARLY_TAKE_WAIT`] a sender that read nothing for a second lost its
    /// link). If its chunks do not come within [`EARLY_TAKE_WAIT`]
    /// (or the sender is gone) it waits for its receive as a rendezvous
    /// message instead, which then reads it or reports why not.
    fn take_early(&mut self, p: Rank, tag: i64, rdv: Rdv) {
        let mut data = vec![0u8; rdv.len];
        let deadline = Instant::now() + EARLY_TAKE_WAIT;
        let read = match self.attach.as_ref().and_then(|l| Some((l, l.local_index(p)?))) {
            Some((local, i)) => self.read_staged(local, p, i, &mut data, &rdv, deadline),
            None => Err(format!("rank {p} is not a rank of this host")),
        };
        if read.is_err() {
            self.unexpected.push_back((p, tag, Unexpected::Rendezvous(rdv)));
            return;
        }
        // No receive gives the ack a deadline: the group's timeout does
        // (the ack waits only while the sender's ring is full).
        self.queue_control(p, P2pKind::Ack, rdv.id, 0, Vec::new(), Instant::now() + self.timeout);
        self.unexpected.push_back((p, tag, Unexpected::Data(data, rdv.dtype, Some(route::STAGED))));
    }

    /// Copies staged message `rdv` of `p` (local index `i`) out of its
    /// staging area into `dst`: the sender may still be copying in, so
    /// each chunk is waited for while `p` lives, until `deadline`.
    fn read_staged(&self, local: &ShmLocal, p: Rank, i: usize, dst: &mut [u8], rdv: &Rdv, deadline: Instant) -> Result<(), String> {
        let watch = self.peers[p].as_ref().and_then(|x| x.link.watch());
        let coming = || match watch.map_or(Ok(()), watch_alive) {
            Ok(()) if Instant::now() >= deadline => Err(format!("timed out waiting for the sender's staged bytes ({} bytes)", rdv.len)),
            r => r,
        };
        local.stage_out(i, dst, rdv.addr, &coming)
    }

    /// Reads rendezvous message `rdv` of `p` into the receive `r`,
    /// finishes the receive and queues the ack.
    pub(super) fn take(&mut self, p: Rank, rdv: Rdv, r: Posted) {
        if r.buf.nbytes() == rdv.len && frame::dtype_code(r.buf.dtype()) == rdv.dtype {
            if let Some(from) = self.split_from(p, &rdv) {
                return self.take_split(p, rdv, r, from);
            }
        }
        let Posted { posted_at, tag, mut buf, work, deadline, .. } = r;
        let (res, nack) = if let Some(e) = mismatch(work.op(), &buf, rdv.len, rdv.dtype, p, tag) {
            let why = format!(
                "rank {}'s matching receive is {} x {} ({} bytes) but this send is {} ({} bytes) (tag {tag}): pass the same dtype and number of elements to the send and the recv",
                self.rank,
                buf.numel(),
                buf.dtype().name(),
                buf.nbytes(),
                frame::dtype_name(rdv.dtype),
                rdv.len
            );
            (Err(e), Some(why))
        } else {
            let attach = self.attach.as_ref().and_then(|l| Some((l, l.attach.as_ref()?, l.local_index(p)?)));
            let read = match attach {
                Some((local, _, i)) if rdv.staged => self.read_staged(local, p, i, buf.bytes_mut(), &rdv, deadline),
                Some((local, a, i)) => {
                    pull(&local.workers, &|at, d| a.read(i, at, d), rdv.addr, buf.bytes_mut()).map_err(|e| e.to_string())
                }
                None => Err(format!("rank {p} is not a rank of this host with cross-memory attach")),
            };
            match read {
                Ok(()) => (Ok(()), None),
                Err(e) => {
                    let (err, why) = self.read_failed(p, &rdv, tag, &work, e);
                    (Err(err), Some(why))
                }
            }
        };
        drop(buf);
        // The ack goes out before the receive finishes: its caller may
        // shut down next.
        let ack_deadline = Instant::now() + deadline.saturating_duration_since(posted_at);
        let text = nack.unwrap_or_default().into_bytes();
        self.queue_control(p, P2pKind::Ack, rdv.id, text.len() as u64, text, ack_deadline);
        work.arrived(p, Some(if rdv.staged { route::STAGED } else { route::READ }));
        work.finish(res);
    }

    /// The receive's error and the ack's text when reading rendezvous
    /// message `rdv` of `p` (tag `tag`) failed with `e`.
    pub(super) fn read_failed(&self, p: Rank, rdv: &Rdv, tag: i64, work: &Work, e: String) -> (Error, String) {
        // Dead already, or found gone while we waited for its staged bytes
        // (its death is handled on the next pass).
        let dead = self.peers[p].as_ref().and_then(|x| x.dead.clone().or_else(|| x.link.alive().err()));
        let how = if rdv.staged { "shared memory" } else { "memory (cross-memory attach)" };
        let detail = format!("reading the message ({} bytes, tag {tag}) from rank {p}'s {how} failed: {e}", rdv.len);
        let err = match dead {
            Some(why) => self.lost(p, work, &why),
            None => Error::Protocol {
                site: site(work, &self.group),
                rank: self.rank,
                peer: p,
                addr: self.peers[p].as_ref().map(|x| x.addr.clone()).unwrap_or_default(),
                detail,
            },
        };
        (err, format!("rank {} could not read this send's bytes: {e}", self.rank))
    }

    /// The number of a new staged send of `n` bytes to `peer` when it can
    /// be staged: our staging area is free and holds it, and it is over
    /// `ShmLocal::stage_min` bytes (see the module `p2p`); the caller then
    /// sends it as `Staged` and hands it to [`EventLoop::stage_send`].
    /// None: it goes by rendezvous, or by value.
    pub(super) fn next_stage(&mut self, peer: Rank, n: usize) -> Option<u64> {
        let local = self.attach.as_ref()?;
        if self.staged.is_some() || n <= local.stage_min || n > local.stage_capacity() || local.local_index(peer).is_none() {
            return None;
        }
        self.stage_seq += 1;
        Some(self.stage_seq)
    }

    /// Our staged message `seq` to `peer` is queued: writes it now when the
    /// ring has room (so a receiver that matches it copies behind us), then
    /// copies `buf` into our staging area. The send completes then, or with
    /// its message when that is still queued.
    pub(super) fn stage_send(&mut self, peer: Rank, seq: u64, buf: CpuTensor, work: Work) {
        self.pump_out(peer);
        let n = buf.nbytes();
        let staged = self.attach.as_ref().and_then(|l| l.stage_in(buf.bytes(), seq));
        drop(buf);
        let dead = self.peers[peer].as_ref().and_then(|p| p.dead.clone());
        if let Some(why) = dead {
            let e = self.lost(peer, &work, &why);
            work.finish(Err(e));
            return;
        }
        if staged.is_none() {
            // `next_stage` checked that it fits.
            work.finish(Err(Error::Internal(format!("staging a send of {n} bytes failed"))));
            return;
        }
        match self.peers[peer].as_mut().and_then(|p| p.out.back_mut()).filter(|o| o.staged) {
            Some(o) => o.work = Some(work),
            None => work.finish(Ok(())),
        }
    }

    /// Queues a control message to `p` about rendezvous message `id` and
    /// writes what it can at once (behind what was queued before): an ack
    /// or pushed (`body`: error text, at most [`ACK_MAX`] bytes kept; `len`
    /// is then its length), or a push request. At once, so that a caller
    /// whose receive just finished and who shuts down next does not leave
    /// its sender's ack unwritten.
    pub(super) fn queue_control(&mut self, p: Rank, kind: P2pKind, id: u64, len: u64, mut body: Vec<u8>, deadline: Instant) {
        let Some(peer) = self.peers[p].as_mut().filter(|x| x.dead.is_none()) else { return };
        let len = if kind == P2pKind::PushRequest {
            len
        } else {
            body.truncate(ACK_MAX);
            body.len() as u64
        };
        let hdr = P2pHeader { kind, dtype: 0, tag: id as i64, len }.encode();
        let now = Instant::now();
        peer.link.queue();
        peer.out.push_back(Outgoing {
            hdr,
            hdr_done: 0,
            body_done: 0,
            ctl: Some(body),
            buf: None,
            work: None,
            rdv: None,
            staged: false,
            posted_at: now,
            deadline,
        });
        self.pump_out(p);
    }

    /// `p` took (or refused) our rendezvous send `id`.
    pub(super) fn on_ack(&mut self, p: Rank, id: u64, text: Vec<u8>) {
        if self.staged.is_some_and(|(q, i, _)| (q, i) == (p, id)) {
            // Our staging area is free again. The send completed when it
            // was staged: a receive that refused it (other size) failed on
            // the receiver's side, as for a send by value.
            self.staged = None;
            return;
        }
        let Some(peer) = self.peers[p].as_mut() else { return };
        let Some(i) = peer.awaiting.iter().position(|a| a.id == id) else { return };
        let a = peer.awaiting.swap_remove(i);
        drop(a.buf);
        let Some(work) = a.work else { return };
        let res = if text.is_empty() {
            Ok(())
        } else {
            Err(Error::Protocol {
                site: site(&work, &self.group),
                rank: self.rank,
                peer: p,
                addr: peer.addr.clone(),
                detail: String::from_utf8_lossy(&text).into_owned(),
            })
        };
        work.finish(res);
    }

    /// Rendezvous sends whose receive did not come in time fail with
    /// `Error::Timeout`; their tensors stay held until the ack (or the
    /// peer's death), since the receiver may still read them.
    pub(super) fn expire_rendezvous(&mut self, now: Instant) {
        let mut late = Vec::new();
        for (p, peer) in self.peers.iter_mut().enumerate() {
            let Some(peer) = peer else { continue };
            for a in peer.awaiting.iter_mut().filter(|a| a.deadline <= now) {
                if let Some(w) = a.work.take() {
                    late.push((p, w, now.saturating_duration_since(a.posted_at)));
                }
            }
        }
        for (p, work, elapsed) in late {
            let e = Error::Timeout { site: site(&work, &self.group), rank: self.rank, waiting: vec![p], elapsed };
            work.finish(Err(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::remote;

    #[test]
    fn pulls_in_pieces_and_fails_on_a_bad_address() {
        let workers = Workers::new(3, "test", 64, std::time::Duration::from_micros(100)).unwrap();
        let src: Vec<u8> = (0..100_003u32).map(|i| (i * 13 + 5) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pid = std::process::id() as i32;
        let read = |at, d: &mut [u8]| remote::read(pid, at, d);
        pull(&workers, &read, src.as_ptr() as u64, &mut dst).unwrap();
        assert_eq!(src, dst);
        assert!(pull(&workers, &read, 8, &mut dst).is_err());
        let (addr, id) = parse(&crate::transport::frame::rendezvous_body(0xdead_beef, 7));
        assert_eq!((addr, id), (0xdead_beef, 7));
    }
}
