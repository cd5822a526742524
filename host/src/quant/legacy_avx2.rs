//! AVX2 dot products for Q4_0 × Q8_0, Q4_1 × Q8_1, Q8_0 × Q8_0.
//!
//! Integer core: `maddubs` (u8 × i8 → pairwise i16 sums) then `madd` with ones (→ i32), then
//! one f32 FMA per 32-element block with the product of the two block scales. maddubs needs
//! one unsigned operand: signed weights use |w| and move w's sign onto the activation
//! (`sign_epi8`), exact as long as activations avoid -128 (our quantizers clamp to ±127).

use super::float_avx2::hsum_ps;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn h2f(p: *const u8) -> f32 {
    unsafe {
        let b = core::ptr::read_unaligned(p as *const u16);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(b as i32)))
    }
}

/// 16 bytes of packed nibbles to 32 bytes 0..15, in element order (low nibbles = elements
/// 0..16 in the low lane, high nibbles = 16..32 in the high lane).
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let x = _mm_loadu_si128(p as *const __m128i);
        let v = _mm256_set_m128i(_mm_srli_epi16::<4>(x), x);
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }
}

/// Sum of u8 × i8 products in 8 i32 lanes.
#[inline(always)]
pub(super) unsafe fn dot_u8i8(u: __m256i, s: __m256i) -> __m256i {
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
}

#[inline(always)]
unsafe fn dot_i8i8(w: __m256i, a: __m256i) -> __m256i {
    unsafe { dot_u8i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / 18).min(a.len() / 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 2];
        let eight = _mm256_set1_epi8(8);
        for i in 0..nb {
            let (wb, ab) = (wp.add(18 * i), ap.add(34 * i));
            let d = _mm256_set1_ps(h2f(wb) * h2f(ab));
            let q = _mm256_sub_epi8(nibbles(wb.add(2)), eight);
            let p = dot_i8i8(q, _mm256_loadu_si256(ab.add(2) as *const __m256i));
            acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
        }
        hsum_ps(_mm256_add_ps(acc[0], acc[1]))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / 20).min(a.len() / 36);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut summ = 0f32;
        for i in 0..nb {
            let (wb, ab) = (wp.add(20 * i), ap.add(36 * i));
            // Both (d, m) and (d, s) pairs widened with one conversion each.
            let wdm = _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(wb as *const i32)));
            let ads = _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(ab as *const i32)));
            let prod = _mm_mul_ps(wdm, ads);
            summ += _mm_cvtss_f32(_mm_movehdup_ps(prod));
            let d = _mm256_broadcastss_ps(prod);
            let p = dot_u8i8(nibbles(wb.add(4)), _mm256_loadu_si256(ab.add(4) as *const __m256i));
            acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
        }
        hsum_ps(_mm256_add_ps(acc[0], acc[1])) + summ
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / 34).min(a.len() / 34);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 2];
        for i in 0..nb {
            let (wb, ab) = (wp.add(34 * i), ap.add(34 * i));
            let d = _mm256_set1_ps(h2f(wb) * h2f(ab));
            let p = dot_i8i8(
                _mm256_loadu_si256(wb.add(2) as *const __m256i),
                _mm256_loadu_si256(ab.add(2) as *const __m256i),
            );
            acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
        }
        hsum_ps(_mm256_add_ps(acc[0], acc[1]))
    }
}

// Safe entry points: only handed out by `dot_fn` after checking the CPU supports AVX2/FMA/F16C;
// the kernels read at most as many whole blocks as both slices hold.
pub(super) fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q4_0_q8_0(w, a) }
}
pub(super) fn dot_q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q4_1_q8_1(w, a) }
}
pub(super) fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q8_0_q8_0(w, a) }
}
