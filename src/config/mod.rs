//! Every `RUSTCCL_*` setting, declared once with its default and meaning,
//! parsed once per process. `rustccl.config()` in Python shows this table.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

mod env;
mod group;
mod setting;
mod settings;
mod tls;

/// Defaults of `RUSTCCL_SHM_TENSORS_MIN_BYTES` / `_CACHE_BYTES`.
const SHM_TENSORS_MIN: usize = 64 << 10;
const SHM_TENSORS_CACHE: usize = 256 << 20;

/// Tunables of the host (CPU) algorithms. Communicators copy them at
/// creation; tests build their own to reach multi-segment paths with small
/// inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlgoConfig {
    /// all_reduce of at most this many bytes uses recursive doubling
    /// (latency-optimal); larger ones use the pipelined ring.
    pub small_allreduce_bytes: usize,
    /// broadcast of at most this many bytes uses a binomial tree; larger ones
    /// a pipelined chain.
    pub small_broadcast_bytes: usize,
    /// Largest unit in flight on a link during ring / chain steps.
    pub segment_bytes: usize,
    /// How long (microseconds) a blocking CPU collective (torch's
    /// `asyncOp=False`) waits in the queue for its caller's `wait()` to run
    /// it on the caller's thread before the engine's worker thread runs
    /// it (a caller whose wait would sleep, or has a deadline, hands it over
    /// at once); 0: the worker runs everything.
    pub caller_runs_us: u64,
}

impl Default for AlgoConfig {
    fn default() -> Self {
        AlgoConfig { small_allreduce_bytes: 64 << 10, small_broadcast_bytes: 256 << 10, segment_bytes: 512 << 10, caller_runs_us: 10_000 }
    }
}

/// Which transport links ranks of one host (`RUSTCCL_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportMode {
    /// Shared memory between ranks of one host, TCP between hosts.
    Auto,
    /// TCP everywhere.
    Tcp,
    /// Shared memory, and an error if some peer is on another host.
    Shm,
}

