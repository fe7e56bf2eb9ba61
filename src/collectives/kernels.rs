//! Element-wise reduction kernels over byte buffers.
//!
//! Every kernel is a straight loop over two (or three) slices of one element
//! type so that the compiler vectorises it. f16 / bf16 are widened to f32 in
//! blocks (through `half`'s slice conversions), reduced, and narrowed back.
//! `Avg` reduces as `Sum`; [`finish_avg`] divides once at the end.
//!
//! Buffers come from validated tensors (element-aligned) or from
//! [`Scratch`], which is 8-byte aligned.
#![forbid(unsafe_code)]

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

/// Why `op` cannot reduce `dtype`, if it cannot.
pub fn check(op: ReduceOp, dtype: DType) -> std::result::Result<(), String> {
    use ReduceOp::*;
    match dtype {
        DType::Other { .. } => Err(format!("reductions are not supported for dtype {dtype}")),
        DType::Bool if op == Avg => Err("ReduceOp.AVG is not defined for bool tensors".into()),
        d if d.is_float() && matches!(op, BAnd | BOr | BXor) => {
            Err(format!("bitwise ReduceOp.{} needs an integer or bool tensor, got {dtype}", op.name()))
        }
        _ => Ok(()),
    }
}

// Empty slices may carry a dangling, unaligned pointer: answer them directly.
fn cast<T: bytemuck::Pod>(b: &[u8]) -> Result<&[T]> {
    if b.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(b).map_err(|e| Error::Internal(format!("reduce: misaligned buffer: {e:?}")))
}

fn cast_mut<T: bytemuck::Pod>(b: &mut [u8]) -> Result<&mut [T]> {
    if b.is_empty() {
        return Ok(&mut []);
    }
    bytemuck::try_cast_slice_mut(b).map_err(|e| Error::Internal(format!("reduce: misaligned buffer: {e:?}")))
}

#[inline(always)]
fn zip_into<T: Copy>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (a, b) in acc.iter_mut().zip(src) {
        *a = f(*a, *b);
    }
}

#[inline(always)]
fn zip_out<T: Copy>(out: &mut [T], x: &[T], y: &[T], f: impl Fn(T, T) -> T) {
    for ((o, a), b) in out.iter_mut().zip(x).zip(y) {
        *o = f(*a, *b);
    }
}

/// NaN-propagating max / min, like `torch.maximum` / `torch.minimum`.
macro_rules! float_minmax {
    ($max:ident, $min:ident, $t:ty) => {
        #[inline(always)]
        fn $max(a: $t, b: $t) -> $t {
            if a > b || a.is_nan() {
                a
            } else {
                b
            }
        }
        #[inline(always)]
        fn $min(a: $t, b: $t) -> $t {
            if a < b || a.is_nan() {
                a
            } else {
                b
            }
        }
    };
}
float_minmax!(max_f32, min_f32, f32);
float_minmax!(max_f64, min_f64, f64);

/// Applies `$body` with `f` bound to the binary function of `$op` for a
/// float type.
macro_rules! with_float_op {
    ($op:expr, $t:ty, $max:ident, $min:ident, |$f:ident| $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let $f = |a: $t, b: $t| a + b;
                $body
            }
            ReduceOp::Product => {
                let $f = |a: $t, b: $t| a * b;
                $body
            }
            ReduceOp::Max => {
                let $f = $max;
                $body
            }
            ReduceOp::Min => {
                let $f = $min;
                $body
            }
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                return Err(Error::Internal("bitwise op on a float reached the kernel".into()))
            }
        }
    };
}

macro_rules! with_int_op {
    ($op:expr, $t:ty, |$f:ident| $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let $f = |a: $t, b: $t| a.wrapping_add(b);
                $body
            }
            ReduceOp::Product => {
                let $f = |a: $t, b: $t| a.wrapping_mul(b);
                $body
            }
            ReduceOp::Max => {
                let $f = |a: $t, b: $t| a.max(b);
                $body
            }
            ReduceOp::Min => {
                let $f = |a: $t, b: $t| a.min(b);
                $body
            }
            ReduceOp::BAnd => {
                let $f = |a: $t, b: $t| a & b;
                $body
            }
            ReduceOp::BOr => {
                let $f = |a: $t, b: $t| a | b;
                $body
            }
            ReduceOp::BXor => {
                let $f = |a: $t, b: $t| a ^ b;
                $body
            }
        }
    };
}

