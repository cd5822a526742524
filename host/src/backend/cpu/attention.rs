//! Causal grouped-query attention over the f16 KV cache.
//!
//! Cache layout per layer: `[n_kv_head][max_seq][head_dim]`. Each (query row, head) pair is one
//! rayon task: scores against the head's contiguous keys, softmax, weighted sum of values.

use half::f16;
use rayon::prelude::*;

use super::CpuTensor;
use crate::backend::{Attention, KvSpec};

/// Below this many query-key multiply-adds attention runs on the calling thread.
const PAR_MIN_MACS: usize = 1 << 15;

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

pub(super) fn attend(
    kc: &[f16],
    vc: &[f16],
    q: &CpuTensor,
    out: &mut CpuTensor,
    pos: usize,
    attn: &Attention,
    max_seq: usize,
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
        let mut scores: Vec<f32> =
            keys.chunks_exact(hd).map(|k| simd.dot(qh, k) * attn.scale).collect();
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
