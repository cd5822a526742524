//! The CPU backend's two arithmetics, and the scalar steps where they differ.
//!
//! [`Numerics::Kiln`] (the default) rounds where it is most accurate: f32 attention with a
//! two-pass softmax, RMSNorm and RoPE angles in f64; its 8-bit activation codes round as the
//! CUDA kernels do, so the two backends agree op for op.
//!
//! [`Numerics::Llama`] reproduces what llama.cpp's CPU backend computes (llama.cpp 0c1e570 as
//! vendored in llama-cpp-python 0.3.36, built by GCC with `-march=native` on an AVX-512 machine,
//! default context: flash attention over an f16 KV cache), rounding for rounding. Greedy
//! decoding amplifies any one-ulp difference: it moves an 8-bit activation code somewhere, and
//! logits then drift by ~0.1 (measured on SmolLM2), enough to flip near-ties. With every step
//! below reproduced, SmolLM2's logits equal llama.cpp's to the 4 decimals it printed at every
//! step of 9 prompts (4 to 104 tokens) × 32 tokens; with any one left out they were back ~0.1 away
//! (`docs/benchmarks.md`, `host/tests/model_smollm2.rs`). Costs: attention accumulates in f16
//! (less precise), decode ran at ~0.75× kiln's speed. Checked only where SmolLM2 goes (llama
//! architecture, Q4_1 / Q8_0 weights): K-quant activations keep kiln's rounding, qwen3 is
//! unchecked, and the sum orders are an AVX-512 build's (an AVX2-only build of llama.cpp takes
//! other code paths for the Q·K dot and for `exp`, so it is not what this reproduces).

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    #[default]
    Kiln,
    Llama,
}

impl Numerics {
    /// `1/d` for the 8-bit codes of a block whose largest magnitude is `amax` (`d = amax/127`):
    /// kiln inverts the rounded `d`, llama.cpp's x86 quantizers compute `127/amax` directly.
    #[inline(always)]
    pub fn q8_inv_scale(self, amax: f32) -> f32 {
        let d = amax / 127.0;
        match self {
            _ if d == 0.0 => 0.0,
            Numerics::Kiln => 1.0 / d,
            Numerics::Llama => 127.0 / amax,
        }
    }

    /// The 8-bit code of `v` (already scaled by `1/d`): kiln rounds half away from zero like
    /// llama.cpp's reference quantizer, its AVX build rounds half to even (`_mm256_round_ps`).
    #[inline(always)]
    pub fn q8_code(self, v: f32) -> i8 {
        let c = match self {
            Numerics::Kiln => round_half_away(v),
            // Ties to even by the 1.5·2²³ shift (the default rounding mode; |v| ≤ 2²² here),
            // which is what `round_ties_even` computes without a call to libm's `rintf`.
            Numerics::Llama => ((v + ROUND_SHIFT) - ROUND_SHIFT) as i32,
        };
        c.clamp(-127, 127) as i8
    }

    /// `silu(g) · u`. llama.cpp's SwiGLU takes `exp` from ggml's vectorised polynomial, not libm.
    #[inline]
    pub fn silu_mul(self, g: f32, u: f32) -> f32 {
        let e = match self {
            Numerics::Kiln => (-g).exp(),
            Numerics::Llama => ggml_expf(0.0 - g),
        };
        g / (1.0 + e) * u
    }

    /// RMSNorm's `1/sqrt(mean(x²) + eps)`. kiln: squares and mean in f64. llama.cpp: squares
    /// rounded to f32, summed in f64, the mean rounded to f32, then `1/sqrtf` in f32.
    pub fn rms_scale(self, x: &[f32], eps: f32) -> f32 {
        match self {
            Numerics::Kiln => {
                let ms = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / x.len() as f64;
                (1.0 / (ms + eps as f64).sqrt()) as f32
            }
            Numerics::Llama => {
                let mean = (x.iter().map(|&v| (v * v) as f64).sum::<f64>() / x.len() as f64) as f32;
                1.0 / (mean + eps).sqrt()
            }
        }
    }

