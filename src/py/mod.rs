//! The `rustccl._rustccl` Python module: the communicator for the
//! torch backend (bootstrapped from torch's store, handed to the C++ shim),
//! and a small torch-free API that runs the same collectives on any
//! DLPack-capable CPU array (numpy at least).
#![forbid(unsafe_code)]

mod info;

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::bootstrap::{addr, Store};
use crate::collectives::OpSpec;
use crate::comm::CommOptions;
use crate::config::{Config, SETTINGS};
use crate::error::{Code, Error};
use crate::tensor::Tensor;
use crate::types::{Device, OpKind, ReduceOp};

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.code() {
        Code::InvalidArgument | Code::Unsupported => PyValueError::new_err(msg),
        Code::Timeout | Code::WaitTimeout => PyTimeoutError::new_err(msg),
        Code::Network => PyConnectionError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// Any Python object with `set(key, value)`, `get(key) -> bytes` and
/// `add(key, int) -> int` (torch's stores, `rustccl.FileStore`).
struct PyStore(Py<PyAny>);

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        Python::attach(|py| {
            self.0.bind(py).call_method1("set", (key, PyBytes::new(py, value))).map(|_| ()).map_err(|e| format!("store.set({key:?}): {e}"))
        })
    }

    fn get(&self, key: &str, _timeout: Duration) -> Result<Vec<u8>, String> {
        // torch stores block in get() up to their own timeout, which torch
        // sets to the group's timeout.
        Python::attach(|py| {
            let v = self.0.bind(py).call_method1("get", (key,)).map_err(|e| format!("store.get({key:?}): {e}"))?;
            v.extract::<Vec<u8>>().map_err(|e| format!("store.get({key:?}) returned a non-bytes value: {e}"))
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, String> {
        Python::attach(|py| {
            let v = self.0.bind(py).call_method1("add", (key, delta)).map_err(|e| format!("store.add({key:?}): {e}"))?;
            v.extract::<i64>().map_err(|e| format!("store.add({key:?}): {e}"))
        })
    }
}

/// A rustccl communicator: one process group.
#[pyclass(name = "Communicator", module = "rustccl._rustccl", frozen)]
struct PyCommunicator {
    inner: Arc<crate::comm::Communicator>,
}

fn tensor(py: Python<'_>, op: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    Tensor::from_py(py, obj)?.map_err(|why| to_py(Error::unsupported(op, why)))
}

fn tensors(py: Python<'_>, op: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<Tensor>> {
    if let Ok(list) = obj.cast::<PyList>() {
        list.iter().map(|o| tensor(py, op, &o)).collect()
    } else {
        Ok(vec![tensor(py, op, obj)?])
    }
}

fn reduce_op(name: &str) -> PyResult<i32> {
    ReduceOp::from_name(name)
        .map(|o| o as i32)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl: unknown reduce op {name:?} (sum, avg, product, min, max, band, bor, bxor)")))
}

/// Sends and receives up to this size are submitted holding the GIL.
const GIL_HELD_MAX: usize = 64 << 10;

/// Whether `spec` is submitted without releasing the GIL first: a small
/// send or receive on CPU, which is mostly finished by its submit (a send
/// written into a local peer's ring, a receive whose message is in), and
/// whose submit copies at most `GIL_HELD_MAX` bytes of its own and takes no
/// lock held across a pass (`comm::p2p`). Releasing and taking the GIL back
/// costs about a tenth of such a call; one that is not finished releases
/// it to wait.
fn holds_gil(spec: &OpSpec) -> bool {
    matches!(spec.kind, OpKind::Send | OpKind::Recv)
        && spec.inputs.iter().chain(&spec.outputs).all(|t| t.device() == Device::Cpu && t.nbytes() <= GIL_HELD_MAX)
}

impl PyCommunicator {
    /// Submits one operation and waits for it with the GIL released (a
    /// small send or receive: once it is not finished by its submit).
    fn run(&self, py: Python<'_>, mut spec: OpSpec) -> PyResult<Option<usize>> {
        let comm = self.inner.clone();
        // It waits at once: the engine leaves the operation to this thread
        // instead of waking its worker for it.
        spec.sync = true;
        // The arrays' exports are released here, under the GIL, after the
        // engine let go of its holds without it.
        // (The first apart: most calls pass one array, and need no list.)
        let mut holds = spec.inputs.iter().chain(&spec.outputs).filter_map(|t| t.py_hold());
        let holds = (holds.next(), holds.collect::<Vec<_>>());
        // The work records a receive's source before it finishes, so it is
        // known once wait() returns.
        let r = if holds_gil(&spec) {
            comm.submit(vec![spec], None, None).and_then(|w| {
                match w.result() {
                    Some(r) => r?,
                    None => py.detach(|| w.wait(None))?,
                }
                Ok(w.source())
            })
        } else {
            py.detach(move || {
                let w = comm.submit(vec![spec], None, None)?;
                w.wait(None)?;
                Ok(w.source())
            })
        };
        drop(holds);
        r.map_err(to_py)
    }
}

#[pymethods]
impl PyCommunicator {
    /// Rendezvous through `store` (an object with set / get / add) and
    /// connect to every peer; `settings`: the group's own `RUSTCCL_*`
    /// settings ((name, value) pairs) over the process's.
    #[staticmethod]
    #[pyo3(signature = (store, rank, size, timeout_s=1800.0, group="default", host_hint=None, settings=None))]
    #[allow(clippy::too_many_arguments)]
    fn bootstrap(
        py: Python<'_>,
        store: Py<PyAny>,
        rank: usize,
        size: usize,
        timeout_s: f64,
        group: &str,
        host_hint: Option<String>,
        settings: Option<Vec<(String, String)>>,
    ) -> PyResult<PyCommunicator> {
        let cfg = Config::get();
        let timeout = Duration::from_secs_f64(timeout_s.max(0.001));
        cfg.check_process().map_err(|reason| to_py(Error::invalid("init_process_group", reason)))?;
        let opts = CommOptions::with_settings(group, timeout, settings.unwrap_or_default()).map_err(to_py)?;
        let listen =
            addr::listen_ip(cfg.socket_ifname.as_deref(), host_hint.as_deref()).map_err(|e| to_py(Error::Bootstrap { rank, detail: e }))?;
        let store = PyStore(store);
        let comm = py.detach(|| crate::comm::Communicator::bootstrap(&store, rank, size, opts, listen)).map_err(to_py)?;
        let inner = Arc::new(comm);
        crate::comm::stats::register(&inner);
        Ok(PyCommunicator { inner })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Set where the peers' settings differ from this rank's (the
    /// rendezvous compares them): which, and what that can do.
    #[getter]
    fn settings_warning(&self) -> Option<String> {
        self.inner.settings_warning().map(str::to_string)
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    #[getter]
    fn group(&self) -> String {
        self.inner.group().to_string()
    }

    /// This communicator's counters (as `rustccl.stats(group)`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner)
    }

    /// A new reference to the communicator as an integer handle, owned by
    /// whoever receives it (the C++ shim releases it).
    fn _into_raw(&self) -> usize {
        crate::capi::comm_into_raw(self.inner.clone())
    }

    /// The first error that left this group unusable (None while it works):
    /// a lost peer, a timeout, an abort of work in flight.
    fn error(&self) -> Option<String> {
        self.inner.fatal_error()
    }

    /// Ranks whose link to this one broke under an operation, sorted.
    fn failed_ranks(&self) -> Vec<usize> {
        self.inner.failed_ranks()
    }

    /// Compresses this group's later float SUM / AVG all-reduces between
    /// hosts with `codec` (None / "none": exact), as `rustccl.set_compression`.
    #[pyo3(signature = (codec, error_feedback=true))]
    fn set_compression(&self, codec: Option<&str>, error_feedback: bool) -> PyResult<()> {
        self.inner.set_compression(codec_setting(codec, error_feedback, "Communicator.set_compression")?);
        Ok(())
    }

    /// Creates this group's NCCL communicator on CUDA device `device` now
    /// (every rank must call it) instead of on the first CUDA collective.
    fn connect_cuda(&self, py: Python<'_>, device: i32) -> PyResult<()> {
        let c = self.inner.clone();
        py.detach(move || c.connect_cuda(device)).map_err(to_py)
    }

    /// The NCCL version in use, once a CUDA collective ran (else None).
    fn nccl_version(&self) -> Option<String> {
        self.inner.nccl_version()
    }

    /// Stops the engines (`abort=True` interrupts a running collective).
    #[pyo3(signature = (abort=false))]
    fn shutdown(&self, py: Python<'_>, abort: bool) {
        let c = self.inner.clone();
        py.detach(move || c.shutdown(abort));
    }

    #[pyo3(signature = (array, op="sum"))]
    fn all_reduce(&self, py: Python<'_>, array: &Bound<'_, PyAny>, op: &str) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::AllReduce);
        s.reduce_op = reduce_op(op)?;
        s.inputs = tensors(py, "all_reduce", array)?;
        self.run(py, s).map(|_| ())
    }

    #[pyo3(signature = (array, root=0))]
    fn broadcast(&self, py: Python<'_>, array: &Bound<'_, PyAny>, root: i64) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::Broadcast);
        s.root = root;
        s.inputs = vec![tensor(py, "broadcast", array)?];
        self.run(py, s).map(|_| ())
    }

    #[pyo3(signature = (array, root=0, op="sum"))]
    fn reduce(&self, py: Python<'_>, array: &Bound<'_, PyAny>, root: i64, op: &str) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::Reduce);
        s.root = root;
        s.reduce_op = reduce_op(op)?;
        s.inputs = vec![tensor(py, "reduce", array)?];
        self.run(py, s).map(|_| ())
    }

    /// `output`: one array of world size x len(input), or a list of arrays.
    fn all_gather(&self, py: Python<'_>, output: &Bound<'_, PyAny>, input: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::AllGather);
        s.inputs = vec![tensor(py, "all_gather", input)?];
        s.outputs = tensors(py, "all_gather", output)?;
        self.run(py, s).map(|_| ())
    }

    /// `input`: one array of world size x len(output), or a list of arrays.
    #[pyo3(signature = (output, input, op="sum"))]
    fn reduce_scatter(&self, py: Python<'_>, output: &Bound<'_, PyAny>, input: &Bound<'_, PyAny>, op: &str) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::ReduceScatter);
        s.reduce_op = reduce_op(op)?;
        s.inputs = tensors(py, "reduce_scatter", input)?;
        s.outputs = vec![tensor(py, "reduce_scatter", output)?];
        self.run(py, s).map(|_| ())
    }

    /// Arrays split along dimension 0 (evenly, or by the split sizes), or
    /// lists of one array per rank.
    #[pyo3(signature = (output, input, output_splits=None, input_splits=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        output_splits: Option<Vec<i64>>,
        input_splits: Option<Vec<i64>>,
    ) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::AllToAll);
        s.inputs = tensors(py, "all_to_all", input)?;
        s.outputs = tensors(py, "all_to_all", output)?;
        s.in_splits = input_splits.unwrap_or_default();
        s.out_splits = output_splits.unwrap_or_default();
        self.run(py, s).map(|_| ())
    }

    /// `outputs` only at the root: one array of world size x len(input), or
    /// a list of arrays, one per rank.
    #[pyo3(signature = (input, outputs=None, root=0))]
    fn gather(&self, py: Python<'_>, input: &Bound<'_, PyAny>, outputs: Option<&Bound<'_, PyAny>>, root: i64) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::Gather);
        s.root = root;
        s.inputs = vec![tensor(py, "gather", input)?];
        if let Some(o) = outputs {
            s.outputs = tensors(py, "gather", o)?;
        }
        self.run(py, s).map(|_| ())
    }

    /// `inputs` only at the root: one array of world size x len(output), or
    /// a list of arrays, one per rank.
    #[pyo3(signature = (output, inputs=None, root=0))]
    fn scatter(&self, py: Python<'_>, output: &Bound<'_, PyAny>, inputs: Option<&Bound<'_, PyAny>>, root: i64) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::Scatter);
        s.root = root;
        s.outputs = vec![tensor(py, "scatter", output)?];
        if let Some(i) = inputs {
            s.inputs = tensors(py, "scatter", i)?;
        }
        self.run(py, s).map(|_| ())
    }

    #[pyo3(signature = (array, dst, tag=0))]
    fn send(&self, py: Python<'_>, array: &Bound<'_, PyAny>, dst: i64, tag: i64) -> PyResult<()> {
        let mut s = OpSpec::new(OpKind::Send);
        s.root = dst;
        s.tag = tag;
        s.inputs = vec![tensor(py, "send", array)?];
        self.run(py, s).map(|_| ())
    }

    /// Receives into `array`; `src=None` takes any sender. Returns the
    /// sender's rank.
    #[pyo3(signature = (array, src=None, tag=0))]
    fn recv(&self, py: Python<'_>, array: &Bound<'_, PyAny>, src: Option<i64>, tag: i64) -> PyResult<Option<usize>> {
        let mut s = OpSpec::new(OpKind::Recv);
        s.root = src.unwrap_or(-1);
        s.tag = tag;
        s.outputs = vec![tensor(py, "recv", array)?];
        self.run(py, s)
    }

    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, OpSpec::new(OpKind::Barrier)).map(|_| ())
    }

    fn __repr__(&self) -> String {
        format!(
            "Communicator(group={:?}, rank={}, size={}, transport={})",
            self.inner.group(),
            self.inner.rank(),
            self.inner.size(),
            self.inner.transport_kind()
        )
    }
}

