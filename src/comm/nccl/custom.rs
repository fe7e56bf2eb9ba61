//! rustccl's one-shot all-reduce over NVLink peer memory (`custom_ar.cu`),
//! used instead of NCCL for small CUDA all-reduces when every GPU of the
//! group reaches every other as a CUDA peer with native atomics (NVLink) on
//! one host.
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
use crate::config::LogLevel;
use crate::cuda::{self, Context, DeviceAlloc, Function, HostFlag, IpcMapping, Module};
use crate::error::Result;
use crate::log_at;
use crate::tensor::Tensor;
use crate::types::{DType, Rank, ReduceOp};

/// Largest group the kernel serves (its `MAX_RANKS`).
pub const MAX_RANKS: usize = 8;
/// Most blocks per launch (the kernel has flags for 64).
const MAX_GRID: u64 = 32;
const THREADS: u32 = 512;
/// Where the data buffers start in a region (after flags and counters).
const DATA_OFF: u64 = 4096;
const SOURCE: &str = include_str!("custom_ar.cu");
/// How much longer than the operation's timeout a kernel waits for peers.
const KERNEL_GRACE: Duration = Duration::from_secs(10);
/// Bytes each rank contributes to the setup exchange.
const BLOB: usize = 128;

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
    rank: u32,
    world: u32,
    vec: u32,
    pad: u32,
}

const DTYPES: [(DType, &str); 6] =
    [(DType::F32, "f32"), (DType::F64, "f64"), (DType::F16, "f16"), (DType::BF16, "bf16"), (DType::I32, "i32"), (DType::I64, "i64")];
const OPS: [(ReduceOp, &str); 5] =
    [(ReduceOp::Sum, "sum"), (ReduceOp::Avg, "avg"), (ReduceOp::Product, "prod"), (ReduceOp::Min, "min"), (ReduceOp::Max, "max")];

/// The kernel for (`dt`, `op`), if there is one.
fn kernel_name(dt: DType, op: ReduceOp) -> Option<String> {
    let d = DTYPES.iter().find(|(t, _)| *t == dt)?.1;
    let o = OPS.iter().find(|(t, _)| *t == op)?.1;
    Some(format!("rustccl_ar_{d}_{o}"))
}

/// Blocks and bytes per block for `nbytes` (> 0): about 16 bytes per
/// thread per block, at most [`MAX_GRID`] blocks, pieces of whole 16-byte
/// packs, so every element belongs to one block on every rank.
pub fn geometry(nbytes: u64) -> (u32, u64) {
    let want = nbytes.div_ceil(THREADS as u64 * 16).clamp(1, MAX_GRID);
    let piece = (nbytes.div_ceil(want).div_ceil(16) * 16).max(16);
    (nbytes.div_ceil(piece).max(1) as u32, piece)
}

/// The (dtype, op) of `op` when the one-shot kernel can run it on a group
/// of `world` ranks with buffers of `max_bytes`.
pub fn eligible(op: &Op<Tensor>, world: usize, max_bytes: usize) -> Option<(DType, ReduceOp)> {
    let Op::AllReduce { bufs, op } = op else { return None };
    let [b] = bufs.as_slice() else { return None };
    if !(2..=MAX_RANKS).contains(&world) || b.nbytes() == 0 || b.nbytes() > max_bytes {
        return None;
    }
    kernel_name(b.dtype(), *op)?;
    Some((b.dtype(), *op))
}

/// The kernels' PTX for compute capability `cc` (NVRTC; no GPU needed).
pub fn ptx(cc: (i32, i32)) -> std::result::Result<String, String> {
    cuda::nvrtc::compile(SOURCE, "custom_ar.cu", cc)
}

