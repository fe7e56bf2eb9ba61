//! rustccl's collectives over NVLink peer memory (`custom_ar.cu`): the
//! one-shot and two-shot all-reduce, all_gather_into_tensor and
//! reduce_scatter_tensor, used instead of NCCL for small and medium CUDA
//! tensors when every GPU of the group reaches every other as a CUDA peer
//! with native atomics (NVLink) on one host. [`choose`] decides per call
//! (from the call and the settings only, so every rank decides alike).
//!
//! Set up once per group and device at its first eligible all-reduce, which
//! every rank reaches with the same call (eligibility depends only on the
//! call and the settings): compile the kernels (NVRTC, once per process and
//! device), allocate this rank's region, exchange IPC handles and PCI bus
//! ids over rustccl's CPU links, map every peer's region, and agree. When
//! any rank cannot, every rank keeps using NCCL for that group.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::IdExchange;
use crate::collectives::Op;
use crate::config::log_at;
use crate::config::LogLevel;
use crate::cuda::{self, Context, DeviceAlloc, Function, IpcMapping, MappedFlag, Module};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::types::{DType, Rank, ReduceOp};

/// Largest group the kernel serves (its `MAX_RANKS`).
pub const MAX_RANKS: usize = 8;
/// Most blocks per one-shot, all-gather or reduce-scatter launch.
const MAX_GRID: u64 = 64;
const THREADS: u32 = 512;
/// Where the data buffers start in a region (after flags and counters).
const DATA_OFF: u64 = 8192;
const SOURCE: &str = include_str!("custom_ar.cu");
/// How much longer than the operation's timeout a kernel waits for peers.
const KERNEL_GRACE: Duration = Duration::from_secs(10);
/// Bytes each rank contributes to the setup exchange.
const BLOB: usize = 128;
/// Most blocks of a two-shot launch (the kernel has flags for 128): enough
/// loads in flight to fill NVLink at 4-16 MiB.
const MAX_GRID_TWO_SHOT: u64 = 128;

/// Which peer-memory kernel runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    OneShot,
    TwoShot,
    AllGather,
    ReduceScatter,
}

impl Kind {
    /// The name `rustccl.stats()` shows as the algorithm.
    pub fn algorithm(self) -> &'static str {
        match self {
            Kind::OneShot => "one_shot",
            Kind::TwoShot => "two_shot",
            Kind::AllGather | Kind::ReduceScatter => "peer_copy",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Kind::OneShot => "one_shot",
            Kind::TwoShot => "two_shot",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "ag",
        }
    }
}

/// A call the peer-memory kernels run: the kernel, element type and op
/// (`U8` / `Sum` for the all-gather, which only copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Choice {
    pub kind: Kind,
    pub dt: DType,
    pub op: ReduceOp,
}

/// Size limits of the peer-memory paths for one group (bytes).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// all_reduce up to here: one-shot.
    pub one_shot: usize,
    /// all_reduce above `one_shot` up to here: two-shot.
    pub all_reduce: usize,
    /// all_gather_into_tensor output / reduce_scatter_tensor input up to here.
    pub gather: usize,
}

impl Limits {
    /// Bytes of each of the two data buffers every rank needs.
    pub fn cap(&self) -> usize {
        self.one_shot.max(self.all_reduce).max(self.gather)
    }
}

/// The kernel's parameter (`struct Args` in custom_ar.cu).
#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    input: u64,
    output: u64,
    bufs: [u64; MAX_RANKS],
    nbytes: u64,
    piece: u64,
    cap: u64,
    timeout_ns: u64,
    abort: u64,
    error: u64,
    slice: u64,
    rank: u32,
    world: u32,
    vec: u32,
    pad: u32,
}

const DTYPES: [(DType, &str); 6] =
    [(DType::F32, "f32"), (DType::F64, "f64"), (DType::F16, "f16"), (DType::BF16, "bf16"), (DType::I32, "i32"), (DType::I64, "i64")];
const OPS: [(ReduceOp, &str); 5] =
    [(ReduceOp::Sum, "sum"), (ReduceOp::Avg, "avg"), (ReduceOp::Product, "prod"), (ReduceOp::Min, "min"), (ReduceOp::Max, "max")];

/// Whether the module has a kernel for `c` ([`kernel_name`] without
/// building the name: [`choose`] asks on every call).
fn has_kernel(c: Choice) -> bool {
    c.kind == Kind::AllGather || (DTYPES.iter().any(|(t, _)| *t == c.dt) && OPS.iter().any(|(o, _)| *o == c.op))
}

