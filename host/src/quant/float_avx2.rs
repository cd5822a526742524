//! AVX2+FMA(+F16C) dot products of F32 / F16 / BF16 weight rows with f32 activations.

use std::arch::x86_64::*;

#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// `load8(p)` widens 8 weights at byte pointer `p` to f32; `wsize` bytes each.
#[inline(always)]
unsafe fn dot_impl(
    w: &[u8],
    a: &[u8],
    wsize: usize,
    load8: impl Fn(*const u8) -> __m256,
    conv: impl Fn(&[u8]) -> f32,
) -> f32 {
    let n = (w.len() / wsize).min(a.len() / 4);
    let (wp, ap) = (w.as_ptr(), a.as_ptr() as *const f32);
    unsafe {
        // Four accumulators hide the FMA latency.
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            #[allow(clippy::needless_range_loop)] // k is the accumulator and the 8-lane offset
            for k in 0..4 {
                let x = load8(wp.add((i + 8 * k) * wsize));
                acc[k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(ap.add(i + 8 * k)), acc[k]);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(load8(wp.add(i * wsize)), _mm256_loadu_ps(ap.add(i)), acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum_ps(v);
        while i < n {
            s += conv(&w[i * wsize..])
                * f32::from_le_bytes([a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]]);
            i += 1;
        }
        s
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_avx2(w: &[u8], a: &[u8]) -> f32 {
    unsafe {
        dot_impl(
            w,
            a,
            4,
            |p| _mm256_loadu_ps(p as *const f32),
            |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(w: &[u8], a: &[u8]) -> f32 {
    unsafe {
        dot_impl(
            w,
            a,
            2,
            |p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            |b| kernels_gpu::quant::f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16_avx2(w: &[u8], a: &[u8]) -> f32 {
    unsafe {
        dot_impl(
            w,
            a,
            2,
            |p| {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            },
            |b| kernels_gpu::quant::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        )
    }
}

// Safe entry points: only handed out by `dot_fn` after checking the CPU supports AVX2/FMA/F16C.
pub(super) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    unsafe { dot_f32_avx2(w, a) }
}
pub(super) fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    unsafe { dot_f16_avx2(w, a) }
}
pub(super) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    unsafe { dot_bf16_avx2(w, a) }
}
