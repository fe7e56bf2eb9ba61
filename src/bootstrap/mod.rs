//! Rendezvous: addresses in through a [`Store`], connected links out.
//!
//! 1. Each rank takes a generation number (a per-rank counter in the store),
//!    so re-creating a group under the same store prefix never reads stale
//!    keys of an earlier one.
//! 2. Rank 0 draws a random 128-bit secret and publishes it; every
//!    connection must present it (strangers on the port are dropped).
//! 3. Each rank listens on one local address (never the wildcard), publishes
//!    `addr|host identity|pid`, and reads everyone else's.
//! 4. Rank r connects to every lower rank (two connections: collectives and
//!    point-to-point) and accepts from every higher one, concurrently.
//! 5. With TLS (`RUSTCCL_TLS`), every connection whose bytes will travel
//!    over TCP (to another host, or any with `RUSTCCL_TRANSPORT=tcp`) runs
//!    a TLS handshake; ranks that disagree on TLS fail here, on every rank.
#![forbid(unsafe_code)]

pub mod addr;
mod handshake;
pub mod store;

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use store::{MemStore, Store};

use crate::config::log_at;
use crate::config::LogLevel;
use crate::config::TransportMode;
use crate::error::{Error, Result};
use crate::tls::Tls;
use crate::types::Rank;

/// Connections are of two kinds, kept apart so that point-to-point traffic
/// never interleaves with a collective's byte stream.
pub const CHANNELS: usize = 2;
pub const CHANNEL_COLLECTIVE: u8 = 0;
pub const CHANNEL_P2P: u8 = 1;

#[derive(Debug, Clone)]
pub struct BootstrapOpts {
    /// Group name, for logs and errors.
    pub group: String,
    pub timeout: Duration,
    pub listen_ip: IpAddr,
    /// This rank's host identity (ranks with equal ones may share memory).
    pub host: String,
    /// Settings every rank of the group should share, opaque here (no
    /// `|`): published with the rank's address, so that each rank can
    /// compare its peers' with its own.
    pub settings: String,
    /// TLS on the connections whose bytes travel over TCP (None: plain).
    pub tls: Option<Arc<Tls>>,
    /// Whether ranks of one host link over TCP (then TLS covers them too).
    pub transport: TransportMode,
}

/// What a rank adds to its published settings when it uses TLS: ranks
/// compare it before any connection, so a plain rank among TLS ranks fails
/// every rank at once instead of a handshake that waits for it.
const TLS_MARK: &str = "RUSTCCL_TLS=1";

impl BootstrapOpts {
    /// The settings line this rank publishes.
    fn published(&self) -> String {
        match (&self.tls, self.settings.is_empty()) {
            (None, _) => self.settings.clone(),
            (Some(_), true) => TLS_MARK.to_string(),
            (Some(_), false) => format!("{},{TLS_MARK}", self.settings),
        }
    }
}

fn uses_tls(settings: &str) -> bool {
    settings.split(',').any(|s| s == TLS_MARK)
}

#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub rank: Rank,
    pub addr: SocketAddr,
    pub host: String,
    pub pid: u32,
    /// The rank's [`BootstrapOpts::settings`] (empty where a group is made
    /// from another, whose settings it keeps).
    pub settings: String,
}

impl PeerInfo {
    /// `addr|pid|settings|host` (the host last: it may hold `|`).
    pub fn encode(&self) -> Vec<u8> {
        format!("{}|{}|{}|{}", self.addr, self.pid, self.settings, self.host).into_bytes()
    }

    pub fn decode(rank: Rank, b: &[u8]) -> std::result::Result<PeerInfo, String> {
        let s = String::from_utf8_lossy(b);
        let mut it = s.splitn(4, '|');
        let bad = || format!("malformed peer record for rank {rank}: {s:?}");
        let addr = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let pid = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let settings = it.next().ok_or_else(bad)?.to_string();
        let host = it.next().ok_or_else(bad)?.to_string();
        Ok(PeerInfo { rank, addr, host, pid, settings })
    }
}

/// A connected stream to a peer, the peer's address (for messages), and
/// the TLS session the link's bytes go through (None: plain).
pub struct Conn {
    pub stream: TcpStream,
    pub addr: String,
    pub tls: Option<rustls::Connection>,
}

pub struct Endpoints {
    pub rank: Rank,
    pub size: usize,
    pub peers: Vec<PeerInfo>,
    /// `conns[channel][peer]`; `None` at our own rank.
    pub conns: [Vec<Option<Conn>>; CHANNELS],
    pub generation: i64,
    /// Random per-group token (hex) naming the group's shared memory.
    pub token: String,
}

