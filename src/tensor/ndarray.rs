//! numpy arrays read in place: the common case of the torch-free API,
//! without the DLPack export (a capsule, a managed tensor and a deleter
//! per call) that costs as much as a small collective's own work.
//!
//! C-contiguous, aligned arrays of a dtype rustccl names take this path; a
//! read-only array or one in foreign byte order is refused with the fix
//! (DLPack cannot describe either). Every other object goes through
//! `__dlpack__`.

use std::sync::atomic::{AtomicBool, Ordering};

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::types::DType;

/// An array's memory and layout, read from its header.
pub(super) struct ArrayView {
    pub data: *mut u8,
    pub dtype: DType,
    pub shape: Vec<i64>,
}

/// numpy is imported: until then no object is an array, and asking numpy's
/// C API would import it (or fail where it cannot).
static NUMPY_LOADED: AtomicBool = AtomicBool::new(false);

fn numpy_loaded(py: Python<'_>) -> bool {
    if NUMPY_LOADED.load(Ordering::Relaxed) {
        return true;
    }
    let loaded = py
        .import("sys")
        .and_then(|s| s.getattr("modules"))
        .ok()
        .and_then(|m| m.cast_into::<PyDict>().ok())
        .is_some_and(|m| m.contains("numpy").unwrap_or(false));
    if loaded {
        NUMPY_LOADED.store(true, Ordering::Relaxed);
    }
    loaded
}

/// The dtype of numpy's `kind` and `itemsize`, as DLPack would name it
/// ([`DType::from_dlpack`]); None for kinds DLPack has no code for and for
/// dtypes rustccl does not name (those go through `__dlpack__`, as before).
fn dtype_of(kind: u8, itemsize: usize) -> Option<DType> {
    use dlpack_rs::ffi::DLDataTypeCode as C;
    let code = match kind {
        b'f' => C::kDLFloat,
        b'i' => C::kDLInt,
        b'u' => C::kDLUInt,
        b'b' => C::kDLBool,
        _ => return None,
    };
    match DType::from_dlpack(code as u8, u8::try_from(itemsize * 8).ok()?, 1)? {
        DType::Other { .. } => None,
        d => Some(d),
    }
}

/// `obj` as a numpy array read in place, the reason it cannot be used, or
/// None where it goes through DLPack (not an array, or a layout this path
/// does not take).
pub(super) fn view(obj: &Bound<'_, PyAny>) -> Option<Result<ArrayView, String>> {
    if !numpy_loaded(obj.py()) {
        return None;
    }
    let arr = obj.cast::<PyUntypedArray>().ok()?;
    if !arr.is_c_contiguous() || !arr.is_aligned() {
        return None;
    }
    // SAFETY: `arr` is a live numpy array (checked above), so its header
    // is a PyArrayObject; the flags are read, not kept.
    let flags = unsafe { (*arr.as_array_ptr()).flags };
    if flags & numpy::npyffi::NPY_ARRAY_WRITEABLE == 0 {
        return Some(Err("the array is read-only (flags.writeable is False): pass a writeable copy".into()));
    }
    let descr = arr.dtype();
    if descr.is_native_byteorder() == Some(false) {
        return Some(Err(format!(
            "the array's dtype {} is not in this machine's byte order: pass arr.astype(arr.dtype.newbyteorder(\"=\"))",
            descr.str().map(|s| s.to_string()).unwrap_or_default()
        )));
    }
    let dtype = dtype_of(descr.kind(), descr.itemsize())?;
    // SAFETY: as above; the data pointer stays valid while the caller holds
    // the array (it keeps a reference for as long as the tensor lives, which
    // also makes numpy refuse to resize it in place).
    let data = unsafe { (*arr.as_array_ptr()).data } as *mut u8;
    let shape = arr.shape().iter().map(|&d| d as i64).collect();
    Some(Ok(ArrayView { data, dtype, shape }))
}