/// Bool tensors hold 0 / 1 bytes: SUM, MAX and BOR are "any", PRODUCT, MIN
/// and BAND are "all", BXOR is parity.
fn bool_fn(op: ReduceOp) -> Result<fn(u8, u8) -> u8> {
    Ok(match op {
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => |a, b| a | b,
        ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => |a, b| a & b,
        ReduceOp::BXor => |a, b| a ^ b,
        ReduceOp::Avg => return Err(Error::Internal("AVG on bool reached the kernel".into())),
    })
}

const HALF_BLOCK: usize = 512;

/// `acc[i] = f(acc[i], src[i])` for f16 / bf16 through f32 blocks.
fn half_into<H: Copy + Default>(
    acc: &mut [H],
    src: &[H],
    widen: impl Fn(&[H], &mut [f32]),
    narrow: impl Fn(&mut [H], &[f32]),
    f: impl Fn(&mut [f32], &[f32]),
) {
    let mut fa = [0f32; HALF_BLOCK];
    let mut fb = [0f32; HALF_BLOCK];
    for (ca, cb) in acc.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = ca.len();
        widen(ca, &mut fa[..n]);
        widen(cb, &mut fb[..n]);
        f(&mut fa[..n], &fb[..n]);
        narrow(ca, &fa[..n]);
    }
}

type F32Block = fn(&mut [f32], &[f32]);

fn f32_block_fn(op: ReduceOp) -> Result<F32Block> {
    Ok(match op {
        ReduceOp::Sum | ReduceOp::Avg => |a, b| zip_into(a, b, |x, y| x + y),
        ReduceOp::Product => |a, b| zip_into(a, b, |x, y| x * y),
        ReduceOp::Max => |a, b| zip_into(a, b, max_f32),
        ReduceOp::Min => |a, b| zip_into(a, b, min_f32),
        _ => return Err(Error::Internal("bitwise op on a half type reached the kernel".into())),
    })
}

/// `acc = acc ⊕ src`, element-wise. Lengths must match.
pub fn reduce_into(op: ReduceOp, dtype: DType, acc: &mut [u8], src: &[u8]) -> Result<()> {
    if acc.len() != src.len() {
        return Err(Error::Internal(format!("reduce_into: {} vs {} bytes", acc.len(), src.len())));
    }
    match dtype {
        DType::F32 => with_float_op!(op, f32, max_f32, min_f32, |f| zip_into(cast_mut::<f32>(acc)?, cast(src)?, f)),
        DType::F64 => with_float_op!(op, f64, max_f64, min_f64, |f| zip_into(cast_mut::<f64>(acc)?, cast(src)?, f)),
        DType::F16 => half_into(
            cast_mut::<f16>(acc)?,
            cast::<f16>(src)?,
            |h, f| h.convert_to_f32_slice(f),
            |h, f| h.convert_from_f32_slice(f),
            f32_block_fn(op)?,
        ),
        DType::BF16 => half_into(
            cast_mut::<bf16>(acc)?,
            cast::<bf16>(src)?,
            |h, f| h.convert_to_f32_slice(f),
            |h, f| h.convert_from_f32_slice(f),
            f32_block_fn(op)?,
        ),
        DType::U8 => with_int_op!(op, u8, |f| zip_into(acc, src, f)),
        DType::I8 => with_int_op!(op, i8, |f| zip_into(cast_mut::<i8>(acc)?, cast(src)?, f)),
        DType::I16 => with_int_op!(op, i16, |f| zip_into(cast_mut::<i16>(acc)?, cast(src)?, f)),
        DType::I32 => with_int_op!(op, i32, |f| zip_into(cast_mut::<i32>(acc)?, cast(src)?, f)),
        DType::I64 => with_int_op!(op, i64, |f| zip_into(cast_mut::<i64>(acc)?, cast(src)?, f)),
        DType::Bool => zip_into(acc, src, bool_fn(op)?),
        DType::Other { .. } => return Err(Error::Internal(format!("reduction of {dtype} reached the kernel"))),
    }
    Ok(())
}

