//! Quant formats against llama.cpp's reference (fixtures from the `gguf` Python package, see
//! fixtures/quant/gen.py), quantize→dequantize error bounds, and error handling.

use kiln_host::gguf::GgmlType;
use kiln_host::quant::{dequantize_row, quantize_row};
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    let p = format!("{}/tests/fixtures/quant/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn dequantize_matches_gguf_reference_bit_exact() {
    use GgmlType::*;
    for (name, ty) in [
        ("f16", F16),
        ("bf16", BF16),
        ("q4_0", Q4_0),
        ("q4_1", Q4_1),
        ("q8_0", Q8_0),
        ("q4_k", Q4_K),
        ("q5_k", Q5_K),
        ("q6_k", Q6_K),
    ] {
        let raw = fixture(&format!("{name}.raw"));
        let want = f32s(&fixture(&format!("{name}.f32")));
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, &raw, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name} element {i}: got {g}, reference {w}"
            );
        }
    }
}

#[test]
fn per_element_get_matches_dequant() {
    use kiln_host::quant::blocks::*;
    fn check<B: QuantBlock>(name: &str) {
        let raw = fixture(&format!("{name}.raw"));
        let mut out = vec![0f32; B::QK];
        for b in raw.chunks_exact(B::BYTES) {
            let blk = B::read(b).unwrap();
            blk.dequant(&mut out);
            for (i, v) in out.iter().enumerate() {
                assert_eq!(blk.get(i).to_bits(), v.to_bits(), "{name} get({i})");
            }
        }
    }
    check::<BlockQ4_0>("q4_0");
    check::<BlockQ4_1>("q4_1");
    check::<BlockQ8_0>("q8_0");
    check::<BlockQ4K>("q4_k");
    check::<BlockQ5K>("q5_k");
    check::<BlockQ6K>("q6_k");
}

#[test]
fn quantize_matches_gguf_reference_bit_exact() {
    for (name, ty) in [
        ("q4_0", GgmlType::Q4_0),
        ("q4_1", GgmlType::Q4_1),
        ("q8_0", GgmlType::Q8_0),
    ] {
        let x = f32s(&fixture(&format!("{name}.qin")));
        let want = fixture(&format!("{name}.qout"));
        let mut got = vec![0u8; want.len()];
        quantize_row(ty, &x, &mut got).unwrap();
        let bs = ty.block().1;
        for (i, (g, w)) in got.chunks(bs).zip(want.chunks(bs)).enumerate() {
            assert_eq!(g, w, "{name} block {i}");
        }
    }
}

fn roundtrip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let (qk, bs) = ty.block();
    let mut q = vec![0u8; x.len() / qk * bs];
    quantize_row(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    y
}

fn blocks_strategy(max_blocks: usize, qk: usize) -> impl Strategy<Value = Vec<f32>> {
    (1..=max_blocks, -8i32..8).prop_flat_map(move |(nb, e)| {
        let s = 2f32.powi(e);
        proptest::collection::vec(-1f32..1f32, nb * qk)
            .prop_map(move |v| v.into_iter().map(|x| x * s).collect::<Vec<f32>>())
    })
}

