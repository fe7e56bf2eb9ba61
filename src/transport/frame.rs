//! The 24-byte header in front of every message on a link:
//! magic (u16) | roots (u16) | sequence number (u32) | payload length (u64) |
//! what the collective is ([`What`]: kind, reduce op, dtype (u8 each), flags
//! (u8), element count (u32)), little endian.
//!
//! A frame flagged [`Header::abort`] (no payload) tells the peer that the
//! sender gave its collective `seq` up because the ranks disagree about
//! it; the receiver then gives it up too, and frames of an earlier
//! collective left on a link are skipped ([`Header::classify`]).
#![forbid(unsafe_code)]

use crate::types::{DType, OpKind, ReduceOp};

pub const HEADER_LEN: usize = 24;
const MAGIC: u16 = 0x52ce;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub roots: u16,
    pub seq: u32,
    pub len: u64,
    pub what: What,
    /// The sender gave collective `seq` up (no payload).
    pub abort: bool,
}

const FLAG_ABORT: u8 = 1;

/// What a received header means to a receiver at collective `want.seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The message it waits for.
    Expected,
    /// A frame of an earlier collective that this rank left unread when
    /// that collective was given up: `len` payload bytes to skip.
    Stale { len: u64 },
    /// The sender gave this collective up; its header says what it runs.
    Aborted { theirs: What },
    /// The ranks disagree about this collective (roots, dtype, size,
    /// reduce op); the frame is not consumed.
    Mismatch(String),
    /// The byte stream is out of step (a bad header, a peer ahead): the
    /// link cannot be used again.
    Desync(String),
}

/// True if sequence number `a` comes before `b` (modulo 2^32).
pub fn before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

/// What every message of one collective carries besides its length, so
/// that ranks that disagree about the collective fail instead of mixing
/// data: its sequence number, its roots ([`roots_tag`]) and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wire {
    pub seq: u32,
    pub roots: u16,
    pub what: What,
}

impl Wire {
    /// The header of a message of `len` bytes of this operation.
    pub fn header(self, len: usize) -> Header {
        Header { roots: self.roots, seq: self.seq, len: len as u64, what: self.what, abort: false }
    }

    /// The frame that gives this operation up ([`Header::abort`]).
    pub fn abort(self) -> Header {
        Header { abort: true, ..self.header(0) }
    }
}

/// A collective as every rank of it describes it alike: its kind, reduce
/// op, dtype and the element count that all ranks share (of the reduced
/// tensor, the gathered output, the broadcast buffer). Two ranks whose
/// messages have the same length can still disagree here (`float32[8]`
/// against `int32[8]` or `float64[4]`), which must fail, not mix bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct What {
    /// `OpKind as u8 + 1`; 0: not described (set-up traffic).
    pub kind: u8,
    /// `ReduceOp as u8 + 1`; 0: the collective does not reduce.
    pub op: u8,
    /// [`dtype_code`]; 0: no tensor.
    pub dtype: u8,
    /// The shared element count; above [`FOLDED_COUNT`] a fold of several
    /// (or of one too large to carry); [`UNCHECKED_COUNT`]: the ranks'
    /// counts may differ (all_to_all, gather, scatter).
    pub count: u32,
}

const FOLDED_COUNT: u32 = 0x8000_0000;
pub const UNCHECKED_COUNT: u32 = u32::MAX;

/// What to do after a mismatch between ranks.
pub const NEXT_STEP: &str = "rerun with RUSTCCL_CHECK=1 to compare every call across ranks before it runs: it names the call that differs";

/// An element count (or several, when coalesced) in 32 bits: the count
/// itself when there is one below 2^31, else a fold of them all.
pub fn count_tag(counts: impl IntoIterator<Item = usize>) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let (mut n, mut first) = (0, 0usize);
    for c in counts {
        if n == 0 {
            first = c;
        }
        h = (h ^ c as u64).wrapping_mul(0x0000_0100_0000_01b3);
        n += 1;
    }
    if n == 1 && (first as u64) < FOLDED_COUNT as u64 {
        return first as u32;
    }
    ((h ^ (h >> 32)) as u32 | FOLDED_COUNT).min(UNCHECKED_COUNT - 1)
}

/// A dtype in one byte: its own number for torch's common dtypes, else a
/// fold of DLPack's code and the element size.
pub fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F32 => 1,
        DType::F64 => 2,
        DType::F16 => 3,
        DType::BF16 => 4,
        DType::U8 => 5,
        DType::I8 => 6,
        DType::I16 => 7,
        DType::I32 => 8,
        DType::I64 => 9,
        DType::Bool => 10,
        DType::Other { code, bits } => 0x80 | (code & 0x0f) << 3 | ((bits / 8).trailing_zeros() as u8 & 7),
    }
}

