//! New groups made from an existing one, without the store:
//!
//! - `split` (torch's `split_group`): every rank of the parent calls it,
//!   each naming the parent ranks of its new group; the records travel in
//!   one all-gather over the parent's links.
//! - `shrink` (torch's `shrink_group`): only the survivors call it, naming
//!   the ranks to leave out; the records travel over the survivors'
//!   point-to-point links, which a dead rank does not disturb.
//!
//! A record carries what a rank agreed to (the members, or the excluded
//! ranks), its listening address and host, a secret (the new group takes
//! its first member's) and the CUDA device of the parent's NCCL
//! communicator. Once every member holds every record and they agree, the
//! new group connects afresh: its own TCP links and shared memory, so it
//! owns its links outright and outlives the parent (torch destroys the
//! parent right after a shrink; the parent's collective streams may still
//! hold the bytes of the operation the dead rank broke).
#![forbid(unsafe_code)]

use std::time::Duration;

use super::{nccl, CommOptions, Communicator};
use crate::bootstrap::{self, BootstrapOpts, PeerInfo};
use crate::config::log_at;
use crate::config::LogLevel;
use crate::error::{Error, Result};
use crate::tensor::SharedBuf;
use crate::types::{DType, Rank};

/// Bytes of one record (the all-gather needs a fixed size).
const REC: usize = 1024;

struct Record {
    /// Split: the parent ranks of the new group. Shrink: the excluded ranks.
    key: Vec<Rank>,
    secret: [u8; 32],
    /// Device of the parent's NCCL communicator, -1 without one.
    cuda: i32,
    /// Address, pid and host (the rank field is filled in by the reader).
    info: Option<PeerInfo>,
}

impl Record {
    fn encode(&self, rank: Rank) -> Result<[u8; REC]> {
        let info = self.info.as_ref().map(|i| String::from_utf8_lossy(&i.encode()).to_string()).unwrap_or_default();
        let key = self.key.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",");
        let text = format!("{key}\n{}\n{}\n{info}", bootstrap::hex(&self.secret), self.cuda);
        let mut out = [0u8; REC];
        if text.len() > REC {
            return Err(Error::Bootstrap { rank, detail: format!("group record of {} bytes exceeds {REC}", text.len()) });
        }
        out[..text.len()].copy_from_slice(text.as_bytes());
        Ok(out)
    }

    fn decode(from: Rank, b: &[u8]) -> std::result::Result<Record, String> {
        let s = String::from_utf8_lossy(b).trim_end_matches('\0').to_string();
        let bad = || format!("malformed group record from rank {from}: {s:?}");
        let mut it = s.splitn(4, '\n');
        let key = it.next().ok_or_else(bad)?;
        let key = if key.is_empty() {
            Vec::new()
        } else {
            key.split(',').map(|r| r.parse::<Rank>().map_err(|_| bad())).collect::<std::result::Result<_, _>>()?
        };
        let secret = bootstrap::unhex(it.next().ok_or_else(bad)?.as_bytes()).ok_or_else(bad)?;
        let cuda = it.next().ok_or_else(bad)?.parse::<i32>().map_err(|_| bad())?;
        let info = it.next().unwrap_or_default();
        let info = if info.is_empty() { None } else { Some(PeerInfo::decode(from, info.as_bytes())?) };
        Ok(Record { key, secret, cuda, info })
    }
}

impl Communicator {
    fn regroup_err(&self, op: &'static str, detail: impl Into<String>) -> Error {
        Error::Regroup { op, group: self.opts.group.clone(), rank: self.rank, detail: detail.into() }
    }

    /// This rank's bootstrap options for a new group (its parent's address
    /// and host identity).
    fn child_bootstrap(&self, op: &'static str, group: &str, timeout: Duration) -> Result<BootstrapOpts> {
        let me = self.peers.get(self.rank).ok_or_else(|| Error::unsupported(op, "this communicator was not bootstrapped from a store"))?;
        // (no settings to compare: a new group keeps its parent's)
        Ok(BootstrapOpts {
            group: group.to_string(),
            timeout,
            listen_ip: me.addr.ip(),
            host: me.host.clone(),
            settings: String::new(),
            tls: self.opts.tls.clone(),
            transport: self.opts.transport,
        })
    }

