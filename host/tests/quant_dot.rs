//! Fast dot products and QMatrix::matmul against a float64 reference, scalar vs AVX2
//! agreement, odd shapes, and shape errors.

use kiln_host::gguf::GgmlType;
use kiln_host::numerics::Numerics;
use kiln_host::quant::blocks::{f16_to_f32, f32_to_f16, get_scale_min_k4};
use kiln_host::quant::{
    Isa, QMatrix, activation_type, dequantize_row, matmul_many_with, matmul_swiglu_with,
    quantize_activations, vec_dot_with,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use GgmlType::*;
const WEIGHT_TYPES: [GgmlType; 11] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
];

/// A finite f16 scale of either sign, over several binades, sometimes zero.
fn scale(rng: &mut StdRng, base: f32) -> [u8; 2] {
    let v = if rng.random_bool(0.05) {
        0.0
    } else {
        let m: f32 = rng.random_range(-1.0..1.0);
        m * base * 2f32.powi(rng.random_range(-4..3))
    };
    f32_to_f16(v).to_le_bytes()
}

/// Random weights of `ty`: every code bit random (all nibble / 6-bit / i8 values appear),
/// scale fields finite random of both signs.
fn random_weights(rng: &mut StdRng, ty: GgmlType, n_elems: usize) -> Vec<u8> {
    let (qk, bs) = ty.block();
    let mut w = vec![0u8; n_elems / qk * bs];
    rng.fill(&mut w[..]);
    match ty {
        F32 => {
            for c in w.chunks_mut(4) {
                c.copy_from_slice(&rng.random_range(-2f32..2.0).to_le_bytes());
            }
        }
        F16 => {
            for c in w.chunks_mut(2) {
                c.copy_from_slice(&scale(rng, 1.0));
            }
        }
        BF16 => {
            for c in w.chunks_mut(2) {
                let v: f32 = rng.random_range(-2.0..2.0);
                c.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        _ => {
            for b in w.chunks_mut(bs) {
                match ty {
                    Q4_0 | Q5_0 | Q8_0 => b[0..2].copy_from_slice(&scale(rng, 0.1)),
                    Q4_1 | Q5_1 => {
                        b[0..2].copy_from_slice(&scale(rng, 0.1));
                        b[2..4].copy_from_slice(&scale(rng, 1.0));
                    }
                    Q4_K | Q5_K => {
                        b[0..2].copy_from_slice(&scale(rng, 0.01));
                        b[2..4].copy_from_slice(&scale(rng, 0.01));
                    }
                    Q6_K => b[208..210].copy_from_slice(&scale(rng, 0.01)),
                    _ => unreachable!(),
                }
            }
        }
    }
    w
}

fn random_acts(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let s = 2f32.powi(rng.random_range(-6..6));
    (0..n)
        .map(|_| rng.random_range(-1f32..1.0) * s * if rng.random_bool(0.1) { 8.0 } else { 1.0 })
        .collect()
}

fn h(b: &[u8], at: usize) -> f64 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])) as f64
}

