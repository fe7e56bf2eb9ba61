//! The byte rings between two local ranks: one producer and one consumer
//! per direction, in the producer's segment, and [`ShmLink`], the pair of
//! them that a transport link reads and writes.

use std::io;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::segment::{Channel, Segment};
use super::ShmLocal;

/// Byte rings to and from one local peer.
pub struct ShmLink {
    tx: RingTx,
    rx: RingRx,
    /// The (otherwise idle) TCP connection to the peer: EOF means it died
    /// (None: the owner of the link watches the peer itself).
    watch: Option<TcpStream>,
    /// Bytes given back to the ring ([`ShmLink::give_back`]): pulls take
    /// them first.
    given_back: Vec<u8>,
}

/// The producing end of the ring towards one local peer (in our segment).
pub struct RingTx {
    peer: usize,
    chan: Channel,
    mine: Arc<Segment>,
    theirs: Arc<Segment>,
    out_head: u64,
}

/// The consuming end of the ring from one local peer (in its segment).
pub struct RingRx {
    me: usize,
    chan: Channel,
    theirs: Arc<Segment>,
    in_tail: u64,
}

impl ShmLink {
    pub(super) fn new(local: &ShmLocal, peer: usize, chan: Channel, watch: Option<TcpStream>) -> io::Result<ShmLink> {
        if let Some(w) = &watch {
            w.set_nonblocking(true)?;
        }
        let mine = local.segs[local.me].clone();
        let theirs = local.segs[peer].clone();
        let out_head = mine.u64_at(mine.layout.head_off(chan, peer)).load(Ordering::Acquire);
        let in_tail = theirs.u64_at(theirs.layout.tail_off(chan, local.me)).load(Ordering::Acquire);
        let tx = RingTx { peer, chan, mine, theirs: theirs.clone(), out_head };
        let rx = RingRx { me: local.me, chan, theirs, in_tail };
        Ok(ShmLink { tx, rx, watch, given_back: Vec::new() })
    }

    /// Local index of the peer.
    pub fn peer_index(&self) -> usize {
        self.tx.peer
    }

    /// Appends as much of `bytes` as fits to the ring towards the peer.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        self.tx.push(bytes)
    }

    /// Takes as many bytes as are available (up to `dst.len()`) from the
    /// ring from the peer.
    pub fn pull(&mut self, dst: &mut [u8]) -> usize {
        if self.given_back.is_empty() {
            return self.rx.pull(dst);
        }
        let k = dst.len().min(self.given_back.len());
        dst[..k].copy_from_slice(&self.given_back[..k]);
        self.given_back.drain(..k);
        k
    }

    /// Puts `bytes` back in front of what is unread (a frame the receiver
    /// does not take now).
    pub fn give_back(&mut self, bytes: &[u8]) {
        self.given_back.splice(0..0, bytes.iter().copied());
    }

    /// The two ends, for an owner that writes from other threads than it
    /// reads (the point-to-point engine); drops the watched connection, if
    /// the link has one.
    pub fn split(self) -> (RingTx, RingRx) {
        (self.tx, self.rx)
    }

    /// Whether bytes this rank pushed are still in the ring for the peer
    /// to take.
    pub fn unread(&self) -> bool {
        self.tx.free() < self.tx.mine.layout.ring
    }

    /// Whether the peer pushed bytes this rank has not taken yet.
    pub fn readable(&self) -> bool {
        !self.given_back.is_empty() || self.rx.available() > 0
    }

    /// Closes the watched connection, so the peer sees this rank as gone.
    pub fn shutdown(&self) {
        if let Some(w) = &self.watch {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Err if the peer's process is gone (its TCP connection closed).
    pub fn alive(&self) -> Result<(), String> {
        let Some(w) = &self.watch else { return Ok(()) };
        let mut b = [0u8; 1];
        match w.peek(&mut b) {
            Ok(0) => Err("connection closed by peer (process exited?)".into()),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(format!("connection to peer lost: {e}")),
        }
    }
}

impl RingTx {
    /// Bytes that can be pushed now without waiting for the consumer.
    pub fn free(&self) -> usize {
        let l = self.mine.layout;
        let tail = self.mine.u64_at(l.tail_off(self.chan, self.peer)).load(Ordering::Acquire);
        l.ring - (self.out_head - tail) as usize
    }

    /// Appends as much of `bytes` as fits and wakes the peer.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        self.push_parts(&[bytes])
    }

    /// Appends as much of `parts`, one after the other, as fits, and wakes
    /// the peer once. The bytes are published every [`PUBLISH_EVERY`] as
    /// they are written, so a consumer polling the ring copies a message
    /// out while the rest of it goes in.
    pub fn push_parts(&mut self, parts: &[&[u8]]) -> usize {
        let l = self.mine.layout;
        let c = self.chan;
        let ring = l.ring_off(c, self.peer);
        let head = self.mine.u64_at(l.head_off(c, self.peer));
        let mut free = self.free();
        let mut total = 0;
        for bytes in parts.iter().filter(|b| !b.is_empty()) {
            let n = free.min(bytes.len());
            if n == 0 {
                break;
            }
            for piece in bytes[..n].chunks(PUBLISH_EVERY) {
                let pos = (self.out_head as usize) & (l.ring - 1);
                let first = piece.len().min(l.ring - pos);
                // SAFETY: bytes [head, head + n) of the ring are free: the
                // consumer has released everything below `tail` (acquired
                // in `free`) and reads nothing at or above `head` until we
                // publish it below.
                unsafe {
                    self.mine.write(ring + pos, &piece[..first]);
                    self.mine.write(ring, &piece[first..]);
                }
                self.out_head += piece.len() as u64;
                head.store(self.out_head, Ordering::Release);
            }
            free -= n;
            total += n;
            if n < bytes.len() {
                break;
            }
        }
        if total > 0 {
            self.theirs.notify_on(c);
        }
        total
    }
}

/// How often [`RingTx::push_parts`] publishes what it has written of a
/// longer push: published in pieces, the receiver's copy runs behind the
/// sender's instead of after it (`docs/decisions/0004`).
const PUBLISH_EVERY: usize = 8 << 10;

impl RingRx {
    /// Bytes published by the producer and not yet taken.
    pub fn available(&self) -> usize {
        let l = self.theirs.layout;
        let head = self.theirs.u64_at(l.head_off(self.chan, self.me)).load(Ordering::Acquire);
        (head - self.in_tail) as usize
    }

    /// Takes as many bytes as are available (up to `dst.len()`) and wakes
    /// the producer.
    pub fn pull(&mut self, dst: &mut [u8]) -> usize {
        let l = self.theirs.layout;
        let c = self.chan;
        let head = self.theirs.u64_at(l.head_off(c, self.me)).load(Ordering::Acquire);
        let n = ((head - self.in_tail) as usize).min(dst.len());
        if n == 0 {
            return 0;
        }
        let pos = (self.in_tail as usize) & (l.ring - 1);
        let first = n.min(l.ring - pos);
        let ring = l.ring_off(c, self.me);
        // SAFETY: bytes [tail, head) were published by the producer (release
        // store of head, acquired above) and it writes none of them again
        // until we release them below.
        unsafe {
            self.theirs.read(ring + pos, &mut dst[..first]);
            self.theirs.read(ring, &mut dst[first..n]);
        }
        self.in_tail += n as u64;
        self.theirs.u64_at(l.tail_off(c, self.me)).store(self.in_tail, Ordering::Release);
        self.theirs.notify_on(c);
        n
    }
}
