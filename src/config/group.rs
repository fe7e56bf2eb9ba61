//! A group's own settings (`pg_options=rustccl.Options(...)`): which
//! `RUSTCCL_*` settings one communicator may set apart from the process,
//! and reading them over what the environment said.
#![forbid(unsafe_code)]

use super::env::Vars;
use super::{AlgoConfig, Config, ShmConfig, TransportMode, SETTINGS, TLS_SETTINGS};

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
    GROUP_SETTINGS.contains(&name)
        || TLS_SETTINGS.contains(&name)
        || (name.starts_with("RUSTCCL_SHM_") && !name.starts_with("RUSTCCL_SHM_TENSORS"))
}

/// Group settings a rank may hold apart from its peers: each rank applies
/// them to its own threads alone (how many help a root, how a quick team
/// takes a phase, how idle threads wait or move), or a root decides with
/// them and says so in its header. Every other group setting chooses an
/// algorithm or a layout on each rank by itself, so ranks that differ in
/// one can take different paths for the same call.
const MAY_DIFFER: &[&str] = &[
    "RUSTCCL_CALLER_RUNS_US",
    "RUSTCCL_SHM_MIN_PIECE_BYTES",
    "RUSTCCL_SHM_ROOT_THREADS",
    "RUSTCCL_SHM_QUICK_THREADS",
    "RUSTCCL_SHM_QUICK_BYTES_PER_THREAD",
    "RUSTCCL_SHM_QUICK_ALL_TO_ALL_BYTES_PER_THREAD",
    "RUSTCCL_SHM_QUICK_MIN_PIECE_BYTES",
    "RUSTCCL_SHM_QUICK_LEADS",
    "RUSTCCL_SHM_SPIN_US",
    "RUSTCCL_SHM_WAIT_SPIN_US",
    // How long this rank's threads wait for a sender's chunk before the
    // rank waits for the whole block (`collectives::shm::blocks::copy`): the sender
    // flags every chunk either way.
    "RUSTCCL_SHM_BLOCK_WAIT_US",
    "RUSTCCL_SHM_KEEP_APART",
    "RUSTCCL_SHM_GATHER_PUSH",
    "RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES",
    "RUSTCCL_SHM_SCATTER_ROOT_SHARE",
    "RUSTCCL_SHM_GATHER_ROOT_SHARE",
    // Paths of each rank's own files; whether a rank uses TLS at all is
    // compared at the rendezvous (`bootstrap`), which fails on a difference.
    "RUSTCCL_TLS",
    "RUSTCCL_TLS_CA",
    "RUSTCCL_TLS_CERT",
    "RUSTCCL_TLS_KEY",
    "RUSTCCL_TLS_SECRET_FILE",
];

/// The settings that differ between two [`Config::shared_settings`]
/// lines: (name, value in `ours`, value in `theirs`; "" where one line
/// lacks the name).
pub fn setting_differences(ours: &str, theirs: &str) -> Vec<(String, String, String)> {
    let pairs = |line: &str| -> Vec<(String, String)> {
        line.split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (n, v) = p.split_once('=').unwrap_or((p, ""));
                (n.to_string(), v.to_string())
            })
            .collect()
    };
    let (a, b) = (pairs(ours), pairs(theirs));
    let value = |l: &[(String, String)], n: &str| l.iter().find(|(k, _)| k == n).map_or(String::new(), |(_, v)| v.clone());
    let mut out: Vec<(String, String, String)> = Vec::new();
    for n in a.iter().chain(&b).map(|(n, _)| n) {
        let (x, y) = (value(&a, n), value(&b, n));
        if x != y && !out.iter().any(|(k, _, _)| k == n) {
            out.push((n.clone(), x, y));
        }
    }
    out
}

impl Config {
    /// The group settings every rank of a group should share, as group
    /// `g` has them: `NAME=value` joined by `,` (what a rank publishes at
    /// the rendezvous; values as `rustccl.config()` gives them, `auto`
    /// where the host decides).
    pub fn shared_settings(&self, g: GroupConfig) -> String {
        let shared = self.effective_for(g).into_iter().filter(|(n, _)| group_scoped(n) && !MAY_DIFFER.contains(n));
        shared.map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(",")
    }

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
        // the TLS settings travel in the communicator's options apart
        // (`comm::CommOptions::tls`), loaded with their files
        for s in SETTINGS.iter().filter(|s| !TLS_SETTINGS.contains(&s.name)) {
            let changed = ["3", "1", "0", "tcp", "off"].iter().any(|v| with(s.name, v).is_ok_and(|g| g != base));
            if group_scoped(s.name) {
                assert!(changed, "{} is a group's setting but no value changed the group's part", s.name);
            } else {
                let err = with(s.name, "1").unwrap_err();
                assert!(err.contains("whole process"), "{}: {err}", s.name);
            }
        }
    }

    /// What a rank publishes names every group setting but those a rank
    /// may hold alone, and the differences between two ranks' lines are
    /// exactly the settings changed.
    #[test]
    fn ranks_compare_the_settings_that_choose_their_paths() {
        let c = Config::get();
        let base = c.shared_settings(c.group());
        for s in SETTINGS.iter().filter(|s| group_scoped(s.name)) {
            assert_eq!(base.contains(&format!("{}=", s.name)), !MAY_DIFFER.contains(&s.name), "{}", s.name);
        }
        let tcp = c.shared_settings(with("RUSTCCL_SMALL_BROADCAST_BYTES", "1K").unwrap());
        let d = setting_differences(&base, &tcp);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].0, "RUSTCCL_SMALL_BROADCAST_BYTES");
        assert_eq!(d[0].2, "1024");
        assert!(setting_differences(&base, &base).is_empty());
        // a setting a rank may hold alone is not compared
        assert_eq!(c.shared_settings(with("RUSTCCL_SHM_SPIN_US", "7").unwrap()), base);
        assert_eq!(
            setting_differences("A=1,B=2", "B=3"),
            vec![("A".into(), "1".into(), String::new()), ("B".into(), "2".into(), "3".into())]
        );
    }

    #[test]
    fn bad_names_and_values_are_errors_that_name_them() {
        let err = with("RUSTCCL_SHM_SLOT_MIN", "1M").unwrap_err();
        assert!(err.contains("unknown setting \"RUSTCCL_SHM_SLOT_MIN\""), "{err}");
        let err = with("RUSTCCL_SHM_SLOT_MIN_BYTES", "1 banana").unwrap_err();
        assert!(err.contains("RUSTCCL_SHM_SLOT_MIN_BYTES") && err.contains("not a byte count"), "{err}");
        let err = with("RUSTCCL_TRANSPORT", "carrier-pigeon").unwrap_err();
        assert!(err.contains("RUSTCCL_TRANSPORT"), "{err}");
        assert_eq!(with("RUSTCCL_SHM_SLOT_MIN_BYTES", "1M").unwrap().shm.slot_min, crate::config::Setting::Fixed(1 << 20));
        assert_eq!(with("RUSTCCL_TRANSPORT", "tcp").unwrap().transport, TransportMode::Tcp);
    }
}
