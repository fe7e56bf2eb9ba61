//! Codecs against a plain reference of the same quantisation, and error
//! feedback's running sums.
use super::*;

/// Deterministic values spanning several magnitudes, a few exact zeros.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let mag = [1e-3f32, 1.0, 37.0, 1e4][(i / 300) % 4];
            if i % 97 == 0 {
                0.0
            } else {
                u * mag
            }
        })
        .collect()
}

/// The int8 quantisation written out plainly: scale = max|block| / 127,
/// q = round-half-even(x / scale), value = q * scale.
fn int8_reference(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for blk in x.chunks(INT8_BLOCK) {
        let m = blk.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let scale = m / 127.0;
        for v in blk {
            let q = if m > 0.0 { (v * (127.0 / m)).round_ties_even().clamp(-127.0, 127.0) } else { 0.0 };
            out.push(q * scale);
        }
    }
    out
}

fn roundtrip(c: Codec, x: &[f32]) -> Vec<f32> {
    let mut p = vec![0u8; c.payload_len(x.len())];
    c.encode(x, &mut p).unwrap();
    let mut y = vec![f32::NAN; x.len()];
    c.decode(&p, &mut y, false).unwrap();
    y
}

#[test]
fn casts_match_half_rounding() {
    for n in [0, 1, 255, 256, 257, 1000] {
        let x = values(n, 1);
        let b = roundtrip(Codec::Bf16, &x);
        let h = roundtrip(Codec::Fp16, &x);
        for i in 0..n {
            assert_eq!(b[i].to_bits(), bf16::from_f32(x[i]).to_f32().to_bits(), "bf16 at {i}");
            assert_eq!(h[i].to_bits(), f16::from_f32(x[i]).to_f32().to_bits(), "fp16 at {i}");
            assert!((b[i] - x[i]).abs() <= x[i].abs() * 2f32.powi(-8), "bf16 error at {i}");
        }
    }
}

#[test]
fn int8_matches_reference_and_bound() {
    for n in [0, 1, 2, 255, 256, 257, 511, 5000] {
        let x = values(n, n as u64);
        let y = roundtrip(Codec::Int8, &x);
        let r = int8_reference(&x);
        assert_eq!(y.len(), n);
        for (b, blk) in x.chunks(INT8_BLOCK).enumerate() {
            let m = blk.iter().map(|v| v.abs()).fold(0f32, f32::max);
            for (j, v) in blk.iter().enumerate() {
                let i = b * INT8_BLOCK + j;
                assert_eq!(y[i], r[i], "n={n} i={i}: {} vs reference {}", y[i], r[i]);
                assert!((y[i] - v).abs() <= m / 254.0 * 1.0001 + 1e-30, "n={n} i={i}: error {} > {}", (y[i] - v).abs(), m / 254.0);
            }
        }
        assert_eq!(Codec::Int8.payload_len(n), n + 4 * n.div_ceil(256));
    }
}

#[test]
fn int8_extremes() {
    let x = vec![0.0f32; 300];
    assert!(roundtrip(Codec::Int8, &x).iter().all(|v| *v == 0.0));
    let x: Vec<f32> = (0..256).map(|i| if i == 7 { -3.0e38 } else { 1.0 }).collect();
    let y = roundtrip(Codec::Int8, &x);
    assert_eq!(y[7], -3.0e38f32 / 127.0 * 127.0);
    assert!(y.iter().all(|v| v.is_finite()));
}

#[test]
fn int8_non_finite_block_decodes_to_nan() {
    let mut x = values(600, 4);
    x[300] = f32::NAN;
    x[10] = f32::INFINITY;
    let y = roundtrip(Codec::Int8, &x);
    assert!(y[..512].iter().all(|v| v.is_nan()), "blocks 0 and 1 hold a non-finite value");
    let r = int8_reference(&x[512..]);
    assert_eq!(&y[512..], &r[..], "block 2 is unaffected");
    let mut w = x.clone();
    let mut res = vec![0.5f32; 600];
    let mut p = vec![0u8; Codec::Int8.payload_len(600)];
    encode_with_feedback(Codec::Int8, &mut w, Some(&mut res), &mut p).unwrap();
    assert!(res[..512].iter().all(|v| *v == 0.0) && res[512..].iter().all(|v| v.is_finite()));
}

#[test]
fn int8_tiny_block_is_zero_and_carried_over() {
    let x: Vec<f32> = (0..300).map(|i| if i < 256 { (i as f32 - 128.0) * 1e-41 } else { 1.0 }).collect();
    let mut w = x.clone();
    let mut res = vec![0f32; 300];
    let mut p = vec![0u8; Codec::Int8.payload_len(300)];
    encode_with_feedback(Codec::Int8, &mut w, Some(&mut res), &mut p).unwrap();
    let mut y = vec![0f32; 300];
    Codec::Int8.decode(&p, &mut y, false).unwrap();
    assert!(y.iter().chain(res.iter()).all(|v| v.is_finite()), "no NaN from a subnormal block");
    assert!(y[..256].iter().all(|v| *v == 0.0) && res[..256] == x[..256]);
}