/// Float64 dot of the dequantized weight row with the dequantized (quantized) activations, and
/// the sum of |terms| the kernel actually adds (its f32 rounding scales with that).
fn reference(ty: GgmlType, w: &[u8], act: &[u8], cols: usize) -> (f64, f64) {
    let mut wd = vec![0f32; cols];
    dequantize_row(ty, w, &mut wd).unwrap();
    let mut ad = vec![0f32; cols];
    dequantize_row(activation_type(ty).unwrap(), act, &mut ad).unwrap();
    let (mut dot, mut mag) = (0f64, 0f64);
    match ty {
        Q4_1 | Q5_1 => {
            // Q8_1 folds the offset through its stored (f16-rounded) s = d * sum(q).
            for (i, (wb, ab)) in w.chunks(ty.block().1).zip(act.chunks(36)).enumerate() {
                let (m, s) = (h(wb, 2), h(ab, 2));
                for l in 0..32 {
                    let t = (wd[32 * i + l] as f64 - m) * ad[32 * i + l] as f64;
                    dot += t;
                    mag += t.abs();
                }
                dot += m * s;
                mag += (m * s).abs();
            }
        }
        Q4_K | Q5_K => {
            // Terms are d*sc*q*a and dmin*m*a separately: bound |d*sc*q| by |w| + |dmin*m|.
            let bs = ty.block().1;
            for (i, wb) in w.chunks(bs).enumerate() {
                let scales: [u8; 12] = wb[4..16].try_into().unwrap();
                for e in 0..256 {
                    let (_, m) = get_scale_min_k4(e / 32, &scales);
                    let dm = (h(wb, 2) * m as f64).abs();
                    let (x, a) = (wd[256 * i + e] as f64, ad[256 * i + e] as f64);
                    dot += x * a;
                    mag += (x.abs() + 2.0 * dm) * a.abs();
                }
            }
        }
        _ => {
            for (x, a) in wd.iter().zip(&ad) {
                dot += *x as f64 * *a as f64;
                mag += (*x as f64 * *a as f64).abs();
            }
        }
    }
    (dot, mag)
}

fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::AvxVnni]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

