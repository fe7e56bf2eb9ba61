//! The `rustccl._rustccl` Python module: the communicator for the
//! torch backend (bootstrapped from torch's store, handed to the C++ shim),
//! and a small torch-free API that runs the same collectives on any
//! DLPack-capable CPU array (numpy at least).
#![forbid(unsafe_code)]

mod communicator;
mod groups;
mod info;

use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bootstrap::addr;
use crate::config::{Config, SETTINGS};
use crate::error::{Code, Error};

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.code() {
        Code::InvalidArgument | Code::Unsupported => PyValueError::new_err(msg),
        Code::Timeout | Code::WaitTimeout => PyTimeoutError::new_err(msg),
        Code::Network => PyConnectionError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
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

/// Times this process's waiting threads moved off a CPU another local
/// rank's polling thread shared (also `stats()["thread_moves"]`).
#[pyfunction]
fn _thread_moves() -> u64 {
    crate::comm::stats::thread_moves()
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
    m.add_class::<communicator::PyCommunicator>()?;
    m.add_function(wrap_pyfunction!(config, m)?)?;
    m.add_function(wrap_pyfunction!(_thread_moves, m)?)?;
    m.add_function(wrap_pyfunction!(host_identity, m)?)?;
    m.add_function(wrap_pyfunction!(_shm_tensors_requested, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_stats, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_reset_stats, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_flight_record, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_failed_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_shutdown_all, m)?)?;
    m.add_function(wrap_pyfunction!(_one_shot_ptx, m)?)?;
    m.add_function(wrap_pyfunction!(info::build_info, m)?)?;
    m.add_function(wrap_pyfunction!(info::_nccl_version, m)?)?;
    m.add_function(wrap_pyfunction!(info::_cuda_report, m)?)?;
    m.add_function(wrap_pyfunction!(info::_groups, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_set_compression, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_compression, m)?)?;
    m.add_function(wrap_pyfunction!(groups::_compress_next, m)?)?;
    m.add_function(wrap_pyfunction!(_peer_limits, m)?)?;
    m.add_function(wrap_pyfunction!(_host_profile, m)?)?;
    Ok(())
}