    /// The device of this group's NCCL communicator, -1 without one.
    fn cuda_device(&self) -> i32 {
        self.nccl_if_started().and_then(|n| n.device()).unwrap_or(-1)
    }

    /// torch's `split_group`: every rank of this group calls it; `members`
    /// (sorted parent ranks) is this rank's new group. Returns `None` when
    /// this rank is not a member (torch passes such ranks another group's
    /// ranks). The parent keeps working.
    pub fn split(&self, members: &[Rank], group: &str, timeout: Duration) -> Result<Option<Communicator>> {
        const OP: &str = "split_group";
        if let Some(bad) = members.iter().find(|&&r| r >= self.size) {
            return Err(Error::invalid(OP, format!("rank {bad} is not in this group of {} ranks", self.size)));
        }
        if members.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid(OP, format!("the ranks of a split must be sorted and distinct, got {members:?}")));
        }
        let me = members.iter().position(|&r| r == self.rank);
        let bopts = self.child_bootstrap(OP, group, timeout)?;
        let listening = me.map(|new_rank| bootstrap::listen(new_rank, &bopts)).transpose()?;
        let mine = Record {
            key: if me.is_some() { members.to_vec() } else { Vec::new() },
            secret: bootstrap::new_secret(self.rank)?,
            cuda: self.cuda_device(),
            info: listening.as_ref().map(|l| l.me.clone()),
        };
        let all = nccl::IdExchange::all_gather(self, &mine.encode(self.rank)?)?;
        let (Some(new_rank), Some(l)) = (me, listening) else {
            return Ok(None);
        };
        let records = (0..self.size)
            .map(|r| Record::decode(r, &all[r * REC..(r + 1) * REC]).map_err(|e| self.regroup_err(OP, e)))
            .collect::<Result<Vec<_>>>()?;
        for &r in members {
            if records[r].key != members {
                return Err(self.regroup_err(OP, format!(
                    "this rank splits into parent ranks {members:?}, but rank {r} splits into {:?}: every rank must pass the same split_ranks",
                    records[r].key
                )));
            }
        }
        let child = self.connect_child(OP, members, &records, l, &bopts)?;
        log_at!(
            LogLevel::Info,
            "group '{}' rank {}: split into '{group}' as rank {new_rank} of {}",
            self.opts.group,
            self.rank,
            members.len()
        );
        Ok(Some(child))
    }

    /// torch's `shrink_group`: only the survivors call it, each with the
    /// same `excluded` ranks (sorted). `abort` first aborts what this
    /// group still has in flight. Survivors keep their order.
    pub fn shrink(&self, excluded: &[Rank], abort: bool, timeout: Duration) -> Result<Communicator> {
        const OP: &str = "shrink_group";
        if let Some(bad) = excluded.iter().find(|&&r| r >= self.size) {
            return Err(Error::invalid(OP, format!("rank {bad} is not in this group of {} ranks", self.size)));
        }
        if excluded.contains(&self.rank) {
            return Err(Error::invalid(
                OP,
                format!("rank {} (this process) is in the exclusion list {excluded:?}; only survivors call shrink", self.rank),
            ));
        }
        if excluded.is_empty() || excluded.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid(OP, format!("the excluded ranks must be sorted, distinct and not empty, got {excluded:?}")));
        }
        if abort {
            let grace = Duration::from_secs(5);
            if let Some(n) = self.nccl_if_started() {
                n.shutdown(true, grace);
            }
            self.cpu.shutdown(true, grace);
        }
        let survivors: Vec<Rank> = (0..self.size).filter(|r| !excluded.contains(r)).collect();
        let new_rank = survivors.iter().position(|&r| r == self.rank).unwrap_or_default();
        let bopts = self.child_bootstrap(OP, &format!("{}:shrunk", self.opts.group), timeout)?;
        let l = bootstrap::listen(new_rank, &bopts)?;
        let mine = Record {
            key: excluded.to_vec(),
            secret: bootstrap::new_secret(self.rank)?,
            cuda: self.cuda_device(),
            info: Some(l.me.clone()),
        };
        let records = self.exchange_among(&survivors, &mine.encode(self.rank)?, timeout)?;
        for &r in &survivors {
            if records[r].as_ref().is_some_and(|rec| rec.key != excluded) {
                let theirs = records[r].as_ref().map(|rec| rec.key.clone()).unwrap_or_default();
                return Err(
                    self.regroup_err(OP, format!("the survivors disagree: this rank excludes {excluded:?}, rank {r} excludes {theirs:?}"))
                );
            }
        }
        let records =
            records.into_iter().map(|r| r.unwrap_or(Record { key: Vec::new(), secret: [0; 32], cuda: -1, info: None })).collect::<Vec<_>>();
        let child = self.connect_child(OP, &survivors, &records, l, &bopts)?;
        log_at!(
            LogLevel::Info,
            "group '{}' rank {}: shrunk to {} ranks (excluded {excluded:?}), now rank {new_rank}",
            self.opts.group,
            self.rank,
            survivors.len()
        );
        Ok(child)
    }

    /// Sends `mine` to every other rank of `ranks` and receives theirs over
    /// the point-to-point links; records are indexed by parent rank
    /// (ranks outside `ranks` are `None`).
    fn exchange_among(&self, ranks: &[Rank], mine: &[u8; REC], timeout: Duration) -> Result<Vec<Option<Record>>> {
        const OP: &str = "shrink_group";
        let tag = self.control_tag();
        let mut recvs = Vec::new();
        let mut sends = Vec::new();
        for &r in ranks.iter().filter(|&&r| r != self.rank) {
            let inbox = SharedBuf::zeros(DType::U8, REC);
            recvs.push((r, inbox.clone(), self.p2p_bytes(false, r, tag, &inbox, timeout)?));
            sends.push((r, self.p2p_bytes(true, r, tag, &SharedBuf::new(DType::U8, &mine[..]), timeout)?));
        }
        let mut records: Vec<Option<Record>> = (0..self.size).map(|_| None).collect();
        records[self.rank] = Some(Record::decode(self.rank, mine).map_err(|e| self.regroup_err(OP, e))?);
        for (r, w) in sends {
            w.wait(Some(timeout)).map_err(|e| self.regroup_err(OP, format!("could not reach survivor rank {r}: {e}")))?;
        }
        for (r, inbox, w) in recvs {
            w.wait(Some(timeout)).map_err(|e| self.regroup_err(OP, format!("no word from survivor rank {r}: {e}")))?;
            let bytes = inbox.bytes().ok_or_else(|| Error::Internal("record buffer still lent".into()))?;
            records[r] = Some(Record::decode(r, &bytes).map_err(|e| self.regroup_err(OP, e))?);
        }
        Ok(records)
    }

    /// Connects the new group (`members`: parent ranks in new-rank order)
    /// and starts its engines; its NCCL communicator too when every member
    /// had one in the parent.
    fn connect_child(
        &self,
        op: &'static str,
        members: &[Rank],
        records: &[Record],
        l: bootstrap::Listening,
        bopts: &BootstrapOpts,
    ) -> Result<Communicator> {
        let mut peers = Vec::with_capacity(members.len());
        for (i, &r) in members.iter().enumerate() {
            let mut info = if r == self.rank { Some(l.me.clone()) } else { records[r].info.clone() };
            let mut p = info.take().ok_or_else(|| self.regroup_err(op, format!("rank {r} sent no address")))?;
            p.rank = i;
            peers.push(p);
        }
        let secret = records[members[0]].secret;
        let ep = bootstrap::connect(l, peers, &secret, 0, bopts)?;
        let mut opts: CommOptions = self.opts.clone();
        opts.group = bopts.group.clone();
        opts.timeout = bopts.timeout;
        let child = Communicator::from_endpoints(ep, opts)?;
        let devices: Vec<i32> = members.iter().map(|&r| records[r].cuda).collect();
        if devices.iter().all(|&d| d >= 0) {
            child.connect_cuda(self.cuda_device())?;
        }
        Ok(child)
    }
}
