//! Codecs for the leaders' exchange between hosts, and the error-feedback
//! memory that goes with them.
//!
//! Vocabulary: a *codec* turns `n` f32 values into a *payload* of
//! [`Codec::payload_len`] bytes and back. Every leader encodes its host's
//! partial sum, all leaders gather all payloads, and each decodes them in
//! host order, so all leaders hold the same bytes and reduce them in the
//! same order (bitwise identical results). The *residual* of a key is what
//! the last encoding lost (`x - decode(encode(x))`); with error feedback it
//! is added to the next input of the same key, so what was rounded away is
//! sent later instead of lost.
//!
//! | codec | payload for n values | error per value |
//! |---|---|---|
//! | `bf16` | 2n bytes | relative 2^-9 (round to nearest even) |
//! | `fp16` | 2n bytes | relative 2^-12 in 6e-5..65504; overflows to inf above |
//! | `int8` | n + 4 ceil(n / 256) bytes | at most max\|block\| / 254 (one f32 scale per 256 values, round to nearest even) |
//!
//! Non-finite inputs: the casts keep them; an int8 block holding one
//! decodes to NaN (and its residual restarts from zero).
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::DType;

/// Values per int8 scale.
pub const INT8_BLOCK: usize = 256;

/// 1.5 * 2^23: adding it to an f32 of magnitude below 2^22 rounds it to an
/// integer k (nearest, ties to even; vectorises, unlike `round`), held in
/// the low mantissa bits: the low byte of the sum's bits is k as an i8.
const ROUND_MAGIC: f32 = 12_582_912.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    Bf16,
    Fp16,
    Int8,
}

