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

/// How far ahead of each weight row the streaming kernels prefetch. The four-row kernel reads
/// four short streams (one row is 360 bytes of Q4_1 or 612 of Q8_0 at 576 columns) that the
/// hardware prefetchers do not follow: without it the SmolLM2 output head (Q8_0 49152×576)
/// streamed at 11.8 GB/s on 2 threads, with it 47 GB/s (the machine's copy rate); 4 KiB gave
/// 36, 16 KiB no more than 8 KiB, and longer distances slowed the small per-layer matrices.
/// Batched mat-muls (weights L1-tiled, reused by many activation rows) run without it: there
/// it cost 20 % of prefill (docs/benchmarks.md, "CPU, this 2-core box").
const PREFETCH_BYTES: usize = 8192;

pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q8_0: u8 = 2;
/// Q4_0 / Q4_1 blocks expanded for batched mat-muls ([`expand`]): the f16 scales as f32
/// (Q4_0: d; Q4_1: d, m), then the 32 codes one byte each (0..15, element order), so the
/// kernels skip unpacking nibbles and converting scales for every activation row.
const Q4_0X: u8 = 3;
const Q4_1X: u8 = 4;

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

/// `R` consecutive weight rows (`rb` bytes apart) of format `F` against one activation row;
/// `PF`: prefetch [`PREFETCH_BYTES`] ahead (weights streamed once, as in decode).
/// Caller guarantees `R` rows of `nb` blocks at `w` and `nb` activation blocks at `a`.
#[inline(always)]
unsafe fn rows<const R: usize, const F: u8, const VNNI: bool, const PF: bool>(
    w: *const u8,
    rb: usize,
    a: *const u8,
    nb: usize,
) -> [f32; R] {
    let (wbs, abs) = blocks(F);
    let qoff = if F == Q4_1 || F == Q4_1X { 4 } else { 2 };
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut accm = [_mm_setzero_ps(); R];
        for i in 0..nb {
            let ab = a.add(abs * i);
            let aq = _mm256_loadu_si256(ab.add(qoff) as *const __m256i);
            // Shared by all rows: Q4_0's -8 offset as 8 * sum(a) per lane.
            let off = if F == Q4_0 || F == Q4_0X {
                dot_u8i8::<VNNI>(_mm256_set1_epi8(8), aq)
            } else {
                _mm256_setzero_si256()
            };
            let ads = if F == Q4_1 || F == Q4_1X {
                _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(
                    ab as *const i32,
                )))
            } else {
                _mm_set1_ps(h2f(ab))
            };
            for r in 0..R {
                let wb = w.add(r * rb + wbs * i);
                if PF {
                    // Never faults, so it may point past the matrix.
                    _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH_BYTES) as *const i8);
                }
                let (p, d) = match F {
                    Q4_0 => (
                        _mm256_sub_epi32(dot_u8i8::<VNNI>(nibbles(wb.add(2)), aq), off),
                        _mm256_set1_ps(h2f(wb) * _mm_cvtss_f32(ads)),
                    ),
                    Q4_0X => (
                        _mm256_sub_epi32(
                            dot_u8i8::<VNNI>(_mm256_loadu_si256(wb.add(4) as *const __m256i), aq),
                            off,
                        ),
                        _mm256_set1_ps(
                            core::ptr::read_unaligned(wb as *const f32) * _mm_cvtss_f32(ads),
                        ),
                    ),
                    Q4_1X => {
                        // As Q4_1 below, with (d_w, m_w) already f32: the same values, the same bits.
                        let wdm = _mm_castpd_ps(_mm_load_sd(wb as *const f64));
                        let prod = _mm_mul_ps(wdm, ads);
                        accm[r] = _mm_add_ps(accm[r], prod);
                        (
                            dot_u8i8::<VNNI>(_mm256_loadu_si256(wb.add(8) as *const __m256i), aq),
                            _mm256_broadcastss_ps(prod),
                        )
                    }
                    Q4_1 => {
                        // (d_w, m_w) × (d_a, s_a): lane 0 scales the codes, lane 1 is m·s.
                        let wdm = _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(
                            wb as *const i32,
                        )));
                        let prod = _mm_mul_ps(wdm, ads);
                        accm[r] = _mm_add_ps(accm[r], prod);
                        (
                            dot_u8i8::<VNNI>(nibbles(wb.add(4)), aq),
                            _mm256_broadcastss_ps(prod),
                        )
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

/// (weight, activation) block bytes of format `f`.
const fn blocks(f: u8) -> (usize, usize) {
    match f {
        Q4_0 => (18, 34),
        Q4_1 => (20, 36),
        Q4_0X => (36, 34),
        Q4_1X => (40, 36),
        _ => (34, 34),
    }
}