/// The shared-memory transport's settings as the user gave them; each
/// [`Setting::Auto`] is chosen by the tuning rules (`tuning::shm`) for the group and
/// the host (`docs/settings.md` says what each one does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmConfig {
    pub ring_bytes: usize,
    /// One-round all-reduce limit and small-slot size.
    pub small_bytes: Setting<usize>,
    /// Bytes per thread of each round of the pipelined algorithms.
    pub segment_bytes: usize,
    /// Smallest input / output slot (bytes), where `segment_bytes` x
    /// threads is less (0: none).
    pub slot_min: Setting<usize>,
    /// Threads per rank in the direct algorithms.
    pub threads: Setting<usize>,
    /// Smallest collective that reads peers' buffers directly (cross-memory
    /// attach); [`NEVER`]: off, not even probed.
    pub attach_min: Setting<usize>,
    /// Per-collective single-copy thresholds over what `attach_min` and
    /// the host's rules give that collective.
    pub op_attach_min: OpAttach,
    /// Smallest piece of a copy a rank's worker threads split off;
    /// reductions take half.
    pub min_piece: Setting<usize>,
    /// Point-to-point messages (and, where collectives do not read,
    /// gather / scatter blocks) over this many bytes are read directly.
    pub single_min: Setting<usize>,
    /// all_to_all / gather / scatter blocks over this many bytes are read
    /// from the sender's tensor; smaller ones are copied through its input
    /// slots while they fit.
    pub block_min: Setting<usize>,
    /// Threads of a root's phases that only it works in.
    pub root_threads: Setting<usize>,
    /// Threads of a rank's quick team (small parallel phases; 0: none).
    pub quick_threads: Setting<usize>,
    /// Bytes per thread of the largest phase the quick team takes.
    pub quick_bytes: Setting<usize>,
    /// The same for all_to_all's block copies.
    pub quick_all_to_all_bytes: Setting<usize>,
    /// Smallest piece of the quick team's phases.
    pub quick_min_piece: Setting<usize>,
    /// Phases too large for the quick team start on it while the workers
    /// wake and join (`Workers::add_quick`).
    pub quick_leads: Setting<bool>,
    /// How long a rank's idle worker threads spin (microseconds) before
    /// they sleep (`transport::shm::team`).
    pub spin_us: Setting<usize>,
    /// How long a waiting thread polls for its local peers (microseconds)
    /// before it sleeps; auto: a window that adapts
    /// (`transport::shm::wait_window`).
    pub wait_spin_us: Setting<usize>,
    /// Smallest broadcast that reads the root's tensor (cross-memory
    /// attach); [`NEVER`]: off.
    pub broadcast_min: Setting<usize>,
    /// Point-to-point sends to a rank of this host of more than
    /// `staged_min` and at most `staged_max` bytes go through the sender's
    /// staging area when it is free (of `staged_max` bytes; 0: none):
    /// those that would be read from the sender's tensor, and those that
    /// would go through the ring.
    pub staged_min: usize,
    pub staged_max: Setting<usize>,
    /// Whether such sends of tensors in shared memory (`RUSTCCL_SHM_TENSORS`)
    /// are staged too (else the receiver copies them out of the tensor).
    pub stage_shared: bool,
    /// A polling thread that shares its CPU with another local rank's
    /// moves to a free one (`transport::shm::place`).
    pub keep_apart: bool,
    /// A gather's root lets its senders write the blocks no slot takes
    /// into its outputs (`collectives::shm::attach::gather`), a reduce's
    /// root the others their reduced parts into its buffer
    /// (`collectives::shm::attach::reduce::reduce`).
    pub gather_push: bool,
    /// A large send to a rank of this host that goes by rendezvous (read
    /// by the receiver) from this many bytes is split: the receiver reads
    /// the first half while the sender writes the second into the
    /// receiver's buffer (`comm::p2p::rendezvous`); decided by the
    /// receiver; [`NEVER`]: off.
    pub split_send_min: Setting<usize>,
    /// A scatter root splits the blocks its receivers would read of at
    /// most this many bytes (it writes their second halves,
    /// `collectives::shm::attach::scatter::scatter`); [`NEVER`]: any size.
    pub scatter_split_max: Setting<usize>,
    /// A scatter root that splits a block writes its last 1 / this of it
    /// (2 ..= [`MAX_ROOT_SHARE`]; values outside are clamped).
    pub scatter_root_share: Setting<usize>,
    /// A gather root that takes pushes reads the last 1 / this of each
    /// pushed block itself (2 ..= [`MAX_ROOT_SHARE`]); 1: it reads none.
    pub gather_root_share: Setting<usize>,
    /// How long (microseconds) a thread that copies a block out of a
    /// peer's input slots waits for a chunk before the rank's own thread
    /// takes the wait over, with the group's timeout and dead-peer checks
    /// (`collectives::shm::blocks`); 0: it hands over at once.
    pub block_wait_us: usize,
}

/// One collective's own single-copy threshold each
/// (`RUSTCCL_SHM_<OP>_ATTACH_MIN_BYTES`); [`Setting::Auto`]: the one
/// `ShmConfig::attach_min` and the host's rules give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpAttach {
    pub all_reduce: Setting<usize>,
    pub all_gather: Setting<usize>,
    pub reduce_scatter: Setting<usize>,
    pub reduce: Setting<usize>,
}

impl OpAttach {
    /// Each left to the shared threshold and the host.
    pub const AUTO: OpAttach =
        OpAttach { all_reduce: Setting::Auto, all_gather: Setting::Auto, reduce_scatter: Setting::Auto, reduce: Setting::Auto };
}

impl ShmConfig {
    /// Single-copy reads are off (`RUSTCCL_SHM_ATTACH_MIN_BYTES=off`): none
    /// at all, not even probed, and no staging area.
    pub fn attach_off(&self) -> bool {
        self.attach_min == Setting::Fixed(NEVER)
    }
}

/// `ShmConfig::block_wait_us` when `RUSTCCL_SHM_BLOCK_WAIT_US` is unset:
/// far longer than a sender's copy of a whole block takes unless its
/// threads lost their cores.
pub const BLOCK_WAIT_US: usize = 20_000;