/// The effective `RUSTCCL_*` settings: {name: {"value", "default", "doc"}};
/// with `group` (a group name), that group's (its own settings over the
/// process's).
#[pyfunction]
#[pyo3(signature = (group=None))]
fn config(py: Python<'_>, group: Option<&str>) -> PyResult<Py<PyDict>> {
    let out = PyDict::new(py);
    let cfg = Config::get();
    let effective = match group {
        None => cfg.effective(),
        Some(g) => {
            let c = crate::comm::stats::lookup(g)
                .ok_or_else(|| PyValueError::new_err(format!("rustccl.config: no live rustccl process group named {g:?}")))?;
            cfg.effective_for(c.group_config())
        }
    };
    for (name, value) in effective {
        let d = PyDict::new(py);
        d.set_item("value", value)?;
        if let Some(s) = SETTINGS.iter().find(|s| s.name == name) {
            d.set_item("default", s.default)?;
            d.set_item("doc", s.doc)?;
            d.set_item("kind", s.kind.name())?;
        }
        out.set_item(name, d)?;
    }
    Ok(out.unbind())
}

fn stats_dict<'py>(py: Python<'py>, c: &crate::comm::Communicator) -> PyResult<Bound<'py, PyDict>> {
    use crate::comm::stats::bus_factor;
    let out = PyDict::new(py);
    out.set_item("group", c.group())?;
    out.set_item("rank", c.rank())?;
    out.set_item("size", c.size())?;
    out.set_item("transport", c.transport_kind())?;
    out.set_item("links", c.link_kinds().to_vec())?;
    out.set_item("nccl", c.nccl_version())?;
    let th = PyDict::new(py);
    for (k, v) in c.thresholds() {
        th.set_item(*k, *v)?;
    }
    out.set_item("thresholds", th)?;
    let own = PyDict::new(py);
    for (k, v) in c.settings() {
        own.set_item(k, v)?;
    }
    out.set_item("settings", own)?;
    out.set_item("thread_moves", crate::comm::stats::thread_moves())?;
    match crate::comm::stats::shared_tensors() {
        Some(kv) => {
            let d = PyDict::new(py);
            for (k, v) in kv {
                d.set_item(k, v)?;
            }
            out.set_item("shared_tensors", d)?;
        }
        None => out.set_item("shared_tensors", py.None())?,
    }
    let ops = PyDict::new(py);
    for (name, s) in c.stats().snapshot() {
        let d = PyDict::new(py);
        d.set_item("calls", s.calls)?;
        d.set_item("errors", s.errors)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("timed_calls", s.timed_calls)?;
        d.set_item("total_s", s.total.as_secs_f64())?;
        let bw = |bytes: u64, secs: f64| if secs > 0.0 { bytes as f64 / secs / 1e9 } else { 0.0 };
        let algbw = bw(s.timed_bytes, s.total.as_secs_f64());
        d.set_item("avg_us", if s.timed_calls > 0 { s.total.as_secs_f64() * 1e6 / s.timed_calls as f64 } else { 0.0 })?;
        d.set_item("algbw_GBps", algbw)?;
        d.set_item("busbw_GBps", algbw * bus_factor(name, c.size()))?;
        let (rb, rt) = s.recent.iter().fold((0u64, 0f64), |(b, t), (x, y)| (b + x, t + y.as_secs_f64()));
        let n = s.recent.len().max(1) as f64;
        d.set_item("recent_calls", s.recent.len())?;
        d.set_item("recent_avg_us", rt * 1e6 / n)?;
        d.set_item("recent_busbw_GBps", bw(rb, rt) * bus_factor(name, c.size()))?;
        d.set_item("algorithm", s.algorithm)?;
        let algorithms = PyDict::new(py);
        for (a, n) in &s.algorithms {
            algorithms.set_item(*a, *n)?;
        }
        d.set_item("algorithms", algorithms)?;
        d.set_item("transport", s.transport)?;
        d.set_item("between_hosts_bytes", s.between_hosts_bytes)?;
        d.set_item("codec", s.codec)?;
        d.set_item("by_caller", s.by_caller)?;
        ops.set_item(name, d)?;
    }
    out.set_item("ops", ops)?;
    Ok(out)
}

