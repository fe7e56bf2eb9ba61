//! Shared-memory links between ranks of one host.
//!
//! Every local rank creates one segment (`segment.rs`) in /dev/shm, named
//! from the group's random token (unguessable, mode 0600, created
//! exclusively), and maps every local peer's. As soon as every local rank
//! has mapped every segment the names are unlinked: nothing is left in
//! /dev/shm afterwards, not even when a rank is killed.
//!
//! A [`ShmLink`] is a pair of single-producer single-consumer byte rings
//! (ours towards the peer in our segment, the peer's towards us in its),
//! carrying the same framed messages as TCP. Each pair of ranks has two:
//! one for the collectives (the worker thread's `Mesh`) and one for
//! point-to-point messages (the p2p engine's thread), each with its own
//! futex word ([`Channel`]). Waiting yields briefly and then
//! sleeps on a futex word in the waiter's own segment, which producers,
//! consumers and phase changes bump. The TCP connection to the peer stays
//! open, unused, so that a dead peer is noticed (EOF) without waiting for
//! the timeout. `window.rs` gives the shared-memory algorithms of
//! `collectives` safe access to every local rank's shared areas.
#![allow(unsafe_code)]

pub mod arena;
mod attach;
mod blocked;
mod place;
pub mod remote;
mod ring;
pub mod segment;
mod stage;
mod team;
mod wait_window;
pub mod window;
pub mod workers;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use attach::{split_at, split_point, Attach, BlockOp};
pub use blocked::{Blocked, BLOCKED_RANKS};
pub use ring::{RingRx, RingTx, ShmLink};
pub use segment::{Channel, Layout, Segment};
pub use stage::StillComing;
pub use wait_window::{Contention, WaitWindow};
pub use window::{Area, AttachError, Desc, PhaseWait, Window};
pub use workers::Workers;

pub use place::moves as thread_moves;

use crate::bootstrap::Conn;
use crate::config::log_at;
use crate::config::{LogLevel, ShmConfig};
use crate::tuning::shm::{choose, ONE_ROUND_BLOCK_MAX, SPIN};
use crate::tuning::HostFacts;
use crate::types::Rank;