/// `ShmConfig::staged_min` unless `RUSTCCL_SHM_STAGED_SEND_MIN_BYTES` is
/// set: sends over 128 KiB are staged where the area is free
/// (`comm::p2p::rendezvous::stages_by_value`).
pub const STAGED_SEND_MIN: usize = 128 << 10;
/// The largest `ShmConfig::scatter_root_share` and `gather_root_share`:
/// a scatter root writes, a gather root reads, at least 1/31 of a block
/// it splits, as its shared-memory header carries the share in five bits.
pub const MAX_ROOT_SHARE: usize = 31;

/// A fault to inject (`RUSTCCL_FAULT`), for testing timeout and dead-peer
/// handling on the CPU transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpec {
    pub action: FaultAction,
    /// Rank (within the group) that misbehaves.
    pub rank: usize,
    /// Collective sequence number at which it does.
    pub seq: u64,
    /// Only in this group (torch's group name); any group when None.
    pub group: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Sleep this long before running the collective.
    Delay(std::time::Duration),
    /// Skip the collective: send nothing, so peers wait for it.
    Drop,
    /// Close all of the rank's links, as a crashed process would.
    Kill,
    /// Panic inside the collective's algorithm (a bug's stand-in).
    Panic,
}

impl FaultSpec {
    /// Parses `action:rank=R:seq=S[:ms=N][:group=G]`, e.g.
    /// `delay:rank=1:seq=3:ms=2000`, `drop:rank=0:seq=5`, `kill:rank=1:seq=2`,
    /// `panic:rank=2:seq=1`.
    pub fn parse(s: &str) -> Result<FaultSpec, String> {
        let mut parts = s.split(':');
        let action = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let (mut rank, mut seq, mut ms, mut group) = (None, None, None, None);
        for p in parts {
            let (k, v) = p.split_once('=').ok_or_else(|| format!("expected key=value, got {p:?}"))?;
            let num = || v.trim().parse::<u64>().map_err(|_| format!("{k}={v:?} is not a number"));
            match k.trim() {
                "rank" => rank = Some(num()? as usize),
                "seq" => seq = Some(num()?),
                "ms" => ms = Some(num()?),
                "group" => group = Some(v.trim().to_string()),
                other => return Err(format!("unknown key {other:?}")),
            }
        }
        let action = match action.as_str() {
            "delay" => FaultAction::Delay(std::time::Duration::from_millis(ms.ok_or("delay needs ms=N")?)),
            "drop" => FaultAction::Drop,
            "kill" => FaultAction::Kill,
            "panic" => FaultAction::Panic,
            other => return Err(format!("unknown action {other:?} (delay, drop, kill or panic)")),
        };
        Ok(FaultSpec { action, rank: rank.ok_or("rank=R is required")?, seq: seq.ok_or("seq=S is required")?, group })
    }
}

/// Log verbosity of `RUSTCCL_DEBUG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off = 0,
    Warn = 1,
    Info = 2,
    Trace = 3,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub algo: AlgoConfig,
    pub socket_ifname: Option<String>,
    pub host_id: Option<String>,
    pub nccl_library: Option<String>,
    pub cuda_timing: bool,
    /// `RUSTCCL_HOST_PROFILE`: time the host spans of calls (`crate::profile`).
    pub host_profile: bool,
    /// rustccl's own NVLink all-reduce for small CUDA tensors.
    pub custom_allreduce: bool,
    /// Largest CUDA all_reduce (bytes) that takes an NVLink kernel (one-shot
    /// or two-shot); `None`: by group size ([`Config::peer_limits`]).
    pub custom_allreduce_max_bytes: Option<usize>,
    /// Largest CUDA all_reduce (bytes) that takes the one-shot kernel (the
    /// two-shot one above it); `None`: by group size.
    pub one_shot_max_bytes: Option<usize>,
    /// Largest all_gather_into_tensor output / reduce_scatter_tensor input
    /// (bytes) that takes the NVLink copy kernels; `None`: auto.
    pub custom_gather_max_bytes: Option<usize>,
    pub nvrtc_library: Option<String>,
    pub transport: TransportMode,
    pub shm: ShmConfig,
    /// The shared tensor arena (`transport::shm::arena`; `import rustccl`
    /// enables it under `RUSTCCL_SHM_TENSORS=1`): its smallest tensor, and
    /// how many freed bytes it keeps mapped.
    pub shm_tensors: bool,
    pub shm_tensors_min: usize,
    pub shm_tensors_cache: usize,
    pub flight_dir: Option<String>,
    pub flight_size: usize,
    pub fault: Option<FaultSpec>,
    pub check: bool,
    pub debug: LogLevel,
    /// The `RUSTCCL_*` variables of the environment when it was read.
    env: Vec<(String, String)>,
    /// The process's settings whose values did not parse ("NAME=value:
    /// why"): creating a group fails with them ([`Config::check_process`]).
    rejected: Vec<String>,
}

