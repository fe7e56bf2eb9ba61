//! Test support: ranks as threads, typed values <-> tensors, and reference
//! reductions computed independently of the engine (in f64 / i64).

use std::sync::Arc;
use std::time::Duration;

use half::{bf16, f16};
use rustccl::bootstrap::MemStore;
use rustccl::collectives::OpSpec;
use rustccl::comm::CommOptions;
use rustccl::config::Setting::{self, Auto, Fixed};
use rustccl::config::{AlgoConfig, OpAttach, ShmConfig, TransportMode, NEVER};
use rustccl::tensor::{SharedBuf, Tensor};
use rustccl::transport::loopback;
use rustccl::{Communicator, DType, OpKind, ReduceOp};

pub const ALL_DTYPES: [DType; 9] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::U8, DType::I8, DType::I32, DType::I64, DType::Bool];

pub const ALL_OPS: [ReduceOp; 8] =
    [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max, ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor];

/// Small algorithm thresholds so that tiny inputs take every path:
/// recursive doubling up to 256 bytes, ring above, 64-byte segments.
pub fn tiny_algo() -> AlgoConfig {
    AlgoConfig { small_allreduce_bytes: 256, small_broadcast_bytes: 256, segment_bytes: 64, ..Default::default() }
}

pub fn opts(timeout: Duration, algo: AlgoConfig) -> CommOptions {
    let mut o = CommOptions::new("test", timeout);
    o.algo = algo;
    o
}

pub fn loopback_comms(n: usize, algo: AlgoConfig) -> Vec<Communicator> {
    loopback::mesh(n).into_iter().map(|t| Communicator::with_transport(Box::new(t), opts(Duration::from_secs(30), algo)).unwrap()).collect()
}

/// Tiny shared-memory areas (test-sized inputs wrap the rings and take many
/// rounds), one thread a rank, idle threads spinning 100 us, no single-copy
/// reads, no staging: the base the tests change a few fields of.
pub const TINY_SHM: ShmConfig = ShmConfig {
    ring_bytes: 4096,
    small_bytes: Fixed(256),
    segment_bytes: 256,
    slot_min: Fixed(0),
    threads: Fixed(1),
    attach_min: Fixed(NEVER),
    op_attach_min: OpAttach::AUTO,
    min_piece: Auto,
    single_min: Auto,
    block_min: Auto,
    root_threads: Auto,
    spin_us: Fixed(100),
    wait_spin_us: Auto,
    broadcast_min: Fixed(NEVER),
    staged_min: 0,
    staged_max: Fixed(0),
    stage_shared: false,
    keep_apart: true,
    gather_push: true,
    quick_threads: Fixed(0),
    quick_bytes: Auto,
    quick_all_to_all_bytes: Auto,
    quick_min_piece: Auto,
    quick_leads: Auto,
    split_send_min: Fixed(NEVER),
    scatter_split_max: Auto,
    scatter_root_share: Auto,
    gather_root_share: Auto,
    block_wait_us: 20_000,
};

/// A setting of `v`, where 0 leaves it to rustccl (as the environment
/// reads 0 for these settings).
pub const fn auto0(v: usize) -> Setting<usize> {
    if v == 0 {
        Auto
    } else {
        Fixed(v)
    }
}

/// Real sockets between ranks (threads of this process), TCP only.
pub fn tcp_comms(n: usize, algo: AlgoConfig, timeout: Duration) -> Vec<Communicator> {
    mesh_comms(
        n,
        algo,
        timeout,
        TransportMode::Tcp,
        ShmConfig { ring_bytes: 1 << 20, small_bytes: Fixed(256 << 10), segment_bytes: 256 << 10, ..TINY_SHM },
    )
}

/// Shared memory between ranks (threads of this process), with tiny areas
/// so that test-sized inputs wrap the rings and take many pipeline rounds;
/// 3 workers a rank and a quick team of 2, which takes the parallel phases
/// of up to 512 KiB in pieces from 64 bytes.
pub fn shm_comms(n: usize, algo: AlgoConfig, timeout: Duration) -> Vec<Communicator> {
    shm_comms_with(n, algo, timeout, |_, _| ())
}

