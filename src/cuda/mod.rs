//! Safe handles over the CUDA driver API (loaded at run time by cudarc):
//! the device's primary context, Rust-owned streams and events, stream-
//! ordered copies and allocations. Raw stream handles cross the C ABI as
//! `u64`; everything else stays typed here.
//!
//! Nothing in here panics: cudarc panics when libcuda is missing, so
//! [`load`] checks for it first and every other entry point requires a
//! successful `load`.

pub mod nvrtc;

use std::sync::OnceLock;

use cudarc::driver::result as drv;
use cudarc::driver::sys;

/// A CUDA failure, with the call that failed.
#[derive(Debug, Clone)]
pub struct CudaError(pub String);

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type CudaResult<T> = Result<T, CudaError>;

fn err(what: &str, e: drv::DriverError) -> CudaError {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    CudaError(format!("{what}: {name}"))
}

/// Loads libcuda and initialises the driver, once per process.
pub fn load() -> CudaResult<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: probing for the library has no preconditions; it only
            // tries dlopen on the candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err("libcuda.so could not be loaded (no NVIDIA driver on this machine?)".into());
            }
            drv::init().map_err(|e| err("cuInit", e).0)
        })
        .clone()
        .map_err(CudaError)
}

/// The primary context of one device (the one torch uses).
pub struct Context {
    raw: sys::CUcontext,
    dev: sys::CUdevice,
    pub device: i32,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver
// serialises access); we only bind it with cuCtxSetCurrent.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    pub fn primary(device: i32) -> CudaResult<Context> {
        load()?;
        let dev = drv::device::get(device).map_err(|e| err(&format!("cuDeviceGet({device})"), e))?;
        // SAFETY: `dev` came from cuDeviceGet; released in Drop.
        let raw = unsafe { drv::primary_ctx::retain(dev) }.map_err(|e| err("cuDevicePrimaryCtxRetain", e))?;
        Ok(Context { raw, dev, device })
    }

    /// Makes this context current on the calling thread (cheap when it is).
    pub fn bind(&self) -> CudaResult<()> {
        if drv::ctx::get_current().ok().flatten() == Some(self.raw) {
            return Ok(());
        }
        // SAFETY: the context is retained for our lifetime.
        unsafe { drv::ctx::set_current(self.raw) }.map_err(|e| err("cuCtxSetCurrent", e))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balanced with the retain in `primary`.
        let _ = unsafe { drv::primary_ctx::release(self.dev) };
    }
}

/// A stream created (and destroyed) by rustccl.
pub struct Stream(sys::CUstream);

// SAFETY: CUDA streams are thread-safe handles.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream of the current context (bind it first).
    pub fn new() -> CudaResult<Stream> {
        drv::stream::create(drv::stream::StreamKind::NonBlocking).map(Stream).map_err(|e| err("cuStreamCreate", e))
    }

    pub fn raw(&self) -> u64 {
        self.0 as u64
    }

    /// Makes this stream wait for `ev` (no CPU thread blocks).
    pub fn wait(&self, ev: &Event) -> CudaResult<()> {
        wait_event_raw(self.raw(), ev)
    }

    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the stream is alive.
        unsafe { drv::stream::synchronize(self.0) }.map_err(|e| err("cuStreamSynchronize", e))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; pending work completes first.
        let _ = unsafe { drv::stream::destroy(self.0) };
    }
}

