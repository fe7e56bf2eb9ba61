//! The [`Communicator`]: one process group's view of its peers. It checks
//! requests, routes collectives to the CPU engine (CPU tensors) and sends /
//! receives to the point-to-point engine, and hands back a [`Work`].
// `unsafe` lives only in `nccl` (and the cuda helpers it uses).
#![deny(unsafe_code)]

mod check;
pub mod compression;
pub mod cpu;
pub mod flight;
pub mod monitor;
pub mod nccl;
mod options;
pub mod p2p;
pub mod regroup;
pub mod stats;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bootstrap::{self, BootstrapOpts, PeerInfo, Store, CHANNEL_COLLECTIVE, CHANNEL_P2P};
use crate::collectives::{into_cpu, Op, OpSpec};
use crate::config::log_at;
use crate::config::{Config, LogLevel};
use crate::error::{Error, Result};
use crate::tensor::{SharedBuf, Tensor};

impl nccl::IdExchange for Communicator {
    fn broadcast(&self, id: &mut [u8; 128]) -> Result<()> {
        self.host_broadcast(id)
    }

    fn pair(&self, peer: Rank, id: &mut [u8; 128], i_send: bool) -> Result<()> {
        let buf = SharedBuf::new(DType::U8, &id[..]);
        let mut s = OpSpec::new(if i_send { OpKind::Send } else { OpKind::Recv });
        s.root = peer as i64;
        s.tag = NCCL_ID_TAG;
        let t = buf.tensor().ok_or_else(|| Error::Internal("fresh buffer lent".into()))?;
        if i_send {
            s.inputs = vec![t];
        } else {
            s.outputs = vec![t];
        }
        self.submit(vec![s], None, None)?.wait(None)?;
        id.copy_from_slice(&buf.bytes().ok_or_else(|| Error::Internal("buffer still lent".into()))?);
        Ok(())
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let input = SharedBuf::new(DType::U8, mine);
        let output = SharedBuf::zeros(DType::U8, mine.len() * self.size);
        let mut s = OpSpec::new(OpKind::AllGather);
        s.inputs = vec![input.tensor().ok_or_else(|| Error::Internal("fresh buffer lent".into()))?];
        s.outputs = vec![output.tensor().ok_or_else(|| Error::Internal("fresh buffer lent".into()))?];
        self.submit(vec![s], None, None)?.wait(None)?;
        output.bytes().ok_or_else(|| Error::Internal("buffer still lent".into()))
    }

    fn single_host(&self) -> bool {
        !self.peers.is_empty() && self.peers.iter().all(|p| p.host == self.peers[0].host)
    }
}
use crate::config::TransportMode;
use crate::transport::mesh::Mesh;
use crate::transport::shm;
use crate::transport::Transport;
use crate::types::{DType, Device, OpKind, Rank};
use crate::work::{self, Callback, Watch, Work};

pub use cpu::{Done, Observer};
pub use options::CommOptions;

pub struct Communicator {
    rank: Rank,
    size: usize,
    opts: CommOptions,
    peers: Vec<PeerInfo>,
    transport_kind: &'static str,
    cpu: cpu::CpuEngine,
    p2p: Option<p2p::P2pEngine>,
    nccl: Mutex<Option<Arc<nccl::NcclEngine>>>,
    stats: Arc<stats::Stats>,
    flight: Arc<flight::FlightRecorder>,
    /// Link kind per peer ("shm" / "tcp" / "tls": TCP through TLS).
    links: Vec<&'static str>,
    /// Control exchanges over the point-to-point links so far (monitored
    /// barriers, shrinks); each uses its own tag, see `control_tag`.
    control_calls: AtomicU64,
    /// The algorithm thresholds in force (settings or chosen from the host).
    thresholds: Vec<(&'static str, u64)>,
    /// Codec for the exchange between hosts (default off).
    compression: compression::GroupCompression,
    /// What the rendezvous found of peers with other settings
    /// (`options::settings_warning`), for Python to warn of.
    settings_warning: Option<String>,
}

/// Why a group with TLS fails where ranks of one host cannot share memory:
/// their TCP connections were set up without TLS.
const TLS_NEEDS_SHM: &str = "with RUSTCCL_TLS=1, ranks of one host that cannot share memory would talk over unencrypted TCP: set RUSTCCL_TRANSPORT=tcp to encrypt their links too";

/// The fault of `opts` if it targets this rank and group.
fn fault_for(opts: &CommOptions, rank: Rank) -> Option<crate::config::FaultSpec> {
    opts.fault.clone().filter(|f| f.rank == rank && f.group.as_deref().is_none_or(|g| g == opts.group))
}

/// Feeds the CPU engine's reports into `stats`.
fn observer(stats: Arc<stats::Stats>) -> Observer {
    Box::new(move |d: &Done<'_>| {
        stats.record(stats::Sample {
            op: d.kind,
            bytes: d.bytes as u64,
            duration: Some(d.duration),
            algorithm: d.algo,
            transport: d.transport,
            ok: d.result.is_ok(),
            by_caller: d.by_caller,
        });
        if let Err(e) = d.result {
            stats.note_error(e);
        }
        if d.result.is_ok() && (d.sent_between_hosts > 0 || !d.codec.is_empty()) {
            stats.record_between_hosts(d.kind, d.sent_between_hosts, d.codec);
        }
    })
}

