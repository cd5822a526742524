//! AVX2 dot products for Q4_0 × Q8_0, Q4_1 × Q8_1, Q8_0 × Q8_0, one row or four rows at once.
//!
//! Integer core: u8 × i8 products summed into i32 lanes (`maddubs` + `madd`, or one `vpdpbusd`
//! with AVX-VNNI), then one f32 FMA per 32-element block with the product of the block scales.
//! The unsigned operand is the weight: Q4 nibbles as they are (Q4_0's -8 comes back out as
//! 8 · sum(a), computed once per block for all rows), Q8_0 as |w| with w's sign moved onto the
//! activation. Exact for any weight bytes as long as activations stay within ±127 (our
//! quantizers clamp): then maddubs' i16 pair sums (at most 2 · 128 · 127) cannot saturate.

use super::float_avx2::hsum_ps;
use std::arch::x86_64::*;

pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q8_0: u8 = 2;

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
unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let x = _mm_loadu_si128(p as *const __m128i);
        let v = _mm256_set_m128i(_mm_srli_epi16::<4>(x), x);
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }
}

/// Sum of u8 × i8 products in 8 i32 lanes.
#[inline(always)]
pub(super) unsafe fn dot_u8i8<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    unsafe {
        if VNNI {
            _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
        }
    }
}

/// `R` consecutive weight rows (`rb` bytes apart) of format `F` against one activation row.
/// Caller guarantees `R` rows of `nb` blocks at `w` and `nb` activation blocks at `a`.
#[inline(always)]
unsafe fn rows<const R: usize, const F: u8, const VNNI: bool>(w: *const u8, rb: usize, a: *const u8, nb: usize) -> [f32; R] {
    let (wbs, abs, qoff) = match F {
        Q4_0 => (18, 34, 2),
        Q4_1 => (20, 36, 4),
        _ => (34, 34, 2),
    };
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut accm = [_mm_setzero_ps(); R];
        for i in 0..nb {
            let ab = a.add(abs * i);
            let aq = _mm256_loadu_si256(ab.add(qoff) as *const __m256i);
            // Shared by all rows: Q4_0's -8 offset as 8 * sum(a) per lane.
            let off = if F == Q4_0 { dot_u8i8::<VNNI>(_mm256_set1_epi8(8), aq) } else { _mm256_setzero_si256() };
            let ads = if F == Q4_1 {
                _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(ab as *const i32)))
            } else {
                _mm_set1_ps(h2f(ab))
            };
            for r in 0..R {
                let wb = w.add(r * rb + wbs * i);
                let (p, d) = match F {
                    Q4_0 => (
                        _mm256_sub_epi32(dot_u8i8::<VNNI>(nibbles(wb.add(2)), aq), off),
                        _mm256_set1_ps(h2f(wb) * _mm_cvtss_f32(ads)),
                    ),
                    Q4_1 => {
                        // (d_w, m_w) × (d_a, s_a): lane 0 scales the codes, lane 1 is m·s.
                        let wdm = _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(wb as *const i32)));
                        let prod = _mm_mul_ps(wdm, ads);
                        accm[r] = _mm_add_ps(accm[r], prod);
                        (dot_u8i8::<VNNI>(nibbles(wb.add(4)), aq), _mm256_broadcastss_ps(prod))
                    }
                    _ => {
                        // |w| as the unsigned operand and w's sign moved onto a; |w| <= 128 and
                        // |a| <= 127 keep maddubs' pair sums within i16.
                        let q = _mm256_loadu_si256(wb.add(2) as *const __m256i);
                        (
                            dot_u8i8::<VNNI>(_mm256_sign_epi8(q, q), _mm256_sign_epi8(aq, q)),
                            _mm256_set1_ps(h2f(wb) * _mm_cvtss_f32(ads)),
                        )
                    }
                };
                // One accumulator per row, same op order for R = 1 and 4: a row's result does
                // not depend on which kernel computed it.
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum_ps(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(accm[r]));
        }
        out
    }
}

fn blocks(f: u8) -> (usize, usize) {
    match f {
        Q4_0 => (18, 34),
        Q4_1 => (20, 36),
        _ => (34, 34),
    }
}

macro_rules! entry {
    ($one:ident, $four:ident, $f:expr, $vnni:expr, $feat:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $one(w: &[u8], a: &[u8]) -> f32 {
            let (wbs, abs) = blocks($f);
            let nb = (w.len() / wbs).min(a.len() / abs);
            // SAFETY: nb whole blocks fit in both slices.
            unsafe { rows::<1, { $f }, { $vnni }>(w.as_ptr(), 0, a.as_ptr(), nb)[0] }
        }
        #[target_feature(enable = $feat)]
        unsafe fn $four(w: &[u8], rb: usize, a: &[u8]) -> [f32; 4] {
            let (wbs, abs) = blocks($f);
            let nb = (rb / wbs).min(a.len() / abs);
            if w.len() < 3 * rb + nb * wbs {
                return [f32::NAN; 4]; // unreachable: matmul passes 4 whole rows
            }
            // SAFETY: 4 rows of nb blocks at stride rb fit in w (checked), nb blocks in a.
            unsafe { rows::<4, { $f }, { $vnni }>(w.as_ptr(), rb, a.as_ptr(), nb) }
        }
    };
}

entry!(q4_0_1, q4_0_4, Q4_0, false, "avx2,fma,f16c");
entry!(q4_1_1, q4_1_4, Q4_1, false, "avx2,fma,f16c");
entry!(q8_0_1, q8_0_4, Q8_0, false, "avx2,fma,f16c");
entry!(q4_0_1v, q4_0_4v, Q4_0, true, "avx2,fma,f16c,avxvnni");
entry!(q4_1_1v, q4_1_4v, Q4_1, true, "avx2,fma,f16c,avxvnni");
entry!(q8_0_1v, q8_0_4v, Q8_0, true, "avx2,fma,f16c,avxvnni");

/// (one-row, four-row) kernels; safe wrappers are only handed out by `kernel()` after checking
/// the CPU has the features (`vnni`: AVX-VNNI as well).
pub(super) fn kernels(f: u8, vnni: bool) -> (super::DotFn, super::Dot4Fn) {
    macro_rules! wrap {
        ($one:ident, $four:ident) => {{
            fn one(w: &[u8], a: &[u8]) -> f32 {
                unsafe { $one(w, a) }
            }
            fn four(w: &[u8], rb: usize, a: &[u8]) -> [f32; 4] {
                unsafe { $four(w, rb, a) }
            }
            (one as super::DotFn, four as super::Dot4Fn)
        }};
    }
    match (f, vnni) {
        (Q4_0, false) => wrap!(q4_0_1, q4_0_4),
        (Q4_1, false) => wrap!(q4_1_1, q4_1_4),
        (Q8_0, false) => wrap!(q8_0_1, q8_0_4),
        (Q4_0, true) => wrap!(q4_0_1v, q4_0_4v),
        (Q4_1, true) => wrap!(q4_1_1v, q4_1_4v),
        _ => wrap!(q8_0_1v, q8_0_4v),
    }
}