/// Counters of the group named `group` (torch's group name).
#[pyfunction]
fn _stats<'py>(py: Python<'py>, group: &str) -> PyResult<Bound<'py, PyDict>> {
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.stats: no live rustccl process group named {group:?}")))?;
    stats_dict(py, &c)
}

/// Resets the counters of `group`, or of every group when None.
#[pyfunction]
#[pyo3(signature = (group=None))]
fn _reset_stats(group: Option<&str>) -> PyResult<()> {
    match group {
        Some(g) => crate::comm::stats::lookup(g)
            .ok_or_else(|| PyValueError::new_err(format!("rustccl.reset_stats: no live rustccl process group named {g:?}")))?
            .stats()
            .reset(),
        None => crate::comm::stats::all().iter().for_each(|c| c.stats().reset()),
    }
    Ok(())
}

/// The flight record of group `group` as JSON; also written to `dir`.
#[pyfunction]
#[pyo3(signature = (group, dir=None))]
fn _flight_record(group: &str, dir: Option<&str>) -> PyResult<String> {
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.flight_record: no live rustccl process group named {group:?}")))?;
    c.flight_record(dir).map_err(to_py)
}

/// Stops every live communicator's engines after the work already queued
/// (as `destroy_process_group` would; idempotent). Registered with
/// `atexit` by the torch backend: a script that ends without
/// `destroy_process_group` must not leave engine threads completing torch
/// futures while the process runs its exit handlers and C++ static
/// destructors (an 8-byte broadcast loop that ended so aborted with
/// "terminate called without an active exception" in about 1 of 15 exits).
#[pyfunction]
fn _shutdown_all(py: Python<'_>) {
    let live = crate::comm::stats::all();
    py.detach(move || live.iter().for_each(|c| c.shutdown(false)));
}