/// The kernel for `c`, if there is one.
fn kernel_name(c: Choice) -> Option<String> {
    if c.kind == Kind::AllGather {
        return Some("rustccl_ag".into());
    }
    let d = DTYPES.iter().find(|(t, _)| *t == c.dt)?.1;
    let o = OPS.iter().find(|(t, _)| *t == c.op)?.1;
    Some(format!("rustccl_{}_{d}_{o}", c.kind.prefix()))
}

/// Every kernel the module holds.
fn all_choices() -> Vec<Choice> {
    let mut v = vec![Choice { kind: Kind::AllGather, dt: DType::U8, op: ReduceOp::Sum }];
    for kind in [Kind::OneShot, Kind::TwoShot, Kind::ReduceScatter] {
        for (dt, _) in DTYPES {
            for (op, _) in OPS {
                v.push(Choice { kind, dt, op });
            }
        }
    }
    v
}

/// Blocks and bytes per block for `nbytes` (> 0): about 16 bytes per
/// thread per block, at most [`MAX_GRID`] blocks, pieces of whole 16-byte
/// packs, so every element belongs to one block on every rank.
pub fn geometry(nbytes: u64) -> (u32, u64) {
    let want = nbytes.div_ceil(THREADS as u64 * 16).clamp(1, MAX_GRID);
    let piece = (nbytes.div_ceil(want).div_ceil(16) * 16).max(16);
    (nbytes.div_ceil(piece).max(1) as u32, piece)
}

/// Two-shot geometry for `nbytes` (> 0) over `world` ranks: (blocks, bytes
/// per block within a slice, bytes per slice). Slices and pieces are whole
/// 16-byte packs; the last slice may be short or empty.
pub fn geometry_two_shot(nbytes: u64, world: u64) -> (u32, u64, u64) {
    let slice = (nbytes.div_ceil(world).div_ceil(16) * 16).max(16);
    let want = slice.div_ceil(THREADS as u64 * 16).clamp(1, MAX_GRID_TWO_SHOT);
    let piece = (slice.div_ceil(want).div_ceil(16) * 16).max(16);
    (slice.div_ceil(piece).max(1) as u32, piece, slice)
}

/// The peer-memory kernel for `op` on a group of `world` ranks, if one can
/// run it within `lim`. Depends only on the call and the settings.
pub fn choose(op: &Op<Tensor>, world: usize, lim: &Limits) -> Option<Choice> {
    use crate::collectives::Parts;
    if !(2..=MAX_RANKS).contains(&world) {
        return None;
    }
    let even = |lens: &[usize], n: usize| lens.len() == world && lens.iter().all(|&l| l == n);
    let c = match op {
        Op::AllReduce { bufs, op } => {
            let [b] = bufs.as_slice() else { return None };
            let n = b.nbytes();
            let kind = if n <= lim.one_shot {
                Kind::OneShot
            } else if n <= lim.all_reduce {
                Kind::TwoShot
            } else {
                return None;
            };
            Choice { kind, dt: b.dtype(), op: *op }
        }
        Op::AllGather { input, outputs: Parts::Flat { t, lens } } => {
            if !even(lens, input.numel()) || t.numel() != world * input.numel() || t.nbytes() > lim.gather || t.dtype() != input.dtype() {
                return None;
            }
            Choice { kind: Kind::AllGather, dt: DType::U8, op: ReduceOp::Sum }
        }
        Op::ReduceScatter { inputs: Parts::Flat { t, lens }, output, op } => {
            if !even(lens, output.numel()) || t.numel() != world * output.numel() || t.nbytes() > lim.gather || t.dtype() != output.dtype()
            {
                return None;
            }
            Choice { kind: Kind::ReduceScatter, dt: output.dtype(), op: *op }
        }
        _ => return None,
    };
    if op.bytes() == 0 {
        return None;
    }
    has_kernel(c).then_some(c)
}

/// The kernels' PTX for compute capability `cc` (NVRTC; no GPU needed).
pub fn ptx(cc: (i32, i32)) -> std::result::Result<String, String> {
    cuda::nvrtc::compile(SOURCE, "custom_ar.cu", cc)
}

/// The compiled kernels of one device.
struct Kernels {
    _module: Module,
    fns: HashMap<Choice, Function>,
}

