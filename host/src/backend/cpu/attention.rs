//! Causal grouped-query attention over the f16 KV cache.
//!
//! Cache layout per layer: `[n_kv_head][max_seq][head_dim]`. Each (query row, head) pair is one
//! rayon task: scores against the head's contiguous keys, softmax, weighted sum of values; in
//! [`Numerics::Llama`], llama.cpp's single-pass version of the same ([`llama_row`]).

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::CpuTensor;
use crate::backend::{Attention, KvSpec};
use crate::numerics::{Numerics, dot_f16_values_ggml, ggml_expf, sum16_ggml};

/// Below this many query-key multiply-adds attention runs on the calling thread.
const PAR_MIN_MACS: usize = 1 << 15;

/// llama.cpp's flash-attention tile (`GGML_FA_TILE_Q` = `GGML_FA_TILE_KV`): batches of this many
/// queries or more take its tiled path, whose key tiles are this long.
const LLAMA_TILE: usize = 64;

/// Writes rows of `x` (`[n, n_kv_head*head_dim]`, positions `pos..pos+n`) into one layer's cache.
pub(super) fn store(cache: &mut [f16], x: &CpuTensor, pos: usize, spec: &KvSpec) {
    let hd = spec.head_dim;
    for (i, row) in x.data.chunks_exact(x.cols).enumerate() {
        for (h, src) in row.chunks_exact(hd).enumerate() {
            let at = (h * spec.max_seq + pos + i) * hd;
            for (d, &s) in cache[at..at + hd].iter_mut().zip(src) {
                *d = f16::from_f32(s);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    kc: &[f16],
    vc: &[f16],
    q: &CpuTensor,
    out: &mut CpuTensor,
    pos: usize,
    attn: &Attention,
    max_seq: usize,
    numerics: Numerics,
) {
    let hd = attn.head_dim;
    let group = attn.n_head / attn.n_kv_head;
    let simd = Simd::detect();
    // One task per (row, head): out is [n][n_head][hd], so its head_dim chunks enumerate them.
    let task = |(task, o): (usize, &mut [f32])| {
        let (i, h) = (task / attn.n_head, task % attn.n_head);
        let qh = &q.data[i * q.cols + h * hd..][..hd];
        let base = (h / group) * max_seq * hd;
        let len = pos + i + 1;
        let keys = &kc[base..base + len * hd];
        let vals = &vc[base..base + len * hd];
        if numerics == Numerics::Llama {
            let tiled = q.rows >= LLAMA_TILE;
            return llama_row(simd, tiled, qh, keys, vals, attn.scale, o);
        }
        let mut scores: Vec<f32> = keys
            .chunks_exact(hd)
            .map(|k| simd.dot(qh, k) * attn.scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for s in &mut scores {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        o.fill(0.0);
        for (&p, v) in scores.iter().zip(vals.chunks_exact(hd)) {
            simd.axpy(p * inv, v, o);
        }
    };
    // Early decode steps are a few thousand multiply-adds: cheaper than waking the pool.
    let work = q.rows * attn.n_head * (pos + q.rows) * hd;
    if work < PAR_MIN_MACS {
        out.data.chunks_exact_mut(hd).enumerate().for_each(task);
    } else {
        out.data.par_chunks_exact_mut(hd).enumerate().for_each(task);
    }
}

/// One query row against `keys`/`vals` (rows of `q.len()`) as llama.cpp's CPU flash attention
/// computes it over an f16 cache: [`one_chunk`] for batches under [`LLAMA_TILE`] queries,
/// [`tiled`] from there on. (From 512 cached positions on, its single-query path splits the
/// keys over threads, which neither reproduces.)
fn llama_row(
    simd: Simd,
    tiled: bool,
    q: &[f32],
    keys: &[f16],
    vals: &[f16],
    scale: f32,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd.avx2 {
        // SAFETY: the features were detected by `Simd::detect`.
        return unsafe { llama_row_fma(tiled, q, keys, vals, scale, o) };
    }
    let _ = simd;
    llama_row_in(tiled, q, keys, vals, scale, o)
}

/// [`llama_row`] with `mul_add` as one instruction instead of a libm call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn llama_row_fma(
    tiled: bool,
    q: &[f32],
    keys: &[f16],
    vals: &[f16],
    scale: f32,
    o: &mut [f32],
) {
    llama_row_in(tiled, q, keys, vals, scale, o)
}

#[inline(always)]
fn llama_row_in(tiled: bool, q: &[f32], keys: &[f16], vals: &[f16], scale: f32, o: &mut [f32]) {
    if tiled {
        tiled_row(q, keys, vals, scale, o)
    } else {
        one_chunk(q, keys, vals, scale, o)
    }
}

/// `ggml_compute_forward_flash_attn_ext_f16_one_chunk`: the query rounded to f16, scores scaled
/// after the dot, one pass with a running maximum and sum, and values accumulated in f16 —
/// rescaled when the maximum rises, each multiply-add rounded back to f16.
#[inline(always)]
fn one_chunk(q: &[f32], keys: &[f16], vals: &[f16], scale: f32, o: &mut [f32]) {
    let hd = q.len();
    // f16 values held as f32 (exactly): the query, each key or value row, the accumulator,
    // which `acc16` rounds back to f16 after each update.
    let q16: Vec<f32> = q.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    let (mut acc, mut row, mut acc16) = (vec![0f32; hd], vec![0f32; hd], vec![f16::ZERO; hd]);
    let mut round_acc = |acc: &mut [f32]| {
        acc16.convert_from_f32_slice(acc);
        acc16.convert_to_f32_slice(acc);
    };
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    for (k, v) in keys.chunks_exact(hd).zip(vals.chunks_exact(hd)) {
        k.convert_to_f32_slice(&mut row);
        let s = dot_f16_values_ggml(&q16, &row) * scale;
        // A new maximum rescales the sums so far and weighs this key 1; else its weight is < 1.
        let (ms, vs) = if s > max {
            let ms = (max - s).exp();
            max = s;
            acc.iter_mut().for_each(|a| *a *= ms);
            round_acc(&mut acc);
            (ms, 1.0)
        } else {
            (1.0, (s - max).exp())
        };
        v.convert_to_f32_slice(&mut row);
        acc.iter_mut()
            .zip(&row)
            .for_each(|(a, &v)| *a = v.mul_add(vs, *a));
        round_acc(&mut acc);
        // `S*ms + vs` in llama.cpp, which GCC contracts into one fused multiply-add.
        sum = sum.mul_add(ms, vs);
    }
    let inv = 1.0 / sum;
    for (o, a) in o.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

/// `ggml_compute_forward_flash_attn_ext_tiled`: keys in tiles of [`LLAMA_TILE`] from position
/// 0; per tile, f32 scores (the query unrounded, one fused multiply-add per dim in order), the
/// running maximum and sums rescaled if the tile's maximum is above it, the tile's weights by
/// ggml's `expf` and summed 16 lanes at a time into f64, then the weighted values added in key
/// order by fused multiply-adds onto an f32 accumulator. Positions past the last key weigh 0.
#[inline(always)]
fn tiled_row(q: &[f32], keys: &[f16], vals: &[f16], scale: f32, o: &mut [f32]) {
    let hd = q.len();
    let (mut acc, mut row) = (vec![0f32; hd], vec![0f32; hd]);
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut p = [0f32; LLAMA_TILE];
    for (ks, vs) in keys
        .chunks(LLAMA_TILE * hd)
        .zip(vals.chunks(LLAMA_TILE * hd))
    {
        p.fill(f32::NEG_INFINITY);
        for (p, k) in p.iter_mut().zip(ks.chunks_exact(hd)) {
            k.convert_to_f32_slice(&mut row);
            *p = row.iter().zip(q).fold(0f32, |s, (&k, &q)| k.mul_add(q, s)) * scale;
        }
        let tile_max = p.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        if tile_max > max {
            let ms = (max - tile_max).exp();
            acc.iter_mut().for_each(|a| *a *= ms);
            sum *= ms;
            max = tile_max;
        }
        let mut tile_sum = 0f64;
        for lanes in p.chunks_exact_mut(16) {
            lanes.iter_mut().for_each(|x| *x = ggml_expf(*x - max));
            tile_sum += sum16_ggml(lanes.try_into().unwrap_or([0.0; 16])) as f64;
        }
        sum = (sum as f64 + tile_sum) as f32;
        for (&p, v) in p.iter().zip(vs.chunks_exact(hd)) {
            v.convert_to_f32_slice(&mut row);
            acc.iter_mut()
                .zip(&row)
                .for_each(|(a, &v)| *a = v.mul_add(p, *a));
        }
    }
    let inv = 1.0 / sum;
    for (o, a) in o.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

/// f16 dot / axpy, with an AVX2+F16C path chosen once per call of [`attend`].
#[derive(Clone, Copy)]
struct Simd {
    #[cfg(target_arch = "x86_64")]
    avx2: bool,
}

impl Simd {
    fn detect() -> Self {
        Simd {
            #[cfg(target_arch = "x86_64")]
            avx2: is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"),
        }
    }

    #[inline]
    fn dot(self, q: &[f32], k: &[f16]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 && q.len().is_multiple_of(8) {
            // SAFETY: the features were detected above; lengths are checked inside.
            return unsafe { x86::dot(q, k) };
        }
        q.iter().zip(k).map(|(&a, &b)| a * b.to_f32()).sum()
    }

    #[inline]
    fn axpy(self, a: f32, v: &[f16], o: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 && o.len().is_multiple_of(8) {
            // SAFETY: as for `dot`.
            return unsafe { x86::axpy(a, v, o) };
        }
        for (o, &v) in o.iter_mut().zip(v) {
            *o += a * v.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `q.len()` must be a multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(q: &[f32], k: &[f16]) -> f32 {
        let n = q.len().min(k.len()) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= both lengths.
            unsafe {
                let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i) as *const __m128i));
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), kv, acc);
            }
            i += 8;
        }
        let lo = _mm256_castps256_ps128(acc);
        let hi = _mm256_extractf128_ps::<1>(acc);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// As for [`dot`], with `o.len()` a multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy(a: f32, v: &[f16], o: &mut [f32]) {
        let n = o.len().min(v.len()) / 8 * 8;
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= both lengths.
            unsafe {
                let vv = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
                let p = o.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(av, vv, _mm256_loadu_ps(p)));
            }
            i += 8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A query row and `len` keys/values of `hd` dims (keys and values f16, as cached).
    fn case() -> impl Strategy<Value = (Vec<f32>, Vec<f16>, Vec<f16>, usize)> {
        (prop::sample::select(vec![8usize, 64, 72]), 1usize..150).prop_flat_map(|(hd, len)| {
            let f16s = move |n| prop::collection::vec((-2f32..2.0).prop_map(f16::from_f32), n);
            (
                prop::collection::vec(-3f32..3.0, hd),
                f16s(len * hd),
                f16s(len * hd),
                Just(hd),
            )
        })
    }

    proptest! {
        /// llama.cpp's attention against softmax(q·K)·V in f64 (from the query rounded to f16
        /// where llama.cpp rounds it). One-chunk: each of the ≤ 2·len f16 roundings of the
        /// accumulator (multiply-adds, rescales) errs by at most 2⁻¹¹ of a value bounded by the
        /// running sum of weights times max|v|; dividing by the final sum bounds the output's
        /// error by 2·len·2⁻¹¹·max|v|, plus f16's subnormal spacing per rounding. Tiled: the same
        /// with f32's 2⁻²⁴, plus ggml's `expf` (≤ 2 ulp) in the weights.
        #[test]
        fn llama_rows_match_f64_softmax((q, k, v, hd) in case(), tiled in any::<bool>()) {
            let len = k.len() / hd;
            let scale = 1.0 / (hd as f32).sqrt();
            let mut out = vec![0f32; hd];
            llama_row(Simd::detect(), tiled, &q, &k, &v, scale, &mut out);

            let q: Vec<f64> = q.iter().map(|&x| if tiled { x as f64 } else { f16::from_f32(x).to_f64() }).collect();
            let s: Vec<f64> = k.chunks_exact(hd).map(|k| q.iter().zip(k).map(|(a, b)| a * b.to_f64()).sum::<f64>() * scale as f64).collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let vmax = v.iter().fold(0f64, |a, x| a.max(x.to_f64().abs()));
            let tol = if tiled {
                (len + 8) as f64 * 2f64.powi(-22) * vmax + 1e-7
            } else {
                2.0 * (len + 1) as f64 * (2f64.powi(-11) * vmax + 2f64.powi(-24)) + 1e-6
            };
            for d in 0..hd {
                let want: f64 = w.iter().zip(v.chunks_exact(hd)).map(|(w, v)| w * v[d].to_f64()).sum::<f64>() / total;
                prop_assert!((out[d] as f64 - want).abs() <= tol, "dim {d}: {} vs {want} (tol {tol})", out[d]);
            }
        }
    }
}
