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
    fn q4_1_q5_1_roundtrip_within_half_step(x in blocks_strategy(6, 32)) {
        for (ty, levels) in [(GgmlType::Q4_1, 15.0), (GgmlType::Q5_1, 31.0)] {
            let y = roundtrip(ty, &x);
            for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
                let max = xb.iter().copied().fold(f32::MIN, f32::max);
                let min = xb.iter().copied().fold(f32::MAX, f32::min);
                let d = (max - min) / levels;
                let tol = 0.5 * d * 1.0001 + (levels + 1.0) * f16_err(d) + f16_err(min) + 1e-30;
                for (a, b) in xb.iter().zip(yb) {
                    prop_assert!((a - b).abs() <= tol, "{ty:?}: {a} -> {b}, d={d} min={min}");
                }
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

/// The two 5-bit formats: (type, bytes before `qh`, code offset, has a minimum).
const Q5_FORMATS: [(GgmlType, usize, i32, bool); 2] =
    [(GgmlType::Q5_0, 2, 16, false), (GgmlType::Q5_1, 4, 0, true)];

fn half(b: &[u8], at: usize) -> f64 {
    kiln_host::quant::blocks::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])) as f64
}

/// Element `i` of a Q5_0/Q5_1 block from the layout as llama.cpp documents it, in f64.
fn q5_reference(ty: GgmlType, b: &[u8], i: usize) -> f64 {
    let (_, at, offset, has_min) = Q5_FORMATS.into_iter().find(|f| f.0 == ty).unwrap();
    let qh = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let byte = b[at + 4 + i % 16];
    let low = if i < 16 { byte & 0xF } else { byte >> 4 };
    let q = low as i32 + (((qh >> i) & 1) as i32) * 16 - offset;
    let m = if has_min { half(b, 2) } else { 0.0 };
    half(b, 0) * q as f64 + m
}

/// Random blocks of `ty` (all code bits random) with finite scales of both signs.
fn random_q5_blocks(ty: GgmlType, bytes: &[u8], scales: &[f32]) -> Vec<u8> {
    use kiln_host::quant::blocks::f32_to_f16;
    let bs = ty.block().1;
    let mut out = Vec::new();
    for (blk, s) in bytes.chunks_exact(bs).zip(scales.chunks_exact(2)) {
        let mut b = blk.to_vec();
        b[0..2].copy_from_slice(&f32_to_f16(s[0]).to_le_bytes());
        if ty == GgmlType::Q5_1 {
            b[2..4].copy_from_slice(&f32_to_f16(s[1]).to_le_bytes());
        }
        out.extend(b);
    }
    out
}