impl Codec {
    pub fn from_name(s: &str) -> Option<Codec> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Some(Codec::Bf16),
            "fp16" | "f16" | "float16" | "half" => Some(Codec::Fp16),
            "int8" => Some(Codec::Int8),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::Bf16 => "bf16",
            Codec::Fp16 => "fp16",
            Codec::Int8 => "int8",
        }
    }

    /// Bytes of the payload for `n` values.
    pub fn payload_len(self, n: usize) -> usize {
        match self {
            Codec::Bf16 | Codec::Fp16 => 2 * n,
            Codec::Int8 => n + 4 * n.div_ceil(INT8_BLOCK),
        }
    }

    /// Encodes `x` into `out` (`payload_len(x.len())` bytes).
    pub fn encode(self, x: &[f32], out: &mut [u8]) -> Result<()> {
        check_len(self, x.len(), out.len())?;
        match self {
            Codec::Bf16 => cast_out::<bf16>(x, out),
            Codec::Fp16 => cast_out::<f16>(x, out),
            Codec::Int8 => {
                let (scales, values) = out.split_at_mut(4 * x.len().div_ceil(INT8_BLOCK));
                for ((blk, s), q) in x.chunks(INT8_BLOCK).zip(scales.chunks_exact_mut(4)).zip(values.chunks_mut(INT8_BLOCK)) {
                    s.copy_from_slice(&quantize(blk, q, None).to_le_bytes());
                }
            }
        }
        Ok(())
    }

    /// `acc[i] = decode(payload)[i]` when `add` is false, `acc[i] += ...`
    /// when true.
    pub fn decode(self, payload: &[u8], acc: &mut [f32], add: bool) -> Result<()> {
        check_len(self, acc.len(), payload.len())?;
        match self {
            Codec::Bf16 => cast_in::<bf16>(payload, acc, add),
            Codec::Fp16 => cast_in::<f16>(payload, acc, add),
            Codec::Int8 => {
                let (scales, values) = payload.split_at(4 * acc.len().div_ceil(INT8_BLOCK));
                for ((a, s), q) in acc.chunks_mut(INT8_BLOCK).zip(scales.chunks_exact(4)).zip(values.chunks(INT8_BLOCK)) {
                    let scale = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                    if add {
                        a.iter_mut().zip(q).for_each(|(a, q)| *a += (*q as i8) as f32 * scale);
                    } else {
                        a.iter_mut().zip(q).for_each(|(a, q)| *a = (*q as i8) as f32 * scale);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Quantises one block into `q` and returns its scale (max|x| / 127);
/// with `residual`, stores `x - q * scale` there. A block holding a
/// non-finite value gets a NaN scale (it decodes to NaN) and a zero
/// residual. Written so that it vectorises: eight running maxima, and the
/// integer read from the bits of `x / scale + 1.5 * 2^23`.
fn quantize(x: &[f32], q: &mut [u8], residual: Option<&mut [f32]>) -> f32 {
    let mut lanes = [0f32; 8];
    let mut bad = false;
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for j in 0..8 {
            let a = c[j].abs();
            lanes[j] = if a > lanes[j] { a } else { lanes[j] };
            bad |= c[j].is_nan();
        }
    }
    for v in it.remainder() {
        lanes[0] = if v.abs() > lanes[0] { v.abs() } else { lanes[0] };
        bad |= v.is_nan();
    }
    let m = lanes.iter().fold(0f32, |m, v| if *v > m { *v } else { m });
    if bad || !m.is_finite() {
        q.iter_mut().for_each(|q| *q = 0);
        if let Some(r) = residual {
            r.iter_mut().for_each(|r| *r = 0.0);
        }
        return f32::NAN;
    }
    let scale = m / 127.0;
    let inv = 127.0 / m;
    if m == 0.0 || !inv.is_finite() {
        // All zero, or so small (subnormal) that 127 / max overflows: send
        // zeros; with feedback the whole block carries over.
        q.iter_mut().for_each(|q| *q = 0);
        if let Some(r) = residual {
            r.copy_from_slice(x);
        }
        return 0.0;
    }
    match residual {
        None => q.iter_mut().zip(x).for_each(|(o, v)| *o = (v * inv + ROUND_MAGIC).to_bits() as u8),
        Some(r) => {
            for ((o, v), r) in q.iter_mut().zip(x).zip(r.iter_mut()) {
                let y = v * inv + ROUND_MAGIC;
                *o = y.to_bits() as u8;
                *r = v - (y - ROUND_MAGIC) * scale;
            }
        }
    }
    scale
}

/// A 16-bit float type half's slice conversions handle.
trait Half16: bytemuck::Pod + Default {
    fn from_f32s(dst: &mut [Self], src: &[f32]);
    fn to_f32s(src: &[Self], dst: &mut [f32]);
    fn from_le(b: [u8; 2]) -> Self;
    fn to_le(self) -> [u8; 2];
}

macro_rules! half16 {
    ($t:ty) => {
        impl Half16 for $t {
            fn from_f32s(dst: &mut [Self], src: &[f32]) {
                use half::slice::HalfFloatSliceExt;
                dst.convert_from_f32_slice(src)
            }
            fn to_f32s(src: &[Self], dst: &mut [f32]) {
                use half::slice::HalfFloatSliceExt;
                src.convert_to_f32_slice(dst)
            }
            fn from_le(b: [u8; 2]) -> Self {
                <$t>::from_le_bytes(b)
            }
            fn to_le(self) -> [u8; 2] {
                self.to_le_bytes()
            }
        }
    };
}
half16!(bf16);
half16!(f16);

/// Values per conversion block of the casts.
const CAST_BLOCK: usize = 512;

/// Payload (little-endian 16-bit floats) of `x`, through a stack block.
fn cast_out<H: Half16>(x: &[f32], out: &mut [u8]) {
    let mut tmp = [H::default(); CAST_BLOCK];
    for (xb, ob) in x.chunks(CAST_BLOCK).zip(out.chunks_mut(2 * CAST_BLOCK)) {
        let t = &mut tmp[..xb.len()];
        H::from_f32s(t, xb);
        match bytemuck::try_cast_slice_mut::<u8, H>(ob) {
            Ok(dst) if cfg!(target_endian = "little") => dst.copy_from_slice(t),
            _ => ob.chunks_exact_mut(2).zip(t.iter()).for_each(|(o, v)| o.copy_from_slice(&v.to_le())),
        }
    }
}

/// `acc (+)= payload` as f32.
fn cast_in<H: Half16>(payload: &[u8], acc: &mut [f32], add: bool) {
    let mut tmp = [H::default(); CAST_BLOCK];
    let mut wide = [0f32; CAST_BLOCK];
    for (pb, ab) in payload.chunks(2 * CAST_BLOCK).zip(acc.chunks_mut(CAST_BLOCK)) {
        let t = &mut tmp[..ab.len()];
        match bytemuck::try_cast_slice::<u8, H>(pb) {
            Ok(src) if cfg!(target_endian = "little") => t.copy_from_slice(src),
            _ => t.iter_mut().zip(pb.chunks_exact(2)).for_each(|(v, b)| *v = H::from_le([b[0], b[1]])),
        }
        if add {
            let w = &mut wide[..ab.len()];
            H::to_f32s(t, w);
            ab.iter_mut().zip(w.iter()).for_each(|(a, w)| *a += w);
        } else {
            H::to_f32s(t, ab);
        }
    }
}

fn check_len(c: Codec, n: usize, bytes: usize) -> Result<()> {
    if c.payload_len(n) != bytes {
        return Err(Error::Internal(format!("{} codec: {n} values need {} payload bytes, got {bytes}", c.name(), c.payload_len(n))));
    }
    Ok(())
}

/// Whether an all-reduce of `dtype` with this op may be compressed: sums
/// (and averages) of floating-point values; everything else stays exact.
pub fn applies(dtype: DType, op: crate::types::ReduceOp) -> bool {
    use crate::types::ReduceOp;
    matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) && matches!(op, ReduceOp::Sum | ReduceOp::Avg)
}

/// `out = buf` as f32 (buf of `dtype`, a float type).
pub fn widen(dtype: DType, buf: &[u8], out: &mut [f32]) -> Result<()> {
    match dtype {
        DType::F32 => out.iter_mut().zip(buf.chunks_exact(4)).for_each(|(o, b)| *o = f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        DType::F64 => out.iter_mut().zip(buf.chunks_exact(8)).for_each(|(o, b)| {
            *o = f64::from_ne_bytes(b.try_into().expect("8 bytes")) as f32;
        }),
        DType::F16 => out.iter_mut().zip(buf.chunks_exact(2)).for_each(|(o, b)| *o = f16::from_ne_bytes([b[0], b[1]]).to_f32()),
        DType::BF16 => out.iter_mut().zip(buf.chunks_exact(2)).for_each(|(o, b)| *o = bf16::from_ne_bytes([b[0], b[1]]).to_f32()),
        d => return Err(Error::Internal(format!("codec input of type {d}"))),
    }
    Ok(())
}

/// `buf = x` in `dtype` (round to nearest).
pub fn narrow(dtype: DType, x: &[f32], buf: &mut [u8]) -> Result<()> {
    match dtype {
        DType::F32 => buf.chunks_exact_mut(4).zip(x).for_each(|(b, v)| b.copy_from_slice(&v.to_ne_bytes())),
        DType::F64 => buf.chunks_exact_mut(8).zip(x).for_each(|(b, v)| b.copy_from_slice(&(*v as f64).to_ne_bytes())),
        DType::F16 => buf.chunks_exact_mut(2).zip(x).for_each(|(b, v)| b.copy_from_slice(&f16::from_f32(*v).to_ne_bytes())),
        DType::BF16 => buf.chunks_exact_mut(2).zip(x).for_each(|(b, v)| b.copy_from_slice(&bf16::from_f32(*v).to_ne_bytes())),
        d => return Err(Error::Internal(format!("codec output of type {d}"))),
    }
    Ok(())
}

/// What one compressed all-reduce asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub codec: Codec,
    /// Names the tensor or bucket whose residual carries over.
    pub key: String,
    pub feedback: bool,
}

struct Residual {
    codec: Codec,
    dtype: DType,
    err: Vec<f32>,
}

/// Error-feedback residuals per key, kept by the engine between calls. A
/// key whose codec, dtype or length changed starts again from zero. At most
/// [`Feedback::MAX_KEYS`] keys are kept (the oldest is dropped first).
#[derive(Default)]
pub struct Feedback {
    map: HashMap<String, Residual>,
    order: VecDeque<String>,
}

impl Feedback {
    pub const MAX_KEYS: usize = 1024;

    /// The residual of `key` for `n` values (zeros when new or reset).
    pub fn residual(&mut self, key: &str, codec: Codec, dtype: DType, n: usize) -> &mut [f32] {
        let fresh = match self.map.get(key) {
            Some(r) => r.codec != codec || r.dtype != dtype || r.err.len() != n,
            None => true,
        };
        if fresh {
            if !self.map.contains_key(key) {
                self.order.push_back(key.to_string());
                while self.order.len() > Self::MAX_KEYS {
                    if let Some(old) = self.order.pop_front() {
                        self.map.remove(&old);
                    }
                }
            }
            self.map.insert(key.to_string(), Residual { codec, dtype, err: vec![0.0; n] });
        }
        &mut self.map.get_mut(key).expect("inserted above").err
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Encodes `x` (this leader's partial sum) into `payload`; with a residual,
/// first adds it to `x` and then stores what this encoding lost in it. One
/// pass per block of [`INT8_BLOCK`] values (the block stays in cache).
pub fn encode_with_feedback(codec: Codec, x: &mut [f32], residual: Option<&mut [f32]>, payload: &mut [u8]) -> Result<()> {
    check_len(codec, x.len(), payload.len())?;
    let Some(r) = residual else {
        return codec.encode(x, payload);
    };
    if r.len() != x.len() {
        return Err(Error::Internal(format!("residual of {} values for {} inputs", r.len(), x.len())));
    }
    match codec {
        Codec::Bf16 | Codec::Fp16 => {
            for ((xb, rb), pb) in x.chunks_mut(INT8_BLOCK).zip(r.chunks_mut(INT8_BLOCK)).zip(payload.chunks_mut(2 * INT8_BLOCK)) {
                xb.iter_mut().zip(rb.iter()).for_each(|(x, r)| *x += r);
                codec.encode(xb, pb)?;
                codec.decode(pb, rb, false)?;
                rb.iter_mut().zip(xb.iter()).for_each(|(r, x)| *r = x - *r);
            }
        }
        Codec::Int8 => {
            let (scales, values) = payload.split_at_mut(4 * x.len().div_ceil(INT8_BLOCK));
            let blocks = x.chunks_mut(INT8_BLOCK).zip(r.chunks_mut(INT8_BLOCK));
            for (((xb, rb), s), q) in blocks.zip(scales.chunks_exact_mut(4)).zip(values.chunks_mut(INT8_BLOCK)) {
                xb.iter_mut().zip(rb.iter()).for_each(|(x, r)| *x += r);
                s.copy_from_slice(&quantize(xb, q, Some(rb)).to_le_bytes());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