/// Makes the stream with raw handle `stream` wait for `ev`.
pub fn wait_event_raw(stream: u64, ev: &Event) -> CudaResult<()> {
    // SAFETY: `stream` is a live stream handle handed to us by torch (the
    // caller's current stream) or one of ours; `ev` is alive.
    unsafe { drv::stream::wait_event(stream as sys::CUstream, ev.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
        .map_err(|e| err("cuStreamWaitEvent", e))
}

/// An event without timing (cheapest kind).
pub struct Event(sys::CUevent);

// SAFETY: CUDA events are thread-safe handles.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn new() -> CudaResult<Event> {
        drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map(Event).map_err(|e| err("cuEventCreate", e))
    }

    /// An event that can be timed against another ([`Event::since`]).
    pub fn timed() -> CudaResult<Event> {
        drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map(Event).map_err(|e| err("cuEventCreate", e))
    }

    /// Device time from `start` to this event (both timed and complete).
    pub fn since(&self, start: &Event) -> CudaResult<std::time::Duration> {
        // SAFETY: both events are alive.
        let ms = unsafe { drv::event::elapsed(start.0, self.0) }.map_err(|e| err("cuEventElapsedTime", e))?;
        Ok(std::time::Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3))
    }

    /// Records the event on the stream with raw handle `stream`.
    pub fn record(&self, stream: u64) -> CudaResult<()> {
        // SAFETY: the event is alive and `stream` is a live stream handle.
        unsafe { drv::event::record(self.0, stream as sys::CUstream) }.map_err(|e| err("cuEventRecord", e))
    }

    /// True once everything recorded before the event has run.
    pub fn query(&self) -> CudaResult<bool> {
        // SAFETY: the event is alive.
        match unsafe { drv::event::query(self.0) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(err("cuEventQuery", e)),
        }
    }

    pub fn synchronize(&self) -> CudaResult<()> {
        // SAFETY: the event is alive.
        unsafe { drv::event::synchronize(self.0) }.map_err(|e| err("cuEventSynchronize", e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by us; the driver releases it once complete.
        let _ = unsafe { drv::event::destroy(self.0) };
    }
}

/// Device-to-device copy ordered on `stream`.
///
/// # Safety
/// `dst` and `src` must be device allocations of at least `bytes` bytes that
/// stay alive until the copy has run on `stream`.
pub unsafe fn copy_async(dst: u64, src: u64, bytes: usize, stream: u64) -> CudaResult<()> {
    if bytes == 0 || dst == src {
        return Ok(());
    }
    drv::memcpy_dtod_async(dst, src, bytes, stream as sys::CUstream).map_err(|e| err("cuMemcpyDtoDAsync", e))
}

/// Device memory allocated in stream order, freed in stream order on drop.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    stream: u64,
}

// SAFETY: a device pointer and a stream handle; used only through this type.
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    /// `bytes` of device memory usable on `stream` (bind the context first).
    pub fn new(bytes: usize, stream: u64) -> CudaResult<DeviceBuffer> {
        if bytes == 0 {
            return Ok(DeviceBuffer { ptr: 0, bytes, stream });
        }
        // SAFETY: `stream` is a live stream of the current context.
        let ptr = unsafe { drv::malloc_async(stream as sys::CUstream, bytes) }.map_err(|e| err("cuMemAllocAsync", e))?;
        Ok(DeviceBuffer { ptr, bytes, stream })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: allocated by `new` on `stream`; freed once, in stream
            // order after everything already queued there.
            let _ = unsafe { drv::free_async(self.ptr, self.stream as sys::CUstream) };
        }
    }
}

/// Copies `bytes` from device memory to CPU memory (synchronous).
///
/// # Safety
/// `src` must be device memory of at least `dst.len()` bytes of the
/// current context, not written concurrently.
pub unsafe fn copy_to_host(dst: &mut [u8], src: u64) -> CudaResult<()> {
    if dst.is_empty() {
        return Ok(());
    }
    drv::memcpy_dtoh_sync(dst, src).map_err(|e| err("cuMemcpyDtoH", e))
}

/// Copies CPU memory to device memory (synchronous).
///
/// # Safety
/// `dst` must be device memory of at least `src.len()` bytes of the
/// current context, not used concurrently.
pub unsafe fn copy_to_device(dst: u64, src: &[u8]) -> CudaResult<()> {
    if src.is_empty() {
        return Ok(());
    }
    drv::memcpy_htod_sync(dst, src).map_err(|e| err("cuMemcpyHtoD", e))
}

/// Whether `dev` can map memory of `peer`, and whether it has native
/// atomics over that link (true over NVLink, false over PCIe).
pub fn peer_link(dev: i32, peer: i32) -> CudaResult<(bool, bool)> {
    load()?;
    let (d, p) = (device_handle(dev)?, device_handle(peer)?);
    let mut ok = 0;
    // SAFETY: `ok` is a valid out-pointer; both handles came from cuDeviceGet.
    unsafe { sys::cuDeviceCanAccessPeer(&mut ok, d, p) }.result().map_err(|e| err("cuDeviceCanAccessPeer", e))?;
    let mut atomics = 0;
    // SAFETY: as above.
    unsafe {
        sys::cuDeviceGetP2PAttribute(&mut atomics, sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, d, p)
    }
    .result()
    .map_err(|e| err("cuDeviceGetP2PAttribute", e))?;
    Ok((ok != 0, atomics != 0))
}

