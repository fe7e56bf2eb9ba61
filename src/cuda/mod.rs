//! Safe handles over the CUDA driver API (loaded at run time by cudarc):
//! the device's primary context, Rust-owned streams and events, stream-
//! ordered copies and allocations. Raw stream handles cross the C ABI as
//! `u64`; everything else stays typed here.
//!
//! Nothing in here panics: cudarc panics when libcuda is missing, so
//! [`load`] checks for it first and every other entry point requires a
//! successful `load`.

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

    /// Makes this stream wait for `ev` (no host blocking).
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
        drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(Event)
            .map_err(|e| err("cuEventCreate", e))
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

/// Copies `bytes` from device memory to host memory (synchronous).
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

/// Copies host memory to device memory (synchronous).
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