/// The ranks of this host and every one's segment.
pub struct ShmLocal {
    /// Global ranks of the local group, ascending.
    pub ranks: Vec<Rank>,
    /// This rank's index in `ranks`.
    pub me: usize,
    /// Segments by local index (ours included; a peer that could not be
    /// mapped has ours in its place and `complete` is false).
    pub segs: Vec<Arc<Segment>>,
    /// Every local peer is reachable through shared memory.
    pub complete: bool,
    /// Threads that share this rank's copies and reductions in the direct
    /// algorithms (one on small machines).
    pub workers: Workers,
    /// The same threads with half the smallest piece, for the copies of
    /// the reducing slot algorithms (pipelined all_reduce and reduce,
    /// reduce_scatter's slot path; measured with these pieces).
    pub reduce_workers: Workers,
    /// The same threads for the reductions of those algorithms: a piece
    /// of a reduction reads every local rank's copy, so `min_piece / n`
    /// of it moves about as much memory as a copied piece, which is what
    /// waking a thread is worth (a copied 128 KiB piece takes about what
    /// the wake-up costs); only phases `n` times smaller than a copy's
    /// run on the quick team (`Workers::reducing`).
    pub sum_workers: Workers,
    /// The same threads for all_to_all's block copies, whose quick team
    /// takes larger phases (`tuning::shm::QUICK_ALL_TO_ALL_BYTES_PER_THREAD`).
    pub all_to_all_workers: Workers,
    /// More threads for a root's phases in which the other ranks only
    /// wait (gather's and reduce's reads of every block, scatter's copies
    /// into the root's slots; `Window::solo_workers`): their cores are free,
    /// and one rank's threads alone read far more slowly than the host's
    /// memory allows. A pool of their own, made at the first such phase
    /// ([`ShmLocal::root_workers`]): with one pool of that size for
    /// everything, idle threads of the larger pool woke up in the other
    /// phases and took cores.
    pub root_threads: usize,
    root_pool: OnceLock<Option<Workers>>,
    /// Largest all-reduce done in one round (the setting, or from the host).
    pub one_round_max: usize,
    /// Largest gather or scatter block taken in one step
    /// (`tuning::shm::ONE_ROUND_BLOCK_MAX`).
    pub one_round_block_max: usize,
    /// Cross-memory attach between every pair of local ranks, when all
    /// of them could use it.
    pub attach: Option<Attach>,
    /// Sends of at most this many bytes are not staged (`stage.rs`).
    pub stage_min: usize,
    /// Whether sends of tensors in our shared arena are staged too (else
    /// the receiver copies them out of the tensor).
    pub stage_shared: bool,
    /// Polling threads move off a CPU another local rank's polls on
    /// (`place.rs`, `RUSTCCL_SHM_KEEP_APART`).
    pub keep_apart: bool,
    /// This rank, as a gather's or reduce's root, lets senders push (`RUSTCCL_SHM_GATHER_PUSH`).
    pub gather_push: bool,
    /// Sends this rank receives by rendezvous from this many bytes on are
    /// split: it asks the sender to write the second half into its buffer
    /// while it reads the first (`comm::p2p::rendezvous`); `usize::MAX`:
    /// never.
    pub split_send_min: usize,
    /// As a scatter's root, this rank splits the blocks its receivers
    /// would read of at most this many bytes (`reads::scatter_split_max`).
    pub scatter_split_max: usize,
    /// Of a block it splits, a scatter root writes the last 1 / this
    /// (`reads::scatter_root_share`).
    pub scatter_root_share: usize,
    /// Of each block pushed into it, a gather root reads the last 1 / this
    /// itself (1: none; `reads::gather_root_share`).
    pub gather_root_share: usize,
    /// How long a thread waits for a peer's chunk (`ShmConfig::block_wait_us`).
    pub block_wait: Duration,
    /// How long the waiting thread polls before it sleeps, to start with
    /// (the transport keeps its own copy, which adapts).
    pub wait_window: WaitWindow,
    /// Whether this rank's pauses find its core taken by other work
    /// (then waits sleep at once).
    pub contention: Arc<Contention>,
}

impl ShmLocal {
    /// The root's solo-phase threads (see `root_threads`); this rank's
    /// own workers when there are no more of them, or the pool cannot be
    /// made.
    pub fn root_workers(&self) -> &Workers {
        let pool = self.root_pool.get_or_init(|| {
            let rank = self.ranks[self.me];
            (self.root_threads > self.workers.threads())
                .then(|| {
                    Workers::new(self.root_threads, &format!("rustccl-shm-r{rank}-root"), self.workers.min_piece(), self.workers.spin())
                        .map(|w| w.alone_when_taken(self.contention.clone()))
                })?
                .map_err(|e| log_at!(LogLevel::Info, "rank {rank}: no root threads ({e}); the rank's own do the work"))
                .ok()
        });
        pool.as_ref().unwrap_or(&self.workers)
    }

    pub fn mine(&self) -> &Segment {
        &self.segs[self.me]
    }

    /// The first moments of a wait that began at `t0`: spins on the core
    /// until `done()` or [`wait_window::SPIN`] has passed, unless the cores
    /// are taken (then the wait goes on to its pauses or sleep at once).
    pub fn spin(&self, t0: Instant, done: impl Fn() -> bool) {
        let max = self.spin_for();
        while !done() && t0.elapsed() < max {
            std::hint::spin_loop();
        }
    }

    /// How long a wait may spin on its core before its first pause
    /// ([`ShmLocal::spin`]; a point-to-point waiter runs its passes
    /// meanwhile): [`wait_window::SPIN`], none while the cores are taken.
    pub fn spin_for(&self) -> Duration {
        if self.contention.cores_taken() {
            Duration::ZERO
        } else {
            wait_window::SPIN
        }
    }

    /// Between two looks of a thread polling for a local peer: yields the
    /// CPU, and first moves to another if a local rank's polling thread
    /// shares it (`place.rs`).
    pub fn pause(&self) {
        if self.keep_apart {
            place::look(&self.segs, self.me);
        }
        let t = Instant::now();
        std::thread::yield_now();
        self.contention.paused(t);
    }