// The scale is rounded to f16 after the codes are chosen, so every bound carries a slack of
// |code| * |d - f16(d)| on top of the half-step rounding error (large for subnormal f16 scales).
fn f16_err(d: f32) -> f32 {
    use kiln_host::quant::blocks::{f16_to_f32, f32_to_f16};
    (d - f16_to_f32(f32_to_f16(d))).abs()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn q8_0_roundtrip_within_half_step(x in blocks_strategy(6, 32)) {
        let y = roundtrip(GgmlType::Q8_0, &x);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let tol = 0.5 * d + 128.0 * f16_err(d) + 1e-30;
            for (a, b) in xb.iter().zip(yb) {
                prop_assert!((a - b).abs() <= tol, "{a} -> {b}, d={d}");
            }
        }
    }

    #[test]
    fn q4_0_roundtrip_within_half_step(x in blocks_strategy(6, 32)) {
        let y = roundtrip(GgmlType::Q4_0, &x);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 8.0;
            for (a, b) in xb.iter().zip(yb) {
                // Only the code 15 side is clipped: the extreme maps to -8, so a value of the
                // opposite sign near +8d can be off by a full step.
                let step = if (a / d).abs() > 7.5 && a.signum() != -xb.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m }).signum() { 0.5 } else { 1.0 };
                let tol = step * d + 16.0 * f16_err(d) + 1e-30;
                prop_assert!((a - b).abs() <= tol, "{a} -> {b}, d={d}");
            }
        }
    }

    #[test]
    fn q4_1_roundtrip_within_half_step(x in blocks_strategy(6, 32)) {
        let y = roundtrip(GgmlType::Q4_1, &x);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let max = xb.iter().copied().fold(f32::MIN, f32::max);
            let min = xb.iter().copied().fold(f32::MAX, f32::min);
            let d = (max - min) / 15.0;
            let tol = 0.5 * d + 16.0 * f16_err(d) + f16_err(min) + 1e-30;
            for (a, b) in xb.iter().zip(yb) {
                prop_assert!((a - b).abs() <= tol, "{a} -> {b}, d={d} min={min}");
            }
        }
    }

    #[test]
    fn q8_1_and_q8_k_roundtrip(x in blocks_strategy(4, 256)) {
        for ty in [GgmlType::Q8_1, GgmlType::Q8_K] {
            let qk = ty.block().0;
            let y = roundtrip(ty, &x);
            for (xb, yb) in x.chunks(qk).zip(y.chunks(qk)) {
                let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                let d16 = if ty == GgmlType::Q8_K { 0.0 } else { f16_err(d) };
                let tol = 0.5 * d * 1.0001 + 128.0 * d16 + 1e-30;
                for (a, b) in xb.iter().zip(yb) {
                    prop_assert!((a - b).abs() <= tol, "{ty:?}: {a} -> {b}, d={d}");
                }
            }
        }
    }

    #[test]
    fn f16_bf16_roundtrip(x in proptest::collection::vec(-1e4f32..1e4, 0..100)) {
        for (ty, rel) in [(GgmlType::F16, 1.0 / 2048.0), (GgmlType::BF16, 1.0 / 256.0)] {
            let y = roundtrip(ty, &x);
            for (a, b) in x.iter().zip(&y) {
                prop_assert!((a - b).abs() <= a.abs() * rel + 6e-8, "{ty:?}: {a} -> {b}");
            }
        }
        prop_assert_eq!(roundtrip(GgmlType::F32, &x), x);
    }
}

#[test]
fn q8_1_sum_field_is_d_times_code_sum() {
    let x: Vec<f32> = (0..64)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.3)
        .collect();
    let mut q = vec![0u8; 72];
    quantize_row(GgmlType::Q8_1, &x, &mut q).unwrap();
    for b in q.chunks(36) {
        let d = kiln_host::quant::blocks::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let s = kiln_host::quant::blocks::f16_to_f32(u16::from_le_bytes([b[2], b[3]]));
        let sum: i32 = b[4..].iter().map(|&c| c as i8 as i32).sum();
        assert!((s - d * sum as f32).abs() <= (d * sum as f32).abs() / 1024.0);
        assert!(b[4..].iter().all(|&c| c as i8 != -128));
    }
}

#[test]
fn mismatched_sizes_are_errors() {
    use GgmlType::*;
    let mut out = vec![0f32; 64];
    let e = dequantize_row(Q4_0, &[0u8; 35], &mut out)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Q4_0") && e.contains("36") && e.contains("35"),
        "{e}"
    );
    let e = dequantize_row(Q4_K, &[0u8; 144], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Q4_K") && e.contains("256"), "{e}");
    assert!(dequantize_row(Q2_K, &[0u8; 84], &mut vec![0f32; 256]).is_err());
    assert!(dequantize_row(F32, &[0u8; 7], &mut [0f32; 2]).is_err());
    assert!(quantize_row(Q8_0, &[0f32; 31], &mut [0u8; 34]).is_err());
    assert!(quantize_row(Q8_0, &[0f32; 32], &mut [0u8; 33]).is_err());
    assert!(quantize_row(Q4_K, &[0f32; 256], &mut [0u8; 144]).is_err());
    assert!(quantize_row(Q8_K, &[0f32; 256], &mut [0u8; 292]).is_ok());
    // Empty rows are fine.
    assert!(dequantize_row(Q6_K, &[], &mut []).is_ok());
}

#[test]
fn bf16_conversion_rounds_to_nearest_even_and_keeps_nan() {
    use kiln_host::quant::blocks::{bf16_to_f32, f32_to_bf16};
    assert_eq!(f32_to_bf16(1.0), 0x3f80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie -> even
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie -> even
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    assert_eq!(bf16_to_f32(f32_to_bf16(f32::INFINITY)), f32::INFINITY);
}
