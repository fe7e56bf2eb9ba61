//! `rustccl.Communicator`: one process group's communicator, bootstrapped
//! through a store, running collectives and send / receive on DLPack-capable
//! CPU arrays (numpy at least) and handed to the torch backend's C++ shim.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::groups::{codec_setting, stats_dict};
use super::to_py;
use crate::bootstrap::{addr, Store};
use crate::collectives::OpSpec;
use crate::comm::CommOptions;
use crate::config::Config;
use crate::error::Error;
use crate::tensor::Tensor;
use crate::types::{Device, OpKind, ReduceOp};

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
pub(super) struct PyCommunicator {
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