/// Times this process's waiting threads moved off a CPU another local
/// rank's polling thread shared (also `stats()["thread_moves"]`).
#[pyfunction]
fn _thread_moves() -> u64 {
    crate::comm::stats::thread_moves()
}

/// Ranks of group `group` whose link to this rank broke (dead ranks).
#[pyfunction]
fn _failed_ranks(group: &str) -> PyResult<Vec<usize>> {
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.failed_ranks: no live rustccl process group named {group:?}")))?;
    Ok(c.failed_ranks())
}

fn codec_setting(codec: Option<&str>, error_feedback: bool, who: &str) -> PyResult<Option<crate::comm::compression::Setting>> {
    use crate::collectives::compress::codec::Codec;
    match codec {
        None | Some("none") | Some("") => Ok(None),
        Some(name) => Codec::from_name(name)
            .map(|codec| Some(crate::comm::compression::Setting { codec, feedback: error_feedback }))
            .ok_or_else(|| PyValueError::new_err(format!("{who}: unknown codec {name:?} (known: none, bf16, fp16, int8)"))),
    }
}

/// Compresses the later float SUM / AVG all-reduces of group `group`
/// between hosts with `codec` (None / "none": exact).
#[pyfunction]
#[pyo3(signature = (group, codec, error_feedback=true))]
fn _set_compression(group: &str, codec: Option<&str>, error_feedback: bool) -> PyResult<()> {
    let s = codec_setting(codec, error_feedback, "rustccl.set_compression")?;
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.set_compression: no live rustccl process group named {group:?}")))?;
    c.set_compression(s);
    Ok(())
}