    /// True while a pause found the core taken by other work recently: a
    /// waiting thread should sleep at once (`wait_window::Contention`).
    pub fn cores_taken(&self) -> bool {
        let taken = self.contention.cores_taken();
        if taken && self.keep_apart {
            // Two local pollers put on one CPU find it taken by each other:
            // the look that moves one of them off still runs.
            place::look(&self.segs, self.me);
        }
        taken
    }

    pub fn local_index(&self, rank: Rank) -> Option<usize> {
        self.ranks.iter().position(|&r| r == rank)
    }
}

/// What [`connect`] sets up: the local group, and per local peer both
/// sides could map one collective link (watching the peer through its
/// collective connection) and one point-to-point link (whose owner watches
/// the peer through its own connection).
pub struct ShmSetup {
    pub local: Arc<ShmLocal>,
    pub links: Vec<(Rank, ShmLink)>,
    pub p2p: Vec<(Rank, ShmLink)>,
}

/// Why a rank has no shared memory with its local peers.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// It could not make its segment and said so in every exchange: its
    /// connections are in step and no peer has a link to it, so the group
    /// goes on over TCP (or fails, with `RUSTCCL_TRANSPORT=shm`).
    #[error("{0}")]
    Unavailable(io::Error),
    /// Setup broke off part-way (a connection failed, the deadline passed,
    /// a thread would not start): peers may still wait for its bytes on
    /// the connections the group would use, or hold links to it, so the
    /// group cannot be built.
    #[error("{0}")]
    Broken(#[from] io::Error),
}

/// Sends `out` to every other local rank and returns what each sent back
/// (by local index; ours stays 0), in the same order on every rank.
fn exchange_with_all(ranks: &[Rank], my_idx: usize, conns: &mut [Option<Conn>], out: u8, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut got = vec![0u8; ranks.len()];
    for (i, &r) in ranks.iter().enumerate().filter(|(i, _)| *i != my_idx) {
        let s = &mut conns[r].as_mut().expect("local peer has a connection").stream;
        got[i] = exchange_byte(s, out, deadline)?;
    }
    Ok(got)
}

fn exchange_byte(s: &mut TcpStream, out: u8, deadline: Instant) -> io::Result<u8> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))?;
    s.write_all(&[out])?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    s.set_read_timeout(None)?;
    Ok(b[0])
}

/// Every local rank that wants it (`try_it`: attach is on here and every
/// peer's segment is mapped) reads every peer's canary through the pid
/// and address the peer published; then each tells every peer whether all
/// its reads worked, so all ranks take the same decision. Every rank takes
/// part in that exchange, whatever its settings, so ranks that differ fall
/// back together instead of waiting for each other. The pids, when all
/// could read all.
fn agree_attach(
    me: Rank,
    ranks: &[Rank],
    my_idx: usize,
    segs: &[Arc<Segment>],
    try_it: bool,
    conns: &mut [Option<Conn>],
    deadline: Instant,
) -> io::Result<Option<Vec<i32>>> {
    let pids: Vec<i32> = segs.iter().map(|s| s.attach_info().0.load(Ordering::Relaxed) as i32).collect();
    let mut ok = try_it;
    for (i, s) in segs.iter().enumerate().filter(|(i, _)| try_it && *i != my_idx) {
        let (_, addr, value) = s.attach_info();
        let (value, addr) = (value.load(Ordering::Acquire), addr.load(Ordering::Relaxed));
        if value == 0 || !remote::probe(pids[i], addr, value) {
            log_at!(
                LogLevel::Info,
                "rank {me}: cannot read rank {}'s memory (cross-memory attach); copying through shared memory",
                ranks[i]
            );
            ok = false;
        }
    }
    let theirs = exchange_with_all(ranks, my_idx, conns, ok as u8, deadline)?;
    let all_ok = ok && theirs.iter().enumerate().all(|(i, &b)| i == my_idx || b == 1);
    Ok(all_ok.then_some(pids))
}