impl Endpoints {
    pub fn take_channel(&mut self, channel: u8) -> Vec<Option<Conn>> {
        std::mem::take(&mut self.conns[channel as usize])
    }
}

fn berr(rank: Rank, detail: impl Into<String>) -> Error {
    Error::Bootstrap { rank, detail: detail.into() }
}

fn random_secret() -> std::result::Result<[u8; 32], String> {
    let mut s = [0u8; 32];
    getrandom::fill(&mut s).map_err(|e| format!("no randomness for the rendezvous secret: {e}"))?;
    Ok(s)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &[u8]) -> Option<[u8; 32]> {
    let s = std::str::from_utf8(s).ok()?;
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A rank's listening socket and the record it publishes about itself.
pub struct Listening {
    listener: TcpListener,
    pub me: PeerInfo,
}

/// Step 3's first half: listen on one local address.
pub fn listen(rank: Rank, opts: &BootstrapOpts) -> Result<Listening> {
    let listener = TcpListener::bind((opts.listen_ip, 0)).map_err(|e| berr(rank, format!("cannot listen on {}: {e}", opts.listen_ip)))?;
    let local = listener.local_addr().map_err(|e| berr(rank, e.to_string()))?;
    let me = PeerInfo { rank, addr: local, host: opts.host.clone(), pid: std::process::id(), settings: opts.published().replace('|', "/") };
    Ok(Listening { listener, me })
}

/// A fresh random secret for a new group (its rank 0 draws it).
pub fn new_secret(rank: Rank) -> Result<[u8; 32]> {
    random_secret().map_err(|e| berr(rank, e))
}

/// Runs the rendezvous for `rank` of `size` (see the module docs).
pub fn rendezvous(store: &dyn Store, rank: Rank, size: usize, opts: &BootstrapOpts) -> Result<Endpoints> {
    if size == 0 || rank >= size {
        return Err(berr(rank, format!("rank {rank} is not in a group of size {size}")));
    }
    let generation = store.add(&format!("rustccl/gen/{rank}"), 1).map_err(|e| berr(rank, e))?;
    let prefix = format!("rustccl/{generation}");
    let l = listen(rank, opts)?;

    let secret = if rank == 0 {
        let s = new_secret(rank)?;
        store.set(&format!("{prefix}/secret"), hex(&s).as_bytes()).map_err(|e| berr(rank, e))?;
        s
    } else {
        let v = store.get(&format!("{prefix}/secret"), opts.timeout).map_err(|e| berr(rank, e))?;
        unhex(&v).ok_or_else(|| berr(rank, "malformed rendezvous secret in the store"))?
    };

    store.set(&format!("{prefix}/peer/{rank}"), &l.me.encode()).map_err(|e| berr(rank, e))?;
    let mut peers = Vec::with_capacity(size);
    for p in 0..size {
        let v = store.get(&format!("{prefix}/peer/{p}"), opts.timeout).map_err(|e| berr(rank, e))?;
        peers.push(PeerInfo::decode(p, &v).map_err(|e| berr(rank, e))?);
    }
    if let Some(p) = peers.iter().find(|p| uses_tls(&p.settings) != opts.tls.is_some()) {
        let (here, there) = if opts.tls.is_some() { ("uses", "does not") } else { ("does not use", "does") };
        let why = format!("this rank {here} TLS and rank {} ({}) {there}: set RUSTCCL_TLS the same on every rank", p.rank, p.addr);
        fail_together(store, &prefix, size, opts.timeout);
        return Err(berr(rank, why));
    }
    connect(l, peers, &secret, generation, opts)
}

/// Waits, for a bounded time, until every rank has read the records and
/// seen the same mistake, before this rank raises: the store may live in
/// the process of a rank that exits on its error, and a rank still reading
/// would then get a lost connection instead of the cause.
fn fail_together(store: &dyn Store, prefix: &str, size: usize, timeout: Duration) {
    let done = format!("{prefix}/failed/all");
    match store.add(&format!("{prefix}/failed"), 1) {
        Ok(n) if n as usize >= size => {
            let _ = store.set(&done, b"1");
        }
        Ok(_) => {
            let _ = store.get(&done, timeout.min(Duration::from_secs(10)));
        }
        Err(_) => {}
    }
}

/// Step 4, once every rank knows every record and the group's secret:
/// connects to the lower ranks and accepts the higher ones. `peers` are
/// indexed by rank; this rank is `l.me.rank`.
pub fn connect(l: Listening, peers: Vec<PeerInfo>, secret: &[u8; 32], generation: i64, opts: &BootstrapOpts) -> Result<Endpoints> {
    let (rank, size) = (l.me.rank, peers.len());
    let deadline = Instant::now() + opts.timeout;
    log_at!(LogLevel::Info, "group '{}' rank {rank}/{size}: listening on {}, generation {generation}", opts.group, l.me.addr);
    // First half: the handshake secret; second half: the shared-memory token.
    let mut hs_secret = [0u8; 16];
    hs_secret.copy_from_slice(&secret[..16]);
    let token = hex(&secret[16..]);
    let hs = handshake::Handshake { rank, size, secret: hs_secret, deadline };
    let listener = &l.listener;
    let (accepted, connected) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| hs.accept_all(listener, &peers));
        let connected = hs.connect_all(&peers);
        let accepted = acceptor.join().unwrap_or_else(|_| Err("acceptor thread panicked".into()));
        (accepted, connected)
    });
    let mut conns: [Vec<Option<Conn>>; CHANNELS] = std::array::from_fn(|_| (0..size).map(|_| None).collect());
    for (peer, channel, stream) in connected.map_err(|e| berr(rank, e))?.into_iter().chain(accepted.map_err(|e| berr(rank, e))?) {
        conns[channel as usize][peer] = Some(Conn { stream, addr: peers[peer].addr.to_string(), tls: None });
    }
    if let Some(tls) = &opts.tls {
        secure(tls, &mut conns, &peers, rank, opts.transport, deadline)?;
    }
    Ok(Endpoints { rank, size, peers, conns, generation, token })
}