/// Ranks grouped by host identity, hosts ordered by their lowest rank.
fn hosts_of(peers: &[PeerInfo]) -> Vec<Vec<Rank>> {
    let mut hosts: Vec<(String, Vec<Rank>)> = Vec::new();
    for p in peers {
        match hosts.iter_mut().find(|(h, _)| h == &p.host) {
            Some((_, v)) => v.push(p.rank),
            None => hosts.push((p.host.clone(), vec![p.rank])),
        }
    }
    hosts.into_iter().map(|(_, v)| v).collect()
}

/// Tag of the point-to-point messages that carry a pair's NCCL unique id
/// (outside torch's int32 tag range, so it never meets a user's message).
const NCCL_ID_TAG: i64 = i64::MIN + 0x6e63636c;

/// First tag of the control exchanges (monitored barrier, shrink): call n
/// of a communicator uses `CONTROL_TAG + n`, also outside torch's range.
const CONTROL_TAG: i64 = i64::MIN + (1 << 40);

impl Communicator {
    /// Rendezvous through `store`, connect to every peer, start the engines.
    pub fn bootstrap(store: &dyn Store, rank: Rank, size: usize, opts: CommOptions, listen_ip: std::net::IpAddr) -> Result<Communicator> {
        let host = opts.host_id.clone().unwrap_or_else(bootstrap::addr::host_identity);
        let settings = Config::get().shared_settings(opts.group_config());
        let (tls, transport) = (opts.tls.clone(), opts.transport);
        let bopts = BootstrapOpts { group: opts.group.clone(), timeout: opts.timeout, listen_ip, host, settings, tls, transport };
        let ep = bootstrap::rendezvous(store, rank, size, &bopts)?;
        let warning = options::settings_warning(&opts.group, rank, &ep.peers);
        if let Some(w) = &warning {
            log_at!(LogLevel::Warn, "{w}");
        }
        Ok(Communicator { settings_warning: warning, ..Self::from_endpoints(ep, opts)? })
    }

