//! AVX2 dot products for Q4_K / Q5_K / Q6_K weights × Q8_K activations.
//!
//! Per 256-element super-block everything stays in integers: maddubs of the unsigned codes
//! with the activation bytes, then `madd` against the sub-block scales broadcast to i16, summed
//! in i32 lanes; one float FMA per super-block. Offsets (Q4_K/Q5_K mins, Q6_K's -32) come from
//! Q8_K's precomputed 16-element sums instead of touching the codes again.

use super::float_avx2::hsum_ps;
use kernels_gpu::quant::get_scale_min_k4;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn h2f(p: *const u8) -> f32 {
    unsafe {
        let b = core::ptr::read_unaligned(p as *const u16);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(b as i32)))
    }
}

#[inline(always)]
unsafe fn bsum(ab: *const u8, k: usize) -> i32 {
    unsafe { core::ptr::read_unaligned(ab.add(260 + 2 * k) as *const i16) as i32 }
}

/// Shared body of Q4_K and Q5_K (`QH`: whether a 32-byte high-bit plane precedes the nibbles).
#[inline(always)]
unsafe fn q45k<const QH: bool>(w: &[u8], a: &[u8]) -> f32 {
    let wbytes = if QH { 176 } else { 144 };
    let nb = (w.len() / wbytes).min(a.len() / 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut summ = 0f32;
        let mask = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        for i in 0..nb {
            let (wb, ab) = (wp.add(wbytes * i), ap.add(292 * i));
            let da = core::ptr::read_unaligned(ab as *const f32);
            let d = da * h2f(wb);
            let dmin = da * h2f(wb.add(2));
            let scales: [u8; 12] = core::ptr::read_unaligned(wb.add(4) as *const [u8; 12]);
            let mut sc = [0i16; 8];
            let mut msum = 0i32;
            #[allow(clippy::needless_range_loop)] // j indexes the scales and the sums' halves
            for j in 0..8 {
                let (s, m) = get_scale_min_k4(j, &scales);
                sc[j] = s as i16;
                msum += m as i32 * (bsum(ab, 2 * j) + bsum(ab, 2 * j + 1));
            }
            summ += dmin * msum as f32;
            let qh = if QH {
                _mm256_loadu_si256(wb.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let qs = wb.add(if QH { 48 } else { 16 });
            let aq = ab.add(4);
            let mut sumi = _mm256_setzero_si256();
            for g in 0..4 {
                let q = _mm256_loadu_si256(qs.add(32 * g) as *const __m256i);
                let mut lo = _mm256_and_si256(q, mask);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask);
                if QH {
                    // Bit 2g of qh[l] tops element 64g+l, bit 2g+1 element 64g+32+l; shifting
                    // 16-bit lanes then masking bit 0 of each byte keeps bytes independent.
                    let hl = _mm256_and_si256(
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g as i32)),
                        one,
                    );
                    let hh = _mm256_and_si256(
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g as i32 + 1)),
                        one,
                    );
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hl));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(hh));
                }
                let a0 = _mm256_loadu_si256(aq.add(64 * g) as *const __m256i);
                let a1 = _mm256_loadu_si256(aq.add(64 * g + 32) as *const __m256i);
                let p0 =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_set1_epi16(sc[2 * g]));
                let p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, a1),
                    _mm256_set1_epi16(sc[2 * g + 1]),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc) - summ
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q45k::<false>(w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q45k::<true>(w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / 210).min(a.len() / 292);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        for i in 0..nb {
            let (wb, ab) = (wp.add(210 * i), ap.add(292 * i));
            let d = core::ptr::read_unaligned(ab as *const f32) * h2f(wb.add(208));
            let scales = wb.add(192) as *const i8;
            let aq = ab.add(4);
            // The -32 of every code: sum_k sc_k * 32 * bsum_k, as a vector of 8 i32.
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales as *const __m128i));
            let bs = _mm256_loadu_si256(ab.add(260) as *const __m256i);
            let mut sumi = _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, sc16)),
            );
            for n in 0..2 {
                let ql0 = _mm256_loadu_si256(wb.add(64 * n) as *const __m256i);
                let ql1 = _mm256_loadu_si256(wb.add(64 * n + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(wb.add(128 + 32 * n) as *const __m256i);
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), m2)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), m2)),
                    ),
                ];
                for (t, &qt) in q.iter().enumerate() {
                    let k = 8 * n + 2 * t;
                    let s = _mm256_set_m128i(
                        _mm_set1_epi16(*scales.add(k + 1) as i16),
                        _mm_set1_epi16(*scales.add(k) as i16),
                    );
                    let at = _mm256_loadu_si256(aq.add(128 * n + 32 * t) as *const __m256i);
                    sumi =
                        _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(qt, at), s));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

// Safe entry points: only handed out by `dot_fn` after checking the CPU supports AVX2/FMA/F16C;
// the kernels read at most as many whole blocks as both slices hold.
pub(super) fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q4_k(w, a) }
}
pub(super) fn dot_q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q5_k(w, a) }
}
pub(super) fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    unsafe { q6_k(w, a) }
}
