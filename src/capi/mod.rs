//! The C ABI the C++ c10d shim calls (declared in `csrc-shim/rustccl.h`).
//!
//! Rules: every function catches panics and reports them as a status code;
//! errors leave their message in a thread-local buffer read through
//! `rustccl_last_error`; `rustccl_submit` owns every DLPack export handed to
//! it from the moment it is called, also when it fails.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use dlpack_rs::ffi::DLManagedTensor;

use crate::collectives::OpSpec;
use crate::comm::Communicator;
use crate::error::{Code, Error};
use crate::tensor::Tensor;
use crate::types::OpKind;
use crate::work::Work;

mod arena;

/// Opaque to C: stands for a leaked `Arc<Communicator>`.
pub struct RustcclComm {
    _private: [u8; 0],
}
/// Opaque to C: a boxed `Work`.
pub struct RustcclWork(Work);

#[repr(C)]
pub struct RustcclOpDesc {
    pub kind: i32,
    pub reduce_op: i32,
    pub root: i64,
    pub tag: i64,
    pub inputs: *const *mut DLManagedTensor,
    pub n_inputs: usize,
    pub outputs: *const *mut DLManagedTensor,
    pub n_outputs: usize,
    pub in_splits: *const i64,
    pub n_in_splits: usize,
    pub out_splits: *const i64,
    pub n_out_splits: usize,
    /// CUDA: the caller's current stream on the tensors' device.
    pub stream: u64,
    /// `RUSTCCL_OP_*` bits (rustccl.h).
    pub flags: u32,
}

/// `RUSTCCL_OP_SYNC`: the caller waits for the operation at once.
const OP_SYNC: u32 = 1;

/// Called once when a submitted work finishes: status 0 or an error code,
/// the error message (valid during the call), and the source rank of a
/// receive (-1 otherwise).
pub type RustcclDoneFn = extern "C" fn(ctx: *mut c_void, status: i32, message: *const c_char, source_rank: i32);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn fail(e: &Error) -> i32 {
    set_last_error(&e.to_string());
    e.code() as i32
}

fn guarded(what: &str, f: impl FnOnce() -> i32) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(p) => {
            let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            set_last_error(&format!("rustccl internal error: {what} panicked: {msg}"));
            Code::Internal as i32
        }
    }
}

/// The message of the last failed call on this thread (never null).
#[no_mangle]
pub extern "C" fn rustccl_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Wraps a communicator for the shim (called from `py`).
pub(crate) fn comm_into_raw(c: Arc<Communicator>) -> usize {
    // The shim receives an Arc<RustcclComm>-like pointer: store the Arc.
    Arc::into_raw(c) as usize
}

fn comm<'a>(c: *const RustcclComm) -> &'a Communicator {
    // SAFETY: `c` came from `comm_into_raw` (an `Arc<Communicator>` leaked
    // for the shim) and is released only by `rustccl_comm_release`, after
    // the last call that uses it.
    unsafe { &*(c as *const Communicator) }
}

#[no_mangle]
pub extern "C" fn rustccl_comm_release(c: *const RustcclComm) {
    if c.is_null() {
        return;
    }
    let _ = catch_unwind(|| {
        // SAFETY: see `comm`; this is the shim's single release.
        drop(unsafe { Arc::from_raw(c as *const Communicator) });
    });
}

/// Runs `f` with the GIL released: shutting down joins engine threads,
/// which may be waiting for the GIL to run a future's Python callbacks.
/// (Attaching is re-entrant, so this works whether or not the caller holds
/// the GIL; the limited API has no way to ask.)
fn without_gil<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    // SAFETY: reads interpreter state; allowed from any thread at any time.
    if unsafe { pyo3::ffi::Py_IsInitialized() } != 0 {
        pyo3::Python::attach(|py| py.detach(f))
    } else {
        f()
    }
}

/// Stops the communicator's engines (`abort`: interrupt running work);
/// idempotent.
#[no_mangle]
pub extern "C" fn rustccl_comm_shutdown(c: *const RustcclComm, abort: i32) {
    if c.is_null() {
        return;
    }
    let c = comm(c);
    let _ = catch_unwind(AssertUnwindSafe(|| without_gil(|| c.shutdown(abort != 0))));
}

#[no_mangle]
pub extern "C" fn rustccl_comm_seq(c: *const RustcclComm) -> u64 {
    if c.is_null() {
        return 0;
    }
    catch_unwind(AssertUnwindSafe(|| comm(c).seq())).unwrap_or(0)
}