    /// Starts the engines over freshly connected endpoints (after a
    /// rendezvous, a split or a shrink).
    fn from_endpoints(mut ep: bootstrap::Endpoints, opts: CommOptions) -> Result<Communicator> {
        let (rank, size) = (ep.rank, ep.size);
        let mut coll = ep.take_channel(CHANNEL_COLLECTIVE);
        let p2p_conns = ep.take_channel(CHANNEL_P2P);
        let mut shm = Self::connect_shm(&ep, &mut coll, &opts)?;
        let any_shm = shm.is_some();
        let p2p_shm = shm.as_mut().map(|s| (s.local.clone(), std::mem::take(&mut s.p2p)));
        let thresholds = stats::thresholds(&opts.algo, shm.as_ref().map(|s| s.local.as_ref()));
        let mut transport = Mesh::new(rank, size, coll, shm, hosts_of(&ep.peers))
            .map_err(|e| Error::Bootstrap { rank, detail: format!("setting up links: {e}") })?;
        if any_shm || opts.transport != TransportMode::Tcp {
            transport.agree_shm(opts.timeout)?;
        }
        log_at!(LogLevel::Info, "group '{}' rank {rank}/{size}: connected over {}; {}", opts.group, transport.kind(), {
            let get = |name: &str| thresholds.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v);
            let tcp = format!(
                "all_reduce <= {} B recursive doubling, ring above; segments {} B",
                opts.algo.small_allreduce_bytes, opts.algo.segment_bytes
            );
            let shm = format!(
                "all_reduce over shared memory <= {} B in one round, pipelined above with {} thread(s) a rank",
                get("shm_one_round_max_bytes"),
                get("shm_threads")
            );
            match transport.kind() {
                "shm" => shm,
                "shm+tcp" => format!("within a host: {shm}; between hosts: {tcp}"),
                _ => tcp,
            }
        });
        let transport_kind = transport.kind();
        let links = transport.link_kinds();
        let stats = Arc::new(stats::Stats::default());
        let fault = fault_for(&opts, rank);
        let cpu = cpu::CpuEngine::start(Box::new(transport), opts.group.clone(), opts.algo, Some(observer(stats.clone())), fault)?;
        let p2p = p2p::P2pEngine::new(rank, size, opts.group.clone(), p2p_conns, p2p_shm, opts.timeout);
        Ok(Communicator {
            rank,
            size,
            opts,
            peers: ep.peers,
            transport_kind,
            cpu,
            p2p: Some(p2p),
            nccl: Mutex::new(None),
            stats,
            flight: Arc::new(flight::FlightRecorder::new(Config::get().flight_size)),
            links,
            control_calls: AtomicU64::new(0),
            thresholds,
            compression: Default::default(),
            settings_warning: None,
        })
    }

    /// Shared memory with the ranks of this host (per `RUSTCCL_TRANSPORT`).
    fn connect_shm(ep: &bootstrap::Endpoints, coll: &mut [Option<bootstrap::Conn>], opts: &CommOptions) -> Result<Option<shm::ShmSetup>> {
        let (rank, size) = (ep.rank, ep.size);
        let me = &ep.peers[rank].host;
        let local: Vec<Rank> = ep.peers.iter().filter(|p| &p.host == me).map(|p| p.rank).collect();
        let remote: Vec<Rank> = (0..size).filter(|r| !local.contains(r)).collect();
        if opts.transport == TransportMode::Shm && !remote.is_empty() {
            return Err(Error::Bootstrap { rank, detail: format!("RUSTCCL_TRANSPORT=shm, but ranks {remote:?} are on other hosts") });
        }
        if opts.transport == TransportMode::Tcp || local.len() < 2 {
            return Ok(None);
        }
        let deadline = std::time::Instant::now() + opts.timeout;
        match shm::connect(rank, &local, &ep.token, opts.shm, coll, deadline) {
            Ok(setup) => {
                if opts.tls.is_some() && setup.links.len() + 1 < local.len() {
                    return Err(Error::Bootstrap { rank, detail: TLS_NEEDS_SHM.into() });
                }
                if opts.transport == TransportMode::Shm && setup.links.len() + 1 < local.len() {
                    return Err(Error::Bootstrap {
                        rank,
                        detail: "RUSTCCL_TRANSPORT=shm, but some local ranks could not map each other's shared memory".into(),
                    });
                }
                Ok(Some(setup))
            }
            Err(shm::SetupError::Broken(e)) => {
                Err(Error::Bootstrap { rank, detail: format!("setting up shared memory with the ranks of this host broke off: {e}") })
            }
            Err(e) if opts.transport == TransportMode::Shm => {
                Err(Error::Bootstrap { rank, detail: format!("RUSTCCL_TRANSPORT=shm, but shared memory failed: {e}") })
            }
            Err(e) if opts.tls.is_some() => Err(Error::Bootstrap { rank, detail: format!("{TLS_NEEDS_SHM} ({e})") }),
            Err(e) => {
                log_at!(LogLevel::Warn, "rank {rank}: shared memory unavailable ({e}); using TCP between the ranks of this host");
                Ok(None)
            }
        }
    }

    /// A communicator over a ready transport (tests); no point-to-point.
    pub fn with_transport(transport: Box<dyn Transport>, opts: CommOptions) -> Result<Communicator> {
        let (rank, size, kind) = (transport.rank(), transport.size(), transport.kind());
        let stats = Arc::new(stats::Stats::default());
        let fault = fault_for(&opts, rank);
        let th = stats::thresholds(&opts.algo, None);
        let cpu = cpu::CpuEngine::start(transport, opts.group.clone(), opts.algo, Some(observer(stats.clone())), fault)?;
        Ok(Communicator {
            rank,
            size,
            opts,
            peers: Vec::new(),
            transport_kind: kind,
            cpu,
            p2p: None,
            nccl: Mutex::new(None),
            stats,
            flight: Arc::new(flight::FlightRecorder::new(Config::get().flight_size)),
            links: vec![kind; size],
            control_calls: AtomicU64::new(0),
            thresholds: th,
            compression: Default::default(),
            settings_warning: None,
        })
    }

    pub fn rank(&self) -> Rank {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }
    pub fn group(&self) -> &str {
        &self.opts.group
    }

    /// Set where peers published other shared settings at the rendezvous
    /// than this rank's: which, and what that can do.
    pub fn settings_warning(&self) -> Option<&str> {
        self.settings_warning.as_deref()
    }

    /// The group's own settings (`pg_options`), set over the process's.
    pub fn settings(&self) -> &[(String, String)] {
        &self.opts.settings
    }

    /// The settings this communicator copied at creation.
    pub fn group_config(&self) -> crate::config::GroupConfig {
        self.opts.group_config()
    }
    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }
    pub fn transport_kind(&self) -> &'static str {
        self.transport_kind
    }
    /// Link kind per peer: "shm", "tcp" or "tls" ("" for this rank).
    pub fn link_kinds(&self) -> &[&'static str] {
        &self.links
    }
    /// Ranks whose link to this one broke under an operation (dead ranks,
    /// as this rank saw them), sorted.
    pub fn failed_ranks(&self) -> Vec<Rank> {
        self.stats.lost_peers()
    }

    /// The first error that left this group unusable (a lost peer, a
    /// timeout, an abort of work in flight): later operations fail with it.
    pub fn fatal_error(&self) -> Option<String> {
        self.stats.fatal()
    }

    /// The algorithm thresholds in force: name and bytes (or count).
    pub fn thresholds(&self) -> &[(&'static str, u64)] {
        &self.thresholds
    }
    /// Per-collective counters.
    pub fn stats(&self) -> &stats::Stats {
        &self.stats
    }

    /// A fresh tag for a control exchange over the point-to-point links.
    /// The ranks taking part make the same calls in the same order, so
    /// they draw the same tag; a late message of an earlier exchange can
    /// never be taken for a later one's.
    fn control_tag(&self) -> i64 {
        CONTROL_TAG + self.control_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as i64
    }

    /// Compresses this group's later float SUM / AVG all-reduces between
    /// hosts with `setting` (None: exact). Every rank must set the same.
    pub fn set_compression(&self, setting: Option<compression::Setting>) {
        self.compression.set(setting)
    }

    pub fn compression(&self) -> Option<compression::Setting> {
        self.compression.get()
    }

    /// Collectives submitted so far (the next sequence number).
    pub fn seq(&self) -> u64 {
        self.cpu.seq()
    }

    /// Times a CPU collective's submit woke the engine's sleeping worker
    /// thread (`comm::cpu`): a loop of blocking calls that their callers
    /// run wakes it about once per caller-runs grace, not once a call.
    pub fn worker_wakes(&self) -> u64 {
        self.cpu.worker_wakes()
    }

    /// Checks and submits one operation, or several as one unit of work
    /// (coalesced collectives, or a batch of sends and receives). `timeout`
    /// overrides the group's; `callback` runs once when the work finishes.
    /// An `Err` means nothing was submitted and the group is unaffected.
    pub fn submit(&self, specs: Vec<OpSpec>, timeout: Option<Duration>, callback: Option<Callback>) -> Result<Work> {
        let next = compression::take_next(&self.opts.group);
        let timeout_d = timeout.unwrap_or(self.opts.timeout);
        let mut ops = Vec::with_capacity(specs.len());
        let stream = specs.first().map_or(0, |s| s.stream);
        let sync = !specs.is_empty() && specs.iter().all(|s| s.sync);
        for spec in specs {
            ops.push(Op::from_spec(spec, self.rank, self.size)?);
        }
        if ops.is_empty() {
            return Err(Error::Internal("empty submission".into()));
        }
        if self.opts.check && self.size > 1 && !ops[0].kind().is_p2p() {
            self.check_collective(&ops, timeout_d)?;
        }
        let meta = flight::Meta::of(&ops);
        // Compression serves the CPU engine only (CPU tensors).
        let compress = if meta.device == Device::Cpu { self.compression.request_with(next, &ops) } else { None };
        let w = self.dispatch(ops, stream, sync, timeout_d, callback, compress)?;
        self.flight.record(meta, w.queued().unwrap_or_else(Instant::now), &w);
        if let Some(dir) = &Config::get().flight_dir {
            let (fr, dir, g, r, n) = (self.flight.clone(), dir.clone(), self.opts.group.clone(), self.rank, self.size);
            w.on_complete(Box::new(move |res, _| {
                if let Err(Error::Timeout { .. }) = res {
                    match fr.dump(&dir, &g, r, n) {
                        Ok(path) => log_at!(LogLevel::Warn, "group '{g}' rank {r}: flight record written to {path}"),
                        Err(e) => log_at!(LogLevel::Warn, "group '{g}' rank {r}: cannot write the flight record: {e}"),
                    }
                }
            }));
        }
        Ok(w)
    }

    /// The flight recorder as JSON (and written to `dir` when given).
    pub fn flight_record(&self, dir: Option<&str>) -> Result<String> {
        if let Some(d) = dir {
            self.flight
                .dump(d, &self.opts.group, self.rank, self.size)
                .map_err(|e| Error::Internal(format!("writing the flight record to {d}: {e}")))?;
        }
        Ok(self.flight.to_json(&self.opts.group, self.rank, self.size))
    }

    fn dispatch(
        &self,
        ops: Vec<Op<Tensor>>,
        stream: u64,
        sync: bool,
        timeout: Duration,
        callback: Option<Callback>,
        compress: Option<crate::collectives::compress::codec::Request>,
    ) -> Result<Work> {
        let first = ops[0].kind();
        let name = first.name();
        let p2p = ops.iter().filter(|o| o.kind().is_p2p()).count();
        if p2p != 0 && p2p != ops.len() {
            return Err(Error::invalid(name, "a batch cannot mix point-to-point operations and collectives"));
        }
        let device = ops[0].device();
        if let Some(op) = ops.iter().find(|o| o.device() != device) {
            return Err(Error::invalid(op.kind().name(), "a batch cannot mix tensors of different devices"));
        }
        match device {
            Device::Cpu => {}
            Device::Cuda(d) => return self.submit_cuda(ops, d, stream, sync, timeout, callback),
            d => return Err(Error::unsupported(name, format!("tensors on device {d} are not supported"))),
        }
        if first == OpKind::Barrier {
            // A host operation, which first waits for this group's CUDA work
            // to finish on the device, as torch's NCCL barrier does.
            if let Some(n) = self.nccl_if_started() {
                n.wait_idle(timeout)?;
            }
        }
        let mut callback = callback;
        let mut attach = |w: &Work| {
            if let Some(cb) = callback.take() {
                w.on_complete(cb);
            }
        };
        if p2p > 0 {
            let engine = self.p2p.as_ref().ok_or_else(|| Error::unsupported(name, "this communicator has no point-to-point links"))?;
            let single = ops.len() == 1;
            // A single operation returns its own work: no list to allocate.
            let mut works = Vec::with_capacity(if single { 0 } else { ops.len() });
            for op in ops {
                let (kind, bytes) = (op.kind(), op.bytes() as u64);
                let transport = match &op {
                    Op::Send { peer, .. } | Op::Recv { peer: Some(peer), .. } => engine.link_kind(*peer),
                    _ => engine.link_kind_any(),
                };
                let op = into_cpu(op)?;
                // Counted without a callback allocated per call.
                let watch = Watch { observer: self.stats.clone(), kind, bytes, transport };
                if single {
                    return engine.submit(op, timeout, |w| {
                        w.watch(watch);
                        attach(w);
                    });
                }
                works.push(engine.submit(op, timeout, |w| w.watch(watch))?);
            }
            let joined = work::join("batch_p2p", 0, works);
            attach(&joined);
            return Ok(joined);
        }
        let bytes = ops.iter().map(|o| o.bytes()).sum();
        let cpu_ops = ops.into_iter().map(into_cpu).collect::<Result<Vec<_>>>()?;
        self.cpu.submit(cpu_ops, bytes, timeout, compress, sync, attach)
    }

    /// Runs a CPU broadcast of `data` from rank 0 on the CPU engine.
    fn host_broadcast(&self, data: &mut [u8]) -> Result<()> {
        let buf = SharedBuf::new(DType::U8, data);
        let mut s = OpSpec::new(OpKind::Broadcast);
        s.inputs = vec![buf.tensor().ok_or_else(|| Error::Internal("fresh buffer lent".into()))?];
        self.submit(vec![s], None, None)?.wait(None)?;
        data.copy_from_slice(&buf.bytes().ok_or_else(|| Error::Internal("buffer still lent".into()))?);
        Ok(())
    }

    /// Stops the engines. `abort` interrupts a running collective; without
    /// it, queued collectives finish first (bounded by the group timeout).
    pub fn shutdown(&self, abort: bool) {
        let grace = if abort { Duration::from_secs(5) } else { self.opts.timeout.min(Duration::from_secs(10)) };
        if let Some(n) = self.nccl_if_started() {
            n.shutdown(abort, grace);
        }
        self.cpu.shutdown(abort, grace);
        if let Some(p) = &self.p2p {
            p.shutdown();
        }
    }

    fn nccl_if_started(&self) -> Option<Arc<nccl::NcclEngine>> {
        self.nccl.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The CUDA engine, started on first use.
    fn nccl(&self, op: &'static str) -> Result<Arc<nccl::NcclEngine>> {
        let mut n = self.nccl.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = n.as_ref() {
            return Ok(e.clone());
        }
        let e = nccl::NcclEngine::new(self.rank, self.size, self.opts.group.clone(), self.stats.clone())
            .map_err(|why| Error::unsupported(op, format!("CUDA collectives need libcuda and libnccl: {why}")))?;
        let e = Arc::new(e);
        *n = Some(e.clone());
        Ok(e)
    }

    /// Creates this group's NCCL communicator on `device` now (every rank
    /// must call it), instead of on the first CUDA collective.
    pub fn connect_cuda(&self, device: i32) -> Result<()> {
        self.nccl("connect")?.connect(device, self)
    }

    /// NCCL version string, once the CUDA engine has started.
    pub fn nccl_version(&self) -> Option<String> {
        self.nccl_if_started().map(|n| n.nccl_version())
    }

    /// The CUDA device and one-shot all-reduce state, once the CUDA engine
    /// has started.
    pub fn one_shot_state(&self) -> Option<nccl::OneShotState> {
        self.nccl_if_started().map(|n| n.one_shot_state())
    }

    fn submit_cuda(
        &self,
        ops: Vec<Op<Tensor>>,
        device: i32,
        stream: u64,
        sync: bool,
        timeout: Duration,
        callback: Option<Callback>,
    ) -> Result<Work> {
        let name = ops[0].kind().name();
        let engine = self.nccl(name)?;
        if ops.iter().any(nccl::plan::needs_host) {
            return self.cuda_via_host(ops, device, stream, timeout, callback);
        }
        let mut callback = callback;
        engine.submit(ops, device, nccl::Caller { stream, sync }, timeout, self, |w| {
            if let Some(cb) = callback.take() {
                w.on_complete(cb);
            }
        })
    }

    /// Reductions NCCL cannot do (bitwise ops, int16, bool XOR) run on the
    /// CPU engine over copies in CPU memory: slower, but every op works.
    fn cuda_via_host(&self, ops: Vec<Op<Tensor>>, device: i32, stream: u64, timeout: Duration, callback: Option<Callback>) -> Result<Work> {
        let name = ops[0].kind().name();
        let (cpu_ops, staged) = nccl::staging::to_cpu(ops, device, stream)?;
        let bytes = staged.bytes();
        self.cpu.submit_blocking(cpu_ops, bytes, timeout)?.wait(None)?;
        staged.copy_back()?;
        let w = Work::done(name, self.cpu.seq(), Ok(()));
        if let Some(cb) = callback {
            w.on_complete(cb);
        }
        Ok(w)
    }
}
