//! What a communicator is created with: its group's name and timeout,
//! and the settings it copies (the process's, or its group's own over
//! them: `pg_options`).
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::config::{AlgoConfig, Config, FaultSpec, GroupConfig, ShmConfig, TransportMode};
use crate::error::{Error, Result};

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
        let g = Config::get().for_group(&settings).map_err(|reason| Error::invalid("pg_options", reason))?;
        Ok(CommOptions::from_group(group.into(), timeout, g, settings))
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
        }
    }

    /// The settings a group may set, as these options hold them.
    pub fn group_config(&self) -> GroupConfig {
        GroupConfig { algo: self.algo, transport: self.transport, shm: self.shm, check: self.check }
    }
}
