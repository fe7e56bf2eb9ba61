//! A group's own settings (`pg_options=rustccl.Options(...)`): which
//! `RUSTCCL_*` settings one communicator may set apart from the process,
//! and reading them over what the environment said.
#![forbid(unsafe_code)]

use super::env::Vars;
use super::{AlgoConfig, Config, ShmConfig, TransportMode, SETTINGS};

/// The settings a communicator copies at creation (`comm::CommOptions`):
/// the host algorithms' thresholds, the transport and its shared-memory
/// sizes and thresholds, and the cross-rank check. Everything else (the
/// flight recorder, NCCL, logging, the shared tensor arena, faults) is one
/// per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    pub algo: AlgoConfig,
    pub transport: TransportMode,
    pub shm: ShmConfig,
    pub check: bool,
}

/// Settings outside `RUSTCCL_SHM_*` that a group may set.
const GROUP_SETTINGS: &[&str] = &[
    "RUSTCCL_SMALL_ALLREDUCE_BYTES",
    "RUSTCCL_SMALL_BROADCAST_BYTES",
    "RUSTCCL_SEGMENT_BYTES",
    "RUSTCCL_CALLER_RUNS_US",
    "RUSTCCL_TRANSPORT",
    "RUSTCCL_CHECK",
];

/// Whether a group may set `name` apart from the process ([`GroupConfig`]):
/// the shared-memory settings but the tensor arena's, and
/// [`GROUP_SETTINGS`].
pub fn group_scoped(name: &str) -> bool {
    GROUP_SETTINGS.contains(&name) || (name.starts_with("RUSTCCL_SHM_") && !name.starts_with("RUSTCCL_SHM_TENSORS"))
}

impl Config {
    /// This process's group settings.
    pub fn group(&self) -> GroupConfig {
        GroupConfig { algo: self.algo, transport: self.transport, shm: self.shm, check: self.check }
    }

    /// (name, effective value) pairs as [`Config::effective`] gives them,
    /// with a group's settings `g` in place of the process's.
    pub fn effective_for(&self, g: GroupConfig) -> Vec<(&'static str, String)> {
        let c = Config { algo: g.algo, transport: g.transport, shm: g.shm, check: g.check, ..self.clone() };
        c.effective()
    }

    /// The group settings with `settings` ((name, value) as in the
    /// environment) over what the environment said when the process read
    /// it. Err names the first setting that is unknown, not a group's, or
    /// whose value does not parse.
    pub fn for_group(&self, settings: &[(String, String)]) -> Result<GroupConfig, String> {
        for (name, _) in settings {
            if !SETTINGS.iter().any(|s| s.name == name) {
                return Err(format!("unknown setting {name:?} (rustccl.config() lists them)"));
            }
            if !group_scoped(name) {
                return Err(format!("{name} applies to the whole process: set it in the environment"));
            }
        }
        let v = Vars::layered(settings, &self.env);
        let c = Config::from_vars(&v);
        match v.rejected().into_iter().find(|(name, _)| settings.iter().any(|(k, _)| k == name)) {
            Some((_, why)) => Err(why),
            None => Ok(c.group()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, value: &str) -> Result<GroupConfig, String> {
        Config::get().for_group(&[(name.to_string(), value.to_string())])
    }

    /// Every setting a group may set changes its `GroupConfig` for some
    /// value, and no other setting is taken: `group_scoped` and what
    /// `from_vars` reads into the group's part agree.
    #[test]
    fn a_group_sets_exactly_the_settings_its_communicator_copies() {
        let base = Config::get().group();
        for s in SETTINGS {
            let changed = ["3", "1", "0", "tcp", "off"].iter().any(|v| with(s.name, v).is_ok_and(|g| g != base));
            if group_scoped(s.name) {
                assert!(changed, "{} is a group's setting but no value changed the group's part", s.name);
            } else {
                let err = with(s.name, "1").unwrap_err();
                assert!(err.contains("whole process"), "{}: {err}", s.name);
            }
        }
    }

    #[test]
    fn bad_names_and_values_are_errors_that_name_them() {
        let err = with("RUSTCCL_SHM_SLOT_MIN", "1M").unwrap_err();
        assert!(err.contains("unknown setting \"RUSTCCL_SHM_SLOT_MIN\""), "{err}");
        let err = with("RUSTCCL_SHM_SLOT_MIN_BYTES", "1 banana").unwrap_err();
        assert!(err.contains("RUSTCCL_SHM_SLOT_MIN_BYTES") && err.contains("not a byte count"), "{err}");
        let err = with("RUSTCCL_TRANSPORT", "carrier-pigeon").unwrap_err();
        assert!(err.contains("RUSTCCL_TRANSPORT"), "{err}");
        assert_eq!(with("RUSTCCL_SHM_SLOT_MIN_BYTES", "1M").unwrap().shm.slot_min, 1 << 20);
        assert_eq!(with("RUSTCCL_TRANSPORT", "tcp").unwrap().transport, TransportMode::Tcp);
    }
}
