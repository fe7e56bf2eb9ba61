//! The NCCL entry points rustccl calls, loaded at run time.
//!
//! Types come from `cudarc::nccl::sys`. The library is opened by its soname
//! `libnccl.so.2`, so the NCCL torch already loaded (from its `nvidia-nccl`
//! wheel) is the one used; cudarc 0.19's own loader only tries names such as
//! `libnccl.so` and `libnccl.so.13`, which torch's wheel does not provide.
//! `RUSTCCL_NCCL_LIBRARY` names another file. Every status code becomes an
//! error string here, and only here.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use libloading::Library;

type Status = u32; // ncclResult_t, read as an integer so unknown codes are not UB
type Stream = *mut c_void;

/// Function pointers into libnccl.
pub struct NcclLib {
    _lib: Library,
    pub version: i32,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> Status,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> Status,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> Status,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> Status,
    comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut Status) -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, ncclComm_t, Stream) -> Status,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, ncclComm_t, Stream) -> Status,
    reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, c_int, ncclComm_t, Stream) -> Status,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclComm_t, Stream) -> Status,
    reduce_scatter: unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, ncclComm_t, Stream) -> Status,
    send: unsafe extern "C" fn(*const c_void, usize, ncclDataType_t, c_int, ncclComm_t, Stream) -> Status,
    recv: unsafe extern "C" fn(*mut c_void, usize, ncclDataType_t, c_int, ncclComm_t, Stream) -> Status,
    group_start: unsafe extern "C" fn() -> Status,
    group_end: unsafe extern "C" fn() -> Status,
}

// SAFETY: plain function pointers into a library that stays loaded for the
// life of the process (the OnceLock below never drops it).
unsafe impl Send for NcclLib {}
unsafe impl Sync for NcclLib {}

const SUCCESS: Status = 0;
const IN_PROGRESS: Status = 7;

fn open() -> Result<Library, String> {
    // An explicit RUSTCCL_NCCL_LIBRARY is the only candidate: no silent
    // fallback to another NCCL.
    let names: Vec<String> = match &crate::config::Config::get().nccl_library {
        Some(p) => vec![p.clone()],
        None => vec!["libnccl.so.2".into(), "libnccl.so".into()],
    };
    let mut errors = Vec::new();
    for n in &names {
        // SAFETY: loading NCCL runs its initialisers, which have no
        // preconditions; torch usually has loaded this same file already.
        match unsafe { Library::new(n) } {
            Ok(l) => return Ok(l),
            Err(e) => errors.push(format!("{n}: {e}")),
        }
    }
    Err(format!("libnccl could not be loaded ({})", errors.join("; ")))
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol has the C signature declared in NcclLib (NCCL's
        // public API, stable since 2.x).
        *unsafe { $lib.get($name) }.map_err(|e| format!("libnccl lacks {}: {e}", String::from_utf8_lossy(&$name[..$name.len() - 1])))?
    };
}

impl NcclLib {
    fn load() -> Result<NcclLib, String> {
        let lib = open()?;
        let get_version: unsafe extern "C" fn(*mut c_int) -> Status = sym!(lib, b"ncclGetVersion\0");
        let mut version = 0;
        // SAFETY: valid out-pointer.
        unsafe { get_version(&mut version) };
        Ok(NcclLib {
            version,
            get_unique_id: sym!(lib, b"ncclGetUniqueId\0"),
            comm_init_rank: sym!(lib, b"ncclCommInitRank\0"),
            comm_destroy: sym!(lib, b"ncclCommDestroy\0"),
            comm_abort: sym!(lib, b"ncclCommAbort\0"),
            comm_get_async_error: sym!(lib, b"ncclCommGetAsyncError\0"),
            get_error_string: sym!(lib, b"ncclGetErrorString\0"),
            get_last_error: sym!(lib, b"ncclGetLastError\0"),
            all_reduce: sym!(lib, b"ncclAllReduce\0"),
            broadcast: sym!(lib, b"ncclBroadcast\0"),
            reduce: sym!(lib, b"ncclReduce\0"),
            all_gather: sym!(lib, b"ncclAllGather\0"),
            reduce_scatter: sym!(lib, b"ncclReduceScatter\0"),
            send: sym!(lib, b"ncclSend\0"),
            recv: sym!(lib, b"ncclRecv\0"),
            group_start: sym!(lib, b"ncclGroupStart\0"),
            group_end: sym!(lib, b"ncclGroupEnd\0"),
            _lib: lib,
        })
    }