/// The kernels for `device`, compiled and loaded once per process.
fn kernels(device: i32) -> std::result::Result<Arc<Kernels>, String> {
    type Cache = Mutex<HashMap<i32, std::result::Result<Arc<Kernels>, String>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    cache
        .entry(device)
        .or_insert_with(|| {
            let cc = cuda::compute_capability(device).map_err(|e| e.0)?;
            if cc.0 < 8 {
                return Err(format!("needs compute capability 8.0 or newer, cuda:{device} has {}.{}", cc.0, cc.1));
            }
            let t0 = std::time::Instant::now();
            let ptx = ptx(cc)?;
            let module = Module::from_ptx(&ptx).map_err(|e| e.0)?;
            let mut fns = HashMap::new();
            for c in all_choices() {
                let name = kernel_name(c).expect("listed");
                fns.insert(c, module.function(&name).map_err(|e| e.0)?);
            }
            log_at!(LogLevel::Info, "peer-memory kernels for sm_{}{} compiled in {:?}", cc.0, cc.1, t0.elapsed());
            Ok(Arc::new(Kernels { _module: module, fns }))
        })
        .clone()
}

/// This rank's side before the exchange.
struct Local {
    ctx: Context,
    kernels: Arc<Kernels>,
    region: DeviceAlloc,
    handle: [u8; 64],
    pci: String,
    abort: MappedFlag,
    error: MappedFlag,
}

impl Local {
    fn prepare(device: i32, cap: usize) -> std::result::Result<Local, String> {
        let ctx = Context::primary(device).map_err(|e| e.0)?;
        ctx.bind().map_err(|e| e.0)?;
        let kernels = kernels(device)?;
        let region = DeviceAlloc::zeroed(DATA_OFF as usize + 2 * cap).map_err(|e| e.0)?;
        let handle = region.ipc_handle().map_err(|e| e.0)?;
        let pci = cuda::pci_bus_id(device).map_err(|e| e.0)?;
        if pci.len() > BLOB - 65 {
            return Err(format!("PCI bus id {pci:?} too long"));
        }
        let abort = MappedFlag::new().map_err(|e| e.0)?;
        let error = MappedFlag::new().map_err(|e| e.0)?;
        Ok(Local { ctx, kernels, region, handle, pci, abort, error })
    }

    fn blob(&self) -> [u8; BLOB] {
        let mut b = [0u8; BLOB];
        b[0] = 1;
        b[1..65].copy_from_slice(&self.handle);
        b[65..65 + self.pci.len()].copy_from_slice(self.pci.as_bytes());
        b
    }

    /// Maps the region of every peer (`None` at this rank's index).
    fn map_peers(&self, all: &[u8], rank: Rank, world: usize, device: i32) -> std::result::Result<Vec<Option<IpcMapping>>, String> {
        let mut out = Vec::with_capacity(world);
        for r in 0..world {
            if r == rank {
                out.push(None);
                continue;
            }
            let b = &all[r * BLOB..(r + 1) * BLOB];
            let pci = String::from_utf8_lossy(&b[65..]).trim_end_matches('\0').to_string();
            let d = cuda::device_by_pci_bus_id(&pci)
                .map_err(|e| e.0)?
                .ok_or_else(|| format!("rank {r}'s GPU {pci} is not visible in this process (CUDA_VISIBLE_DEVICES)"))?;
            if d == device {
                return Err(format!("rank {r} uses the same GPU ({pci})"));
            }
            let (access, atomics) = cuda::peer_link(device, d).map_err(|e| e.0)?;
            if !access || !atomics {
                return Err(format!("cuda:{device} cannot reach rank {r}'s GPU {pci} as a peer over NVLink"));
            }
            let mut h = [0u8; 64];
            h.copy_from_slice(&b[1..65]);
            out.push(Some(IpcMapping::open(&h).map_err(|e| format!("mapping rank {r}'s buffer: {}", e.0))?));
        }
        Ok(out)
    }
}

/// One group's peer-memory collectives on one device.
pub struct CustomAr {
    kernels: Arc<Kernels>,
    abort: MappedFlag,
    error: MappedFlag,
    _peers: Vec<Option<IpcMapping>>,
    region: DeviceAlloc,
    _ctx: Context,
    bufs: [u64; MAX_RANKS],
    rank: u32,
    world: u32,
    cap: u64,
}

