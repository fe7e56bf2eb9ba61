//! Functions on the live groups of this process, found by torch's group
//! name: counters, the flight record, failed ranks, compression, shutdown.
#![forbid(unsafe_code)]

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::to_py;

pub(super) fn stats_dict<'py>(py: Python<'py>, c: &crate::comm::Communicator) -> PyResult<Bound<'py, PyDict>> {
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
pub(super) fn _stats<'py>(py: Python<'py>, group: &str) -> PyResult<Bound<'py, PyDict>> {
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.stats: no live rustccl process group named {group:?}")))?;
    stats_dict(py, &c)
}

/// Resets the counters of `group`, or of every group when None.
#[pyfunction]
#[pyo3(signature = (group=None))]
pub(super) fn _reset_stats(group: Option<&str>) -> PyResult<()> {
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
pub(super) fn _flight_record(group: &str, dir: Option<&str>) -> PyResult<String> {
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
pub(super) fn _shutdown_all(py: Python<'_>) {
    let live = crate::comm::stats::all();
    py.detach(move || live.iter().for_each(|c| c.shutdown(false)));
}

/// Ranks of group `group` whose link to this rank broke (dead ranks).
#[pyfunction]
pub(super) fn _failed_ranks(group: &str) -> PyResult<Vec<usize>> {
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.failed_ranks: no live rustccl process group named {group:?}")))?;
    Ok(c.failed_ranks())
}

pub(super) fn codec_setting(codec: Option<&str>, error_feedback: bool, who: &str) -> PyResult<Option<crate::comm::compression::Setting>> {
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
pub(super) fn _set_compression(group: &str, codec: Option<&str>, error_feedback: bool) -> PyResult<()> {
    let s = codec_setting(codec, error_feedback, "rustccl.set_compression")?;
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.set_compression: no live rustccl process group named {group:?}")))?;
    c.set_compression(s);
    Ok(())
}

/// The codec of group `group` (None when exact) and whether error feedback is on.
#[pyfunction]
pub(super) fn _compression(group: &str) -> PyResult<Option<(String, bool)>> {
    let c = crate::comm::stats::lookup(group)
        .ok_or_else(|| PyValueError::new_err(format!("rustccl.compression: no live rustccl process group named {group:?}")))?;
    Ok(c.compression().map(|s| (s.codec.name().to_string(), s.feedback)))
}

/// The next collective this thread submits to group `group` compresses
/// with `codec` (None / "none": exact), error feedback under `key`.
#[pyfunction]
#[pyo3(signature = (group, codec, key, error_feedback=true))]
pub(super) fn _compress_next(group: &str, codec: Option<&str>, key: &str, error_feedback: bool) -> PyResult<()> {
    let s = codec_setting(codec, error_feedback, "rustccl.hooks.engine_compression")?;
    crate::comm::compression::set_next(group, s, key);
    Ok(())
}