    /// The process-wide NCCL, loaded on first use.
    pub fn get() -> Result<&'static NcclLib, String> {
        static LIB: OnceLock<Result<NcclLib, String>> = OnceLock::new();
        LIB.get_or_init(NcclLib::load).as_ref().map_err(|e| e.clone())
    }

    /// "major.minor.patch" of the loaded library.
    pub fn version_string(&self) -> String {
        let v = self.version;
        if v >= 10000 {
            format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
        } else {
            format!("{}.{}.{}", v / 1000, (v / 100) % 10, v % 100)
        }
    }

    /// Turns a status into a result naming the call and NCCL's reason.
    pub fn check(&self, what: &str, comm: ncclComm_t, s: Status) -> Result<(), String> {
        if s == SUCCESS || s == IN_PROGRESS {
            return Ok(());
        }
        // SAFETY: NCCL returns static, NUL-terminated strings.
        let name = unsafe { CStr::from_ptr((self.get_error_string)(s)) }.to_string_lossy().into_owned();
        let last = if comm.is_null() {
            String::new()
        } else {
            // SAFETY: as above; `comm` is a live communicator.
            let p = unsafe { (self.get_last_error)(comm) };
            if p.is_null() {
                String::new()
            } else {
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        Err(if last.is_empty() { format!("{what}: {name}") } else { format!("{what}: {name} ({last})") })
    }

    pub fn unique_id(&self) -> Result<ncclUniqueId, String> {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        let s = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", std::ptr::null_mut(), s)?;
        Ok(id)
    }

    /// Blocks until all `nranks` ranks joined (bind the device's context first).
    pub fn init_rank(&self, nranks: usize, id: ncclUniqueId, rank: usize) -> Result<ncclComm_t, String> {
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; id is 128 bytes by value.
        let s = unsafe { (self.comm_init_rank)(&mut comm, nranks as c_int, id, rank as c_int) };
        self.check("ncclCommInitRank", std::ptr::null_mut(), s)?;
        Ok(comm)
    }

    /// # Safety
    /// `comm` must be live and not used again.
    pub unsafe fn destroy(&self, comm: ncclComm_t) {
        let _ = (self.comm_destroy)(comm);
    }

    /// # Safety
    /// `comm` must be live and not used again.
    pub unsafe fn abort(&self, comm: ncclComm_t) {
        let _ = (self.comm_abort)(comm);
    }

    /// An asynchronous error of `comm`, if any.
    ///
    /// # Safety
    /// `comm` must be live.
    pub unsafe fn async_error(&self, comm: ncclComm_t) -> Result<(), String> {
        let mut e: Status = SUCCESS;
        let s = (self.comm_get_async_error)(comm, &mut e);
        self.check("ncclCommGetAsyncError", comm, s)?;
        self.check("NCCL asynchronous error", comm, e)
    }

    pub fn group_start(&self) -> Result<(), String> {
        // SAFETY: no arguments; balanced by group_end.
        self.check("ncclGroupStart", std::ptr::null_mut(), unsafe { (self.group_start)() })
    }

    pub fn group_end(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        self.check("ncclGroupEnd", std::ptr::null_mut(), unsafe { (self.group_end)() })
    }
}

/// One NCCL call; counts are in elements of `dt`. The planner builds them
/// over its own addresses (`plan::PCall`), [`NcclLib::launch`] takes raw
/// device pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call<A = u64> {
    AllReduce { buf: A, count: usize, dt: ncclDataType_t, op: ncclRedOp_t },
    Broadcast { buf: A, count: usize, dt: ncclDataType_t, root: usize },
    Reduce { buf: A, count: usize, dt: ncclDataType_t, op: ncclRedOp_t, root: usize },
    AllGather { send: A, recv: A, count: usize, dt: ncclDataType_t },
    ReduceScatter { send: A, recv: A, count: usize, dt: ncclDataType_t, op: ncclRedOp_t },
    Send { buf: A, count: usize, dt: ncclDataType_t, peer: usize },
    Recv { buf: A, count: usize, dt: ncclDataType_t, peer: usize },
}

impl<A> Call<A> {
    /// The same call with every address passed through `f`.
    pub fn map<B>(self, f: impl Fn(A) -> B) -> Call<B> {
        match self {
            Call::AllReduce { buf, count, dt, op } => Call::AllReduce { buf: f(buf), count, dt, op },
            Call::Broadcast { buf, count, dt, root } => Call::Broadcast { buf: f(buf), count, dt, root },
            Call::Reduce { buf, count, dt, op, root } => Call::Reduce { buf: f(buf), count, dt, op, root },
            Call::AllGather { send, recv, count, dt } => Call::AllGather { send: f(send), recv: f(recv), count, dt },
            Call::ReduceScatter { send, recv, count, dt, op } => Call::ReduceScatter { send: f(send), recv: f(recv), count, dt, op },
            Call::Send { buf, count, dt, peer } => Call::Send { buf: f(buf), count, dt, peer },
            Call::Recv { buf, count, dt, peer } => Call::Recv { buf: f(buf), count, dt, peer },
        }
    }
}

impl NcclLib {
    /// Enqueues `call` on `stream`.
    ///
    /// # Safety
    /// `comm` is live; every pointer in `call` is device memory of the
    /// communicator's device holding `count` elements, alive until the
    /// call has run on `stream`.
    pub unsafe fn launch(&self, comm: ncclComm_t, stream: u64, call: Call) -> Result<(), String> {
        let st = stream as Stream;
        let p = |x: u64| x as *mut c_void;
        let (what, s) = match call {
            Call::AllReduce { buf, count, dt, op } => ("ncclAllReduce", (self.all_reduce)(p(buf), p(buf), count, dt, op, comm, st)),
            Call::Broadcast { buf, count, dt, root } => {
                ("ncclBroadcast", (self.broadcast)(p(buf), p(buf), count, dt, root as c_int, comm, st))
            }
            Call::Reduce { buf, count, dt, op, root } => {
                ("ncclReduce", (self.reduce)(p(buf), p(buf), count, dt, op, root as c_int, comm, st))
            }
            Call::AllGather { send, recv, count, dt } => ("ncclAllGather", (self.all_gather)(p(send), p(recv), count, dt, comm, st)),
            Call::ReduceScatter { send, recv, count, dt, op } => {
                ("ncclReduceScatter", (self.reduce_scatter)(p(send), p(recv), count, dt, op, comm, st))
            }
            Call::Send { buf, count, dt, peer } => ("ncclSend", (self.send)(p(buf), count, dt, peer as c_int, comm, st)),
            Call::Recv { buf, count, dt, peer } => ("ncclRecv", (self.recv)(p(buf), count, dt, peer as c_int, comm, st)),
        };
        self.check(what, comm, s)
    }
}