/// [`shm_comms`] with rank r's options changed by `tweak(r, options)`.
pub fn shm_comms_with(n: usize, algo: AlgoConfig, timeout: Duration, tweak: impl Fn(usize, &mut CommOptions) + Sync) -> Vec<Communicator> {
    let shm =
        ShmConfig { threads: auto0(3), root_threads: auto0(4), quick_threads: Setting::Fixed(2), quick_min_piece: auto0(64), ..TINY_SHM };
    hosts_comms_with(&vec![0; n], algo, timeout, TransportMode::Shm, shm, tweak)
}

pub fn mesh_comms(n: usize, algo: AlgoConfig, timeout: Duration, transport: TransportMode, shm: ShmConfig) -> Vec<Communicator> {
    hosts_comms(&vec![0; n], algo, timeout, transport, shm)
}

/// Ranks on simulated hosts: rank r claims host `hosts[r]` (shared memory
/// within a host, TCP between hosts).
pub fn hosts_comms(hosts: &[usize], algo: AlgoConfig, timeout: Duration, transport: TransportMode, shm: ShmConfig) -> Vec<Communicator> {
    hosts_comms_with(hosts, algo, timeout, transport, shm, |_, _| ())
}

/// [`hosts_comms`] with rank r's options changed by `tweak(r, options)`.
pub fn hosts_comms_with(
    hosts: &[usize],
    algo: AlgoConfig,
    timeout: Duration,
    transport: TransportMode,
    shm: ShmConfig,
    tweak: impl Fn(usize, &mut CommOptions) + Sync,
) -> Vec<Communicator> {
    let n = hosts.len();
    let tweak = &tweak;
    let store = Arc::new(MemStore::new());
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let store = store.clone();
                s.spawn(move || {
                    let mut o = opts(timeout, algo);
                    o.transport = transport;
                    o.shm = shm;
                    o.host_id = Some(format!("host{}", hosts[r]));
                    tweak(r, &mut o);
                    Communicator::bootstrap(store.as_ref(), r, n, o, "127.0.0.1".parse().unwrap()).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs `f(rank, comm)` on one thread per rank and collects the results.
pub fn on_ranks<R: Send>(comms: &[Communicator], f: impl Fn(usize, &Communicator) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// A buffer of `dtype` holding `values` (converted the way torch would).
pub fn buf(dtype: DType, values: &[f64]) -> Arc<SharedBuf> {
    match dtype {
        DType::F32 => SharedBuf::new(dtype, &values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        DType::F64 => SharedBuf::new(dtype, values),
        DType::F16 => SharedBuf::new(dtype, &values.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>()),
        DType::BF16 => SharedBuf::new(dtype, &values.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>()),
        DType::U8 => SharedBuf::new(dtype, &values.iter().map(|&v| v as i64 as u8).collect::<Vec<_>>()),
        DType::I8 => SharedBuf::new(dtype, &values.iter().map(|&v| v as i64 as i8).collect::<Vec<_>>()),
        DType::I16 => SharedBuf::new(dtype, &values.iter().map(|&v| v as i64 as i16).collect::<Vec<_>>()),
        DType::I32 => SharedBuf::new(dtype, &values.iter().map(|&v| v as i64 as i32).collect::<Vec<_>>()),
        DType::I64 => SharedBuf::new(dtype, &values.iter().map(|&v| v as i64).collect::<Vec<_>>()),
        DType::Bool => SharedBuf::new(dtype, &values.iter().map(|&v| (v != 0.0) as u8).collect::<Vec<_>>()),
        DType::Other { .. } => panic!("no test values for {dtype}"),
    }
}

/// The buffer's contents as f64 (panics if a tensor still holds it).
pub fn read(dtype: DType, b: &SharedBuf) -> Vec<f64> {
    let gone = "buffer still lent: the engine kept a tensor after finishing";
    match dtype {
        DType::F32 => b.to_vec::<f32>().expect(gone).into_iter().map(f64::from).collect(),
        DType::F64 => b.to_vec::<f64>().expect(gone),
        DType::F16 => b.to_vec::<f16>().expect(gone).into_iter().map(|v| v.to_f64()).collect(),
        DType::BF16 => b.to_vec::<bf16>().expect(gone).into_iter().map(|v| v.to_f64()).collect(),
        DType::U8 | DType::Bool => b.to_vec::<u8>().expect(gone).into_iter().map(f64::from).collect(),
        DType::I8 => b.to_vec::<i8>().expect(gone).into_iter().map(f64::from).collect(),
        DType::I16 => b.to_vec::<i16>().expect(gone).into_iter().map(f64::from).collect(),
        DType::I32 => b.to_vec::<i32>().expect(gone).into_iter().map(f64::from).collect(),
        DType::I64 => b.to_vec::<i64>().expect(gone).into_iter().map(|v| v as f64).collect(),
        DType::Other { .. } => panic!("no test values for {dtype}"),
    }
}

pub fn t(b: &Arc<SharedBuf>) -> Tensor {
    b.tensor().expect("buffer already lent")
}

/// Values rank `r` contributes at index `i` for `op` on `dtype`: small
/// integers, so every float type represents every partial result exactly.
pub fn value(dtype: DType, op: ReduceOp, r: usize, i: usize) -> f64 {
    if dtype == DType::Bool {
        return (((r * 3 + i) % 4) != 0) as u8 as f64;
    }
    let unsigned = dtype == DType::U8;
    match op {
        ReduceOp::Product => (((r + 2 * i) % 3) + 1) as f64,
        _ if unsigned => ((r * 7 + i * 3) % 13) as f64,
        _ => (((r * 7 + i * 3) % 11) as i64 - 5) as f64,
    }
}

pub fn values(dtype: DType, op: ReduceOp, r: usize, n: usize) -> Vec<f64> {
    (0..n).map(|i| value(dtype, op, r, i)).collect()
}

/// Wraps an exact integer result into the dtype's range, as the dtype's
/// arithmetic would.
fn wrap(dtype: DType, v: i64) -> f64 {
    match dtype {
        DType::U8 => v as u8 as f64,
        DType::I8 => v as i8 as f64,
        DType::I16 => v as i16 as f64,
        DType::I32 => v as i32 as f64,
        _ => v as f64,
    }
}

/// Reference reduction of everyone's contribution.
pub fn reference(dtype: DType, op: ReduceOp, contribs: &[Vec<f64>]) -> Vec<f64> {
    let n = contribs.len();
    let len = contribs[0].len();
    (0..len)
        .map(|i| {
            let col: Vec<f64> = contribs.iter().map(|c| c[i]).collect();
            if dtype == DType::Bool {
                let b: Vec<bool> = col.iter().map(|&v| v != 0.0).collect();
                let any = b.iter().any(|&x| x);
                let all = b.iter().all(|&x| x);
                let parity = b.iter().filter(|&&x| x).count() % 2 == 1;
                return match op {
                    ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => any,
                    ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => all,
                    ReduceOp::BXor => parity,
                    ReduceOp::Avg => unreachable!(),
                } as u8 as f64;
            }
            if dtype.is_float() {
                return match op {
                    ReduceOp::Sum => col.iter().sum(),
                    ReduceOp::Avg => col.iter().sum::<f64>() / n as f64,
                    ReduceOp::Product => col.iter().product(),
                    ReduceOp::Min => col.iter().cloned().fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => col.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                    _ => unreachable!(),
                };
            }
            let ints: Vec<i64> = col.iter().map(|&v| v as i64).collect();
            match op {
                ReduceOp::Sum => wrap(dtype, ints.iter().sum()),
                ReduceOp::Avg => {
                    let s = wrap(dtype, ints.iter().sum()) as i64;
                    (s / n as i64) as f64
                }
                ReduceOp::Product => wrap(dtype, ints.iter().fold(1i64, |a, &b| a.wrapping_mul(b))),
                ReduceOp::Min => *ints.iter().min().unwrap() as f64,
                ReduceOp::Max => *ints.iter().max().unwrap() as f64,
                ReduceOp::BAnd => wrap(dtype, ints.iter().fold(-1i64, |a, &b| a & b)),
                ReduceOp::BOr => wrap(dtype, ints.iter().fold(0i64, |a, &b| a | b)),
                ReduceOp::BXor => wrap(dtype, ints.iter().fold(0i64, |a, &b| a ^ b)),
            }
        })
        .collect()
}

/// Whether the engine supports `op` on `dtype` (bitwise ops need integers,
/// AVG is not defined for bool).
pub fn supported(dtype: DType, op: ReduceOp) -> bool {
    rustccl::collectives::kernels::check(op, dtype).is_ok()
}

pub fn assert_close(dtype: DType, op: ReduceOp, got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = match (op, dtype) {
        (ReduceOp::Avg, DType::F16 | DType::BF16) => 0.02,
        (ReduceOp::Avg, DType::F32) => 1e-5,
        (ReduceOp::Avg, DType::F64) => 1e-12,
        _ => 0.0,
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}: element {i}: got {g}, want {w}");
    }
}

pub fn spec(kind: OpKind) -> OpSpec {
    OpSpec::new(kind)
}

/// Runs an in-place all_reduce of `b` with `op` and waits for it.
pub fn all_reduce(c: &Communicator, b: &Arc<SharedBuf>, op: ReduceOp) {
    let mut s = spec(OpKind::AllReduce);
    s.reduce_op = op as i32;
    s.inputs = vec![t(b)];
    run(c, s);
}

/// Runs a broadcast of `b` from `root` and waits for it.
pub fn broadcast(c: &Communicator, b: &Arc<SharedBuf>, root: usize) {
    let mut s = spec(OpKind::Broadcast);
    s.root = root as i64;
    s.inputs = vec![t(b)];
    run(c, s);
}

/// Rank `r`'s contribution to rank `dst`'s part of a reduce_scatter on `n`
/// ranks: `values(dtype, op, r * n + dst, len)`.
pub fn rs_part(dtype: DType, op: ReduceOp, n: usize, r: usize, dst: usize, len: usize) -> Vec<f64> {
    values(dtype, op, r * n + dst, len)
}

/// Runs a reduce_scatter with one flat input of `n` parts of `len`
/// elements (`rs_part`) on rank `r` and checks its output against the
/// reference reduction, and that the input is left as it was.
pub fn check_reduce_scatter_flat(c: &Communicator, r: usize, n: usize, dtype: DType, op: ReduceOp, len: usize, what: &str) {
    let flat: Vec<f64> = (0..n).flat_map(|p| rs_part(dtype, op, n, r, p, len)).collect();
    let inp = buf(dtype, &flat);
    let out = buf(dtype, &vec![0.0; len]);
    let mut s = spec(OpKind::ReduceScatter);
    s.reduce_op = op as i32;
    s.inputs = vec![t(&inp)];
    s.outputs = vec![t(&out)];
    run(c, s);
    let want = reference(dtype, op, &(0..n).map(|src| rs_part(dtype, op, n, src, r, len)).collect::<Vec<_>>());
    assert_close(dtype, op, &read(dtype, &out), &want, what);
    assert_eq!(read(dtype, &inp), flat, "{what}: reduce_scatter must not modify its input");
}

/// Reduce of `values(dtype, op, r, len)` to `root`; checks the root's
/// result against the reference and that every other buffer is untouched.
#[allow(clippy::too_many_arguments)]
pub fn check_reduce(c: &Communicator, r: usize, n: usize, dtype: DType, op: ReduceOp, root: usize, len: usize, what: &str) {
    let mine = values(dtype, op, r, len);
    let b = buf(dtype, &mine);
    let mut s = spec(OpKind::Reduce);
    s.root = root as i64;
    s.reduce_op = op as i32;
    s.inputs = vec![t(&b)];
    run(c, s);
    let got = read(dtype, &b);
    if r == root {
        let contribs: Vec<Vec<f64>> = (0..n).map(|p| values(dtype, op, p, len)).collect();
        assert_close(dtype, op, &got, &reference(dtype, op, &contribs), what);
    } else {
        assert_eq!(got, mine, "{what}: reduce must leave non-root buffers alone");
    }
}

/// Posts a send of `b` to `to` with `tag` (its Work).
pub fn send(c: &Communicator, b: &Arc<SharedBuf>, to: usize, tag: i64) -> rustccl::Work {
    let mut s = spec(OpKind::Send);
    s.root = to as i64;
    s.tag = tag;
    s.inputs = vec![t(b)];
    c.submit(vec![s], None, None).unwrap()
}

/// Posts a receive into `b` from `from` (None: any source) with `tag`.
pub fn recv(c: &Communicator, b: &Arc<SharedBuf>, from: Option<usize>, tag: i64) -> rustccl::Work {
    let mut s = spec(OpKind::Recv);
    s.root = from.map_or(-1, |f| f as i64);
    s.tag = tag;
    s.outputs = vec![t(b)];
    c.submit(vec![s], None, None).unwrap()
}

/// Submits one op and waits for it.
pub fn run(c: &Communicator, s: OpSpec) {
    c.submit(vec![s], None, None).unwrap().wait(None).unwrap();
}

/// An all_to_all of f32 blocks of `block` elements on 3 ranks where rank 2
/// expects one element more from rank 0 than rank 0 sends it, then an
/// all_reduce that must still work on every rank. Returns each rank's
/// error from the all_to_all.
pub fn all_to_all_one_short(comms: &[Communicator], block: usize) -> Vec<Option<String>> {
    on_ranks(comms, |r, c| {
        let want_from_0 = if r == 2 { block + 1 } else { block };
        let ib = buf(DType::F32, &vec![r as f64; 3 * block]);
        let ob = buf(DType::F32, &vec![0.0; 2 * block + want_from_0]);
        let mut s = spec(OpKind::AllToAll);
        s.in_splits = vec![block as i64; 3];
        s.out_splits = vec![want_from_0 as i64, block as i64, block as i64];
        s.inputs = vec![t(&ib)];
        s.outputs = vec![t(&ob)];
        let res = c.submit(vec![s], None, None).unwrap().wait(None);
        // the group still works: an all_reduce right after
        let b = buf(DType::F32, &[r as f64; 3]);
        all_reduce(c, &b, ReduceOp::Sum);
        assert_eq!(read(DType::F32, &b), vec![3.0; 3]);
        res.err().map(|e| e.to_string())
    })
}

/// Runs a gather of `input` into `outs` (the root's list; empty elsewhere).
pub fn gather(c: &Communicator, input: &Arc<SharedBuf>, outs: &[Arc<SharedBuf>], root: usize) {
    let mut s = spec(OpKind::Gather);
    s.root = root as i64;
    s.inputs = vec![t(input)];
    s.outputs = outs.iter().map(t).collect();
    run(c, s);
}

/// Runs a scatter of `ins` (the root's list; empty elsewhere) into `out`.
pub fn scatter(c: &Communicator, ins: &[Arc<SharedBuf>], out: &Arc<SharedBuf>, root: usize) {
    let mut s = spec(OpKind::Scatter);
    s.root = root as i64;
    s.inputs = ins.iter().map(t).collect();
    s.outputs = vec![t(out)];
    run(c, s);
}

/// Shared memory with attach from 0 bytes: every collective reads directly.
/// Tiny slots and 3 threads, so the pieces of one read run in parallel.
pub fn attach_comms(n: usize, attach_min: usize) -> Vec<Communicator> {
    let shm = ShmConfig {
        threads: auto0(3),
        attach_min: Setting::Fixed(attach_min),
        root_threads: auto0(5),
        broadcast_min: Setting::Fixed(attach_min),
        ..TINY_SHM
    };
    mesh_comms(n, tiny_algo(), Duration::from_secs(60), TransportMode::Shm, shm)
}

/// The algorithm that ran `op` last on `c`.
pub fn algorithm(c: &Communicator, op: &str) -> &'static str {
    c.stats().snapshot()[op].algorithm
}

/// The value of one of `c`'s thresholds (`Communicator::thresholds`), if
/// it has that key.
pub fn threshold(c: &Communicator, key: &str) -> Option<u64> {
    c.thresholds().iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// Three ranks of one host over shared memory, each with its own
/// settings (`shm(r)`).
pub fn comms_with(shm: impl Fn(usize) -> ShmConfig + Sync) -> Vec<Communicator> {
    n_comms_with(3, shm)
}

/// `n` ranks of one host over shared memory, each with its own settings.
pub fn n_comms_with(n: usize, shm: impl Fn(usize) -> ShmConfig + Sync) -> Vec<Communicator> {
    let store = std::sync::Arc::new(rustccl::bootstrap::MemStore::new());
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (store, shm) = (store.clone(), &shm);
                s.spawn(move || {
                    let mut o = opts(Duration::from_secs(30), tiny_algo());
                    o.transport = TransportMode::Shm;
                    o.shm = shm(r);
                    Communicator::bootstrap(store.as_ref(), r, n, o, "127.0.0.1".parse().unwrap()).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Changes the protection of the page at `addr` (only `on` the rank that
/// owns it): a test's way to make one rank's reads or writes of a peer's
/// buffer fail.
pub fn protect(on: bool, addr: usize, prot: i32) {
    if on {
        // SAFETY: one whole page inside a buffer of the calling test,
        // where nothing else lives; the test restores it before the
        // buffer is read or freed.
        assert_eq!(unsafe { libc::mprotect(addr as *mut libc::c_void, 4096, prot) }, 0);
    }
}