use env::Vars;
pub use env::{env_flag, parse_size};
pub use group::{group_scoped, setting_differences, GroupConfig};
pub use setting::{Setting, NEVER};
pub use settings::{Kind, SettingDoc, SETTINGS};
pub use tls::{TlsMode, TLS_SETTINGS};

/// `RUSTCCL_SHM_TENSORS_MIN_BYTES` and `_CACHE_BYTES`, read now: the arena
/// reads them when `import rustccl` enables it, before anything reads
/// [`Config::get`] (which would freeze every setting a script makes after
/// the import).
pub fn shm_tensors_sizes() -> (usize, usize) {
    let v = Vars::process();
    let sizes = shm_tensors_from(&v);
    v.report();
    sizes
}

fn shm_tensors_from(v: &Vars<'_>) -> (usize, usize) {
    (v.size("RUSTCCL_SHM_TENSORS_MIN_BYTES", SHM_TENSORS_MIN), v.size("RUSTCCL_SHM_TENSORS_CACHE_BYTES", SHM_TENSORS_CACHE))
}

fn parse_level(v: &Vars<'_>) -> LogLevel {
    let s = v.var("RUSTCCL_DEBUG").unwrap_or_default();
    match s.trim().to_ascii_uppercase().as_str() {
        "" | "OFF" | "0" | "NONE" => LogLevel::Off,
        "WARN" | "WARNING" => LogLevel::Warn,
        "INFO" | "1" => LogLevel::Info,
        "TRACE" | "DEBUG" | "2" => LogLevel::Trace,
        _ => {
            v.reject("RUSTCCL_DEBUG", &s, "not OFF, WARN, INFO or TRACE; using INFO");
            LogLevel::Info
        }
    }
}

impl Config {
    /// The settings in the environment now; values that do not parse are
    /// kept for [`Config::check_process`], unknown names warned of.
    fn from_env() -> Config {
        // Read once and kept, so a group's own settings go over what the
        // process read, not over a later change of the environment.
        let env: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, x)| Some((k.into_string().ok()?, x.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with("RUSTCCL_"))
            .collect();
        let v = Vars::layered(&[], &env);
        let c = Config::from_vars(&v);
        let rejected = v.rejected().into_iter().map(|(_, why)| why).collect();
        // Once per process, since the environment is read once.
        for (name, _) in env.iter().filter(|(k, _)| settings::is_unknown(k)) {
            eprintln!("{}", settings::unknown_warning(name));
        }
        Config { env, rejected, ..c }
    }

    /// Fails where a `RUSTCCL_*` setting of the process has a value that
    /// does not parse: a group built on a setting the user did not get
    /// would run other algorithms than the ones asked for.
    pub fn check_process(&self) -> Result<(), String> {
        match self.rejected.as_slice() {
            [] => Ok(()),
            bad => Err(format!(
                "bad setting in the environment: {}; fix or unset it (rustccl.config() lists the settings and their values)",
                bad.join("; ")
            )),
        }
    }