fn device_handle(device: i32) -> CudaResult<sys::CUdevice> {
    drv::device::get(device).map_err(|e| err(&format!("cuDeviceGet({device})"), e))
}

/// The PCI bus id of `device` ("0000:18:00.0"): names a GPU across the
/// processes of one host, whatever their CUDA_VISIBLE_DEVICES.
pub fn pci_bus_id(device: i32) -> CudaResult<String> {
    load()?;
    let d = device_handle(device)?;
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: `buf` has the length we pass; the driver NUL-terminates.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, d) }.result().map_err(|e| err("cuDeviceGetPCIBusId", e))?;
    // SAFETY: NUL-terminated within `buf` (zero-initialised, driver writes less than its length).
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// The ordinal of the device with PCI bus id `id` in this process, if visible.
pub fn device_by_pci_bus_id(id: &str) -> CudaResult<Option<i32>> {
    load()?;
    let Ok(c) = std::ffi::CString::new(id) else { return Ok(None) };
    let mut d: sys::CUdevice = 0;
    // SAFETY: `d` is a valid out-pointer, `c` a NUL-terminated string.
    match unsafe { sys::cuDeviceGetByPCIBusId(&mut d, c.as_ptr()) }.result() {
        Ok(()) => Ok(Some(d)),
        Err(_) => Ok(None),
    }
}

/// (major, minor) compute capability of `device`.
pub fn compute_capability(device: i32) -> CudaResult<(i32, i32)> {
    load()?;
    let d = device_handle(device)?;
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJ, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MIN,
    };
    // SAFETY: valid device handle and attributes.
    let major = unsafe { drv::device::get_attribute(d, MAJ) }.map_err(|e| err("cuDeviceGetAttribute", e))?;
    // SAFETY: as above.
    let minor = unsafe { drv::device::get_attribute(d, MIN) }.map_err(|e| err("cuDeviceGetAttribute", e))?;
    Ok((major, minor))
}

/// True while `stream` is being captured into a CUDA graph.
pub fn is_capturing(stream: u64) -> CudaResult<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is a live stream handle; `status` a valid out-pointer.
    unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) }.result().map_err(|e| err("cuStreamIsCapturing", e))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Lets the calling thread make driver calls (event queries) while other
/// threads capture CUDA graphs in global mode, as torch's NCCL watchdog does.
pub fn relax_capture_mode() {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a valid in/out pointer; affects this thread only.
    let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
}

/// Device memory from `cuMemAlloc` (shareable with CUDA IPC, unlike the
/// stream-ordered pool), zeroed, freed on drop. Bind the context first.
pub struct DeviceAlloc {
    ptr: u64,
    bytes: usize,
}