/// The name of a dtype sent as [`dtype_code`], in torch's words.
pub fn dtype_name(c: u8) -> String {
    dtype_from_code(c).map_or_else(|| format!("dtype code {c}"), |d| d.name())
}

/// The dtype sent as [`dtype_code`] (an uncommon one as DLPack's code and
/// size), if the code is one.
pub fn dtype_from_code(c: u8) -> Option<DType> {
    const KNOWN: [DType; 10] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::U8, DType::I8, DType::I16, DType::I32, DType::I64, DType::Bool];
    match c {
        1..=10 => Some(KNOWN[c as usize - 1]),
        c if c >= 0x80 => Some(DType::Other { code: (c >> 3) & 0x0f, bits: 8 << (c & 7) }),
        _ => None,
    }
}

impl What {
    pub fn new(kind: OpKind, op: Option<ReduceOp>, dtype: Option<DType>, count: u32) -> What {
        What { kind: kind as u8 + 1, op: op.map_or(0, |o| o as u8 + 1), dtype: dtype.map_or(0, dtype_code), count }
    }

    fn kind(self) -> Option<OpKind> {
        self.kind.checked_sub(1).and_then(|k| OpKind::from_i32(k as i32))
    }

    /// True where the two describe the same collective (a count that one
    /// side does not check matches any).
    fn agrees(self, o: What) -> bool {
        let counts = self.count == o.count || self.count == UNCHECKED_COUNT || o.count == UNCHECKED_COUNT;
        self.kind == o.kind && self.op == o.op && self.dtype == o.dtype && counts
    }