    fn from_vars(v: &Vars<'_>) -> Config {
        let d = AlgoConfig::default();
        let algo = AlgoConfig {
            small_allreduce_bytes: v.size("RUSTCCL_SMALL_ALLREDUCE_BYTES", d.small_allreduce_bytes),
            small_broadcast_bytes: v.size("RUSTCCL_SMALL_BROADCAST_BYTES", d.small_broadcast_bytes),
            segment_bytes: v.size("RUSTCCL_SEGMENT_BYTES", d.segment_bytes).max(64),
            caller_runs_us: v.count("RUSTCCL_CALLER_RUNS_US", d.caller_runs_us as usize) as u64,
        };
        let (shm_tensors_min, shm_tensors_cache) = shm_tensors_from(v);
        Config {
            algo,
            socket_ifname: v.text("RUSTCCL_SOCKET_IFNAME"),
            host_id: v.text("RUSTCCL_HOST_ID"),
            nccl_library: v.text("RUSTCCL_NCCL_LIBRARY"),
            transport: match v.var("RUSTCCL_TRANSPORT").unwrap_or_default().to_ascii_lowercase().as_str() {
                "" | "auto" => TransportMode::Auto,
                "tcp" => TransportMode::Tcp,
                "shm" => TransportMode::Shm,
                other => {
                    v.reject("RUSTCCL_TRANSPORT", other, "not auto, tcp or shm");
                    TransportMode::Auto
                }
            },
            shm: ShmConfig {
                ring_bytes: v.size("RUSTCCL_SHM_RING_BYTES", 1 << 20),
                small_bytes: v.size_setting("RUSTCCL_SHM_SMALL_BYTES", true, &[]),
                segment_bytes: v.size("RUSTCCL_SHM_SEGMENT_BYTES", 256 << 10),
                slot_min: v.size_setting("RUSTCCL_SHM_SLOT_MIN_BYTES", false, &[]),
                threads: v.count_setting("RUSTCCL_SHM_THREADS", true, &[]),
                attach_min: v.size_setting("RUSTCCL_SHM_ATTACH_MIN_BYTES", false, &[("off", NEVER)]),
                op_attach_min: OpAttach {
                    all_reduce: v.size_setting("RUSTCCL_SHM_ALL_REDUCE_ATTACH_MIN_BYTES", false, &[("off", NEVER)]),
                    all_gather: v.size_setting("RUSTCCL_SHM_ALL_GATHER_ATTACH_MIN_BYTES", false, &[("off", NEVER)]),
                    reduce_scatter: v.size_setting("RUSTCCL_SHM_REDUCE_SCATTER_ATTACH_MIN_BYTES", false, &[("off", NEVER)]),
                    reduce: v.size_setting("RUSTCCL_SHM_REDUCE_ATTACH_MIN_BYTES", false, &[("off", NEVER)]),
                },
                min_piece: v.size_setting("RUSTCCL_SHM_MIN_PIECE_BYTES", true, &[]),
                single_min: v.size_setting("RUSTCCL_SHM_SINGLE_READER_MIN_BYTES", true, &[]),
                block_min: v.size_setting("RUSTCCL_SHM_BLOCK_READ_MIN_BYTES", true, &[]),
                root_threads: v.count_setting("RUSTCCL_SHM_ROOT_THREADS", true, &[]),
                quick_threads: v.count_setting("RUSTCCL_SHM_QUICK_THREADS", false, &[]),
                quick_bytes: v.size_setting("RUSTCCL_SHM_QUICK_BYTES_PER_THREAD", true, &[]),
                quick_all_to_all_bytes: v.size_setting("RUSTCCL_SHM_QUICK_ALL_TO_ALL_BYTES_PER_THREAD", true, &[]),
                quick_min_piece: v.size_setting("RUSTCCL_SHM_QUICK_MIN_PIECE_BYTES", true, &[]),
                quick_leads: v.flag_setting("RUSTCCL_SHM_QUICK_LEADS"),
                spin_us: v.count_setting("RUSTCCL_SHM_SPIN_US", false, &[]),
                wait_spin_us: v.count_setting("RUSTCCL_SHM_WAIT_SPIN_US", false, &[]),
                broadcast_min: v.size_setting("RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES", false, &[("off", NEVER)]),
                staged_min: v.size("RUSTCCL_SHM_STAGED_SEND_MIN_BYTES", STAGED_SEND_MIN),
                staged_max: v.size_setting("RUSTCCL_SHM_STAGED_SEND_MAX_BYTES", false, &[]),
                stage_shared: v.flag("RUSTCCL_SHM_STAGE_SHARED_SENDS"),
                keep_apart: v.on("RUSTCCL_SHM_KEEP_APART"),
                gather_push: v.on("RUSTCCL_SHM_GATHER_PUSH"),
                split_send_min: v.size_setting("RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES", false, &[("off", NEVER)]),
                scatter_split_max: v.size_setting("RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES", true, &[("any", NEVER)]),
                scatter_root_share: v.count_setting("RUSTCCL_SHM_SCATTER_ROOT_SHARE", true, &[]),
                gather_root_share: v.count_setting("RUSTCCL_SHM_GATHER_ROOT_SHARE", true, &[]),
                block_wait_us: v.size("RUSTCCL_SHM_BLOCK_WAIT_US", BLOCK_WAIT_US),
            },
            shm_tensors: v.flag("RUSTCCL_SHM_TENSORS"),
            shm_tensors_min,
            shm_tensors_cache,
            flight_dir: v.text("RUSTCCL_FLIGHT_RECORDER_DIR"),
            flight_size: v.count("RUSTCCL_FLIGHT_RECORDER_SIZE", 2000),
            fault: v.text("RUSTCCL_FAULT").and_then(|s| match FaultSpec::parse(&s) {
                Ok(f) => Some(f),
                Err(e) => {
                    v.reject("RUSTCCL_FAULT", &s, &e);
                    None
                }
            }),
            check: v.flag("RUSTCCL_CHECK"),
            cuda_timing: v.flag("RUSTCCL_CUDA_TIMING"),
            host_profile: v.flag("RUSTCCL_HOST_PROFILE"),
            custom_allreduce: !matches!(v.var("RUSTCCL_CUSTOM_ALLREDUCE").as_deref(), Some("0") | Some("false") | Some("FALSE")),
            custom_allreduce_max_bytes: v.auto_size("RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES"),
            one_shot_max_bytes: v.auto_size("RUSTCCL_ONE_SHOT_MAX_BYTES"),
            custom_gather_max_bytes: v.auto_size("RUSTCCL_CUSTOM_GATHER_MAX_BYTES"),
            nvrtc_library: v.text("RUSTCCL_NVRTC_LIBRARY"),
            debug: parse_level(v),
            env: Vec::new(),
            rejected: Vec::new(),
        }
    }