    /// RoPE's frequencies `base^(-2i/rot_dim) / factors[i]` for `rot_dim/2` pairs (`factors`:
    /// Llama 3.1's `rope_freqs`, all 1 when `None`; callers check its length).
    pub fn rope_freqs(self, base: f32, rot_dim: usize, factors: Option<&[f32]>) -> RopeFreqs {
        let factors: Vec<f32> = match factors {
            Some(f) => f.to_vec(),
            None => vec![1.0; rot_dim / 2],
        };
        let inv_freq = (0..rot_dim / 2)
            .map(|i| (base as f64).powf(-2.0 * i as f64 / rot_dim as f64) / factors[i] as f64)
            .collect();
        RopeFreqs {
            numerics: self,
            inv_freq,
            step: base.powf(-2.0 / rot_dim as f32),
            factors,
        }
    }

    /// The pair `(x0, x1)` rotated by the angle of `(c, s)`. GCC contracts the first product of
    /// each of llama.cpp's two expressions into a fused multiply-add.
    #[inline(always)]
    pub fn rotate(self, x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
        match self {
            Numerics::Kiln => (x0 * c - x1 * s, x0 * s + x1 * c),
            Numerics::Llama => (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c)),
        }
    }
}

/// 1.5·2²³: added to and taken from an f32 of magnitude below 2²², rounds it to an integer.
const ROUND_SHIFT: f32 = 12_582_912.0;

pub struct RopeFreqs {
    numerics: Numerics,
    inv_freq: Vec<f64>,
    /// `base^(-2/rot_dim)` in f32: llama.cpp's ratio from one pair's angle to the next.
    step: f32,
    /// Per-pair divisors of the angle (llama.cpp divides its f32 angle by them).
    factors: Vec<f32>,
}

impl RopeFreqs {
    /// (cos, sin) of every pair's angle at position `pos`. kiln: each angle in f64. llama.cpp:
    /// in f32, starting at `pos` and multiplied by `step` from one pair to the next, then
    /// `cosf`/`sinf` (Rust's f32 `cos`/`sin` are those libm calls).
    pub fn cos_sin(&self, pos: usize) -> Vec<(f32, f32)> {
        match self.numerics {
            Numerics::Kiln => self
                .inv_freq
                .iter()
                .map(|&f| {
                    let a = pos as f64 * f;
                    (a.cos() as f32, a.sin() as f32)
                })
                .collect(),
            Numerics::Llama => {
                let mut theta = pos as f32;
                self.factors
                    .iter()
                    .map(|&f| {
                        let a = theta / f;
                        theta *= self.step;
                        (a.cos(), a.sin())
                    })
                    .collect()
            }
        }
    }
}

/// `v.round() as i32` (half away from zero) for |v| < 2³¹, without a call to libm's `roundf`
/// (x86-64's baseline has no rounding instruction for that mode): truncate, then step away
/// from zero when the exact remainder is at least one half. NaN gives 0, as `NaN as i8` does.
#[inline(always)]
pub(crate) fn round_half_away(v: f32) -> i32 {
    let t = v as i32;
    let frac = v - t as f32; // exact: t is v truncated and |v| < 2^31
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

/// `e^x` as ggml's AVX-512 `ggml_v_expf` computes it lane by lane (max error ~1.5 ulp): `x =
/// n·ln2 + b` with `n` rounded to an integer by the 1.5·2²³ shift, `ln2` split in two
/// constants; a degree-5 polynomial in `b`; the result scaled by `2^n` (`vscalefps`). `n`
/// beyond ±192 gives 0 or infinity. Every multiply-add is fused, as the intrinsics are.
pub fn ggml_expf(x: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") {
        // SAFETY: the feature was just detected.
        return unsafe { ggml_expf_fma(x) };
    }
    ggml_expf_in(x)
}

/// [`ggml_expf`] with `mul_add` as one instruction instead of a libm call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn ggml_expf_fma(x: f32) -> f32 {
    ggml_expf_in(x)
}

