//! What a communicator is created with: its group's name and timeout,
//! and the settings it copies (the process's, or its group's own over
//! them: `pg_options`).
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::PeerInfo;
use crate::config::{setting_differences, AlgoConfig, Config, FaultSpec, GroupConfig, ShmConfig, TransportMode};
use crate::error::{Error, Result};
use crate::tls::Tls;
use crate::types::Rank;

/// A communicator's options (`Communicator::bootstrap`).
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// Group name (torch's group name), for logs and errors.
    pub group: String,
    /// Default bound on every operation.
    pub timeout: Duration,
    pub algo: AlgoConfig,
    /// Shared memory between ranks of a host, or TCP only.
    pub transport: TransportMode,
    pub shm: ShmConfig,
    /// Compare every collective across ranks before running it.
    pub check: bool,
    /// Fault to inject (tests), any rank / group; filtered per communicator.
    pub fault: Option<FaultSpec>,
    /// Host identity override (tests simulate hosts in one process).
    pub host_id: Option<String>,
    /// The group's own settings (`pg_options`), over the process's.
    pub settings: Vec<(String, String)>,
    /// TLS on the TCP links (`RUSTCCL_TLS`), loaded; groups made from this
    /// one keep it.
    pub tls: Option<Arc<Tls>>,
}

impl CommOptions {
    /// Options from the process's `RUSTCCL_*` settings.
    pub fn new(group: impl Into<String>, timeout: Duration) -> CommOptions {
        let c = Config::get();
        CommOptions::from_group(group.into(), timeout, c.group(), Vec::new())
    }

    /// Options with the group's own `settings` ((name, value) as in the
    /// environment) over the process's; an error names the setting that a
    /// group cannot set or whose value does not parse.
    pub fn with_settings(group: impl Into<String>, timeout: Duration, settings: Vec<(String, String)>) -> Result<CommOptions> {
        let config = Config::get();
        let g = config.for_group(&settings).map_err(|reason| Error::invalid("pg_options", reason))?;
        let group = group.into();
        let tls = match config.tls_for(&settings).map_err(|why| Error::invalid("init_process_group", why))? {
            Some(mode) => {
                Some(Arc::new(Tls::load(mode, &group).map_err(|why| Error::invalid("init_process_group", format!("TLS: {why}")))?))
            }
            None => None,
        };
        Ok(CommOptions { tls, ..CommOptions::from_group(group, timeout, g, settings) })
    }

    fn from_group(group: String, timeout: Duration, g: GroupConfig, settings: Vec<(String, String)>) -> CommOptions {
        CommOptions {
            group,
            timeout,
            algo: g.algo,
            transport: g.transport,
            shm: g.shm,
            check: g.check,
            fault: Config::get().fault.clone(),
            host_id: None,
            settings,
            tls: None,
        }
    }

    /// The settings a group may set, as these options hold them.
    pub fn group_config(&self) -> GroupConfig {
        GroupConfig { algo: self.algo, transport: self.transport, shm: self.shm, check: self.check }
    }
}

/// What rank `rank` of `group` warns of when its peers published other
/// shared settings than its own (`Config::shared_settings`) at the
/// rendezvous: the first such peer's differences and how many peers
/// differ. Such ranks may pick different algorithms for one call and
/// wait for each other until the timeout, which this names in advance.
pub(super) fn settings_warning(group: &str, rank: Rank, peers: &[PeerInfo]) -> Option<String> {
    let mine = &peers.get(rank)?.settings;
    let differ: Vec<&PeerInfo> = peers.iter().filter(|p| p.rank != rank && &p.settings != mine).collect();
    let first = differ.first()?;
    let list = setting_differences(mine, &first.settings)
        .iter()
        .map(|(n, ours, theirs)| format!("{n}={ours} here, {theirs} on rank {}", first.rank))
        .collect::<Vec<_>>()
        .join("; ");
    let others = match differ.len() {
        1 => String::new(),
        2 => " (and 1 other rank's)".to_string(),
        n => format!(" (and {} other ranks')", n - 1),
    };
    Some(format!(
        "rustccl group '{group}' rank {rank}: its settings differ from rank {}'s{others}: {list}. Ranks whose settings differ can choose different algorithms for the same call and wait for each other until the timeout: give every rank the same RUSTCCL_* environment and pg_options",
        first.rank
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: Rank, settings: &str) -> PeerInfo {
        PeerInfo { rank, addr: "127.0.0.1:1".parse().unwrap(), host: "h".into(), pid: 1, settings: settings.into() }
    }

    #[test]
    fn a_rank_warns_of_peers_with_other_settings() {
        let same = [peer(0, "A=1,B=2"), peer(1, "A=1,B=2")];
        assert_eq!(settings_warning("g", 1, &same), None);
        let differ = [peer(0, "A=1,B=2"), peer(1, "A=1,B=3"), peer(2, "A=5,B=2")];
        let w = settings_warning("g", 0, &differ).unwrap();
        assert!(
            w.starts_with("rustccl group 'g' rank 0: its settings differ from rank 1's (and 1 other rank's): B=2 here, 3 on rank 1."),
            "{w}"
        );
        assert!(w.contains("same RUSTCCL_* environment and pg_options"), "{w}");
        let w = settings_warning("g", 1, &differ).unwrap();
        assert!(w.contains("from rank 0's (and 1 other rank's)") && w.contains("B=3 here, 2 on rank 0"), "{w}");
        // a group made from another publishes no settings: nothing to compare
        assert_eq!(settings_warning("g", 0, &[peer(0, ""), peer(1, "")]), None);
    }
}
