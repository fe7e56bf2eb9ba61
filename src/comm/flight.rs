//! The flight recorder: every communicator keeps its last N operations
//! (sequence number, op, sizes, dtype, peers, state, queue / start / end
//! times) so that after a hang one can see which rank stopped where.
//! `rustccl.flight_record()` returns it; on a timeout it is written to
//! `RUSTCCL_FLIGHT_RECORDER_DIR` (when set) as
//! `rustccl-flight-<group>-rank<r>-<pid>.json`.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::collectives::Op;
use crate::tensor::Tensor;
use crate::types::{DType, Device, Rank};
use crate::work::Work;

/// What is recorded about an operation besides its work handle (plain
/// values, turned into text only when the record is read: recording sits
/// on every collective's submission path).
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub op: &'static str,
    pub bytes: usize,
    pub dtype: Option<DType>,
    pub peers: Peers,
    pub device: Device,
}

impl Meta {
    /// What the recorder notes about a submission of `ops` (not empty).
    pub fn of(ops: &[Op<Tensor>]) -> Meta {
        let first = &ops[0];
        let peers = match first {
            Op::Broadcast { root, .. } | Op::Reduce { root, .. } | Op::Gather { root, .. } | Op::Scatter { root, .. } => Peers::Root(*root),
            Op::Send { peer, .. } => Peers::To(*peer),
            Op::Recv { peer, .. } => Peers::From(*peer),
            _ => Peers::All,
        };
        let op = if ops.len() > 1 { "coalesced" } else { first.kind().name() };
        Meta { op, bytes: ops.iter().map(|o| o.bytes()).sum(), dtype: first.first_dtype(), peers, device: first.device() }
    }
}

/// Whom an operation exchanges with, as the record shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// Every rank of the group ("all").
    All,
    /// A rooted collective ("root=R").
    Root(Rank),
    /// A send ("to=R").
    To(Rank),
    /// A receive ("from=R", or "from=any").
    From(Option<Rank>),
}

impl std::fmt::Display for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peers::All => f.write_str("all"),
            Peers::Root(r) => write!(f, "root={r}"),
            Peers::To(r) => write!(f, "to={r}"),
            Peers::From(Some(r)) => write!(f, "from={r}"),
            Peers::From(None) => f.write_str("from=any"),
        }
    }
}

struct Entry {
    meta: Meta,
    queued: Instant,
    work: Work,
}

pub struct FlightRecorder {
    cap: usize,
    entries: Mutex<VecDeque<Entry>>,
    /// Wall-clock anchor for turning Instants into timestamps.
    epoch: (SystemTime, Instant),
}

fn unix(epoch: (SystemTime, Instant), t: Instant) -> f64 {
    let wall = epoch.0 + t.saturating_duration_since(epoch.1);
    wall.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

impl FlightRecorder {
    pub fn new(cap: usize) -> FlightRecorder {
        FlightRecorder { cap: cap.max(1), entries: Mutex::new(VecDeque::new()), epoch: (SystemTime::now(), Instant::now()) }
    }

    /// Records `work`, handed to the engine at `queued` (before it could
    /// start, so that its queue time reads as started - queued).
    pub fn record(&self, meta: Meta, queued: Instant, work: &Work) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() == self.cap {
            e.pop_front();
        }
        e.push_back(Entry { meta, queued, work: work.clone() });
    }

    /// The recorded operations as a JSON document.
    pub fn to_json(&self, group: &str, rank: usize, size: usize) -> String {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        let _ = write!(
            out,
            "{{\"group\": \"{}\", \"rank\": {rank}, \"size\": {size}, \"pid\": {}, \"dumped_at\": {:.6}, \"entries\": [",
            esc(group),
            std::process::id(),
            unix(self.epoch, Instant::now())
        );
        for (i, e) in entries.iter().enumerate() {
            let (started, finished) = e.work.times();
            let state = match (e.work.result(), started) {
                (Some(Ok(())), _) => "done",
                (Some(Err(_)), _) => "failed",
                (None, Some(_)) => "running",
                (None, None) => "queued",
            };
            let error = match e.work.result() {
                Some(Err(err)) => format!("\"{}\"", esc(&err.to_string())),
                _ => "null".into(),
            };
            let ts = |t: Option<Instant>| t.map_or("null".to_string(), |t| format!("{:.6}", unix(self.epoch, t)));
            let dur = match (started, finished) {
                (Some(s), Some(f)) => format!("{:.1}", f.saturating_duration_since(s).as_secs_f64() * 1e6),
                _ => "null".into(),
            };
            let _ = write!(
                out,
                "{}{{\"seq\": {}, \"op\": \"{}\", \"bytes\": {}, \"dtype\": \"{}\", \"peers\": \"{}\", \"device\": \"{}\", \"state\": \"{state}\", \"error\": {error}, \"queued_at\": {}, \"started_at\": {}, \"finished_at\": {}, \"duration_us\": {dur}}}",
                if i == 0 { "" } else { ", " },
                e.work.seq(),
                e.meta.op,
                e.meta.bytes,
                esc(&e.meta.dtype.map(DType::name).unwrap_or_default()),
                e.meta.peers,
                esc(&e.meta.device.to_string()),
                ts(Some(e.queued)),
                ts(started),
                ts(finished),
            );
        }
        out.push_str("]}");
        out
    }

    /// Writes the record to `dir` (created if needed); returns the path.
    pub fn dump(&self, dir: &str, group: &str, rank: usize, size: usize) -> std::io::Result<String> {
        std::fs::create_dir_all(dir)?;
        let safe: String = group.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let path = format!("{}/rustccl-flight-{safe}-rank{rank}-{}.json", dir.trim_end_matches('/'), std::process::id());
        std::fs::write(&path, self.to_json(group, rank, size))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn meta(op: &'static str) -> Meta {
        Meta { op, bytes: 40, dtype: Some(DType::F32), peers: Peers::All, device: Device::Cpu }
    }

    #[test]
    fn keeps_the_last_n_with_their_states() {
        let fr = FlightRecorder::new(2);
        let a = Work::new("all_reduce", 0);
        let b = Work::new("broadcast", 1);
        let c = Work::new("barrier", 2);
        fr.record(meta("all_reduce"), Instant::now(), &a);
        fr.record(meta("broadcast"), Instant::now(), &b);
        fr.record(meta("barrier"), Instant::now(), &c);
        b.mark_started();
        b.finish(Err(Error::Internal("boom \"x\"".into())));
        c.mark_started();
        let j = fr.to_json("0", 1, 2);
        assert!(!j.contains("\"seq\": 0,"), "oldest entry dropped: {j}");
        assert!(j.contains("\"op\": \"broadcast\"") && j.contains("\"state\": \"failed\"") && j.contains("boom \\\"x\\\""), "{j}");
        assert!(j.contains("\"op\": \"barrier\"") && j.contains("\"state\": \"running\""), "{j}");
        assert!(j.contains("\"dtype\": \"float32\", \"peers\": \"all\", \"device\": \"cpu\""), "{j}");
        assert_eq!(Peers::From(None).to_string(), "from=any");
        assert_eq!(Peers::Root(3).to_string(), "root=3");
        // valid JSON shape: balanced braces
        assert_eq!(j.matches('{').count(), j.matches('}').count());
    }
}
