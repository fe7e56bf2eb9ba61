//! The 16-byte header in front of every message on a link:
//! magic (u16) | roots (u16) | sequence number (u32) | payload length (u64),
//! little endian.
#![forbid(unsafe_code)]

pub const HEADER_LEN: usize = 16;
const MAGIC: u16 = 0x52cc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub roots: u16,
    pub seq: u32,
    pub len: u64,
}

/// What every message of one collective carries besides its length, so
/// that ranks that disagree about the collective fail instead of mixing
/// data: its sequence number and its roots ([`roots_tag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wire {
    pub seq: u32,
    pub roots: u16,
}

impl Wire {
    /// The header of a message of `len` bytes of this operation.
    pub fn header(self, len: usize) -> Header {
        Header { roots: self.roots, seq: self.seq, len: len as u64 }
    }
}

/// Above it: a fold of several roots (or of one root too large to carry).
const FOLDED: u16 = 0x8000;

/// The roots of a collective's rooted operations (broadcast, reduce,
/// gather, scatter; several when coalesced) in 16 bits: 0 for none, the
/// root + 1 for one (below 32767), else a fold of them all.
pub fn roots_tag(roots: impl IntoIterator<Item = usize>) -> u16 {
    let mut it = roots.into_iter();
    let Some(first) = it.next() else { return 0 };
    let mut h: u32 = 0x811c_9dc5;
    let mut n = 0;
    for r in std::iter::once(first).chain(it) {
        h = (h ^ (r as u32).wrapping_add(1)).wrapping_mul(0x0100_0193);
        n += 1;
    }
    if n == 1 && first + 1 < FOLDED as usize {
        return first as u16 + 1;
    }
    (h ^ (h >> 16)) as u16 | FOLDED
}

fn roots_text(tag: u16) -> String {
    match tag {
        0 => "no root".into(),
        t if t < FOLDED => format!("root {}", t - 1),
        _ => "other roots".into(),
    }
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2..4].copy_from_slice(&self.roots.to_le_bytes());
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(format!("bad message header (magic {magic:#06x}); the byte stream is out of step"));
        }
        Ok(Header {
            roots: u16::from_le_bytes([b[2], b[3]]),
            seq: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            len: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        })
    }

    /// Compares a received header with what the receiver expects; the
    /// message says how they differ.
    pub fn expect(&self, want: Wire, len: usize) -> Result<(), String> {
        let seq = want.seq;
        if self.seq != seq {
            return Err(format!(
                "peer is at operation seq {} but this rank is at seq {seq}: the ranks called a different number of collectives (or named different roots, so that some skipped a message)",
                self.seq
            ));
        }
        if self.roots != want.roots {
            return Err(format!(
                "peer runs this collective with {} where this rank has {}: the ranks passed different roots",
                roots_text(self.roots),
                roots_text(want.roots)
            ));
        }
        if self.len != len as u64 {
            return Err(format!(
                "peer sent {} bytes where this rank expects {len}: the ranks passed different tensor sizes or dtypes",
                self.len
            ));
        }
        Ok(())
    }
}

/// Header of a point-to-point message (24 bytes):
/// magic (u16) | kind (u16) | reserved (u32) | tag (i64) | length (u64).
pub const P2P_HEADER_LEN: usize = 24;
const P2P_MAGIC: u16 = 0x52dd;

/// Bytes after a rendezvous header: the sender's address, its id.
pub const RENDEZVOUS_BODY_LEN: usize = 16;
/// Longest error text an ack may carry.
pub const ACK_MAX: usize = 64 << 10;

/// The body of a rendezvous message.
pub fn rendezvous_body(addr: u64, id: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(RENDEZVOUS_BODY_LEN);
    b.extend_from_slice(&addr.to_le_bytes());
    b.extend_from_slice(&id.to_le_bytes());
    b
}

/// (address, id) of a rendezvous body.
pub fn rendezvous_parse(b: &[u8]) -> (u64, u64) {
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    (word(0), word(8))
}