#[test]
fn decode_adds_in_place() {
    let x = values(700, 3);
    let mut p = vec![0u8; Codec::Int8.payload_len(700)];
    Codec::Int8.encode(&x, &mut p).unwrap();
    let mut acc = vec![1.0f32; 700];
    Codec::Int8.decode(&p, &mut acc, true).unwrap();
    let r = int8_reference(&x);
    for i in 0..700 {
        assert_eq!(acc[i], 1.0 + r[i]);
    }
}

#[test]
fn wrong_payload_length_is_an_error() {
    let x = values(10, 0);
    let mut p = vec![0u8; 11];
    assert!(Codec::Int8.encode(&x, &mut p).is_err());
    assert!(Codec::Bf16.decode(&p, &mut [0.0; 10], false).is_err());
}

#[test]
fn error_feedback_running_sum_tracks_inputs() {
    // Sum over steps of decode(encode(x_t + r_t)) = sum of x_t - r_T: the
    // gap stays one step's rounding error, however many steps run.
    for c in [Codec::Int8, Codec::Bf16, Codec::Fp16] {
        let n = 1000;
        let mut fb = Feedback::default();
        let (mut sum_in, mut sum_out) = (vec![0f64; n], vec![0f64; n]);
        let (mut sum_plain, mut gap_plain) = (vec![0f64; n], 0f64);
        let mut big = vec![0f32; n];
        for t in 0..200 {
            let x = values(n, 100 + t);
            let mut w = x.clone();
            let mut p = vec![0u8; c.payload_len(n)];
            encode_with_feedback(c, &mut w, Some(fb.residual("k", c, DType::F32, n)), &mut p).unwrap();
            let mut y = vec![0f32; n];
            c.decode(&p, &mut y, false).unwrap();
            let plain = roundtrip(c, &x);
            for i in 0..n {
                sum_in[i] += x[i] as f64;
                sum_out[i] += y[i] as f64;
                sum_plain[i] += plain[i] as f64;
                big[i] = big[i].max(x[i].abs());
            }
        }
        let r = fb.residual("k", c, DType::F32, n).to_vec();
        let mut gap_fb = 0f64;
        for i in 0..n {
            let d = sum_in[i] - sum_out[i];
            // f32 rounding of x + r, at most one ulp of the input per step
            let tol = 200.0 * 2f64.powi(-22) * big[i] as f64 + 1e-9;
            assert!((d - r[i] as f64).abs() <= tol, "{c:?} i={i}: gap {d} vs residual {}", r[i]);
            gap_fb += d.abs();
            gap_plain += (sum_in[i] - sum_plain[i]).abs();
        }
        assert!(gap_fb < gap_plain, "{c:?}: error feedback gap {gap_fb} not below plain {gap_plain}");
    }
}

#[test]
fn feedback_resets_on_shape_dtype_or_codec_change() {
    let mut fb = Feedback::default();
    fb.residual("a", Codec::Int8, DType::F32, 4).copy_from_slice(&[1.0; 4]);
    assert_eq!(fb.residual("a", Codec::Int8, DType::F32, 4), &[1.0; 4]);
    assert_eq!(fb.residual("a", Codec::Int8, DType::F32, 5), &[0.0; 5]);
    fb.residual("a", Codec::Int8, DType::F32, 5)[0] = 2.0;
    assert_eq!(fb.residual("a", Codec::Int8, DType::F64, 5), &[0.0; 5]);
    fb.residual("a", Codec::Int8, DType::F64, 5)[0] = 2.0;
    assert_eq!(fb.residual("a", Codec::Bf16, DType::F64, 5), &[0.0; 5]);
    for k in 0..Feedback::MAX_KEYS + 10 {
        fb.residual(&format!("k{k}"), Codec::Int8, DType::F32, 1);
    }
    assert_eq!(fb.len(), Feedback::MAX_KEYS);
}

#[test]
fn widen_narrow_roundtrip() {
    let x = values(33, 9);
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let mut buf = vec![0u8; 33 * d.size()];
        narrow(d, &x, &mut buf).unwrap();
        let mut y = vec![0f32; 33];
        widen(d, &buf, &mut y).unwrap();
        for i in 0..33 {
            let want = match d {
                DType::F16 => f16::from_f32(x[i]).to_f32(),
                DType::BF16 => bf16::from_f32(x[i]).to_f32(),
                _ => x[i],
            };
            assert_eq!(y[i].to_bits(), want.to_bits(), "{d} at {i}");
        }
    }
    assert!(widen(DType::I32, &[0; 4], &mut [0.0]).is_err());
}

#[test]
fn names_and_applicability() {
    use crate::types::ReduceOp;
    for c in [Codec::Bf16, Codec::Fp16, Codec::Int8] {
        assert_eq!(Codec::from_name(c.name()), Some(c));
    }
    assert_eq!(Codec::from_name("zstd"), None);
    assert!(applies(DType::F32, ReduceOp::Avg) && applies(DType::BF16, ReduceOp::Sum));
    assert!(!applies(DType::F32, ReduceOp::Max) && !applies(DType::I32, ReduceOp::Sum));
}
