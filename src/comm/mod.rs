//! The [`Communicator`]: one process group's view of its peers. It checks
//! requests, routes collectives to the host engine (CPU tensors) and sends /
//! receives to the point-to-point engine, and hands back a [`Work`].
#![forbid(unsafe_code)]

pub mod host;
pub mod p2p;

use std::time::Duration;

use crate::bootstrap::{self, BootstrapOpts, PeerInfo, Store, CHANNEL_COLLECTIVE, CHANNEL_P2P};
use crate::collectives::{into_host, Op, OpSpec};
use crate::config::{AlgoConfig, Config, LogLevel};
use crate::error::{Error, Result};
use crate::log_at;
use crate::transport::tcp::TcpTransport;
use crate::transport::Transport;
use crate::types::{Device, Rank};
use crate::work::{self, Callback, Work};

pub use host::{Done, Observer};

#[derive(Debug, Clone)]
pub struct CommOptions {
    /// Group name (torch's group name), for logs and errors.
    pub group: String,
    /// Default bound on every operation.
    pub timeout: Duration,
    pub algo: AlgoConfig,
}

impl CommOptions {
    pub fn new(group: impl Into<String>, timeout: Duration) -> CommOptions {
        CommOptions { group: group.into(), timeout, algo: Config::get().algo }
    }
}

pub struct Communicator {
    rank: Rank,
    size: usize,
    opts: CommOptions,
    peers: Vec<PeerInfo>,
    transport_kind: &'static str,
    host: host::HostEngine,
    p2p: Option<p2p::P2pEngine>,
}

impl Communicator {
    /// Rendezvous through `store`, connect to every peer, start the engines.
    pub fn bootstrap(
        store: &dyn Store,
        rank: Rank,
        size: usize,
        opts: CommOptions,
        listen_ip: std::net::IpAddr,
        observer: Option<Observer>,
    ) -> Result<Communicator> {
        let bopts = BootstrapOpts { group: opts.group.clone(), timeout: opts.timeout, listen_ip };
        let mut ep = bootstrap::rendezvous(store, rank, size, &bopts)?;
        let coll = ep.take_channel(CHANNEL_COLLECTIVE);
        let p2p_conns = ep.take_channel(CHANNEL_P2P);
        let transport = TcpTransport::new(rank, size, coll)
            .map_err(|e| Error::Bootstrap { rank, detail: format!("setting up links: {e}") })?;
        log_at!(
            LogLevel::Info,
            "group '{}' rank {rank}/{size}: connected over tcp; all_reduce <= {} B recursive doubling, ring above; segments {} B",
            opts.group,
            opts.algo.small_allreduce_bytes,
            opts.algo.segment_bytes
        );
        let host = host::HostEngine::start(Box::new(transport), opts.group.clone(), opts.algo, observer)?;
        let p2p = p2p::P2pEngine::new(rank, size, opts.group.clone(), p2p_conns);
        Ok(Communicator { rank, size, opts, peers: ep.peers, transport_kind: "tcp", host, p2p: Some(p2p) })
    }

    /// A communicator over a ready transport (tests); no point-to-point.
    pub fn with_transport(transport: Box<dyn Transport>, opts: CommOptions) -> Result<Communicator> {
        let (rank, size, kind) = (transport.rank(), transport.size(), transport.kind());
        let host = host::HostEngine::start(transport, opts.group.clone(), opts.algo, None)?;
        Ok(Communicator { rank, size, opts, peers: Vec::new(), transport_kind: kind, host, p2p: None })
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
    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }
    pub fn transport_kind(&self) -> &'static str {
        self.transport_kind
    }
    /// Collectives submitted so far (the next sequence number).
    pub fn seq(&self) -> u64 {
        self.host.seq()
    }

    /// Checks and submits one operation, or several as one unit of work
    /// (coalesced collectives, or a batch of sends and receives). `timeout`
    /// overrides the group's; `callback` runs once when the work finishes.
    /// An `Err` means nothing was submitted and the group is unaffected.
    pub fn submit(&self, specs: Vec<OpSpec>, timeout: Option<Duration>, callback: Option<Callback>) -> Result<Work> {
        let timeout = timeout.unwrap_or(self.opts.timeout);
        let first = specs.first().map(|s| s.kind).ok_or_else(|| Error::Internal("empty submission".into()))?;
        let name = first.name();
        let mut ops = Vec::with_capacity(specs.len());
        for spec in specs {
            ops.push(Op::from_spec(spec, self.rank, self.size)?);
        }
        let p2p = ops.iter().filter(|o| o.kind().is_p2p()).count();
        if p2p != 0 && p2p != ops.len() {
            return Err(Error::invalid(name, "a batch cannot mix point-to-point operations and collectives"));
        }
        for op in &ops {
            match op.device() {
                Device::Cpu => {}
                Device::Cuda(i) => {
                    return Err(Error::unsupported(
                        op.kind().name(),
                        format!("CUDA tensors (cuda:{i}) are not supported by this build of rustccl"),
                    ))
                }
                d => return Err(Error::unsupported(op.kind().name(), format!("tensors on device {d} are not supported"))),
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
            let mut works = Vec::with_capacity(ops.len());
            let single = ops.len() == 1;
            for op in ops {
                let host = into_host(op)?;
                if single {
                    return engine.submit(host, timeout, &mut attach);
                }
                works.push(engine.submit(host, timeout, |_| {})?);
            }
            let joined = work::join("batch_p2p", 0, works);
            attach(&joined);
            return Ok(joined);
        }
        let bytes = ops.iter().map(|o| o.bytes()).sum();
        let host_ops = ops.into_iter().map(into_host).collect::<Result<Vec<_>>>()?;
        self.host.submit(host_ops, bytes, timeout, attach)
    }

    /// Stops both engines. `abort` interrupts a running collective; without
    /// it, queued collectives finish first (bounded by the group timeout).
    pub fn shutdown(&self, abort: bool) {
        let grace = if abort { Duration::from_secs(5) } else { self.opts.timeout.min(Duration::from_secs(60)) };
        self.host.shutdown(abort, grace);
        if let Some(p) = &self.p2p {
            p.shutdown();
        }
    }
}