/// Sets up shared memory with the local peers in `ranks` (global ranks of
/// this host, including `me`), over their TCP connections `conns[rank]`.
/// Returns the local group and one link per peer that both sides could
/// map; peers missing from the result keep using TCP.
pub fn connect(
    me: Rank,
    ranks: &[Rank],
    token: &str,
    sizes: ShmConfig,
    conns: &mut [Option<Conn>],
    deadline: Instant,
) -> Result<ShmSetup, SetupError> {
    let n = ranks.len();
    let my_idx = ranks.iter().position(|&r| r == me).expect("me is local");
    let host = HostFacts::detect();
    let c = choose(me, &sizes, host, n, arena::Arena::get().is_some(), &remote::read_and_copy_speed_once);
    let (threads, reads) = (c.threads, &c.reads);
    // Off (the setting) means no reads at all, not even probed.
    let attach_off = sizes.attach_off();
    let layout = Layout::new(n, sizes.ring_bytes, c.small_bytes, c.slot_bytes);
    let stage = c.stage_bytes;
    let path = |r: Rank| PathBuf::from(format!("/dev/shm/rustccl-{token}-{r}"));
    // 0. every local rank reserves its segment, then says so: the staging
    // area is an extra (without it sends are read directly), reserved only
    // once every local rank's segment has its room, so that staging areas
    // compete only with each other, never with a peer's segment.
    let mut mine = Segment::create(&path(me), layout);
    exchange_with_all(ranks, my_idx, conns, mine.is_ok() as u8, deadline)?;
    if let (Ok(m), true) = (&mut mine, stage > 0) {
        if let Err(e) = m.add_stage(stage) {
            log_at!(LogLevel::Warn, "rank {me}: no room for a {stage}-byte staging area in /dev/shm ({e}); point-to-point sends are read from the sender's tensor");
        }
    }
    if let Ok(m) = &mine {
        log_at!(LogLevel::Info, "rank {me}: shared-memory segment of {} bytes ({}-byte staging area)", m.layout.total, m.layout.stage);
    }
    let created = mine.is_ok() as u8;
    let why_not = mine.as_ref().err().map(|e| e.to_string());
    let canary = Box::new(u64::from(std::process::id()) << 32 ^ getrandom::u64().unwrap_or(0x9e37_79b9_7f4a_7c15) >> 32 | 1);
    if let (Ok(m), false) = (&mine, attach_off) {
        remote::allow_attach();
        let (pid, addr, value) = m.attach_info();
        pid.store(std::process::id() as u64, Ordering::Relaxed);
        addr.store(&*canary as *const u64 as u64, Ordering::Relaxed);
        m.attach_min().store(reads.attach as u64, Ordering::Relaxed);
        m.single_min().store(reads.single as u64, Ordering::Relaxed);
        m.broadcast_min().store(reads.broadcast as u64, Ordering::Relaxed);
        m.block_min().store(reads.block as u64, Ordering::Relaxed);
        m.all_reduce_min().store(reads.all_reduce as u64, Ordering::Relaxed);
        m.reduce_scatter_min().store(reads.reduce_scatter as u64, Ordering::Relaxed);
        m.reduce_min().store(reads.reduce as u64, Ordering::Relaxed);
        m.all_gather_min().store(reads.all_gather as u64, Ordering::Relaxed);
        if let Some(a) = arena::Arena::get() {
            let info = a.info();
            let [base, len, fd, canary] = m.arena_info();
            len.store(info.len, Ordering::Relaxed);
            fd.store(info.fd, Ordering::Relaxed);
            canary.store(info.canary, Ordering::Relaxed);
            base.store(info.base, Ordering::Release);
        }
        value.store(*canary, Ordering::Release);
    }
    // 1. everyone says whether its segment exists
    let peer_created = exchange_with_all(ranks, my_idx, conns, created, deadline)?;
    // 2. map every peer's; say which ones worked
    let mut segs: Vec<Option<Arc<Segment>>> = vec![None; n];
    if let Ok(m) = mine {
        segs[my_idx] = Some(Arc::new(m));
    }
    let mut agreed = vec![false; n];
    for (i, &r) in ranks.iter().enumerate().filter(|(i, _)| *i != my_idx) {
        let ok = segs[my_idx].is_some() && peer_created[i] == 1 && {
            match Segment::open(&path(r), layout) {
                Ok(s) => {
                    segs[i] = Some(Arc::new(s));
                    true
                }
                Err(e) => {
                    // (a header that does not match is a setting that differs between ranks)
                    let level = if e.kind() == io::ErrorKind::InvalidData { LogLevel::Warn } else { LogLevel::Info };
                    log_at!(level, "rank {me}: cannot map rank {r}'s shared memory ({e}); using TCP");
                    false
                }
            }
        };
        let s = &mut conns[r].as_mut().expect("local peer has a connection").stream;
        agreed[i] = exchange_byte(s, ok as u8, deadline)? == 1 && ok;
    }
    // 3. every local rank has mapped what it could: drop the names
    if let Some(m) = &segs[my_idx] {
        m.unlink();
    }
    let Some(mine) = segs[my_idx].clone() else {
        // The peers that made theirs still vote on attach (`agree_attach`)
        // with every local rank: vote no, so the connections stay in step.
        exchange_with_all(ranks, my_idx, conns, 0, deadline)?;
        let why = why_not.unwrap_or_default();
        return Err(SetupError::Unavailable(io::Error::other(format!("could not create this rank's shared-memory segment: {why}"))));
    };
    let complete = agreed.iter().enumerate().all(|(i, &a)| a || i == my_idx);
    let all: Vec<Arc<Segment>> = segs.iter().map(|s| s.clone().unwrap_or_else(|| mine.clone())).collect();
    let try_it = complete && !attach_off;
    let attach = agree_attach(me, ranks, my_idx, &all, try_it, conns, deadline)?.map(|pids| Attach::agreed(pids, &all, canary, my_idx));
    match &attach {
        Some(a) => {
            let from = if a.min_bytes == usize::MAX { "never".to_string() } else { format!("from {} bytes", a.min_bytes) };
            log_at!(LogLevel::Info, "rank {me}: single-copy reads from peers' tensors: collectives {from}, single readers over {} bytes, collective blocks over {}", a.single_min, a.block_min)
        }
        None => log_at!(LogLevel::Info, "rank {me}: no single-copy reads from peers' tensors"),
    }
    let name = format!("rustccl-shm-r{me}");
    let contention = Arc::new(Contention::default());
    let mut workers = Workers::new(threads, &name, c.min_piece, c.spin)?.alone_when_taken(contention.clone());
    if let Err(e) = workers.add_quick(c.quick_threads, &name, SPIN, c.quick_bytes, c.quick_min_piece, c.quick_leads) {
        log_at!(LogLevel::Info, "rank {me}: no quick team ({e}); the rank's own threads take every phase");
    }
    let reduce_workers = workers.with_min_piece(c.min_piece / 2);
    let sum_workers = workers.reducing(n);
    let all_to_all_workers = workers.with_quick_bytes(c.quick_all_to_all_bytes);
    let local = Arc::new(ShmLocal {
        ranks: ranks.to_vec(),
        me: my_idx,
        segs: all,
        complete,
        workers,
        reduce_workers,
        sum_workers,
        all_to_all_workers,
        root_threads: c.root_threads,
        root_pool: OnceLock::new(),
        one_round_max: c.one_round_max,
        one_round_block_max: ONE_ROUND_BLOCK_MAX,
        attach,
        stage_min: sizes.staged_min,
        stage_shared: sizes.stage_shared,
        keep_apart: sizes.keep_apart,
        gather_push: sizes.gather_push,
        split_send_min: reads.split_send,
        scatter_split_max: c.scatter_split_max,
        scatter_root_share: c.scatter_root_share,
        gather_root_share: c.gather_root_share,
        block_wait: Duration::from_micros(sizes.block_wait_us as u64),
        wait_window: WaitWindow::new(c.wait_spin, n, threads, host.cores),
        contention,
    });
    let (mut links, mut p2p) = (Vec::new(), Vec::new());
    for (i, &r) in ranks.iter().enumerate() {
        if i != my_idx && agreed[i] {
            let s = &conns[r].as_ref().expect("local peer has a connection").stream;
            links.push((r, ShmLink::new(&local, i, Channel::Coll, Some(s.try_clone()?))?));
            p2p.push((r, ShmLink::new(&local, i, Channel::P2p, None)?));
        }
    }
    Ok(ShmSetup { local, links, p2p })
}
