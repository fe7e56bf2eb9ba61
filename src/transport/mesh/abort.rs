//! Giving one collective up without losing the group.
//!
//! When a received header shows that the ranks disagree about the
//! collective (dtype, size, reduce op, root), no rank has used a peer's
//! bytes yet, so the ranks are still in step: each gives the collective
//! up, and the next one runs as usual. The rank that finds the
//! disagreement sends every peer an abort frame ([`Header::abort`]), after
//! the rest of any frame it had begun to send; a peer that receives one
//! does the same. Frames of the collective given up that are still on a
//! link are skipped when that link is next read ([`Seen::Stale`]), so the
//! normal path needs no extra round trip.
//!
//! A rank whose part of the collective was over before the abort reached
//! it (a broadcast's root, a reduce's sender) returns normally: what it
//! returns did not depend on the rank that disagreed. Where the group
//! spans hosts and uses shared-memory phases on each, ranks waiting in
//! those phases read no frames, so there the error still makes the group
//! unusable, as before.
#![forbid(unsafe_code)]

use super::{Link, Mesh};
use crate::config::log_at;
use crate::config::LogLevel;
use crate::error::Error;
use crate::transport::frame::{self, Header, Seen, What, HEADER_LEN};
use crate::transport::{Progress, Step, Xfer};
use crate::types::Rank;

/// Largest read into the sink while skipping bytes.
const SINK: usize = 64 << 10;

impl Mesh {
    /// The ranks disagree about this collective (found on `peer`'s frame):
    /// recoverable unless shared-memory phases of other hosts are involved.
    pub(super) fn disagree(&self, peer: Rank, detail: String) -> Error {
        let e = Error::Mismatch { site: self.ctx.site.clone(), rank: self.rank, peer, addr: self.addrs[peer].clone(), detail };
        self.escalated(e)
    }

    /// A peer sent the abort frame of this collective; `theirs` is what it
    /// runs.
    fn aborted_by(&self, peer: Rank, theirs: What) -> Error {
        let mine = self.ctx.what;
        let detail = if theirs == mine {
            format!(
                "the peer gave this collective up: it found a rank that disagrees about it (that rank's error names how); this rank runs {} ({})",
                mine.text(),
                frame::NEXT_STEP
            )
        } else {
            format!(
                "the peer gave this collective up: it runs {} where this rank runs {}: the ranks passed different dtypes, sizes or reduce ops ({})",
                theirs.text(),
                mine.text(),
                frame::NEXT_STEP
            )
        };
        self.disagree(peer, detail)
    }

    /// A mismatch that this group cannot recover from becomes a protocol
    /// error (which makes it unusable).
    fn escalated(&self, e: Error) -> Error {
        match e {
            Error::Mismatch { site, rank, peer, addr, detail } if self.shm_agreed && self.hosts.len() > 1 => Error::Protocol {
                site,
                rank,
                peer,
                addr,
                detail: format!(
                    "{detail}; the group spans hosts and uses shared memory on each, where a collective cannot be given up alone: the group is unusable now"
                ),
            },
            e => e,
        }
    }

    /// Puts `bytes` back in front of what is unread on `peer`'s link.
    fn give_back(&mut self, peer: Rank, bytes: &[u8]) {
        match self.links[peer].as_mut() {
            Some(Link::Tcp(l)) => l.give_back(bytes),
            Some(Link::Shm(l)) => l.give_back(bytes),
            None => {}
        }
    }

    /// Reads what `peer`'s link has, up to `dst.len()` bytes (0: nothing).
    fn pull(&mut self, peer: Rank, dst: &mut [u8]) -> crate::error::Result<usize> {
        match self.links[peer].as_mut() {
            Some(Link::Tcp(l)) => match l.read_some(dst) {
                Ok(k) => Ok(k.unwrap_or(0)),
                Err(e) => Err(self.io_lost(peer, &e, "skipping a collective given up")),
            },
            Some(Link::Shm(l)) => Ok(l.pull(dst)),
            None => Err(Error::Internal(format!("no link to rank {peer}"))),
        }
    }

    /// Skips payload bytes of a frame given up on `peer`'s link; true once
    /// none are left.
    pub(super) fn skip_step(&mut self, peer: Rank, moved: &mut bool) -> crate::error::Result<bool> {
        while self.skip[peer] > 0 {
            let mut sink = std::mem::take(&mut self.sink);
            sink.resize(SINK, 0);
            let n = self.skip[peer].min(SINK as u64) as usize;
            let got = self.pull(peer, &mut sink[..n]);
            self.sink = sink;
            let k = got?;
            if k == 0 {
                return Ok(false);
            }
            self.skip[peer] -= k as u64;
            *moved = true;
        }
        Ok(true)
    }

    /// A receive found a header other than the one it waits for (`st.hdr`,
    /// with `st.body_done` bytes after it already in `data`). A frame of
    /// an earlier collective is skipped and the receive starts over (Ok);
    /// a disagreement or a peer's abort leaves the frame unread and gives
    /// this collective up (the error).
    pub(super) fn not_expected(&mut self, peer: Rank, seen: Seen, data: &[u8], st: &mut Progress) -> crate::error::Result<()> {
        let (hdr, after) = (st.hdr, st.body_done);
        *st = Progress::new([0; HEADER_LEN]);
        match seen {
            Seen::Stale { len } => {
                let len = len.min(usize::MAX as u64) as usize;
                if after > len {
                    self.give_back(peer, &data[len..after]);
                } else {
                    self.skip[peer] = (len - after) as u64;
                }
                if let Some(h) = Header::decode(&hdr).ok().filter(|h| h.abort) {
                    log_at!(
                        LogLevel::Warn,
                        "group '{}' rank {}: rank {peer} gave collective seq {} up (the ranks disagree about it), after this rank's part of it was over",
                        self.ctx.site.group,
                        self.rank,
                        h.seq
                    );
                }
                Ok(())
            }
            Seen::Aborted { theirs } => {
                self.give_back(peer, &data[..after]);
                Err(self.aborted_by(peer, theirs))
            }
            Seen::Mismatch(why) => {
                let mut unread = hdr.to_vec();
                unread.extend_from_slice(&data[..after]);
                self.give_back(peer, &unread);
                Err(self.disagree(peer, why))
            }
            Seen::Desync(why) => Err(self.protocol(peer, why)),
            Seen::Expected => Err(Error::Internal("rustccl: an expected header was handled as unexpected".into())),
        }
    }