impl CustomAr {
    /// Sets up the one-shot path on every rank, or on none (`Ok(None)`,
    /// with the reason logged at INFO). Collective: every rank calls it.
    pub fn setup(device: i32, rank: Rank, world: usize, cap: usize, ex: &dyn IdExchange) -> Result<Option<CustomAr>> {
        let cap = cap.div_ceil(256).max(1) * 256; // keeps the second buffer aligned
        let local = Local::prepare(device, cap);
        let blob = local.as_ref().map(Local::blob).unwrap_or([0u8; BLOB]);
        let all = ex.all_gather(&blob)?;
        let local = match local {
            Ok(l) if (0..world).all(|r| all[r * BLOB] == 1) => l,
            Ok(_) => {
                log_at!(LogLevel::Info, "rank {rank}: peer-memory collectives off: another rank could not set it up");
                return Ok(None);
            }
            Err(why) => {
                log_at!(LogLevel::Info, "rank {rank}: peer-memory collectives off: {why}");
                return Ok(None);
            }
        };
        let mapped = local.map_peers(&all, rank, world, device);
        let oks = ex.all_gather(&[mapped.is_ok() as u8])?;
        let peers = match mapped {
            Ok(p) if oks.iter().all(|&b| b == 1) => p,
            Ok(_) => {
                log_at!(LogLevel::Info, "rank {rank}: peer-memory collectives off: another rank cannot reach every peer");
                return Ok(None);
            }
            Err(why) => {
                log_at!(LogLevel::Info, "rank {rank}: peer-memory collectives off: {why}");
                return Ok(None);
            }
        };
        let mut bufs = [0u64; MAX_RANKS];
        for (r, p) in peers.iter().enumerate() {
            bufs[r] = p.as_ref().map_or(local.region.ptr(), IpcMapping::ptr);
        }
        log_at!(LogLevel::Info, "rank {rank}: peer-memory collectives over NVLink on cuda:{device}, buffers of {cap} B");
        let Local { ctx, kernels, region, abort, error, .. } = local;
        Ok(Some(CustomAr {
            kernels,
            abort,
            error,
            _peers: peers,
            region,
            _ctx: ctx,
            bufs,
            rank: rank as u32,
            world: world as u32,
            cap: cap as u64,
        }))
    }

    /// Enqueues `op` (which [`choose`] gave `c` for) on `stream`.
    pub fn launch(&self, c: Choice, op: &Op<Tensor>, stream: u64, timeout: Duration) -> std::result::Result<(), String> {
        use crate::collectives::Parts;
        let f = self.kernels.fns.get(&c).ok_or_else(|| format!("no peer-memory kernel for {c:?}"))?;
        // (input, output, bytes per rank as the kernel counts them, staged bytes)
        let (input, output, nbytes, staged) = match (c.kind, op) {
            (Kind::OneShot | Kind::TwoShot, Op::AllReduce { bufs, .. }) if bufs.len() == 1 => {
                let t = &bufs[0];
                (t.addr() as u64, t.addr() as u64, t.nbytes() as u64, t.nbytes() as u64)
            }
            (Kind::AllGather, Op::AllGather { input, outputs: Parts::Flat { t, .. } }) => {
                (input.addr() as u64, t.addr() as u64, input.nbytes() as u64, input.nbytes() as u64)
            }
            (Kind::ReduceScatter, Op::ReduceScatter { inputs: Parts::Flat { t, .. }, output, .. }) => {
                (t.addr() as u64, output.addr() as u64, output.nbytes() as u64, t.nbytes() as u64)
            }
            _ => return Err(format!("{c:?} does not fit a {} call", op.kind().name())),
        };
        if nbytes == 0 || staged > self.cap {
            return Err(format!("{staged} B does not fit the peer-memory buffers ({} B)", self.cap));
        }
        let aligned = input % 16 == 0 && output % 16 == 0;
        let (grid, piece, slice, vec) = match c.kind {
            Kind::OneShot => {
                let (g, p) = geometry(nbytes);
                (g, p, 0, u32::from(aligned))
            }
            Kind::TwoShot => {
                let (g, p, s) = geometry_two_shot(nbytes, self.world as u64);
                (g, p, s, u32::from(aligned))
            }
            // Every rank's part starts at a multiple of nbytes in the big tensor.
            Kind::ReduceScatter => {
                let (g, p) = geometry(nbytes);
                (g, p, 0, u32::from(aligned && nbytes % 16 == 0))
            }
            Kind::AllGather => {
                let (g, p) = geometry(nbytes);
                let w = [16u64, 8, 4, 2].into_iter().find(|w| (input | output | nbytes) % w == 0).unwrap_or(1);
                (g, p, 0, w as u32)
            }
        };
        let args = Args {
            input,
            output,
            bufs: self.bufs,
            nbytes,
            piece,
            cap: self.cap,
            // The watchdog fails the work at `timeout` and raises the abort
            // word; the kernel's own limit is the last resort behind it.
            timeout_ns: (timeout + KERNEL_GRACE).as_nanos().min(u64::MAX as u128) as u64,
            abort: self.abort.device_ptr(),
            error: self.error.device_ptr(),
            slice,
            rank: self.rank,
            world: self.world,
            vec,
            pad: 0,
        };
        let _t = crate::profile::start(crate::profile::Span::Kernel);
        // SAFETY: `Args` mirrors the kernel's parameter. The tensors are
        // validated CUDA tensors of this device (matching sizes, checked by
        // `choose` and above) that the caller keeps alive until the kernel
        // has run (the pending entry, or the graph's owner under capture);
        // the region, the peer mappings and the abort word live as long as
        // this CustomAr, which the engine keeps until it is idle or aborted
        // (the abort word ends any wait first).
        unsafe { f.launch(grid, THREADS, stream, &args) }.map_err(|e| e.0)
    }