    /// Size limits of the NVLink kernels for a group of `world` ranks:
    /// (one-shot all_reduce, any all_reduce, all_gather / reduce_scatter).
    /// Auto values where they beat NCCL on H200 NVLink, measured with
    /// 2 GPUs (`docs/performance.md` names the CUDA results).
    /// With more ranks only the one-shot limit is measured (4 GPUs,
    /// before the two-shot kernel existed): the two-shot kernel stays off
    /// and the copy kernels small until measured there.
    pub fn peer_limits(&self, world: usize) -> (usize, usize, usize) {
        let two = world <= 2;
        let all_reduce = self.custom_allreduce_max_bytes.unwrap_or(if two { 16 << 20 } else { 1 << 20 });
        let one_shot = self.one_shot_max_bytes.unwrap_or(if two { 2 << 20 } else { 1 << 20 }).min(all_reduce);
        let gather = self.custom_gather_max_bytes.unwrap_or(if two { 4 << 20 } else { 256 << 10 });
        (one_shot, all_reduce, gather)
    }

    /// The process-wide configuration, read from the environment once.
    pub fn get() -> &'static Config {
        static CONFIG: OnceLock<Config> = OnceLock::new();
        CONFIG.get_or_init(Config::from_env)
    }

    /// (name, effective value) pairs, for `rustccl.config()`.
    pub fn effective(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RUSTCCL_SMALL_ALLREDUCE_BYTES", self.algo.small_allreduce_bytes.to_string()),
            ("RUSTCCL_SMALL_BROADCAST_BYTES", self.algo.small_broadcast_bytes.to_string()),
            ("RUSTCCL_SEGMENT_BYTES", self.algo.segment_bytes.to_string()),
            ("RUSTCCL_CALLER_RUNS_US", self.algo.caller_runs_us.to_string()),
            ("RUSTCCL_TRANSPORT", format!("{:?}", self.transport).to_lowercase()),
            ("RUSTCCL_SHM_RING_BYTES", self.shm.ring_bytes.to_string()),
            ("RUSTCCL_SHM_SMALL_BYTES", self.shm.small_bytes.show("")),
            ("RUSTCCL_SHM_SEGMENT_BYTES", self.shm.segment_bytes.to_string()),
            ("RUSTCCL_SHM_SLOT_MIN_BYTES", self.shm.slot_min.show("")),
            ("RUSTCCL_SHM_THREADS", self.shm.threads.show("")),
            ("RUSTCCL_SHM_ATTACH_MIN_BYTES", self.shm.attach_min.show("off")),
            ("RUSTCCL_SHM_ALL_REDUCE_ATTACH_MIN_BYTES", self.shm.op_attach_min.all_reduce.show("off")),
            ("RUSTCCL_SHM_ALL_GATHER_ATTACH_MIN_BYTES", self.shm.op_attach_min.all_gather.show("off")),
            ("RUSTCCL_SHM_REDUCE_SCATTER_ATTACH_MIN_BYTES", self.shm.op_attach_min.reduce_scatter.show("off")),
            ("RUSTCCL_SHM_REDUCE_ATTACH_MIN_BYTES", self.shm.op_attach_min.reduce.show("off")),
            ("RUSTCCL_SHM_MIN_PIECE_BYTES", self.shm.min_piece.show("")),
            ("RUSTCCL_SHM_SINGLE_READER_MIN_BYTES", self.shm.single_min.show("")),
            ("RUSTCCL_SHM_BLOCK_READ_MIN_BYTES", self.shm.block_min.show("")),
            ("RUSTCCL_SHM_ROOT_THREADS", self.shm.root_threads.show("")),
            ("RUSTCCL_SHM_QUICK_THREADS", self.shm.quick_threads.show("")),
            ("RUSTCCL_SHM_QUICK_BYTES_PER_THREAD", self.shm.quick_bytes.show("")),
            ("RUSTCCL_SHM_QUICK_ALL_TO_ALL_BYTES_PER_THREAD", self.shm.quick_all_to_all_bytes.show("")),
            ("RUSTCCL_SHM_QUICK_MIN_PIECE_BYTES", self.shm.quick_min_piece.show("")),
            ("RUSTCCL_SHM_QUICK_LEADS", self.shm.quick_leads.show()),
            ("RUSTCCL_SHM_SPIN_US", self.shm.spin_us.show("")),
            ("RUSTCCL_SHM_WAIT_SPIN_US", self.shm.wait_spin_us.show("")),
            ("RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES", self.shm.broadcast_min.show("off")),
            ("RUSTCCL_SHM_STAGED_SEND_MIN_BYTES", self.shm.staged_min.to_string()),
            ("RUSTCCL_SHM_STAGED_SEND_MAX_BYTES", self.shm.staged_max.show("")),
            ("RUSTCCL_SHM_STAGE_SHARED_SENDS", (self.shm.stage_shared as u8).to_string()),
            ("RUSTCCL_SHM_KEEP_APART", (self.shm.keep_apart as u8).to_string()),
            ("RUSTCCL_SHM_GATHER_PUSH", (self.shm.gather_push as u8).to_string()),
            ("RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES", self.shm.split_send_min.show("off")),
            ("RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES", self.shm.scatter_split_max.show("any")),
            ("RUSTCCL_SHM_SCATTER_ROOT_SHARE", self.shm.scatter_root_share.show("")),
            ("RUSTCCL_SHM_GATHER_ROOT_SHARE", self.shm.gather_root_share.show("")),
            ("RUSTCCL_SHM_BLOCK_WAIT_US", self.shm.block_wait_us.to_string()),
            ("RUSTCCL_SOCKET_IFNAME", self.socket_ifname.clone().unwrap_or_default()),
            ("RUSTCCL_HOST_ID", self.host_id.clone().unwrap_or_default()),
            ("RUSTCCL_NCCL_LIBRARY", self.nccl_library.clone().unwrap_or_default()),
            ("RUSTCCL_CUDA_TIMING", (self.cuda_timing as u8).to_string()),
            ("RUSTCCL_HOST_PROFILE", (self.host_profile as u8).to_string()),
            ("RUSTCCL_CUSTOM_ALLREDUCE", (self.custom_allreduce as u8).to_string()),
            ("RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES", self.custom_allreduce_max_bytes.map_or("auto".into(), |b| b.to_string())),
            ("RUSTCCL_ONE_SHOT_MAX_BYTES", self.one_shot_max_bytes.map_or("auto".into(), |b| b.to_string())),
            ("RUSTCCL_CUSTOM_GATHER_MAX_BYTES", self.custom_gather_max_bytes.map_or("auto".into(), |b| b.to_string())),
            ("RUSTCCL_NVRTC_LIBRARY", self.nvrtc_library.clone().unwrap_or_default()),
            ("RUSTCCL_SHM_TENSORS", (self.shm_tensors as u8).to_string()),
            ("RUSTCCL_SHM_TENSORS_MIN_BYTES", self.shm_tensors_min.to_string()),
            ("RUSTCCL_SHM_TENSORS_CACHE_BYTES", self.shm_tensors_cache.to_string()),
            // read by the Python package (`rustccl.tune`) at each group's creation
            ("RUSTCCL_TUNE", self.env_value("RUSTCCL_TUNE").unwrap_or_else(|| "cached".into())),
            ("RUSTCCL_TUNE_DIR", self.env_value("RUSTCCL_TUNE_DIR").unwrap_or_default()),
            ("RUSTCCL_FLIGHT_RECORDER_DIR", self.flight_dir.clone().unwrap_or_default()),
            ("RUSTCCL_FLIGHT_RECORDER_SIZE", self.flight_size.to_string()),
            ("RUSTCCL_CHECK", (self.check as u8).to_string()),
            ("RUSTCCL_FAULT", self.fault.as_ref().map(|f| format!("{f:?}")).unwrap_or_default()),
            ("RUSTCCL_DEBUG", format!("{:?}", self.debug).to_uppercase()),
            ("RUSTCCL_TLS", self.env_value("RUSTCCL_TLS").unwrap_or_else(|| "0".into())),
            ("RUSTCCL_TLS_CA", self.env_value("RUSTCCL_TLS_CA").unwrap_or_default()),
            ("RUSTCCL_TLS_CERT", self.env_value("RUSTCCL_TLS_CERT").unwrap_or_default()),
            ("RUSTCCL_TLS_KEY", self.env_value("RUSTCCL_TLS_KEY").unwrap_or_default()),
            ("RUSTCCL_TLS_SECRET_FILE", self.env_value("RUSTCCL_TLS_SECRET_FILE").unwrap_or_default()),
        ]
    }

    /// `name`'s value in the environment as the process read it.
    fn env_value(&self, name: &str) -> Option<String> {
        self.env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }
}