/// Whole Q4_0 / Q4_1 (`F`) blocks of `src` to their expanded form in `dst`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn expand_impl<const F: u8>(src: &[u8], dst: &mut [u8]) {
    let x = if F == Q4_0 { Q4_0X } else { Q4_1X };
    let (sbs, dbs) = (blocks(F).0, blocks(x).0);
    let nb = (src.len() / sbs).min(dst.len() / dbs);
    for i in 0..nb {
        // SAFETY: block i lies within both slices (nb counts whole blocks of each).
        unsafe {
            let (sp, dp) = (src.as_ptr().add(i * sbs), dst.as_mut_ptr().add(i * dbs));
            if F == Q4_0 {
                core::ptr::write_unaligned(dp as *mut f32, h2f(sp));
            } else {
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(
                    sp as *const i32,
                )));
                _mm_storel_pd(dp as *mut f64, _mm_castps_pd(dm));
            }
            _mm256_storeu_si256(dp.add(dbs - 32) as *mut __m256i, nibbles(sp.add(sbs - 16)));
        }
    }
}

/// The expanded form of Q4_0 / Q4_1 (`f`; `None` for Q8_0, whose codes are bytes already).
pub(super) fn expanded(f: u8, vnni: bool) -> Option<super::Expanded> {
    fn x<const F: u8, const X: u8>(vnni: bool) -> super::Expanded {
        let (dot, dot4) = pick::<X, false>(vnni);
        // SAFETY: handed out by `kernel()` only after checking the CPU features.
        super::Expanded {
            expand: |s, d| unsafe { expand_impl::<F>(s, d) },
            dot,
            dot4,
            block_bytes: blocks(X).0,
        }
    }
    match f {
        Q4_0 => Some(x::<Q4_0, Q4_0X>(vnni)),
        Q4_1 => Some(x::<Q4_1, Q4_1X>(vnni)),
        _ => None,
    }
}

/// `$one`: one weight row (`R = 1` of [`rows`]); `$four`: four rows `rb` bytes apart; with or
/// without AVX-VNNI (`$vnni`, matching the enabled `$feat`ures).
macro_rules! entries {
    ($one:ident, $four:ident, $vnni:literal, $feat:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $one<const F: u8, const PF: bool>(w: &[u8], a: &[u8]) -> f32 {
            let (wbs, abs) = blocks(F);
            let nb = (w.len() / wbs).min(a.len() / abs);
            // SAFETY: nb whole blocks fit in both slices.
            unsafe { rows::<1, F, $vnni, PF>(w.as_ptr(), 0, a.as_ptr(), nb)[0] }
        }
        #[target_feature(enable = $feat)]
        unsafe fn $four<const F: u8, const PF: bool>(w: &[u8], rb: usize, a: &[u8]) -> [f32; 4] {
            let (wbs, abs) = blocks(F);
            let nb = (rb / wbs).min(a.len() / abs);
            if w.len() < 3 * rb + nb * wbs {
                return [f32::NAN; 4]; // unreachable: matmul passes 4 whole rows
            }
            // SAFETY: 4 rows of nb blocks at stride rb fit in w (checked), nb blocks in a.
            unsafe { rows::<4, F, $vnni, PF>(w.as_ptr(), rb, a.as_ptr(), nb) }
        }
    };
}

entries!(one, four, false, "avx2,fma,f16c");
entries!(one_vnni, four_vnni, true, "avx2,fma,f16c,avxvnni");

/// Safe wrappers of one format's kernels (`PF`: the streaming variant).
fn pick<const F: u8, const PF: bool>(vnni: bool) -> (super::DotFn, super::Dot4Fn) {
    // SAFETY (every closure): handed out by `kernel()` only after checking the CPU features.
    if vnni {
        (
            |w, a| unsafe { one_vnni::<F, PF>(w, a) },
            |w, rb, a| unsafe { four_vnni::<F, PF>(w, rb, a) },
        )
    } else {
        (
            |w, a| unsafe { one::<F, PF>(w, a) },
            |w, rb, a| unsafe { four::<F, PF>(w, rb, a) },
        )
    }
}

/// (one-row, four-row) kernels; safe wrappers are only handed out by `kernel()` after checking
/// the CPU has the features (`vnni`: AVX-VNNI as well; `stream`: prefetching, for weights read
/// once per call).
pub(super) fn kernels(f: u8, vnni: bool, stream: bool) -> (super::DotFn, super::Dot4Fn) {
    match (f, stream) {
        (Q4_0, false) => pick::<Q4_0, false>(vnni),
        (Q4_1, false) => pick::<Q4_1, false>(vnni),
        (Q4_0, true) => pick::<Q4_0, true>(vnni),
        (Q4_1, true) => pick::<Q4_1, true>(vnni),
        (_, false) => pick::<Q8_0, false>(vnni),
        (_, true) => pick::<Q8_0, true>(vnni),
    }
}
