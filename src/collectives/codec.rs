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
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::DType;

/// Values per int8 scale.
pub const INT8_BLOCK: usize = 256;

/// 1.5 * 2^23: adding and subtracting it rounds an f32 of magnitude below
/// 2^22 to the nearest integer, ties to even (and vectorises, unlike
/// `round`).
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
            Codec::Bf16 => x.iter().zip(out.chunks_exact_mut(2)).for_each(|(v, o)| o.copy_from_slice(&bf16::from_f32(*v).to_le_bytes())),
            Codec::Fp16 => x.iter().zip(out.chunks_exact_mut(2)).for_each(|(v, o)| o.copy_from_slice(&f16::from_f32(*v).to_le_bytes())),
            Codec::Int8 => {
                let (scales, values) = out.split_at_mut(4 * x.len().div_ceil(INT8_BLOCK));
                for ((blk, s), q) in x.chunks(INT8_BLOCK).zip(scales.chunks_exact_mut(4)).zip(values.chunks_mut(INT8_BLOCK)) {
                    let m = blk.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
                    let scale = m / 127.0;
                    let inv = if m > 0.0 { 127.0 / m } else { 0.0 };
                    s.copy_from_slice(&scale.to_le_bytes());
                    for (o, v) in q.iter_mut().zip(blk) {
                        let r = ((v * inv + ROUND_MAGIC) - ROUND_MAGIC).clamp(-127.0, 127.0);
                        *o = (r as i8) as u8;
                    }
                }
            }
        }
        Ok(())
    }

    /// `acc[i] = decode(payload)[i]` when `add` is false, `acc[i] += ...`
    /// when true.
    pub fn decode(self, payload: &[u8], acc: &mut [f32], add: bool) -> Result<()> {
        check_len(self, acc.len(), payload.len())?;
        fn put(a: &mut f32, v: f32, add: bool) {
            if add {
                *a += v
            } else {
                *a = v
            }
        }
        match self {
            Codec::Bf16 => acc.iter_mut().zip(payload.chunks_exact(2)).for_each(|(a, p)| put(a, bf16::from_le_bytes([p[0], p[1]]).to_f32(), add)),
            Codec::Fp16 => acc.iter_mut().zip(payload.chunks_exact(2)).for_each(|(a, p)| put(a, f16::from_le_bytes([p[0], p[1]]).to_f32(), add)),
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
/// first adds it to `x` and then stores what this encoding lost in it.
pub fn encode_with_feedback(codec: Codec, x: &mut [f32], residual: Option<&mut [f32]>, payload: &mut [u8]) -> Result<()> {
    match residual {
        None => codec.encode(x, payload),
        Some(r) => {
            x.iter_mut().zip(r.iter()).for_each(|(x, r)| *x += r);
            codec.encode(x, payload)?;
            codec.decode(payload, r, false)?;
            r.iter_mut().zip(x.iter()).for_each(|(r, x)| *r = x - *r);
            Ok(())
        }
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