/// Logs to stderr when `RUSTCCL_DEBUG` is at least `level`; the format
/// arguments are not evaluated otherwise. Used as `crate::config::log_at`.
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        if $crate::config::Config::get().debug >= $level {
            $crate::config::log_line(format_args!($($arg)*));
        }
    };
}
pub(crate) use log_at;

/// Writes one log line with a single `write` call. `eprintln!` writes each
/// formatted piece separately (stderr is unbuffered), so lines from ranks that
/// share a pipe, as under torchrun, came out interleaved mid-line; one write
/// of at most `PIPE_BUF` bytes to a pipe is atomic.
pub fn log_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let line = format!("[rustccl {}] {}\n", std::process::id(), args);
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specs_parse() {
        let f = FaultSpec::parse("delay:rank=1:seq=3:ms=2000").unwrap();
        assert_eq!((f.rank, f.seq, f.action), (1, 3, FaultAction::Delay(std::time::Duration::from_millis(2000))));
        assert_eq!(FaultSpec::parse("kill:rank=0:seq=5:group=7").unwrap().group.as_deref(), Some("7"));
        assert_eq!(FaultSpec::parse("panic:rank=2:seq=1").unwrap().action, FaultAction::Panic);
        assert!(FaultSpec::parse("delay:rank=1:seq=3").is_err());
        assert!(FaultSpec::parse("explode:rank=1:seq=3").is_err());
    }

    #[test]
    fn every_effective_setting_is_documented() {
        let c = Config::from_env();
        for (name, _) in c.effective() {
            assert!(SETTINGS.iter().any(|s| s.name == name), "{name} undocumented");
        }
    }

    #[test]
    fn every_documented_setting_shows_its_value() {
        let names: Vec<_> = Config::from_env().effective().into_iter().map(|(n, _)| n).collect();
        for s in SETTINGS {
            assert!(names.contains(&s.name), "{} missing from rustccl.config()", s.name);
        }
    }
}