// SAFETY: a device address; the driver allows freeing it from any thread.
unsafe impl Send for DeviceAlloc {}
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    pub fn zeroed(bytes: usize) -> CudaResult<DeviceAlloc> {
        // SAFETY: plain allocation in the current context.
        let ptr = unsafe { drv::malloc_sync(bytes) }.map_err(|e| err("cuMemAlloc", e))?;
        let a = DeviceAlloc { ptr, bytes };
        // SAFETY: `ptr` has `bytes` bytes, unused by anyone else yet.
        unsafe { drv::memset_d8_sync(ptr, 0, bytes) }.map_err(|e| err("cuMemsetD8", e))?;
        Ok(a)
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A handle other processes of this host open with [`IpcMapping::open`].
    pub fn ipc_handle(&self) -> CudaResult<[u8; 64]> {
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `ptr` is a live cuMemAlloc allocation; `h` a valid out-pointer.
        unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) }.result().map_err(|e| err("cuIpcGetMemHandle", e))?;
        Ok(h.reserved.map(|c| c as u8))
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed`, freed once. Callers make sure no
        // kernel that uses it is still queued (the group is idle or aborted).
        let _ = unsafe { drv::free_sync(self.ptr) };
    }
}

/// Another process's allocation mapped into this one, unmapped on drop.
pub struct IpcMapping(u64);

// SAFETY: a device address; unmapping is allowed from any thread.
unsafe impl Send for IpcMapping {}
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    /// Maps the allocation behind `handle` (bind the context first).
    pub fn open(handle: &[u8; 64]) -> CudaResult<IpcMapping> {
        let h = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; a stale or foreign handle
        // makes the driver return an error, not map anything.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32) }
            .result()
            .map_err(|e| err("cuIpcOpenMemHandle", e))?;
        Ok(IpcMapping(ptr))
    }

    pub fn ptr(&self) -> u64 {
        self.0
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `open`, unmapped once.
        let _ = unsafe { sys::cuIpcCloseMemHandle(self.0) };
    }
}

/// A module loaded from PTX into the current context.
pub struct Module(sys::CUmodule);

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    /// JIT-loads `ptx` (bind the context first).
    pub fn from_ptx(ptx: &str) -> CudaResult<Module> {
        let c = std::ffi::CString::new(ptx).map_err(|_| CudaError("PTX contains a NUL byte".into()))?;
        // SAFETY: `c` is a NUL-terminated PTX image alive during the call.
        unsafe { drv::module::load_data(c.as_ptr().cast()) }.map(Module).map_err(|e| err("cuModuleLoadData", e))
    }

    pub fn function(&self, name: &str) -> CudaResult<Function> {
        let c = std::ffi::CString::new(name).map_err(|_| CudaError(format!("bad kernel name {name:?}")))?;
        // SAFETY: the module is loaded; `c` is NUL-terminated.
        unsafe { drv::module::get_function(self.0, c) }.map(Function).map_err(|e| err(&format!("cuModuleGetFunction({name})"), e))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `from_ptx`; its functions are not used after.
        let _ = unsafe { drv::module::unload(self.0) };
    }
}

/// A kernel of a [`Module`] (valid while the module is loaded).
#[derive(Clone, Copy)]
pub struct Function(sys::CUfunction);

// SAFETY: as for Module.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Function {
    /// Launches the kernel with one by-value argument `args` on `stream`.
    ///
    /// # Safety
    /// `A` must match the kernel's single parameter in layout, every device
    /// address in it must stay valid until the kernel has run, and the
    /// module must stay loaded.
    pub unsafe fn launch<A>(&self, grid: u32, block: u32, stream: u64, args: &A) -> CudaResult<()> {
        let mut params = [args as *const A as *mut std::ffi::c_void];
        drv::launch_kernel(self.0, (grid, 1, 1), (block, 1, 1), 0, stream as sys::CUstream, &mut params)
            .map_err(|e| err("cuLaunchKernel", e))
    }
}

/// A 32-bit word in pinned CPU memory that kernels read and write (an
/// abort signal from the CPU, an error report from the device).
pub struct MappedFlag {
    cpu: *mut u32,
    dev: u64,
}

// SAFETY: the word is only accessed with volatile reads and writes.
unsafe impl Send for MappedFlag {}
unsafe impl Sync for MappedFlag {}

impl MappedFlag {
    /// A zero word, mapped for every context (bind one first).
    pub fn new() -> CudaResult<MappedFlag> {
        // SAFETY: allocates 4 bytes of pinned, device-mapped CPU memory.
        let p = unsafe { drv::malloc_host(4, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| err("cuMemHostAlloc", e))?;
        let cpu = p.cast::<u32>();
        // SAFETY: `cpu` points to 4 writable, suitably aligned bytes.
        unsafe { cpu.write_volatile(0) };
        let mut dev = 0;
        // SAFETY: `p` was allocated with DEVICEMAP; `dev` a valid out-pointer.
        if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) }.result() {
            // SAFETY: allocated above, not shared yet.
            let _ = unsafe { drv::free_host(p) };
            return Err(err("cuMemHostGetDevicePointer", e));
        }
        Ok(MappedFlag { cpu, dev })
    }

    /// The address kernels read.
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }

    pub fn set(&self, v: u32) {
        // SAFETY: live allocation of 4 bytes.
        unsafe { self.cpu.write_volatile(v) }
    }

    pub fn get(&self) -> u32 {
        // SAFETY: live allocation of 4 bytes.
        unsafe { self.cpu.read_volatile() }
    }
}

impl Drop for MappedFlag {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once; kernels that read it are
        // finished (the owner outlives its launches).
        let _ = unsafe { drv::free_host(self.cpu.cast()) };
    }
}

/// The CUDA driver's version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> CudaResult<(i32, i32)> {
    load()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().map_err(|e| err("cuDriverGetVersion", e))?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// Devices visible to this process.
pub fn device_count() -> CudaResult<i32> {
    load()?;
    drv::device::get_count().map_err(|e| err("cuDeviceGetCount", e))
}

/// The name of `device` ("NVIDIA H200").
pub fn device_name(device: i32) -> CudaResult<String> {
    load()?;
    drv::device::get_name(device_handle(device)?).map_err(|e| err("cuDeviceGetName", e))
}