    /// Gives the current collective up after `cause` (an
    /// [`Error::Mismatch`]): the receives under way leave the rest of their
    /// frames to be skipped, the sends under way finish their frames, and
    /// every peer gets the abort frame. Returns `cause`, or the error that
    /// stopped this (which makes the group unusable).
    pub(super) fn give_up_op(&mut self, xfers: &[Xfer<'_>], st: &mut [Progress], cause: Error) -> Error {
        if !matches!(cause, Error::Mismatch { .. }) {
            return cause;
        }
        for (x, s) in xfers.iter().zip(st.iter()) {
            if let Xfer::Recv { peer, data } = x {
                if s.done || s.hdr_done == 0 {
                    continue;
                }
                if s.checked {
                    self.skip[*peer] += (data.len() - s.body_done) as u64;
                } else {
                    let h = s.hdr;
                    self.give_back(*peer, &h[..s.hdr_done]);
                }
            }
        }
        let abort = self.ctx.wire().abort().encode();
        // Per peer: the send it had begun (an index into `xfers`), then
        // the abort frame.
        let mut owed: Vec<(Rank, Option<usize>, Progress)> = (0..self.size)
            .filter(|&p| self.links[p].is_some())
            .map(|p| {
                let begun = xfers
                    .iter()
                    .zip(st.iter())
                    .position(|(x, s)| matches!(x, Xfer::Send { .. }) && x.peer() == p && s.hdr_done > 0 && !s.done);
                (p, begun, Progress::new(abort))
            })
            .collect();
        // Frames this rank reads meanwhile: a peer that finishes a frame to
        // this rank is never stuck behind it.
        let mut reading: Vec<Option<([u8; HEADER_LEN], usize)>> =
            self.links.iter().map(|l| l.as_ref().map(|_| ([0; HEADER_LEN], 0))).collect();
        let r = self.settle(xfers, st, &mut owed, &mut reading);
        for (p, h) in reading.iter().enumerate() {
            if let Some((h, n)) = h.filter(|(_, n)| *n > 0) {
                self.give_back(p, &h[..n]);
            }
        }
        match r {
            Ok(()) => cause,
            Err(e) => {
                log_at!(LogLevel::Warn, "group '{}' rank {}: {cause}", self.ctx.site.group, self.rank);
                e
            }
        }
    }

    fn settle(
        &mut self,
        xfers: &[Xfer<'_>],
        st: &mut [Progress],
        owed: &mut Vec<(Rank, Option<usize>, Progress)>,
        reading: &mut [Option<([u8; HEADER_LEN], usize)>],
    ) -> crate::error::Result<()> {
        loop {
            let sig0 = self.signal();
            let mut moved = false;
            for (p, begun, ab) in owed.iter_mut() {
                if let Some(i) = *begun {
                    let Xfer::Send { data, .. } = &xfers[i] else { continue };
                    match self.send_step(*p, data, &mut st[i])? {
                        Step::Done => {
                            st[i].done = true;
                            *begun = None;
                            moved = true;
                        }
                        Step::Blocked(m) => {
                            moved |= m;
                            continue;
                        }
                    }
                }
                match self.send_step(*p, &[], ab)? {
                    Step::Done => {
                        ab.done = true;
                        moved = true;
                    }
                    Step::Blocked(m) => moved |= m,
                }
            }
            owed.retain(|(_, _, ab)| !ab.done);
            if owed.is_empty() {
                return Ok(());
            }
            for (p, h) in reading.iter_mut().enumerate() {
                if let Some(hdr) = h {
                    if !self.drain_step(p, hdr, &mut moved)? {
                        *h = None;
                    }
                }
            }
            if !moved {
                let pending: Vec<Rank> = owed.iter().map(|o| o.0).collect();
                let shm = pending.iter().any(|&p| matches!(self.links[p], Some(Link::Shm(_))));
                let tcp = pending.iter().any(|&p| matches!(self.links[p], Some(Link::Tcp(_))));
                self.wait(pending, tcp, shm, sig0)?;
            }
        }
    }

    /// Skips frames of this collective (and earlier ones) on `peer`'s link;
    /// false once the peer is past it (its next frame is given back).
    fn drain_step(&mut self, peer: Rank, hdr: &mut ([u8; HEADER_LEN], usize), moved: &mut bool) -> crate::error::Result<bool> {
        loop {
            if !self.skip_step(peer, moved)? {
                return Ok(true);
            }
            while hdr.1 < HEADER_LEN {
                let k = self.pull(peer, &mut hdr.0[hdr.1..])?;
                if k == 0 {
                    return Ok(true);
                }
                hdr.1 += k;
                *moved = true;
            }
            let h = Header::decode(&hdr.0).map_err(|why| self.protocol(peer, why))?;
            let seq = self.ctx.wire_seq();
            if frame::before(seq, h.seq) {
                let b = hdr.0;
                self.give_back(peer, &b);
                hdr.1 = 0;
                return Ok(false);
            }
            self.skip[peer] = h.len;
            hdr.1 = 0;
        }
    }
}