/// llama.cpp's reference quantizers for Q5_0/Q5_1, transcribed loop by loop (the library's
/// version shares its search with Q4_0/Q4_1), for a bit-for-bit comparison.
fn q5_quantize_reference(ty: GgmlType, x: &[f32; 32]) -> Vec<u8> {
    use kiln_host::quant::blocks::f32_to_f16;
    let mut out = vec![0u8; ty.block().1];
    let mut codes = [0u8; 32];
    let at = if ty == GgmlType::Q5_0 {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = ((v * id + 16.5) as i8).min(31) as u8;
        }
        out[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        2
    } else {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = ((v - min) * id + 0.5) as u8;
        }
        out[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        out[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        4
    };
    let mut qh = 0u32;
    for j in 0..16 {
        let (c0, c1) = (codes[j], codes[j + 16]);
        out[at + 4 + j] = (c0 & 0xF) | ((c1 & 0xF) << 4);
        qh |= (((c0 & 0x10) >> 4) as u32) << j;
        qh |= (((c1 & 0x10) >> 4) as u32) << (j + 16);
    }
    out[at..at + 4].copy_from_slice(&qh.to_le_bytes());
    out
}

/// One hand-made block per format: fifth bits at elements 0, 17 (byte 2 of `qh`) and 31, low
/// nibbles of elements 0/16, 1/17 and 15/31 in bytes 0, 1 and 15 of `qs`.
#[test]
fn q5_hand_computed_blocks() {
    let qh = [0x01, 0x00, 0x02, 0x80];
    let mut qs = [0u8; 16];
    (qs[0], qs[1], qs[15]) = (0x21, 0x50, 0xF3);
    let expect = |pairs: &[(usize, f32)], rest: f32| {
        let mut v = [rest; 32];
        for &(i, x) in pairs {
            v[i] = x;
        }
        v
    };
    // Q5_0, d = 0.5: codes 17, 2, 3, 31, 21 at elements 0, 16, 15, 31, 17; the rest 0 (-8).
    let mut q5_0 = vec![0x00, 0x38];
    q5_0.extend(qh);
    q5_0.extend(qs);
    let want_0 = expect(
        &[(0, 0.5), (16, -7.0), (15, -6.5), (31, 7.5), (17, 2.5)],
        -8.0,
    );
    // Q5_1, d = 0.25, m = -1: the same codes as 0.25·q − 1.
    let mut q5_1 = vec![0x00, 0x34, 0x00, 0xBC];
    q5_1.extend(qh);
    q5_1.extend(qs);
    let want_1 = expect(
        &[(0, 3.25), (16, -0.5), (15, -0.25), (31, 6.75), (17, 4.25)],
        -1.0,
    );
    for (ty, block, want) in [
        (GgmlType::Q5_0, q5_0, want_0),
        (GgmlType::Q5_1, q5_1, want_1),
    ] {
        let mut got = [0f32; 32];
        dequantize_row(ty, &block, &mut got).unwrap();
        assert_eq!(got, want, "{ty:?} dequantized");
        // The values are on the grid with their extremes at codes 0 and 31: the quantizer
        // finds the same scale and gives the block back byte for byte.
        let mut q = vec![0u8; block.len()];
        quantize_row(ty, &want, &mut q).unwrap();
        assert_eq!(q, block, "{ty:?} quantized");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn q5_dequant_and_get_match_f64_reference(
        nb in 1usize..6,
        bytes in proptest::collection::vec(any::<u8>(), 6 * 24),
        scales in proptest::collection::vec(-4f32..4.0, 12),
    ) {
        use kiln_host::quant::blocks::*;
        for (ty, ..) in Q5_FORMATS {
            let bs = ty.block().1;
            let w = random_q5_blocks(ty, &bytes[..nb * bs], &scales);
            let mut got = vec![0f32; nb * 32];
            dequantize_row(ty, &w, &mut got).unwrap();
            for (i, g) in got.iter().enumerate() {
                let b = &w[i / 32 * bs..][..bs];
                let want = q5_reference(ty, b, i % 32);
                // Q5_0's d·(q − 16) is exact in f32; Q5_1 rounds d·q + m once.
                let tol = if ty == GgmlType::Q5_0 { 0.0 } else { want.abs() * 2f64.powi(-24) };
                prop_assert!((*g as f64 - want).abs() <= tol, "{ty:?} element {i}: {g} vs {want}");
                let get = if ty == GgmlType::Q5_0 {
                    BlockQ5_0::read(b).unwrap().get(i % 32)
                } else {
                    BlockQ5_1::read(b).unwrap().get(i % 32)
                };
                prop_assert_eq!(get.to_bits(), g.to_bits(), "{:?} get({})", ty, i);
            }
        }
    }

    /// The GPU's load of Q5_0 (`kernels_gpu::quant::reblock::q5_0_as_q8_0`): the Q8_0 blocks
    /// dequantize to the Q5_0 blocks' values bit for bit, NaN and infinite scales included.
    #[test]
    fn q5_0_as_q8_0_keeps_every_value(
        nb in 1usize..6,
        bytes in proptest::collection::vec(any::<u8>(), 6 * 22),
        scales in proptest::collection::vec(-4f32..4.0, 12),
        raw_scale in any::<bool>(),
    ) {
        use kernels_gpu::quant::reblock;
        let w = if raw_scale {
            bytes[..nb * 22].to_vec() // any bit pattern as d: NaN, infinities, subnormals
        } else {
            random_q5_blocks(GgmlType::Q5_0, &bytes[..nb * 22], &scales)
        };
        let mut q8 = vec![0xAAu8; nb * 34];
        prop_assert_eq!(reblock::q5_0_as_q8_0(&w, &mut q8), Ok(()));
        let (mut want, mut got) = (vec![0f32; nb * 32], vec![0f32; nb * 32]);
        dequantize_row(GgmlType::Q5_0, &w, &mut want).unwrap();
        dequantize_row(GgmlType::Q8_0, &q8, &mut got).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&got), bits(&want));
        // Whole blocks only, and a destination of the matching size.
        prop_assert!(reblock::q5_0_as_q8_0(&w[1..], &mut q8[..(nb - 1) * 34]).is_err());
        prop_assert!(reblock::q5_0_as_q8_0(&w, &mut q8[1..]).is_err());
    }

    #[test]
    fn q5_quantize_matches_reference_transcription(x in blocks_strategy(6, 32), dup in 0usize..32) {
        // Ties between the extremes (a repeated max of opposite sign) pick the first.
        let mut x = x;
        x[dup] = -x[0];
        for (ty, ..) in Q5_FORMATS {
            let bs = ty.block().1;
            let mut got = vec![0u8; x.len() / 32 * bs];
            quantize_row(ty, &x, &mut got).unwrap();
            for (i, (g, xb)) in got.chunks(bs).zip(x.chunks(32)).enumerate() {
                let want = q5_quantize_reference(ty, xb.try_into().unwrap());
                prop_assert_eq!(g, &want[..], "{:?} block {}", ty, i);
            }
        }
    }

    #[test]
    fn q5_0_roundtrip_within_half_step(x in blocks_strategy(6, 32)) {
        let y = roundtrip(GgmlType::Q5_0, &x);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let max = xb.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            let d = max.abs() / 16.0;
            for (a, b) in xb.iter().zip(yb) {
                // As Q4_0: only code 31 clips, one step short of the extreme's mirror image.
                let step = if (a / d).abs() > 15.5 && a.signum() != max.signum() { 1.0 } else { 0.5 };
                let tol = step * d * 1.0001 + 32.0 * f16_err(d) + 1e-30;
                prop_assert!((a - b).abs() <= tol, "{a} -> {b}, d={d}");
            }
        }
    }
}