/// Step 5: the TLS handshake on every connection whose bytes travel over
/// TCP. Each rank takes its peers in rank order, so that the pairs
/// (lower, higher) run in the same order everywhere and no two ranks wait
/// for each other's next handshake.
fn secure(
    tls: &Tls,
    conns: &mut [Vec<Option<Conn>>; CHANNELS],
    peers: &[PeerInfo],
    rank: Rank,
    transport: TransportMode,
    deadline: Instant,
) -> Result<()> {
    let me = &peers[rank].host;
    for p in peers.iter().filter(|p| p.rank != rank && (transport == TransportMode::Tcp || &p.host != me)) {
        for channel in conns.iter_mut() {
            let Some(c) = channel[p.rank].as_mut() else { continue };
            let session = tls
                .handshake(&mut c.stream, p.rank < rank, deadline)
                .map_err(|why| berr(rank, format!("TLS with rank {} ({}): {why}", p.rank, p.addr)))?;
            c.tls = Some(session);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::Arc;

    fn opts() -> BootstrapOpts {
        BootstrapOpts {
            group: "t".into(),
            timeout: Duration::from_secs(20),
            listen_ip: "127.0.0.1".parse().unwrap(),
            host: "test".into(),
            settings: String::new(),
            tls: None,
            transport: TransportMode::Auto,
        }
    }

    #[test]
    fn peer_info_round_trip() {
        let p = PeerInfo { rank: 2, addr: "10.1.2.3:4567".parse().unwrap(), host: "h|x".into(), pid: 42, settings: "A=1,B=auto".into() };
        let q = PeerInfo::decode(2, &p.encode()).unwrap();
        assert_eq!((q.addr, q.pid, q.host.as_str(), q.settings.as_str()), (p.addr, 42, "h|x", "A=1,B=auto"));
        let empty = PeerInfo { settings: String::new(), ..p };
        assert_eq!(PeerInfo::decode(2, &empty.encode()).unwrap().settings, "");
        assert!(PeerInfo::decode(0, b"garbage").is_err());
        let mut b = [9u8; 32];
        b[2] = 255;
        assert_eq!(unhex(hex(&b).as_bytes()).unwrap()[2], 255);
    }

    #[test]
    fn full_mesh_connects_and_carries_bytes() {
        for n in 1..=4 {
            let store = Arc::new(MemStore::new());
            let eps: Vec<Endpoints> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..n)
                    .map(|r| {
                        let store = store.clone();
                        s.spawn(move || rendezvous(store.as_ref(), r, n, &opts()).unwrap())
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut eps = eps;
            for (a, ep) in eps.iter().enumerate() {
                for b in 0..n {
                    for c in 0..CHANNELS {
                        assert_eq!(ep.conns[c][b].is_some(), a != b, "n={n} {a}->{b} ch{c}");
                    }
                }
            }
            // Bytes written on a's stream to b arrive on b's stream from a.
            if n >= 2 {
                let s01 = eps[0].conns[0][1].take().unwrap().stream;
                let s10 = eps[1].conns[0][0].take().unwrap().stream;
                (&s01).write_all(b"ping").unwrap();
                let mut buf = [0u8; 4];
                (&s10).read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"ping");
            }
        }
    }

    #[test]
    fn strangers_on_the_listening_port_are_refused() {
        use std::io::Write;
        let store = Arc::new(MemStore::new());
        let eps = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let store = store.clone();
                    s.spawn(move || rendezvous(store.as_ref(), r, 3, &opts()).unwrap())
                })
                .collect();
            // Strangers connect to rank 0 before the real peers: one speaks
            // garbage, one guesses the secret, one says nothing and leaves.
            let rec = store.get("rustccl/1/peer/0", Duration::from_secs(10)).unwrap();
            let addr = PeerInfo::decode(0, &rec).unwrap().addr;
            let mut junk = std::net::TcpStream::connect(addr).unwrap();
            junk.write_all(&[0xab; 64]).unwrap();
            let mut guess = std::net::TcpStream::connect(addr).unwrap();
            let mut hello = [0u8; 32];
            hello[0..4].copy_from_slice(b"RCCL");
            hello[4..6].copy_from_slice(&1u16.to_le_bytes());
            hello[8..12].copy_from_slice(&2u32.to_le_bytes());
            guess.write_all(&hello).unwrap();
            drop(std::net::TcpStream::connect(addr).unwrap());
            hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        for (r, ep) in eps.iter().enumerate() {
            for p in (0..3).filter(|&p| p != r) {
                assert!(ep.conns[CHANNEL_COLLECTIVE as usize][p].is_some(), "rank {r} lacks rank {p}");
            }
        }
    }

    /// Each rank's settings reach every peer with its address.
    #[test]
    fn every_rank_reads_every_peers_settings() {
        let store = Arc::new(MemStore::new());
        let eps: Vec<Endpoints> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let store = store.clone();
                    s.spawn(move || rendezvous(store.as_ref(), r, 3, &BootstrapOpts { settings: format!("X={r}"), ..opts() }).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for ep in &eps {
            let got: Vec<&str> = ep.peers.iter().map(|p| p.settings.as_str()).collect();
            assert_eq!(got, ["X=0", "X=1", "X=2"]);
        }
    }

    /// The store of a torchrun-less job lives in rank 0's process, which
    /// exits on its error: a slower rank must still learn the cause, not
    /// a lost store connection.
    #[test]
    fn a_tls_mismatch_reaches_a_slow_rank_although_the_store_leaves_with_rank_0() {
        use std::sync::atomic::{AtomicBool, Ordering};
        struct Hosted<'a> {
            inner: &'a MemStore,
            gone: &'a AtomicBool,
            slow: bool,
        }
        impl Store for Hosted<'_> {
            fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
                if self.gone.load(Ordering::SeqCst) {
                    Err("connection closed".into())
                } else {
                    self.inner.set(key, value)
                }
            }
            fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, String> {
                if self.slow && key.contains("/peer/") {
                    std::thread::sleep(Duration::from_millis(300));
                }
                if self.gone.load(Ordering::SeqCst) {
                    Err("connection closed".into())
                } else {
                    self.inner.get(key, timeout)
                }
            }
            fn add(&self, key: &str, delta: i64) -> Result<i64, String> {
                if self.gone.load(Ordering::SeqCst) {
                    Err("connection closed".into())
                } else {
                    self.inner.add(key, delta)
                }
            }
        }
        let file = std::env::temp_dir().join(format!("rustccl-bootstrap-secret-{}", std::process::id()));
        std::fs::write(&file, b"the job's secret, 32 bytes......").unwrap();
        let tls = Arc::new(Tls::load(crate::tls::TlsMode::Secret { file }, "t").unwrap());
        let (inner, gone) = (MemStore::new(), AtomicBool::new(false));
        let errs: Vec<String> = std::thread::scope(|s| {
            let host = s.spawn(|| {
                let store = Hosted { inner: &inner, gone: &gone, slow: false };
                let res = rendezvous(&store, 0, 2, &BootstrapOpts { tls: Some(tls.clone()), ..opts() });
                gone.store(true, Ordering::SeqCst);
                res.err().map(|e| e.to_string()).unwrap_or_default()
            });
            let slow = s.spawn(|| {
                let store = Hosted { inner: &inner, gone: &gone, slow: true };
                rendezvous(&store, 1, 2, &opts()).err().map(|e| e.to_string()).unwrap_or_default()
            });
            vec![host.join().unwrap(), slow.join().unwrap()]
        });
        for e in &errs {
            assert!(e.contains("set RUSTCCL_TLS the same on every rank"), "{errs:?}");
        }
    }

    #[test]
    fn regroup_under_same_store_uses_fresh_keys() {
        let store = Arc::new(MemStore::new());
        for _ in 0..3 {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|r| {
                        let store = store.clone();
                        s.spawn(move || rendezvous(store.as_ref(), r, 2, &opts()).unwrap().generation)
                    })
                    .collect();
                let g: Vec<i64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
                assert_eq!(g[0], g[1]);
            });
        }
    }
}