/// What follows a point-to-point header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pKind {
    /// `len` bytes of the message (eager).
    Data,
    /// A large message between ranks of one host that the receiver reads
    /// from the sender's memory (rendezvous): `len` is the message's
    /// length; the body is 16 bytes, the sender's address and its id for
    /// the ack.
    Rendezvous,
    /// As `Rendezvous`, but the bytes go to the sender's staging area in
    /// shared memory (`transport::shm::stage`); the body's address field
    /// holds the staged send's number, which marks its chunks ready.
    Staged,
    /// The receiver of rendezvous message `tag` (its id) took it: `len`
    /// bytes of error text follow (none: it went well).
    Ack,
    /// The receiver of rendezvous message `tag` (its id) asks its sender to
    /// write the message's last `len` bytes into the receiver's memory
    /// (a split send); the body is 16 bytes: where they go, and where in
    /// the message they start.
    PushRequest,
    /// The sender of rendezvous message `tag` wrote what its receiver
    /// asked for: `len` bytes of error text follow (none: it went well).
    Pushed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pHeader {
    pub kind: P2pKind,
    pub tag: i64,
    pub len: u64,
}

impl P2pHeader {
    pub fn encode(&self) -> [u8; P2P_HEADER_LEN] {
        let mut b = [0u8; P2P_HEADER_LEN];
        b[0..2].copy_from_slice(&P2P_MAGIC.to_le_bytes());
        let kind: u16 = match self.kind {
            P2pKind::Data => 0,
            P2pKind::Rendezvous => 1,
            P2pKind::Ack => 2,
            P2pKind::Staged => 3,
            P2pKind::PushRequest => 4,
            P2pKind::Pushed => 5,
        };
        b[2..4].copy_from_slice(&kind.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; P2P_HEADER_LEN]) -> Result<P2pHeader, String> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != P2P_MAGIC {
            return Err(format!("bad point-to-point header (magic {magic:#06x})"));
        }
        let kind = match u16::from_le_bytes([b[2], b[3]]) {
            0 => P2pKind::Data,
            1 => P2pKind::Rendezvous,
            2 => P2pKind::Ack,
            3 => P2pKind::Staged,
            4 => P2pKind::PushRequest,
            5 => P2pKind::Pushed,
            k => return Err(format!("bad point-to-point header (kind {k})")),
        };
        Ok(P2pHeader {
            kind,
            tag: i64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            len: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_mismatch() {
        let h = Header { roots: 3, seq: 77, len: 1 << 40 };
        let want = Wire { seq: 77, roots: 3 };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert!(h.expect(want, 1 << 40).is_ok());
        assert!(h.expect(Wire { seq: 76, ..want }, 1 << 40).unwrap_err().contains("seq 77"));
        assert!(h.expect(want, 4).unwrap_err().contains("different tensor sizes"));
        let e = h.expect(Wire { roots: 1, ..want }, 1 << 40).unwrap_err();
        assert!(e.contains("with root 2 where this rank has root 0: the ranks passed different roots"), "{e}");
        let mut bad = h.encode();
        bad[0] = 0;
        assert!(Header::decode(&bad).is_err());
    }

    #[test]
    fn roots_tags_tell_roots_apart() {
        assert_eq!(roots_tag([]), 0);
        assert_eq!(roots_tag([0]), 1);
        assert_eq!(roots_tag([5]), 6);
        assert!(roots_tag([40_000]) >= FOLDED);
        // coalesced: the order and every root count
        let (a, b, c) = (roots_tag([0, 1]), roots_tag([1, 0]), roots_tag([0, 0]));
        assert!(a >= FOLDED && b >= FOLDED && c >= FOLDED);
        assert!(a != b && a != c && b != c);
        assert_ne!(roots_tag([0, 0]), roots_tag([0]));
        assert!(roots_text(a).contains("other roots"));
    }

    #[test]
    fn p2p_round_trip() {
        for kind in [P2pKind::Data, P2pKind::Rendezvous, P2pKind::Staged, P2pKind::Ack, P2pKind::PushRequest, P2pKind::Pushed] {
            let h = P2pHeader { kind, tag: -5, len: 12345 };
            assert_eq!(P2pHeader::decode(&h.encode()).unwrap(), h);
        }
        let mut bad = P2pHeader { kind: P2pKind::Ack, tag: 1, len: 2 }.encode();
        bad[2] = 9;
        assert!(P2pHeader::decode(&bad).is_err());
        assert!(P2pHeader::decode(&[0; P2P_HEADER_LEN]).is_err());
    }
}