#[inline(always)]
fn ggml_expf_in(x: f32) -> f32 {
    let k = f32::from_bits;
    let n = x.mul_add(k(0x3fb8_aa3b), ROUND_SHIFT) - ROUND_SHIFT; // round(x · log2 e)
    let b = (-n).mul_add(k(0x35bf_be8e), (-n).mul_add(k(0x3f31_7200), x));
    let u = b * b;
    let hi = k(0x3c07_2010)
        .mul_add(b, k(0x3d2b_9f17))
        .mul_add(u, k(0x3e2a_af33).mul_add(b, k(0x3eff_fedb)));
    let j = hi.mul_add(u, k(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // j · 2^n is exact in f64; one rounding to f32, as scalef rounds (subnormals included).
    (j as f64 * 2f64.powi(n as i32)) as f32
}

/// Dot product of two vectors of f16 values (held as f32) in the summation order of ggml's
/// AVX-512 `ggml_vec_dot_f16`: four 16-lane accumulators over 64-element steps, folded (0+2,
/// 1+3, then together), the 16 lanes summed as halves (8, 4, 2, 1), then a tail past the last
/// whole step added one by one in f64. Products of two f16 values are exact in f32, so these
/// plain additions round as ggml's fused multiply-adds do.
#[inline]
pub fn dot_f16_values_ggml(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    const STEP: usize = 4 * LANES;
    let n = a.len().min(b.len());
    let whole = n / STEP * STEP;
    let mut acc = [[0f32; LANES]; 4];
    for (ca, cb) in a[..whole]
        .chunks_exact(STEP)
        .zip(b[..whole].chunks_exact(STEP))
    {
        for (j, acc) in acc.iter_mut().enumerate() {
            for (l, s) in acc.iter_mut().enumerate() {
                *s += ca[j * LANES + l] * cb[j * LANES + l];
            }
        }
    }
    let t: [f32; LANES] =
        std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    a[whole..n]
        .iter()
        .zip(&b[whole..n])
        .fold(sum16_ggml(t) as f64, |s, (x, y)| s + (x * y) as f64) as f32
}

/// The sum of 16 lanes as `_mm512_reduce_add_ps` adds them: halves folded onto each other
/// (8, 4, 2, then 1 lanes wide).
#[inline]
pub fn sum16_ggml(mut t: [f32; 16]) -> f32 {
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            t[l] += t[l + w];
        }
    }
    t[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;
    use proptest::prelude::*;

    const BOTH: [Numerics; 2] = [Numerics::Kiln, Numerics::Llama];

    /// Distance in units in the last place between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn round_half_away_edges() {
        let below_half = f32::from_bits(0.5f32.to_bits() - 1);
        for v in [
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            below_half,
            -below_half,
            126.5,
            -126.5,
            127.49998,
            1e-30,
        ] {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
        }
        assert_eq!(round_half_away(f32::NAN), 0);
    }

    #[test]
    fn q8_codes_differ_only_at_ties_and_scale() {
        // Ties: kiln away from zero, llama.cpp's AVX quantizer to even.
        assert_eq!(
            (Numerics::Kiln.q8_code(2.5), Numerics::Llama.q8_code(2.5)),
            (3, 2)
        );
        assert_eq!(
            (Numerics::Kiln.q8_code(-3.5), Numerics::Llama.q8_code(-3.5)),
            (-4, -4)
        );
        assert_eq!(Numerics::Llama.q8_code(1000.0), 127);
        for n in BOTH {
            assert_eq!(n.q8_inv_scale(0.0), 0.0);
        }
        // 1/(amax/127) and 127/amax: two roundings against one, at most an ulp or two apart.
        let amax = 0.3f32;
        assert!(
            ulps(
                Numerics::Kiln.q8_inv_scale(amax),
                Numerics::Llama.q8_inv_scale(amax)
            ) <= 2
        );
    }

    #[test]
    fn ggml_expf_limits() {
        assert_eq!(ggml_expf(0.0), 1.0);
        assert_eq!(ggml_expf(-200.0), 0.0);
        assert_eq!(ggml_expf(200.0), f32::INFINITY);
        assert_eq!(ggml_expf(-f32::INFINITY), 0.0);
    }

    proptest! {
        #[test]
        fn round_half_away_is_round(v in -200f32..200.0, bits in any::<u32>()) {
            prop_assert_eq!(round_half_away(v), v.round() as i32);
            let w = f32::from_bits(bits);
            if w.abs() < 1e9 {
                prop_assert_eq!(round_half_away(w), w.round() as i32, "{}", w);
            }
        }

        /// The shift rounds ties to even like `round_ties_even`, through ±127's range and beyond.
        #[test]
        fn llama_q8_code_rounds_ties_to_even(v in -300f32..300.0, half_steps in -600i32..600) {
            for v in [v, half_steps as f32 / 2.0] {
                prop_assert_eq!(Numerics::Llama.q8_code(v), (v.round_ties_even() as i32).clamp(-127, 127) as i8, "{}", v);
            }
        }

        /// ggml's stated bound is 1.45 ulp plus rounding; where the result is normal.
        #[test]
        fn ggml_expf_is_within_2_ulp(x in -87f32..88.0) {
            let e = ggml_expf(x);
            let r = (x as f64).exp() as f32;
            prop_assert!(ulps(e, r) <= 2, "x={x}: {e} vs {r}");
        }

        /// Both SiLUs agree to a few ulp of the product (the exps differ by ≤2 ulp).
        #[test]
        fn silu_mul_numerics_agree(g in -80f32..80.0, u in -10f32..10.0) {
            let (k, l) = (Numerics::Kiln.silu_mul(g, u), Numerics::Llama.silu_mul(g, u));
            prop_assert!((k - l).abs() <= 1e-6 * k.abs() + 1e-30, "{k} vs {l}");
        }

        /// The f16 dot in ggml's order against an f64 sum: f32 rounding only (products are exact).
        #[test]
        fn dot_f16_values_ggml_matches_f64(v in prop::collection::vec((-4f32..4.0, -4f32..4.0), 0..200)) {
            let f16_value = |x: f32| f16::from_f32(x).to_f32();
            let a: Vec<f32> = v.iter().map(|p| f16_value(p.0)).collect();
            let b: Vec<f32> = v.iter().map(|p| f16_value(p.1)).collect();
            let (exact, mag) = a.iter().zip(&b).fold((0f64, 0f64), |(s, m), (&x, &y)| {
                let p = x as f64 * y as f64;
                (s + p, m + p.abs())
            });
            let got = dot_f16_values_ggml(&a, &b) as f64;
            prop_assert!((got - exact).abs() <= mag * 2f64.powi(-24) * 8.0 + 1e-30, "{got} vs {exact}");
        }

        #[test]
        fn rms_scale_numerics_agree(x in prop::collection::vec(-100f32..100.0, 1..600)) {
            let k = Numerics::Kiln.rms_scale(&x, 1e-5);
            let l = Numerics::Llama.rms_scale(&x, 1e-5);
            prop_assert!(ulps(k, l) <= 2, "{k} vs {l}");
        }

        /// llama.cpp's f32 angles (rounded once per pair as they are chained) stay within 1e-3
        /// of kiln's f64 ones up to position 4096.
        #[test]
        fn rope_numerics_agree(pos in 0usize..4096, base in prop::sample::select(vec![10_000f32, 100_000.0, 1_000_000.0])) {
            let k = Numerics::Kiln.rope_freqs(base, 64, None).cos_sin(pos);
            let l = Numerics::Llama.rope_freqs(base, 64, None).cos_sin(pos);
            for (i, (a, b)) in k.iter().zip(&l).enumerate() {
                prop_assert!((a.0 - b.0).abs() < 1e-3 && (a.1 - b.1).abs() < 1e-3, "pair {i}: {a:?} vs {b:?}");
            }
        }
    }
}