/// `out = a ⊕ b`, element-wise. Lengths must match.
pub fn reduce_out(op: ReduceOp, dtype: DType, out: &mut [u8], a: &[u8], b: &[u8]) -> Result<()> {
    if out.len() != a.len() || a.len() != b.len() {
        return Err(Error::Internal(format!("reduce_out: {} / {} / {} bytes", out.len(), a.len(), b.len())));
    }
    match dtype {
        DType::F32 => with_float_op!(op, f32, max_f32, min_f32, |f| zip_out(cast_mut::<f32>(out)?, cast(a)?, cast(b)?, f)),
        DType::F64 => with_float_op!(op, f64, max_f64, min_f64, |f| zip_out(cast_mut::<f64>(out)?, cast(a)?, cast(b)?, f)),
        DType::U8 => with_int_op!(op, u8, |f| zip_out(out, a, b, f)),
        DType::I8 => with_int_op!(op, i8, |f| zip_out(cast_mut::<i8>(out)?, cast(a)?, cast(b)?, f)),
        DType::I16 => with_int_op!(op, i16, |f| zip_out(cast_mut::<i16>(out)?, cast(a)?, cast(b)?, f)),
        DType::I32 => with_int_op!(op, i32, |f| zip_out(cast_mut::<i32>(out)?, cast(a)?, cast(b)?, f)),
        DType::I64 => with_int_op!(op, i64, |f| zip_out(cast_mut::<i64>(out)?, cast(a)?, cast(b)?, f)),
        DType::Bool => zip_out(out, a, b, bool_fn(op)?),
        // Half types: copy then reduce in place (one extra pass, still blocked).
        DType::F16 | DType::BF16 => {
            out.copy_from_slice(a);
            reduce_into(op, dtype, out, b)?;
        }
        DType::Other { .. } => return Err(Error::Internal(format!("reduction of {dtype} reached the kernel"))),
    }
    Ok(())
}

/// Divides every element by `n` (the last step of `Avg`). Integers use
/// truncating division, as NCCL does.
pub fn finish_avg(dtype: DType, buf: &mut [u8], n: usize) -> Result<()> {
    if n == 1 {
        return Ok(());
    }
    macro_rules! div_int {
        ($t:ty) => {{
            let d = n as $t;
            for x in cast_mut::<$t>(buf)? {
                *x /= d;
            }
        }};
    }
    match dtype {
        DType::F32 => {
            let d = n as f32;
            cast_mut::<f32>(buf)?.iter_mut().for_each(|x| *x /= d);
        }
        DType::F64 => {
            let d = n as f64;
            cast_mut::<f64>(buf)?.iter_mut().for_each(|x| *x /= d);
        }
        DType::F16 => {
            let d = n as f32;
            cast_mut::<f16>(buf)?.iter_mut().for_each(|x| *x = f16::from_f32(x.to_f32() / d));
        }
        DType::BF16 => {
            let d = n as f32;
            cast_mut::<bf16>(buf)?.iter_mut().for_each(|x| *x = bf16::from_f32(x.to_f32() / d));
        }
        DType::U8 => {
            let d = n.min(255) as u8;
            buf.iter_mut().for_each(|x| *x = if n > 255 { 0 } else { *x / d });
        }
        DType::I8 => div_int!(i8),
        DType::I16 => div_int!(i16),
        DType::I32 => div_int!(i32),
        DType::I64 => div_int!(i64),
        DType::Bool | DType::Other { .. } => return Err(Error::Internal(format!("AVG of {dtype} reached the kernel"))),
    }
    Ok(())
}

/// Aligned scratch memory reused between operations: three independent
/// slots (8-byte aligned) that grow on demand.
#[derive(Default)]
pub struct Scratch {
    slots: [Vec<u64>; 3],
}

fn slot_bytes(v: &mut Vec<u64>, nbytes: usize) -> &mut [u8] {
    let words = nbytes.div_ceil(8);
    if v.len() < words {
        v.resize(words, 0);
    }
    &mut bytemuck::cast_slice_mut::<u64, u8>(v)[..nbytes]
}

impl Scratch {
    /// At least `nbytes` aligned bytes of slot 0 (contents unspecified).
    pub fn get(&mut self, nbytes: usize) -> &mut [u8] {
        slot_bytes(&mut self.slots[0], nbytes)
    }

    /// Slots 0 and 1.
    pub fn get2(&mut self, a: usize, b: usize) -> (&mut [u8], &mut [u8]) {
        let [s0, s1, _] = &mut self.slots;
        (slot_bytes(s0, a), slot_bytes(s1, b))
    }

    /// All three slots.
    pub fn get3(&mut self, a: usize, b: usize, c: usize) -> (&mut [u8], &mut [u8], &mut [u8]) {
        let [s0, s1, s2] = &mut self.slots;
        (slot_bytes(s0, a), slot_bytes(s1, b), slot_bytes(s2, c))
    }