/// Takes ownership of `n` exports at `p` as tensors. Every pointer is
/// consumed even if an earlier one is bad.
///
/// # Safety
/// `p` points to `n` `DLManagedTensor*` that the caller hands over.
unsafe fn take_tensors(op: &'static str, p: *const *mut DLManagedTensor, n: usize) -> Result<Vec<Tensor>, Error> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(Error::Internal(format!("{op}: null tensor array")));
    }
    let ptrs = std::slice::from_raw_parts(p, n);
    let mut out = Vec::with_capacity(n);
    let mut first_err = None;
    for &t in ptrs {
        match Tensor::from_managed(t) {
            Ok(t) => out.push(t),
            Err(why) => {
                first_err.get_or_insert(Error::unsupported(op, why));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// # Safety
/// `p` points to `n` i64 (or is null when `n == 0`).
unsafe fn i64s(p: *const i64, n: usize) -> Vec<i64> {
    if n == 0 || p.is_null() {
        Vec::new()
    } else {
        std::slice::from_raw_parts(p, n).to_vec()
    }
}

struct DoneCtx(*mut c_void);
// SAFETY: the shim's context is an opaque heap object that its callback
// accepts from any thread.
unsafe impl Send for DoneCtx {}

/// Submits `n_ops` operations as one work. On success stores the work in
/// `*out_work` and will call `done(ctx, ...)` exactly once (maybe before
/// this returns, on another thread). On failure returns an error code,
/// never calls `done`, and has released every tensor.
///
/// # Safety
/// `comm` comes from the shim's communicator handle; `ops` points to
/// `n_ops` descriptors whose arrays are valid for this call; the tensors
/// become rustccl's.
#[no_mangle]
pub unsafe extern "C" fn rustccl_submit(
    comm_ptr: *const RustcclComm,
    ops: *const RustcclOpDesc,
    n_ops: usize,
    timeout_ms: i64,
    done: Option<RustcclDoneFn>,
    ctx: *mut c_void,
    out_work: *mut *mut RustcclWork,
) -> i32 {
    guarded("submit", || {
        let _t = crate::profile::start(crate::profile::Span::CapiSubmit);
        // Take every tensor first, so that nothing leaks on any error path.
        let descs = if n_ops == 0 || ops.is_null() { &[][..] } else { std::slice::from_raw_parts(ops, n_ops) };
        let mut specs = Vec::with_capacity(descs.len());
        let mut first_err: Option<Error> = None;
        for d in descs {
            let kind = OpKind::from_i32(d.kind);
            let name = kind.map_or("collective", |k| k.name());
            let inputs = take_tensors(name, d.inputs, d.n_inputs);
            let outputs = take_tensors(name, d.outputs, d.n_outputs);
            match (kind, inputs, outputs) {
                (Some(kind), Ok(inputs), Ok(outputs)) => {
                    let mut s = OpSpec::new(kind);
                    s.reduce_op = d.reduce_op;
                    s.root = d.root;
                    s.tag = d.tag;
                    s.inputs = inputs;
                    s.outputs = outputs;
                    s.in_splits = i64s(d.in_splits, d.n_in_splits);
                    s.out_splits = i64s(d.out_splits, d.n_out_splits);
                    s.stream = d.stream;
                    s.sync = d.flags & OP_SYNC != 0;
                    specs.push(s);
                }
                (None, _, _) => {
                    first_err.get_or_insert(Error::Internal(format!("unknown operation kind {}", d.kind)));
                }
                (_, Err(e), _) | (_, _, Err(e)) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return fail(&e);
        }
        if comm_ptr.is_null() || out_work.is_null() {
            return fail(&Error::Internal("submit: null communicator or result pointer".into()));
        }
        let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        let callback = done.map(|f| {
            let ctx = DoneCtx(ctx);
            Box::new(move |r: &crate::error::Result<()>, source: Option<crate::types::Rank>| {
                let ctx = ctx;
                let (status, msg) = match r {
                    Ok(()) => (0, CString::default()),
                    Err(e) => (e.code() as i32, CString::new(e.to_string().replace('\0', " ")).unwrap_or_default()),
                };
                f(ctx.0, status, msg.as_ptr(), source.map_or(-1, |s| s as i32));
            }) as crate::work::Callback
        });
        match comm(comm_ptr).submit(specs, timeout, callback) {
            Ok(w) => {
                *out_work = Box::into_raw(Box::new(RustcclWork(w)));
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// 1 when `RUSTCCL_HOST_PROFILE=1` (the shim then times its own spans).
#[no_mangle]
pub extern "C" fn rustccl_host_profile_enabled() -> i32 {
    catch_unwind(crate::profile::enabled).unwrap_or(false) as i32
}

/// Adds one call of `nanos` to host-profile span `span` (`RUSTCCL_SPAN_*`).
#[no_mangle]
pub extern "C" fn rustccl_host_profile_add(span: i32, nanos: u64) {
    let _ = catch_unwind(|| crate::profile::add(usize::try_from(span).unwrap_or(usize::MAX), nanos));
}

/// Waits for a work; `timeout_ms < 0` waits without bound. Returns its
/// status (error message in `rustccl_last_error`).
#[no_mangle]
pub extern "C" fn rustccl_work_wait(w: *const RustcclWork, timeout_ms: i64) -> i32 {
    if w.is_null() {
        return fail(&Error::Internal("wait: null work".into()));
    }
    guarded("wait", || {
        // SAFETY: `w` came from `rustccl_submit` and is released only by
        // `rustccl_work_release`.
        let work = unsafe { &(*w).0 };
        let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        match work.wait(timeout) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}

/// Lets the calling thread move the work's engine on for a few tens of
/// microseconds (point-to-point works: it reads the rings itself), or run
/// a queued CPU collective itself, before it blocks on the work's future.
/// 1 once the work finished, else 0.
#[no_mangle]
pub extern "C" fn rustccl_work_drive(w: *const RustcclWork) -> i32 {
    if w.is_null() {
        return 1;
    }
    let _t = crate::profile::start(crate::profile::Span::WorkDrive);
    // SAFETY: as in `rustccl_work_wait`.
    catch_unwind(AssertUnwindSafe(|| unsafe { (*w).0.drive_briefly() } as i32)).unwrap_or(1)
}

#[no_mangle]
pub extern "C" fn rustccl_work_is_completed(w: *const RustcclWork) -> i32 {
    if w.is_null() {
        return 1;
    }
    // SAFETY: as in `rustccl_work_wait`.
    catch_unwind(AssertUnwindSafe(|| unsafe { (*w).0.is_completed() } as i32)).unwrap_or(1)
}

/// Source rank of a finished receive, -1 if unknown.
#[no_mangle]
pub extern "C" fn rustccl_work_source_rank(w: *const RustcclWork) -> i32 {
    if w.is_null() {
        return -1;
    }
    // SAFETY: as in `rustccl_work_wait`.
    catch_unwind(AssertUnwindSafe(|| unsafe { (*w).0.source() }.map_or(-1, |r| r as i32))).unwrap_or(-1)
}

/// For work on a GPU: returns its CUDA device and stores the stream it runs
/// on in `*stream`; -1 for CPU work.
#[no_mangle]
pub extern "C" fn rustccl_work_device(w: *const RustcclWork, stream: *mut u64) -> i32 {
    if w.is_null() {
        return -1;
    }
    // SAFETY: as in `rustccl_work_wait`; `stream` is null or writable.
    catch_unwind(AssertUnwindSafe(|| match unsafe { (*w).0.mark() } {
        Some(m) => {
            if !stream.is_null() {
                unsafe { *stream = m.stream() };
            }
            m.device()
        }
        None => -1,
    }))
    .unwrap_or(-1)
}

/// Makes `stream` (a CUDA stream handle) wait for a CUDA work, without
/// blocking the host.
#[no_mangle]
pub extern "C" fn rustccl_work_order_stream(w: *const RustcclWork, stream: u64) -> i32 {
    if w.is_null() {
        return fail(&Error::Internal("order_stream: null work".into()));
    }
    guarded("order_stream", || {
        let _t = crate::profile::start(crate::profile::Span::OrderStream);
        // SAFETY: as in `rustccl_work_wait`.
        match unsafe { (*w).0.mark() } {
            Some(m) => match m.order_after(stream) {
                Ok(()) => 0,
                Err(why) => fail(&Error::Internal(format!("ordering the caller's stream: {why}"))),
            },
            None => 0,
        }
    })
}

/// 0 while a work is pending or if it succeeded; otherwise its error code
/// (message in `rustccl_last_error`). Never blocks.
#[no_mangle]
pub extern "C" fn rustccl_work_error(w: *const RustcclWork) -> i32 {
    if w.is_null() {
        return 0;
    }
    guarded("work_error", || {
        // SAFETY: as in `rustccl_work_wait`.
        match unsafe { (*w).0.result() } {
            Some(Err(e)) => fail(&e),
            _ => 0,
        }
    })
}

/// Creates the group's NCCL communicator on `device` now (collective).
#[no_mangle]
pub extern "C" fn rustccl_comm_connect_cuda(c: *const RustcclComm, device: i32) -> i32 {
    if c.is_null() {
        return fail(&Error::Internal("connect: null communicator".into()));
    }
    guarded("connect_cuda", || match comm(c).connect_cuda(device) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    })
}

#[no_mangle]
pub extern "C" fn rustccl_work_release(w: *mut RustcclWork) {
    if !w.is_null() {
        // SAFETY: `w` came from `Box::into_raw` in `rustccl_submit`; the
        // shim releases it once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(w) })));
    }
}

fn ranks_of(v: Vec<i64>) -> Vec<crate::types::Rank> {
    v.into_iter().map(|r| usize::try_from(r).unwrap_or(usize::MAX)).collect()
}

/// gloo's monitored barrier: rank 0 names the ranks that did not arrive
/// within `timeout_ms`; the others learn the outcome (blocking).
#[no_mangle]
pub extern "C" fn rustccl_comm_monitored_barrier(c: *const RustcclComm, timeout_ms: i64, wait_all: i32) -> i32 {
    if c.is_null() {
        return fail(&Error::Internal("monitored_barrier: null communicator".into()));
    }
    let c = comm(c);
    let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
    guarded("monitored_barrier", || match without_gil(|| c.monitored_barrier(timeout, wait_all != 0)) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    })
}

/// torch's split: every rank of the group calls it with the sorted parent
/// ranks of its new group (`ranks`, `n`); `*out` receives the new group's
/// communicator (released with `rustccl_comm_release`), or null when this
/// rank is not one of `ranks`.
///
/// # Safety
/// `ranks` points to `n` i64; `group` is a NUL-terminated string; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rustccl_comm_split(
    c: *const RustcclComm,
    ranks: *const i64,
    n: usize,
    group: *const c_char,
    timeout_ms: i64,
    out: *mut *const RustcclComm,
) -> i32 {
    if c.is_null() || out.is_null() || group.is_null() {
        return fail(&Error::Internal("split: null argument".into()));
    }
    *out = std::ptr::null();
    let members = ranks_of(i64s(ranks, n));
    let name = std::ffi::CStr::from_ptr(group).to_string_lossy().into_owned();
    let c = comm(c);
    let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
    let mut made = None;
    let rc = guarded("split", || match without_gil(|| c.split(&members, &name, timeout)) {
        Ok(child) => {
            made = child;
            0
        }
        Err(e) => fail(&e),
    });
    if let Some(child) = made {
        *out = comm_into_raw(Arc::new(child)) as *const RustcclComm;
    }
    rc
}

/// torch's shrink: only survivors call it, with the sorted group ranks to
/// leave out; `abort` first aborts the group's work in flight. `*out`
/// receives the new group's communicator.
///
/// # Safety
/// `excluded` points to `n` i64; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rustccl_comm_shrink(
    c: *const RustcclComm,
    excluded: *const i64,
    n: usize,
    abort: i32,
    timeout_ms: i64,
    out: *mut *const RustcclComm,
) -> i32 {
    if c.is_null() || out.is_null() {
        return fail(&Error::Internal("shrink: null argument".into()));
    }
    *out = std::ptr::null();
    let gone = ranks_of(i64s(excluded, n));
    let c = comm(c);
    let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
    let mut made = None;
    let rc = guarded("shrink", || match without_gil(|| c.shrink(&gone, abort != 0, timeout)) {
        Ok(child) => {
            made = Some(child);
            0
        }
        Err(e) => fail(&e),
    });
    if let Some(child) = made {
        *out = comm_into_raw(Arc::new(child)) as *const RustcclComm;
    }
    rc
}

#[no_mangle]
pub extern "C" fn rustccl_comm_rank(c: *const RustcclComm) -> i32 {
    if c.is_null() {
        return -1;
    }
    catch_unwind(AssertUnwindSafe(|| comm(c).rank() as i32)).unwrap_or(-1)
}

#[no_mangle]
pub extern "C" fn rustccl_comm_size(c: *const RustcclComm) -> i32 {
    if c.is_null() {
        return -1;
    }
    catch_unwind(AssertUnwindSafe(|| comm(c).size() as i32)).unwrap_or(-1)
}

/// torch named the group (ProcessGroup::setGroupName): `rustccl.stats()`
/// and friends find the communicator under that name from now on.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rustccl_comm_set_name(c: *const RustcclComm, name: *const c_char) {
    if c.is_null() || name.is_null() {
        return;
    }
    let name = std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: see `comm`; a new strong reference for the registry's
        // upgrade check, dropped at the end of this block.
        let arc = unsafe {
            Arc::increment_strong_count(c as *const Communicator);
            Arc::from_raw(c as *const Communicator)
        };
        crate::comm::stats::register_as(&arc, &name);
    }));
}