    /// Makes every waiting kernel give up (the group is being aborted).
    pub fn abort(&self) {
        self.abort.set(1);
    }

    /// True once a kernel gave up waiting for its peers (its results are
    /// wrong; the group must fail).
    pub fn gave_up(&self) -> bool {
        self.error.get() != 0
    }

    /// Bytes of device memory this rank holds for it.
    pub fn bytes(&self) -> usize {
        self.region.bytes()
    }
}

impl Drop for CustomAr {
    fn drop(&mut self) {
        // The fields are released next; their driver calls want the context.
        let _ = self._ctx.bind();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_covers_every_byte_once() {
        for nbytes in [1u64, 2, 8, 15, 16, 17, 4095, 8192, 8193, 65536, 100_003, 262_144, 1 << 20, (1 << 20) + 6, 4 << 20] {
            let (grid, piece) = geometry(nbytes);
            assert!(grid >= 1 && grid as u64 <= MAX_GRID, "{nbytes}: grid {grid}");
            assert_eq!(piece % 16, 0, "{nbytes}");
            assert!((grid as u64 - 1) * piece < nbytes, "{nbytes}: last block empty");
            assert!(grid as u64 * piece >= nbytes, "{nbytes}: bytes left over");
        }
    }

    #[test]
    fn two_shot_geometry_covers_every_byte_once() {
        for world in 2..=8u64 {
            for nbytes in [1u64, 15, 16, 17, 100, 4096, 65_537, 1 << 20, (1 << 20) + 6, 3 << 20, 16 << 20, (16 << 20) - 2] {
                let (grid, piece, slice) = geometry_two_shot(nbytes, world);
                assert!(grid >= 1 && grid as u64 <= MAX_GRID_TWO_SHOT, "{nbytes}: grid {grid}");
                assert_eq!(piece % 16, 0);
                assert_eq!(slice % 16, 0);
                assert!(slice * world >= nbytes, "{nbytes}/{world}: slices too short");
                assert!(grid as u64 * piece >= slice && (grid as u64 - 1) * piece < slice, "{nbytes}/{world}");
            }
        }
    }

    #[test]
    fn kernels_exist_for_the_listed_types_only() {
        let c = |kind, dt, op| Choice { kind, dt, op };
        assert_eq!(kernel_name(c(Kind::OneShot, DType::BF16, ReduceOp::Avg)).as_deref(), Some("rustccl_one_shot_bf16_avg"));
        assert_eq!(kernel_name(c(Kind::TwoShot, DType::I64, ReduceOp::Product)).as_deref(), Some("rustccl_two_shot_i64_prod"));
        assert_eq!(kernel_name(c(Kind::ReduceScatter, DType::F16, ReduceOp::Min)).as_deref(), Some("rustccl_reduce_scatter_f16_min"));
        assert_eq!(kernel_name(c(Kind::AllGather, DType::U8, ReduceOp::Sum)).as_deref(), Some("rustccl_ag"));
        assert!(kernel_name(c(Kind::OneShot, DType::U8, ReduceOp::Sum)).is_none());
        assert!(kernel_name(c(Kind::TwoShot, DType::F32, ReduceOp::BXor)).is_none());
        for kind in [Kind::OneShot, Kind::TwoShot, Kind::ReduceScatter, Kind::AllGather] {
            for dt in [DType::F32, DType::BF16, DType::I64, DType::U8, DType::Bool, DType::I16] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::BXor, ReduceOp::BAnd] {
                    let ch = c(kind, dt, op);
                    assert_eq!(has_kernel(ch), kernel_name(ch).is_some(), "{ch:?}");
                }
            }
        }
        assert_eq!(all_choices().len(), 1 + 3 * DTYPES.len() * OPS.len());
        for (_, d) in DTYPES {
            assert!(SOURCE.contains(&format!("RUSTCCL_AR({d}, ")), "{d} not instantiated");
        }
        assert_eq!(std::mem::size_of::<Args>(), 152);
    }
}
