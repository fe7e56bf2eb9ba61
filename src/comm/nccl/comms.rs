//! The NCCL communicators of an [`NcclEngine`]: the group's on its one
//! device, created on first use with the unique id broadcast over
//! rustccl's CPU links, and two-rank ones for sends and receives with a
//! single peer while the group has none; which one a submission runs on.
#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};

use super::ids::{id_bytes, id_from};
use super::{lock, IdExchange, NcclEngine, RawComm};
use crate::collectives::Op;
use crate::config::{log_at, LogLevel};
use crate::cuda::{Context, Event, Stream};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::types::Rank;

/// Which communicator: the group's on a device, or a pair's (device, the
/// other group rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Key {
    Group(i32),
    Pair(i32, Rank),
}

/// One NCCL communicator, its stream and its launch lock.
pub(super) struct DeviceComm {
    pub(super) key: Key,
    pub(super) ctx: Context,
    pub(super) stream: Stream,
    pub(super) ready: Event,
    /// Rank of group rank `i` in this communicator (identity for the group's).
    pub(super) ranks: Vec<Option<usize>>,
    pub(super) raw: Mutex<Option<RawComm>>,
    /// The stream and `done` event of the latest launch (taken under `raw`);
    /// the event is gone once that work was reaped, i.e. finished.
    pub(super) last: Mutex<Option<(u64, std::sync::Weak<Event>)>>,
}

impl NcclEngine {
    /// Binds the group to `device` on first use; later uses must match.
    pub(super) fn bind(&self, op: &'static str, device: i32) -> Result<()> {
        match *self.bound.get_or_init(|| device) {
            d if d == device => Ok(()),
            d => Err(Error::invalid(
                op,
                format!("tensor on cuda:{device}, but this process group uses cuda:{d} (one CUDA device per rank and group)"),
            )),
        }
    }

    /// The communicator for `key` (created on first use). The group's on
    /// the bound device is the common case: kept apart, found without a lock.
    pub(super) fn comm(&self, key: Key, ids: &dyn IdExchange) -> Result<Arc<DeviceComm>> {
        let group = self.bound.get().is_some_and(|&d| key == Key::Group(d));
        if group {
            if let Some(c) = self.group_comm.get() {
                return Ok(c.clone());
            }
        }
        if let Some(c) = lock(&self.sh.comms).get(&key) {
            return Ok(c.clone());
        }
        let c = Arc::new(self.create(key, ids)?);
        lock(&self.sh.comms).insert(key, c.clone());
        if group {
            let _ = self.group_comm.set(c.clone());
        }
        Ok(c)
    }

    fn create(&self, key: Key, ids: &dyn IdExchange) -> Result<DeviceComm> {
        let rank = self.sh.rank;
        let cerr = |what: String| Error::Internal(format!("creating the NCCL communicator: {what}"));
        let (device, nranks, my, ranks) = match key {
            Key::Group(d) => (d, self.size, rank, (0..self.size).map(Some).collect()),
            Key::Pair(d, peer) => {
                let (lo, hi) = (rank.min(peer), rank.max(peer));
                let mut ranks = vec![None; self.size];
                ranks[lo] = Some(0);
                ranks[hi] = Some(1);
                (d, 2, usize::from(rank == hi), ranks)
            }
        };
        let ctx = Context::primary(device).map_err(|e| cerr(e.0))?;
        ctx.bind().map_err(|e| cerr(e.0))?;
        let mut id = [0u8; 128];
        let first = match key {
            Key::Group(_) => rank == 0,
            Key::Pair(_, peer) => rank < peer,
        };
        if first {
            id = id_bytes(&self.sh.lib.unique_id().map_err(cerr)?);
        }
        match key {
            Key::Group(_) => ids.broadcast(&mut id)?,
            Key::Pair(_, peer) => ids.pair(peer, &mut id, first)?,
        }
        let raw = self.sh.lib.init_rank(nranks, id_from(&id), my).map_err(cerr)?;
        let stream = Stream::new().map_err(|e| cerr(e.0))?;
        let ready = Event::new().map_err(|e| cerr(e.0))?;
        log_at!(LogLevel::Info, "group '{}' rank {rank}: NCCL communicator {key:?} on cuda:{device} ({nranks} ranks)", self.sh.group);
        Ok(DeviceComm { key, ctx, stream, ready, ranks, raw: Mutex::new(Some(RawComm(raw))), last: Mutex::new(None) })
    }

    /// Creates the group's communicator on `device` now (all ranks call it).
    pub fn connect(&self, device: i32, ids: &dyn IdExchange) -> Result<()> {
        self.bind("connect", device)?;
        self.comm(Key::Group(device), ids).map(|_| ())
    }

    /// The communicator for `ops`: the group's, or a pair's for sends and
    /// receives with a single peer while the group has none.
    pub(super) fn pick(&self, ops: &[Op<Tensor>], device: i32, ids: &dyn IdExchange) -> Result<Arc<DeviceComm>> {
        if !ops.iter().any(|o| o.kind().is_p2p()) {
            return self.comm(Key::Group(device), ids);
        }
        let mut peers: Vec<Rank> = ops
            .iter()
            .filter_map(|o| match o {
                Op::Send { peer, .. } => Some(*peer),
                Op::Recv { peer: Some(p), .. } => Some(*p),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        peers.dedup();
        let all_p2p = ops.iter().all(|o| o.kind().is_p2p());
        let group_exists = lock(&self.sh.comms).contains_key(&Key::Group(device));
        if all_p2p && peers.len() == 1 && !group_exists {
            return self.comm(Key::Pair(device, peers[0]), ids);
        }
        self.comm(Key::Group(device), ids)
    }
}
