//! The one place where DLPack pointers are dereferenced.
//!
//! A [`Tensor`] owns one DLPack export (it calls the producer's deleter when
//! dropped; one imported from Python it may share with the caller's
//! [`PyHold`], and the last to let go releases it), so a collective holding
//! it keeps the caller's memory alive until it completes. Host memory is
//! only ever touched through [`CpuTensor`], whose slices exist only for
//! CPU, contiguous, aligned tensors.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dlpack_rs::ffi::{DLDeviceType, DLManagedTensor, DLTensor};

use crate::types::{DType, Device};

/// What keeps a tensor's memory alive, and how to let go of it.
enum Owner {
    /// A legacy `DLManagedTensor*` handed to us (by the C++ shim).
    Managed(NonNull<DLManagedTensor>),
    /// A capsule imported from Python (`__dlpack__`), shared with the
    /// caller's [`PyHold`] where it took one: whichever lets go last
    /// releases it, under the GIL.
    #[cfg(feature = "python")]
    Py(#[allow(dead_code)] Arc<PyExport>),
    /// Memory rustccl allocated itself (scratch, staging).
    Vec(#[allow(dead_code)] Vec<u64>),
    /// Memory lent by a [`SharedBuf`]; returned to it on drop.
    Lent(Arc<SharedBuf>),
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Owner::Lent(b) = self {
            b.lent.store(false, Ordering::Release);
        }
        if let Owner::Managed(p) = self {
            // SAFETY: `p` came from `Tensor::from_managed`, whose contract
            // gives us sole ownership of the export; this is the only call of
            // its deleter. Deleters of torch / numpy exports do not unwind.
            unsafe {
                if let Some(del) = (*p.as_ptr()).deleter {
                    del(p.as_ptr());
                }
            }
        }
    }
}

/// A hold on a Python export that a [`Tensor`] also holds
/// ([`Tensor::py_hold`]).
#[cfg(feature = "python")]
pub struct PyHold(#[allow(dead_code)] Arc<PyExport>);

/// A Python export held by a tensor and its caller's [`PyHold`]: a DLPack
/// capsule, or a numpy array read in place (`ndarray.rs`).
#[cfg(feature = "python")]
enum PyExport {
    Capsule(#[allow(dead_code)] dlpack_rs::pyo3_glue::PyTensor),
    Array(#[allow(dead_code)] pyo3::Py<pyo3::PyAny>),
}

// SAFETY: nothing reads an export through a shared reference: its holders
// only keep it and drop it, and the last drop (under the GIL, which the
// producer's deleter takes itself) releases it once.
#[cfg(feature = "python")]
unsafe impl Sync for PyExport {}

/// A tensor on any device, with its metadata read once.
pub struct Tensor {
    data: *mut u8,
    numel: usize,
    dtype: DType,
    device: Device,
    shape: Vec<i64>,
    contiguous: bool,
    /// Never read: it releases the memory when the tensor drops.
    #[allow(dead_code)]
    owner: Owner,
}

// SAFETY: a Tensor is the sole owner of its DLPack export, or shares a
// Python export with its caller's `PyHold` (an `Arc` of a `Sync` holder);
// the exporters we accept (torch, numpy) allow the deleter to run on any
// thread (the Python owner takes the GIL itself). The data pointer is only
// dereferenced through CpuTensor, under Rust's borrow rules.
unsafe impl Send for Tensor {}

/// Reads metadata of a DLTensor. Returns an error string for layouts that
/// cannot be described (bad dtype).
///
/// # Safety
/// `t` must point to a valid DLTensor whose `shape` has `ndim` entries and
/// whose `strides` is null or has `ndim` entries.
unsafe fn describe(t: &DLTensor) -> Result<(DType, Device, Vec<i64>, bool, usize), String> {
    let ndim = t.ndim.max(0) as usize;
    let shape: Vec<i64> = if ndim == 0 || t.shape.is_null() { Vec::new() } else { std::slice::from_raw_parts(t.shape, ndim).to_vec() };
    let strides: Option<Vec<i64>> =
        if t.strides.is_null() || ndim == 0 { None } else { Some(std::slice::from_raw_parts(t.strides, ndim).to_vec()) };
    let dtype = DType::from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes)
        .ok_or_else(|| format!("unsupported DLPack dtype (code {}, bits {}, lanes {})", t.dtype.code, t.dtype.bits, t.dtype.lanes))?;
    let device = match t.device.device_type {
        DLDeviceType::kDLCPU => Device::Cpu,
        DLDeviceType::kDLCUDA => Device::Cuda(t.device.device_id),
        k => Device::Other { kind: k, index: t.device.device_id },
    };
    if shape.iter().any(|&d| d < 0) {
        return Err(format!("negative dimension in shape {shape:?}"));
    }
    let numel = shape.iter().product::<i64>() as usize;
    let contiguous = is_row_major(&shape, strides.as_deref());
    Ok((dtype, device, shape, contiguous, numel))
}

/// Compact row-major check that ignores strides of size-1 dimensions (as
/// torch does) and treats empty tensors as contiguous.
fn is_row_major(shape: &[i64], strides: Option<&[i64]>) -> bool {
    let Some(strides) = strides else { return true };
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected *= d;
    }
    true
}

impl Tensor {
    /// Takes ownership of a legacy DLPack export. On error the export is
    /// still released.
    ///
    /// # Safety
    /// `ptr` must be a valid `DLManagedTensor*` that nobody else will release,
    /// whose memory stays valid until its deleter runs.
    pub unsafe fn from_managed(ptr: *mut DLManagedTensor) -> Result<Tensor, String> {
        let ptr = NonNull::new(ptr).ok_or("null DLManagedTensor")?;
        let owner = Owner::Managed(ptr);
        let t = &(*ptr.as_ptr()).dl_tensor;
        let (dtype, device, shape, contiguous, numel) = describe(t)?;
        let data = (t.data as *mut u8).wrapping_add(t.byte_offset as usize);
        Ok(Tensor { data, numel, dtype, device, shape, contiguous, owner })
    }

    /// Imports a numpy array in place (`ndarray.rs`), or any other Python
    /// object with `__dlpack__` through its export.
    #[cfg(feature = "python")]
    pub fn from_py(py: pyo3::Python<'_>, obj: &pyo3::Bound<'_, pyo3::PyAny>) -> pyo3::PyResult<Result<Tensor, String>> {
        if let Some(v) = super::ndarray::view(obj) {
            let v = match v {
                Ok(v) => v,
                Err(why) => return Ok(Err(why)),
            };
            let numel = v.shape.iter().product::<i64>() as usize;
            let owner = Owner::Py(Arc::new(PyExport::Array(obj.clone().unbind())));
            return Ok(Ok(Tensor { data: v.data, numel, dtype: v.dtype, device: Device::Cpu, shape: v.shape, contiguous: true, owner }));
        }
        let pt = dlpack_rs::pyo3_glue::PyTensor::from_pyany(py, obj)?;
        let ptr = pt.data_ptr() as *mut u8;
        let offset = pt.byte_offset() as usize;
        let dt = pt.dtype();
        let Some(dtype) = DType::from_dlpack(dt.code, dt.bits, dt.lanes) else {
            return Ok(Err(format!("unsupported dtype (DLPack code {}, bits {})", dt.code, dt.bits)));
        };
        let dev = pt.device();
        let device = match dev.device_type {
            DLDeviceType::kDLCPU => Device::Cpu,
            DLDeviceType::kDLCUDA => Device::Cuda(dev.device_id),
            k => Device::Other { kind: k, index: dev.device_id },
        };
        let shape = pt.shape().to_vec();
        let contiguous = is_row_major(&shape, pt.strides());
        let numel = pt.numel();
        let owner = Owner::Py(Arc::new(PyExport::Capsule(pt)));
        Ok(Ok(Tensor { data: ptr.wrapping_add(offset), numel, dtype, device, shape, contiguous, owner }))
    }

    /// A second hold on an export imported from Python ([`Tensor::from_py`]),
    /// for a caller that waits for the operation with the GIL released and
    /// drops the hold once it has the GIL again: the export is then released
    /// there, where releasing it on the engine's side would take the GIL
    /// once more (the producer's deleter needs it).
    #[cfg(feature = "python")]
    pub fn py_hold(&self) -> Option<PyHold> {
        match &self.owner {
            Owner::Py(pt) => Some(PyHold(pt.clone())),
            _ => None,
        }
    }

    /// A fresh, zeroed, 8-byte aligned CPU tensor of `numel` elements.
    pub fn zeros(dtype: DType, numel: usize) -> Tensor {
        let nbytes = numel * dtype.size();
        let mut v = vec![0u64; nbytes.div_ceil(8)];
        let data = v.as_mut_ptr() as *mut u8;
        Tensor { data, numel, dtype, device: Device::Cpu, shape: vec![numel as i64], contiguous: true, owner: Owner::Vec(v) }
    }

    /// A CPU tensor holding a copy of `values`.
    pub fn from_slice<T: bytemuck::Pod>(dtype: DType, values: &[T]) -> Tensor {
        assert_eq!(std::mem::size_of::<T>(), dtype.size(), "element size of {dtype}");
        let mut t = Tensor::zeros(dtype, values.len());
        let bytes: &[u8] = bytemuck::cast_slice(values);
        t.host_mut_unchecked().copy_from_slice(bytes);
        t
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn numel(&self) -> usize {
        self.numel
    }
    pub fn nbytes(&self) -> usize {
        self.numel * self.dtype.size()
    }
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }
    /// Address of the first element; for overlap checks and device pointers.
    pub fn addr(&self) -> usize {
        self.data as usize
    }
    /// True when the data pointer is aligned to the element size.
    pub fn is_aligned(&self) -> bool {
        self.nbytes() == 0 || self.addr() % self.dtype.size().min(8) == 0
    }

    /// Byte range `[start, end)` of the tensor's memory.
    pub fn span(&self) -> (usize, usize) {
        (self.addr(), self.addr() + self.nbytes())
    }

    fn host_mut_unchecked(&mut self) -> &mut [u8] {
        let n = self.nbytes();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: only called on tensors rustccl allocated (Owner::Vec), whose
        // buffer has at least `nbytes` bytes and is borrowed through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.data, n) }
    }
}

/// Host memory that can be lent to one [`Tensor`] at a time and read back
/// once that tensor is gone (the engine drops an operation's tensors before
/// it finishes the work, so a finished work means the memory is back, but
/// for the operation that broke or aborted a group with peers on the host,
/// whose tensors it keeps for good: `comm::cpu`, `Exec::kept`).
/// Used by tests and by callers that keep their own buffers.
pub struct SharedBuf {
    words: UnsafeCell<Vec<u64>>,
    nbytes: usize,
    dtype: DType,
    lent: AtomicBool,
}

// SAFETY: the buffer is written only through the one Tensor it is lent to
// (`lent` is set while that tensor lives) and read only while it is not lent.
unsafe impl Sync for SharedBuf {}
unsafe impl Send for SharedBuf {}

impl SharedBuf {
    pub fn new<T: bytemuck::Pod>(dtype: DType, values: &[T]) -> Arc<SharedBuf> {
        assert_eq!(std::mem::size_of::<T>(), dtype.size(), "element size of {dtype}");
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Arc::new(SharedBuf { words: UnsafeCell::new(words), nbytes: bytes.len(), dtype, lent: AtomicBool::new(false) })
    }

    /// `numel` zeroed elements of `dtype`.
    pub fn zeros(dtype: DType, numel: usize) -> Arc<SharedBuf> {
        let nbytes = numel * dtype.size();
        Arc::new(SharedBuf { words: UnsafeCell::new(vec![0u64; nbytes.div_ceil(8)]), nbytes, dtype, lent: AtomicBool::new(false) })
    }

    /// Lends the memory to a tensor; `None` while it is lent already.
    pub fn tensor(self: &Arc<Self>) -> Option<Tensor> {
        if self.lent.swap(true, Ordering::Acquire) {
            return None;
        }
        // SAFETY: `lent` was false, so no tensor aliases the vector; the
        // pointer stays valid because the tensor's owner holds this Arc and
        // the vector is never resized.
        let data = unsafe { (*self.words.get()).as_mut_ptr() as *mut u8 };
        let numel = self.nbytes / self.dtype.size();
        Some(Tensor {
            data,
            numel,
            dtype: self.dtype,
            device: Device::Cpu,
            shape: vec![numel as i64],
            contiguous: true,
            owner: Owner::Lent(self.clone()),
        })
    }

    /// The raw bytes, copied; `None` while lent.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        self.to_vec::<u8>()
    }

    /// A copy of the contents; `None` while a tensor still uses the memory.
    pub fn to_vec<T: bytemuck::Pod>(&self) -> Option<Vec<T>> {
        if self.lent.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: not lent, so nothing writes the vector concurrently.
        let words = unsafe { &*self.words.get() };
        Some(bytemuck::pod_collect_to_vec(&bytemuck::cast_slice::<u64, u8>(words)[..self.nbytes]))
    }
}

/// A CPU, contiguous, element-aligned tensor: the only kind whose bytes the
/// CPU algorithms touch.
pub struct CpuTensor(Tensor);

impl CpuTensor {
    /// Checks that `t` lives on the CPU, is contiguous and aligned.
    pub fn new(t: Tensor) -> Result<CpuTensor, String> {
        if t.device != Device::Cpu {
            return Err(format!("expected a CPU tensor, got one on {}", t.device));
        }
        if !t.contiguous {
            return Err(format!("tensor of shape {:?} is not contiguous", t.shape));
        }
        if !t.is_aligned() {
            return Err(format!("tensor data at {:#x} is not aligned to its {}-byte elements", t.addr(), t.dtype.size()));
        }
        Ok(CpuTensor(t))
    }