fn check_close(got: f32, want: f64, mag: f64, what: &str) -> Result<(), TestCaseError> {
    let tol = 1e-5 * mag + 1e-30;
    prop_assert!(
        (got as f64 - want).abs() <= tol,
        "{what}: got {got}, want {want}, |diff| {} > tol {tol}",
        (got as f64 - want).abs()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn dot_matches_f64_reference(seed in any::<u64>(), nblocks in 1usize..12) {
        let mut rng = StdRng::seed_from_u64(seed);
        for ty in WEIGHT_TYPES {
            let qk = match ty { Q4_K | Q5_K | Q6_K => 256, _ => 32 };
            let cols = nblocks * qk;
            let w = random_weights(&mut rng, ty, cols);
            let x = random_acts(&mut rng, cols);
            let act = quantize_activations(ty, &x).unwrap();
            let (want, mag) = reference(ty, &w, &act, cols);
            for isa in isas() {
                let got = vec_dot_with(isa, ty, &w, &act).unwrap();
                check_close(got, want, mag, &format!("{ty:?} {isa:?} cols={cols}"))?;
            }
        }
    }

    #[test]
    fn matmul_matches_per_row_dot(seed in any::<u64>(), rows in 1usize..70, nblocks in 1usize..4, n in 1usize..6) {
        let mut rng = StdRng::seed_from_u64(seed);
        for ty in WEIGHT_TYPES {
            let qk = match ty { Q4_K | Q5_K | Q6_K => 256, _ => 32 };
            let cols = nblocks * qk;
            let w = random_weights(&mut rng, ty, rows * cols);
            let x = random_acts(&mut rng, n * cols);
            let m = QMatrix::try_new(ty, &w, rows, cols).unwrap();
            let rb = m.row_bytes();
            for isa in isas() {
                let mut y = vec![f32::NAN; n * rows];
                m.matmul_with(isa, &x, n, &mut y).unwrap();
                for a in 0..n {
                    let act = quantize_activations(ty, &x[a * cols..(a + 1) * cols]).unwrap();
                    for r in 0..rows {
                        // Same kernel on the same bytes: identical bits, whatever the tiling.
                        let d = vec_dot_with(isa, ty, &w[r * rb..(r + 1) * rb], &act).unwrap();
                        prop_assert_eq!(y[a * rows + r].to_bits(), d.to_bits(), "{:?} {:?} a={} r={}", ty, isa, a, r);
                    }
                }
            }
        }
    }
}

/// Large enough to take the parallel path (several rayon tasks, ragged last chunk) for both
/// decode (n = 1) and prefill blocking (n = 3), checked against the f64 reference.
#[test]
fn matmul_parallel_odd_shapes() {
    let mut rng = StdRng::seed_from_u64(7);
    for (ty, rows, cols) in [
        (Q4_1, 1003, 576),
        (Q8_0, 517, 576),
        (Q5_0, 301, 576),
        (Q5_1, 257, 544),
        (Q4_K, 301, 512),
        (Q6_K, 257, 768),
        (F16, 301, 96),
    ] {
        let w = random_weights(&mut rng, ty, rows * cols);
        let m = QMatrix::try_new(ty, &w, rows, cols).unwrap();
        for n in [1, 3] {
            let x = random_acts(&mut rng, n * cols);
            let mut y = vec![f32::NAN; n * rows];
            m.matmul(&x, n, &mut y).unwrap();
            let rb = m.row_bytes();
            for a in 0..n {
                let act = quantize_activations(ty, &x[a * cols..(a + 1) * cols]).unwrap();
                for r in 0..rows {
                    let (want, mag) = reference(ty, &w[r * rb..(r + 1) * rb], &act, cols);
                    let got = y[a * rows + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-30,
                        "{ty:?} n={n} a={a} r={r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// `matmul_many` and `matmul_swiglu` against one `matmul` per matrix (and `Numerics::silu_mul`): the same
/// kernels on the same bytes, so the bits must match whatever the task split. Types mixed, so
/// several activation formats are quantized in one call; outputs poisoned with NaN.
fn check_fused(rng: &mut StdRng, shapes: &[(GgmlType, usize)], cols: usize, n: usize) {
    let ws: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows)| random_weights(rng, ty, rows * cols))
        .collect();
    let ms: Vec<QMatrix> = shapes
        .iter()
        .zip(&ws)
        .map(|(&(ty, rows), w)| QMatrix::try_new(ty, w, rows, cols).unwrap())
        .collect();
    let x = random_acts(rng, n * cols);
    for isa in isas() {
        let want: Vec<Vec<f32>> = ms
            .iter()
            .map(|m| {
                let mut y = vec![f32::NAN; n * m.rows];
                m.matmul_with(isa, &x, n, &mut y).unwrap();
                y
            })
            .collect();
        let mut got: Vec<Vec<f32>> = ms.iter().map(|m| vec![f32::NAN; n * m.rows]).collect();
        let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|y| y.as_mut_slice()).collect();
        matmul_many_with(isa, &ms, &x, n, &mut outs).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (gb, wb): (Vec<u32>, Vec<u32>) = (
                g.iter().map(|v| v.to_bits()).collect(),
                w.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(
                gb, wb,
                "matmul_many {isa:?} matrix {i} ({:?}) n={n}",
                shapes[i]
            );
        }
        // SwiGLU over pairs of equal shape (the second matrix of each pair a different type).
        for (i, m) in ms.iter().enumerate() {
            let Some(other) = ms.iter().skip(i + 1).find(|o| o.rows == m.rows) else {
                continue;
            };
            let mut up = vec![f32::NAN; n * m.rows];
            other.matmul_with(isa, &x, n, &mut up).unwrap();
            let mut y = vec![f32::NAN; n * m.rows];
            matmul_swiglu_with(isa, m, other, &x, n, &mut y).unwrap();
            for (k, (&g, &u)) in want[i].iter().zip(&up).enumerate() {
                assert_eq!(
                    y[k].to_bits(),
                    Numerics::Kiln.silu_mul(g, u).to_bits(),
                    "matmul_swiglu {isa:?} {:?} k={k}",
                    shapes[i]
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn fused_matmuls_match_separate(seed in any::<u64>(), r1 in 1usize..40, r2 in 1usize..40, nblocks in 1usize..3, n in 1usize..5) {
        let mut rng = StdRng::seed_from_u64(seed);
        let shapes = [(Q4_1, r1), (Q8_0, r2), (Q4_K, r1), (F16, r2), (Q4_1, r2), (Q5_1, r1), (Q5_0, r2)];
        check_fused(&mut rng, &shapes, 256 * nblocks, n);
    }
}

/// The fused mat-muls at sizes that take the parallel path (several tasks per matrix, ragged
/// ends), decode and prefill-like n; SmolLM2's q/k/v and gate/up shapes among them.
#[test]
fn fused_matmuls_parallel_shapes() {
    let mut rng = StdRng::seed_from_u64(11);
    for n in [1, 3] {
        check_fused(&mut rng, &[(Q4_1, 576), (Q4_1, 192), (Q4_1, 192)], 576, n);
        check_fused(&mut rng, &[(Q4_1, 1536), (Q4_1, 1536)], 576, n);
        check_fused(
            &mut rng,
            &[(Q8_0, 1003), (Q4_0, 517), (Q4_1, 1003), (F32, 301)],
            576,
            n,
        );
    }
}

/// Extreme codes: all-0 / all-15 nibbles, Q8_0 weights of -128 against ±127 activations,
/// Q6_K codes 0 and 63 with scales -128 and 127 — the saturation corners of maddubs.
#[test]
fn extreme_codes_agree() {
    let cols = 512;
    let x: Vec<f32> = (0..cols)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    for fill in [0x00u8, 0xFF, 0x80, 0x7F] {
        for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K] {
            let (qk, bs) = ty.block();
            let mut w = vec![fill; cols / qk * bs];
            for b in w.chunks_mut(bs) {
                let at = if ty == Q6_K { 208 } else { 0 };
                b[at..at + 2].copy_from_slice(&f32_to_f16(-0.5).to_le_bytes());
                if matches!(ty, Q4_1 | Q5_1 | Q4_K | Q5_K) {
                    b[2..4].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
                }
            }
            let act = quantize_activations(ty, &x).unwrap();
            let (want, mag) = reference(ty, &w, &act, cols);
            for isa in isas() {
                let got = vec_dot_with(isa, ty, &w, &act).unwrap();
                assert!(
                    (got as f64 - want).abs() <= 1e-5 * mag + 1e-30,
                    "{ty:?} {isa:?} fill {fill:#x}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn shape_errors_are_err_not_panic() {
    let w = vec![0u8; 20 * 18 * 3];
    assert!(QMatrix::try_new(Q4_1, &w, 3, 18 * 32).is_ok());
    let e = QMatrix::try_new(Q4_1, &w, 4, 18 * 32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Q4_1") && e.contains("1080"), "{e}");
    assert!(QMatrix::try_new(Q4_1, &w, 3, 18 * 32 + 1).is_err());
    assert!(QMatrix::try_new(Q2_K, &w, 1, 256).is_err());
    assert!(QMatrix::try_new(Q8_0, &w, usize::MAX, 32).is_err());
    let m = QMatrix::try_new(Q4_1, &w, 3, 576).unwrap();
    let mut y = vec![0f32; 6];
    assert!(m.matmul(&vec![0f32; 576 * 2], 2, &mut y).is_ok());
    assert!(m.matmul(&vec![0f32; 576 * 2 - 1], 2, &mut y).is_err());
    assert!(m.matmul(&vec![0f32; 576 * 2], 2, &mut y[..5]).is_err());
    assert!(m.matmul(&vec![0f32; 576 * 2], 1, &mut y[..3]).is_err());
    // Public fields can be set inconsistently; matmul re-validates instead of reading past data.
    let bad = QMatrix {
        ty: Q4_1,
        data: &w[..100],
        rows: 3,
        cols: 576,
    };
    assert!(bad.matmul(&vec![0f32; 576], 1, &mut y[..3]).is_err());
    // vec_dot length checks.
    let act = quantize_activations(Q4_1, &vec![0f32; 64]).unwrap();
    assert!(vec_dot_with(Isa::Scalar, Q4_1, &w[..40], &act).is_ok());
    assert!(vec_dot_with(Isa::Scalar, Q4_1, &w[..60], &act).is_err());
    assert!(vec_dot_with(Isa::Scalar, Q4_1, &w[..39], &act).is_err());
    assert!(quantize_activations(Q4_K, &[0f32; 32]).is_err());
    // n = 0 is a no-op.
    assert!(m.matmul(&[], 0, &mut []).is_ok());
}