/// The compiled kernels of one device.
struct Kernels {
    _module: Module,
    fns: HashMap<(DType, ReduceOp), Function>,
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
            for (dt, _) in DTYPES {
                for (op, _) in OPS {
                    let name = kernel_name(dt, op).expect("listed");
                    fns.insert((dt, op), module.function(&name).map_err(|e| e.0)?);
                }
            }
            log_at!(LogLevel::Info, "one-shot all-reduce kernels for sm_{}{} compiled in {:?}", cc.0, cc.1, t0.elapsed());
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
    abort: HostFlag,
    error: HostFlag,
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
        let abort = HostFlag::new().map_err(|e| e.0)?;
        let error = HostFlag::new().map_err(|e| e.0)?;
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

/// One group's one-shot all-reduce on one device.
pub struct CustomAr {
    kernels: Arc<Kernels>,
    abort: HostFlag,
    error: HostFlag,
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
        let local = Local::prepare(device, cap);
        let blob = local.as_ref().map(Local::blob).unwrap_or([0u8; BLOB]);
        let all = ex.all_gather(&blob)?;
        let local = match local {
            Ok(l) if (0..world).all(|r| all[r * BLOB] == 1) => l,
            Ok(_) => {
                log_at!(LogLevel::Info, "rank {rank}: one-shot all-reduce off: another rank could not set it up");
                return Ok(None);
            }
            Err(why) => {
                log_at!(LogLevel::Info, "rank {rank}: one-shot all-reduce off: {why}");
                return Ok(None);
            }
        };
        let mapped = local.map_peers(&all, rank, world, device);
        let oks = ex.all_gather(&[mapped.is_ok() as u8])?;
        let peers = match mapped {
            Ok(p) if oks.iter().all(|&b| b == 1) => p,
            Ok(_) => {
                log_at!(LogLevel::Info, "rank {rank}: one-shot all-reduce off: another rank cannot reach every peer");
                return Ok(None);
            }
            Err(why) => {
                log_at!(LogLevel::Info, "rank {rank}: one-shot all-reduce off: {why}");
                return Ok(None);
            }
        };
        let mut bufs = [0u64; MAX_RANKS];
        for (r, p) in peers.iter().enumerate() {
            bufs[r] = p.as_ref().map_or(local.region.ptr(), IpcMapping::ptr);
        }
        log_at!(LogLevel::Info, "rank {rank}: one-shot all-reduce over NVLink on cuda:{device} for up to {cap} B");
        let Local { ctx, kernels, region, abort, error, .. } = local;
        Ok(Some(CustomAr { kernels, abort, error, _peers: peers, region, _ctx: ctx, bufs, rank: rank as u32, world: world as u32, cap: cap as u64 }))
    }

    /// Enqueues the all-reduce of `t` (in place) on `stream`.
    pub fn launch(&self, dt: DType, op: ReduceOp, t: &Tensor, stream: u64, timeout: Duration) -> std::result::Result<(), String> {
        let f = self.kernels.fns.get(&(dt, op)).ok_or_else(|| format!("no one-shot kernel for {dt} {}", op.name()))?;
        let nbytes = t.nbytes() as u64;
        if nbytes == 0 || nbytes > self.cap {
            return Err(format!("{nbytes} B does not fit the one-shot buffers ({} B)", self.cap));
        }
        let (grid, piece) = geometry(nbytes);
        let addr = t.addr() as u64;
        let args = Args {
            input: addr,
            output: addr,
            bufs: self.bufs,
            nbytes,
            piece,
            cap: self.cap,
            // The watchdog fails the work at `timeout` and raises the abort
            // word; the kernel's own limit is the last resort behind it.
            timeout_ns: (timeout + KERNEL_GRACE).as_nanos().min(u64::MAX as u128) as u64,
            abort: self.abort.device_ptr(),
            error: self.error.device_ptr(),
            rank: self.rank,
            world: self.world,
            vec: u32::from(addr % 16 == 0),
            pad: 0,
        };
        // SAFETY: `Args` mirrors the kernel's parameter. `t` is a validated
        // CUDA tensor of this device that the caller keeps alive until the
        // kernel has run (the pending entry, or the graph's owner under
        // capture); the region, the peer mappings and the abort word live as
        // long as this CustomAr, which the engine keeps until it is idle or
        // aborted (the abort word ends any wait first).
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
    fn kernels_exist_for_the_listed_types_only() {
        assert_eq!(kernel_name(DType::BF16, ReduceOp::Avg).as_deref(), Some("rustccl_ar_bf16_avg"));
        assert_eq!(kernel_name(DType::I64, ReduceOp::Product).as_deref(), Some("rustccl_ar_i64_prod"));
        assert!(kernel_name(DType::U8, ReduceOp::Sum).is_none());
        assert!(kernel_name(DType::F32, ReduceOp::BXor).is_none());
        for (dt, d) in DTYPES {
            for (op, o) in OPS {
                let name = format!("rustccl_ar_{d}_{o}");
                assert_eq!(kernel_name(dt, op), Some(name.clone()));
                assert!(SOURCE.contains(&format!("RUSTCCL_AR({d}, ")), "{name} not instantiated");
            }
        }
        assert_eq!(std::mem::size_of::<Args>(), 144);
    }
}