/// The codec of group `group` (None when exact) and whether error feedback is on.
#[pyfunction]
fn _compression(group: &str) -> PyResult<Option<(String, bool)>> {
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.compression: no live rustccl process group named {group:?}")))?;
    Ok(c.compression().map(|s| (s.codec.name().to_string(), s.feedback)))
}

/// The next collective this thread submits to group `group` compresses
/// with `codec` (None / "none": exact), error feedback under `key`.
#[pyfunction]
#[pyo3(signature = (group, codec, key, error_feedback=true))]
fn _compress_next(group: &str, codec: Option<&str>, key: &str, error_feedback: bool) -> PyResult<()> {
    let s = codec_setting(codec, error_feedback, "rustccl.hooks.engine_compression")?;
    crate::comm::compression::set_next(group, s, key);
    Ok(())
}

/// Whether `RUSTCCL_SHM_TENSORS` asks for shared tensors, read now (not
/// through `config()`, which would freeze every setting at `import
/// rustccl`).
#[pyfunction]
fn _shm_tensors_requested() -> bool {
    crate::config::env_flag("RUSTCCL_SHM_TENSORS")
}

/// This host's identity as rustccl sees it (for debugging placement).
#[pyfunction]
fn host_identity() -> String {
    addr::host_identity()
}