    pub fn meta(&self) -> &Tensor {
        &self.0
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    pub fn numel(&self) -> usize {
        self.0.numel
    }
    pub fn nbytes(&self) -> usize {
        self.0.nbytes()
    }
    pub fn span(&self) -> (usize, usize) {
        self.0.span()
    }
    pub fn into_inner(self) -> Tensor {
        self.0
    }

    pub fn bytes(&self) -> &[u8] {
        let n = self.0.nbytes();
        if n == 0 {
            return &[];
        }
        // SAFETY: CpuTensor::new checked the tensor is on the CPU and
        // contiguous, so `nbytes` bytes from `data` are the tensor's memory,
        // kept alive by `owner`. Op construction rejects tensors that overlap
        // another tensor of the same operation, so no other live slice
        // aliases this one.
        unsafe { std::slice::from_raw_parts(self.0.data, n) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.0.nbytes();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and `&mut self` makes this borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.0.data, n) }
    }

    /// Copies the elements out (tests and small results).
    pub fn to_vec<T: bytemuck::Pod>(&self) -> Vec<T> {
        bytemuck::pod_collect_to_vec(self.bytes())
    }
}

/// Copies `len` bytes from `src` at `src_off` into `dst` at `dst_off`, also
/// when the two regions overlap (memmove semantics).
///
/// Panics if a range falls outside its tensor (callers pass validated
/// offsets; a panic here is a rustccl bug caught at the C ABI boundary).
pub fn copy_region(dst: &mut CpuTensor, dst_off: usize, src: &CpuTensor, src_off: usize, len: usize) {
    assert!(dst_off + len <= dst.nbytes() && src_off + len <= src.nbytes(), "copy_region out of bounds");
    if len == 0 {
        return;
    }
    let s = src.0.data.wrapping_add(src_off) as *const u8;
    let d = dst.0.data.wrapping_add(dst_off);
    if std::ptr::eq(s, d) {
        return;
    }
    // SAFETY: both ranges lie inside CPU tensors checked by CpuTensor::new
    // (asserted above) and kept alive by their owners; `ptr::copy` allows
    // overlap. No slice of either tensor is alive during the copy.
    unsafe { std::ptr::copy(s, d, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_ignores_unit_dims() {
        assert!(is_row_major(&[2, 3], Some(&[3, 1])));
        assert!(is_row_major(&[1, 3], Some(&[99, 1])));
        assert!(!is_row_major(&[2, 3], Some(&[1, 2])));
        assert!(is_row_major(&[0, 3], Some(&[1, 7])));
        assert!(is_row_major(&[4], None));
    }

    #[test]
    fn owned_tensors_round_trip() {
        let t = CpuTensor::new(Tensor::from_slice(DType::I32, &[1i32, 2, 3])).unwrap();
        assert_eq!(t.to_vec::<i32>(), vec![1, 2, 3]);
        assert_eq!(t.nbytes(), 12);
    }

    /// A hand-made DLManagedTensor whose deleter counts calls.
    #[test]
    fn managed_exports_are_released_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static FREED: AtomicUsize = AtomicUsize::new(0);
        struct Ctx {
            data: Vec<f32>,
            shape: [i64; 1],
        }
        unsafe extern "C" fn deleter(p: *mut DLManagedTensor) {
            drop(Box::from_raw((*p).manager_ctx as *mut Ctx));
            drop(Box::from_raw(p));
            FREED.fetch_add(1, Ordering::SeqCst);
        }
        let mut ctx = Box::new(Ctx { data: vec![1.0, 2.0], shape: [2] });
        let tensor = DLTensor {
            data: ctx.data.as_mut_ptr() as *mut _,
            device: dlpack_rs::safe::cpu_device(),
            ndim: 1,
            dtype: dlpack_rs::safe::dtype_f32(),
            shape: ctx.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let m = Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: Box::into_raw(ctx) as *mut _,
            deleter: Some(deleter),
        }));
        let t = unsafe { Tensor::from_managed(m) }.unwrap();
        let h = CpuTensor::new(t).unwrap();
        assert_eq!(h.to_vec::<f32>(), vec![1.0, 2.0]);
        drop(h);
        assert_eq!(FREED.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn shared_buffers_are_lent_once() {
        let b = SharedBuf::new(DType::I64, &[5i64, 6]);
        let t = b.tensor().unwrap();
        assert!(b.tensor().is_none());
        assert!(b.to_vec::<i64>().is_none());
        let mut h = CpuTensor::new(t).unwrap();
        h.bytes_mut()[0] = 7;
        drop(h);
        assert_eq!(b.to_vec::<i64>().unwrap(), vec![7, 6]);
    }
}