    /// In torch's names: `all_reduce(SUM) of 8 x int32`.
    pub fn text(self) -> String {
        let Some(kind) = self.kind() else { return "set-up traffic".into() };
        let mut s = kind.name().to_string();
        if let Some(op) = self.op.checked_sub(1).and_then(|o| ReduceOp::from_i32(o as i32)) {
            s += &format!("({})", op.name());
        }
        let dtype = dtype_from_code(self.dtype).map(|d| d.name());
        match (self.count, dtype) {
            (_, None) => {}
            (c, Some(d)) if c < FOLDED_COUNT => s += &format!(" of {c} x {d}"),
            (UNCHECKED_COUNT, Some(d)) => s += &format!(" of {d}"),
            (_, Some(d)) => s += &format!(" of {d} (tensors of several or very large sizes)"),
        }
        s
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
        b[16] = self.what.kind;
        b[17] = self.what.op;
        b[18] = self.what.dtype;
        b[19] = if self.abort { FLAG_ABORT } else { 0 };
        b[20..24].copy_from_slice(&self.what.count.to_le_bytes());
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
            what: What { kind: b[16], op: b[17], dtype: b[18], count: u32::from_le_bytes(b[20..24].try_into().expect("4 bytes")) },
            abort: b[19] & FLAG_ABORT != 0,
        })
    }

    /// What a received header `b` means to a receiver at `want` that
    /// expects `len` bytes.
    pub fn classify(b: &[u8; HEADER_LEN], want: Wire, len: usize) -> Seen {
        let h = match Header::decode(b) {
            Ok(h) => h,
            Err(why) => return Seen::Desync(why),
        };
        if before(h.seq, want.seq) {
            return Seen::Stale { len: h.len };
        }
        if h.seq == want.seq && h.abort {
            return Seen::Aborted { theirs: h.what };
        }
        match h.expect(want, len) {
            Ok(()) => Seen::Expected,
            Err(why) if h.seq != want.seq || h.abort => Seen::Desync(why),
            Err(why) => Seen::Mismatch(why),
        }
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
        if !self.what.agrees(want.what) {
            return Err(format!(
                "peer runs {} where this rank runs {}: the ranks passed different dtypes, sizes or reduce ops to this collective ({NEXT_STEP})",
                self.what.text(),
                want.what.text()
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
/// magic (u16) | kind (u16) | dtype (u8, [`dtype_code`]; 0 in control
/// messages) | reserved (3 bytes) | tag (i64) | length (u64).
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
    pub dtype: u8,
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
        b[4] = self.dtype;
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
            dtype: b[4],
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
        let what = What::new(OpKind::AllReduce, Some(ReduceOp::Sum), Some(DType::F32), 8);
        let h = Header { roots: 3, seq: 77, len: 1 << 40, what, abort: false };
        let want = Wire { seq: 77, roots: 3, what };
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
    fn classify_tells_stale_aborted_mismatched_and_desynced_frames_apart() {
        let what = What::new(OpKind::AllReduce, Some(ReduceOp::Sum), Some(DType::F32), 8);
        let want = Wire { seq: 10, roots: 0, what };
        assert_eq!(Header::classify(&want.header(32).encode(), want, 32), Seen::Expected);
        let old = Wire { seq: 9, ..want };
        assert_eq!(Header::classify(&old.header(48).encode(), want, 32), Seen::Stale { len: 48 });
        assert_eq!(Header::classify(&old.abort().encode(), want, 32), Seen::Stale { len: 0 });
        let i32x8 = What { dtype: dtype_code(DType::I32), ..what };
        let theirs = Wire { what: i32x8, ..want };
        assert_eq!(Header::classify(&theirs.abort().encode(), want, 32), Seen::Aborted { theirs: i32x8 });
        assert!(matches!(Header::classify(&theirs.header(32).encode(), want, 32), Seen::Mismatch(w) if w.contains("8 x int32")));
        assert!(matches!(Header::classify(&want.header(48).encode(), want, 32), Seen::Mismatch(_)));
        let ahead = Wire { seq: 11, ..want };
        assert!(matches!(Header::classify(&ahead.header(32).encode(), want, 32), Seen::Desync(w) if w.contains("seq 11")));
        assert!(matches!(Header::classify(&ahead.abort().encode(), want, 32), Seen::Desync(_)));
        assert!(matches!(Header::classify(&[0; HEADER_LEN], want, 32), Seen::Desync(_)));
        // across the wrap of the 32-bit number
        let (last, first) = (Wire { seq: u32::MAX, ..want }, Wire { seq: 0, ..want });
        assert_eq!(Header::classify(&last.header(4).encode(), first, 32), Seen::Stale { len: 4 });
        assert!(matches!(Header::classify(&first.header(32).encode(), last, 32), Seen::Desync(_)));
    }

    #[test]
    fn same_length_different_collective_fails() {
        let f32x8 = What::new(OpKind::AllReduce, Some(ReduceOp::Sum), Some(DType::F32), 8);
        let want = Wire { seq: 1, roots: 0, what: f32x8 };
        let i32x8 = What { dtype: dtype_code(DType::I32), ..f32x8 };
        let e = want.header(32).expect(Wire { what: i32x8, ..want }, 32).unwrap_err();
        assert!(e.contains("peer runs all_reduce(SUM) of 8 x float32 where this rank runs all_reduce(SUM) of 8 x int32"), "{e}");
        let f64x4 = What::new(OpKind::AllReduce, Some(ReduceOp::Sum), Some(DType::F64), 4);
        assert!(Wire { what: f64x4, ..want }.header(32).expect(want, 32).unwrap_err().contains("4 x float64"));
        let max = What::new(OpKind::AllReduce, Some(ReduceOp::Max), Some(DType::F32), 8);
        assert!(Wire { what: max, ..want }.header(32).expect(want, 32).unwrap_err().contains("all_reduce(MAX)"));
        let gather = What::new(OpKind::AllToAll, None, Some(DType::F32), UNCHECKED_COUNT);
        let other = What { count: 3, ..gather };
        assert!(Wire { what: gather, ..want }.header(32).expect(Wire { what: other, ..want }, 32).is_ok());
        assert_eq!(gather.text(), "all_to_all of float32");
    }

    #[test]
    fn dtype_codes_round_trip_and_counts_fold() {
        use dlpack_rs::ffi::DLDataTypeCode as C;
        for d in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::U8, DType::I8, DType::I16, DType::I32, DType::I64, DType::Bool] {
            assert_eq!(dtype_from_code(dtype_code(d)), Some(d));
        }
        let c64 = DType::Other { code: C::kDLComplex as u8, bits: 64 };
        assert_eq!(dtype_from_code(dtype_code(c64)), Some(c64));
        assert_ne!(dtype_code(c64), dtype_code(DType::Other { code: C::kDLComplex as u8, bits: 128 }));
        assert_eq!(count_tag([7]), 7);
        assert_ne!(count_tag([3, 4]), count_tag([4, 3]));
        assert!(count_tag([3, 4]) >= FOLDED_COUNT && count_tag([1 << 33]) >= FOLDED_COUNT);
        assert_ne!(count_tag([3, 4]), UNCHECKED_COUNT);
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
            let h = P2pHeader { kind, dtype: 9, tag: -5, len: 12345 };
            assert_eq!(P2pHeader::decode(&h.encode()).unwrap(), h);
        }
        let mut bad = P2pHeader { kind: P2pKind::Ack, dtype: 0, tag: 1, len: 2 }.encode();
        bad[2] = 9;
        assert!(P2pHeader::decode(&bad).is_err());
        assert!(P2pHeader::decode(&[0; P2P_HEADER_LEN]).is_err());
    }
}