/// The NVLink kernels' size limits for a group of `world` ranks under the
/// current settings: (one-shot all_reduce, any all_reduce, all_gather /
/// reduce_scatter) in bytes (tests and the benchmark read them).
#[pyfunction]
fn _peer_limits(world: usize) -> (usize, usize, usize) {
    crate::config::Config::get().peer_limits(world)
}

/// Host time per span of rustccl's collectives (RUSTCCL_HOST_PROFILE=1):
/// (span, calls, nanoseconds); `reset` zeroes the sums.
#[pyfunction]
#[pyo3(signature = (reset=false))]
fn _host_profile(reset: bool) -> Vec<(&'static str, u64, u64)> {
    crate::profile::snapshot(reset)
}

/// PTX of the NVLink kernels (one-shot, two-shot, all-gather, reduce-scatter) for compute capability
/// (`major`, `minor`), compiled with NVRTC; no GPU needed (tests).
#[pyfunction]
fn _one_shot_ptx(major: i32, minor: i32) -> PyResult<String> {
    crate::comm::nccl::custom::ptx((major, minor)).map_err(|e| PyRuntimeError::new_err(format!("rustccl: {e}")))
}

#[pymodule]
fn _rustccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyCommunicator>()?;
    m.add_function(wrap_pyfunction!(config, m)?)?;
    m.add_function(wrap_pyfunction!(_thread_moves, m)?)?;
    m.add_function(wrap_pyfunction!(host_identity, m)?)?;
    m.add_function(wrap_pyfunction!(_shm_tensors_requested, m)?)?;
    m.add_function(wrap_pyfunction!(_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_reset_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_flight_record, m)?)?;
    m.add_function(wrap_pyfunction!(_failed_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(_shutdown_all, m)?)?;
    m.add_function(wrap_pyfunction!(_one_shot_ptx, m)?)?;
    m.add_function(wrap_pyfunction!(info::build_info, m)?)?;
    m.add_function(wrap_pyfunction!(info::_nccl_version, m)?)?;
    m.add_function(wrap_pyfunction!(info::_cuda_report, m)?)?;
    m.add_function(wrap_pyfunction!(info::_groups, m)?)?;
    m.add_function(wrap_pyfunction!(_set_compression, m)?)?;
    m.add_function(wrap_pyfunction!(_compression, m)?)?;
    m.add_function(wrap_pyfunction!(_compress_next, m)?)?;
    m.add_function(wrap_pyfunction!(_peer_limits, m)?)?;
    m.add_function(wrap_pyfunction!(_host_profile, m)?)?;
    Ok(())
}
