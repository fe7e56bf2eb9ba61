//! What this build and process see, for `rustccl.info()` (python/rustccl/info.py
//! puts the pieces together): the torch the build was compiled against, the
//! CUDA driver, devices and their peer links, NCCL's version, and for each
//! live group the link to every peer.
#![forbid(unsafe_code)]

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::cuda;

/// How this extension was built: its version, and the torch (version, CUDA
/// flavour, C++ ABI flag) its prebuilt shim was compiled against (None:
/// the build saw no torch and the wheel has no prebuilt shim).
#[pyfunction]
pub fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("rustccl", env!("CARGO_PKG_VERSION"))?;
    let version = env!("RUSTCCL_TORCH_VERSION");
    if version.is_empty() {
        out.set_item("torch", py.None())?;
    } else {
        let torch = PyDict::new(py);
        torch.set_item("version", version)?;
        let cuda = env!("RUSTCCL_TORCH_CUDA");
        torch.set_item("cuda", (!cuda.is_empty()).then_some(cuda))?;
        torch.set_item("cxx11_abi", env!("RUSTCCL_TORCH_CXX11_ABI").starts_with('1'))?;
        out.set_item("torch", torch)?;
    }
    out.set_item("debug_assertions", cfg!(debug_assertions))?;
    Ok(out)
}

/// Version of the libnccl CUDA collectives use; RuntimeError with the
/// reason when none can be loaded.
#[pyfunction]
pub fn _nccl_version() -> PyResult<String> {
    crate::comm::nccl::library_version().map_err(PyRuntimeError::new_err)
}

/// How `dev` reaches `peer`: "nvlink" (peer access with native atomics, what
/// the one-shot all-reduce needs), "pcie" (peer access without them) or "none".
fn peer_kind(dev: i32, peer: i32) -> cuda::CudaResult<&'static str> {
    Ok(match cuda::peer_link(dev, peer)? {
        (true, true) => "nvlink",
        (true, false) => "pcie",
        (false, _) => "none",
    })
}

/// The CUDA driver and the visible devices: {"driver", "devices": [{index,
/// name, compute_capability, pci_bus_id}], "peers": matrix of peer_kind
/// ("self" on the diagonal)}. RuntimeError when there is no driver.
#[pyfunction]
pub fn _cuda_report(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let fail = |e: cuda::CudaError| PyRuntimeError::new_err(e.0);
    let (major, minor) = cuda::driver_version().map_err(fail)?;
    let n = cuda::device_count().map_err(fail)?;
    let devices = PyList::empty(py);
    let peers = PyList::empty(py);
    for d in 0..n {
        let dev = PyDict::new(py);
        dev.set_item("index", d)?;
        dev.set_item("name", cuda::device_name(d).map_err(fail)?)?;
        let (cc_major, cc_minor) = cuda::compute_capability(d).map_err(fail)?;
        dev.set_item("compute_capability", format!("{cc_major}.{cc_minor}"))?;
        dev.set_item("pci_bus_id", cuda::pci_bus_id(d).map_err(fail)?)?;
        devices.append(dev)?;
        let row: Vec<&str> = (0..n).map(|p| if p == d { Ok("self") } else { peer_kind(d, p) }).collect::<Result<_, _>>().map_err(fail)?;
        peers.append(row)?;
    }
    let out = PyDict::new(py);
    out.set_item("driver", format!("{major}.{minor}"))?;
    out.set_item("devices", devices)?;
    out.set_item("peers", peers)?;
    Ok(out)
}

/// One live group as this rank sees it.
fn group_dict<'py>(py: Python<'py>, c: &crate::comm::Communicator) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("group", c.group())?;
    out.set_item("rank", c.rank())?;
    out.set_item("size", c.size())?;
    out.set_item("transport", c.transport_kind())?;
    let links = c.link_kinds();
    let peers = PyList::empty(py);
    for p in c.peers() {
        let d = PyDict::new(py);
        d.set_item("rank", p.rank)?;
        let link = if p.rank == c.rank() { "self" } else { links.get(p.rank).copied().unwrap_or("") };
        d.set_item("link", link)?;
        d.set_item("addr", p.addr.to_string())?;
        d.set_item("host", &p.host)?;
        d.set_item("pid", p.pid)?;
        peers.append(d)?;
    }
    out.set_item("peers", peers)?;
    out.set_item("single_host", !c.peers().is_empty() && c.peers().iter().all(|p| p.host == c.peers()[0].host))?;
    out.set_item("nccl", c.nccl_version())?;
    // CUDA, once the group ran a CUDA collective: its device, and per device
    // the one-shot all-reduce's buffer bytes (None: off).
    let cuda = match c.one_shot_state() {
        None => None,
        Some((device, per)) => {
            let d = PyDict::new(py);
            d.set_item("device", device)?;
            let state = PyDict::new(py);
            for (dev, bytes) in per {
                state.set_item(dev, bytes)?;
            }
            d.set_item("one_shot_bytes", state)?;
            Some(d)
        }
    };
    out.set_item("cuda", cuda)?;
    Ok(out)
}

/// Every live rustccl group of this process, ordered by name.
#[pyfunction]
pub fn _groups(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let mut comms = crate::comm::stats::all();
    comms.sort_by(|a, b| a.group().cmp(b.group()));
    let out = PyList::empty(py);
    for c in comms {
        out.append(group_dict(py, &c)?)?;
    }
    Ok(out)
}