    /// Gives memory above `keep` bytes per slot back to the allocator.
    pub fn trim(&mut self, keep: usize) {
        let words = keep.div_ceil(8);
        for v in &mut self.slots {
            if v.len() > words {
                v.truncate(words);
                v.shrink_to_fit();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_into<T: bytemuck::Pod>(op: ReduceOp, dt: DType, a: &[T], b: &[T]) -> Vec<T> {
        let mut acc: Vec<u8> = bytemuck::cast_slice(a).to_vec();
        // Vec<u8> may be misaligned for T: copy through an aligned scratch.
        let mut s = Scratch::default();
        let (x, y) = s.get2(acc.len(), acc.len());
        x.copy_from_slice(&acc);
        y.copy_from_slice(bytemuck::cast_slice(b));
        reduce_into(op, dt, x, y).unwrap();
        acc.copy_from_slice(x);
        bytemuck::pod_collect_to_vec(&acc)
    }

    #[test]
    fn float_ops() {
        let a = [1.0f32, -2.0, 3.0, f32::NAN];
        let b = [4.0f32, 5.0, -6.0, 1.0];
        assert_eq!(run_into(ReduceOp::Sum, DType::F32, &a[..3], &b[..3]), vec![5.0, 3.0, -3.0]);
        assert_eq!(run_into(ReduceOp::Product, DType::F32, &a[..3], &b[..3]), vec![4.0, -10.0, -18.0]);
        let mx = run_into(ReduceOp::Max, DType::F32, &a, &b);
        assert_eq!(&mx[..3], &[4.0, 5.0, 3.0]);
        assert!(mx[3].is_nan(), "max propagates NaN");
        let mn = run_into(ReduceOp::Min, DType::F32, &b, &a);
        assert_eq!(&mn[..3], &[1.0, -2.0, -6.0]);
        assert!(mn[3].is_nan(), "min propagates NaN from the second operand");
    }

    #[test]
    fn int_ops_wrap_and_bitwise() {
        assert_eq!(run_into(ReduceOp::Sum, DType::I8, &[120i8, -5], &[10, -5]), vec![-126, -10]);
        assert_eq!(run_into(ReduceOp::BXor, DType::I32, &[0b1100i32], &[0b1010]), vec![0b0110]);
        assert_eq!(run_into(ReduceOp::BAnd, DType::I64, &[0b1100i64], &[0b1010]), vec![0b1000]);
        assert_eq!(run_into(ReduceOp::Min, DType::U8, &[3u8, 200], &[7, 100]), vec![3, 100]);
    }

    #[test]
    fn bool_ops() {
        let a = [0u8, 0, 1, 1];
        let b = [0u8, 1, 0, 1];
        assert_eq!(run_into(ReduceOp::Sum, DType::Bool, &a, &b), vec![0, 1, 1, 1]);
        assert_eq!(run_into(ReduceOp::Product, DType::Bool, &a, &b), vec![0, 0, 0, 1]);
        assert_eq!(run_into(ReduceOp::BXor, DType::Bool, &a, &b), vec![0, 1, 1, 0]);
        assert!(check(ReduceOp::Avg, DType::Bool).is_err());
    }

    #[test]
    fn half_types_through_f32() {
        let n = 1500; // more than one block
        let a: Vec<f16> = (0..n).map(|i| f16::from_f32((i % 17) as f32)).collect();
        let b: Vec<f16> = (0..n).map(|i| f16::from_f32((i % 5) as f32)).collect();
        let r = run_into(ReduceOp::Sum, DType::F16, &a, &b);
        for (i, x) in r.iter().enumerate() {
            assert_eq!(x.to_f32(), ((i % 17) + (i % 5)) as f32);
        }
        let a: Vec<bf16> = (0..n).map(|i| bf16::from_f32((i % 7) as f32)).collect();
        let b: Vec<bf16> = (0..n).map(|i| bf16::from_f32((i % 3) as f32)).collect();
        let r = run_into(ReduceOp::Max, DType::BF16, &a, &b);
        for (i, x) in r.iter().enumerate() {
            assert_eq!(x.to_f32(), ((i % 7).max(i % 3)) as f32);
        }
    }

    #[test]
    fn unsupported_pairs_are_named() {
        let e = check(ReduceOp::BOr, DType::F32).unwrap_err();
        assert!(e.contains("BOR") && e.contains("float32"), "{e}");
        assert!(check(ReduceOp::Sum, DType::Other { code: 5, bits: 64 }).is_err());
        assert!(check(ReduceOp::Avg, DType::I32).is_ok());
    }

    #[test]
    fn avg_divides() {
        let mut s = Scratch::default();
        let b = s.get(8);
        b.copy_from_slice(bytemuck::cast_slice(&[7i32, -7]));
        finish_avg(DType::I32, b, 2).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i32>(b), &[3, -3]);
    }
}
