//! Weight formats as the GPU keeps them: GGUF blocks split into a quants plane and a scales
//! plane at upload, so every lane reads its 16 or 32 bytes of quants with aligned 16-byte loads
//! (an 18-byte Q4_0 block can never be loaded that way in place).
//!
//! Activations for the integer formats are quantized once per mat-vec to [`Q8_1`]-style blocks
//! (32 × i8 plus `d` and `d·Σq`), so a block dot is eight `dp4a` instead of 32 float FMAs.
use crate::device::{
    dp4a_s32, f16_to_f32, f32_to_f16, fma_f16x2, fma_f32, mul_f16x2, prmt, sub_f16x2,
};

/// Elements per quant block of every split format.
pub const QK: usize = 32;

/// One split-layout weight matrix of a launch over up to three (q/k/v, gate/up) and where its
/// product goes: quants, scales, output, rows (0: no matrix).
#[derive(Clone, Copy)]
pub struct SplitOut {
    pub qs: *const u32,
    pub scales: *const u8,
    pub y: *mut f32,
    pub rows: u32,
}

impl From<(*const u32, *const u8, *mut f32, u32)> for SplitOut {
    /// From a kernel's `(w, s, y, rows)` parameters.
    #[inline(always)]
    fn from((qs, scales, y, rows): (*const u32, *const u8, *mut f32, u32)) -> Self {
        SplitOut {
            qs,
            scales,
            y,
            rows,
        }
    }
}

/// Work units (row groups, row tiles) numbered across the matrices `m` in turn, `units(rows)`
/// of them per matrix: the matrix unit `i` falls in and its number there, `None` past the last.
/// A branch per matrix, not an array indexed by the matrix found: that index would be a
/// run-time value and put the array in local memory.
#[inline(always)]
pub fn pick_matrix(
    m: [SplitOut; 3],
    units: impl Fn(u32) -> u32,
    i: u32,
) -> Option<(SplitOut, u32)> {
    let (c0, c1, c2) = (units(m[0].rows), units(m[1].rows), units(m[2].rows));
    if i < c0 {
        Some((m[0], i))
    } else if i < c0 + c1 {
        Some((m[1], i - c0))
    } else if i < c0 + c1 + c2 {
        Some((m[2], i - c0 - c1))
    } else {
        None
    }
}

/// One GGUF 32-element block format in split layout.
///
/// `scale`/`qs` pointers point into the device planes; the methods are safe to call only from
/// kernel bodies that uphold the kernel's own pointer contract (hence the lint allowance: they
/// are leaf helpers of `unsafe` kernels, not a public safe API).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub trait SplitFormat: 'static {
    /// u32 words of quants per block (16 bytes for 4-bit, 32 for 8-bit).
    const QS_WORDS: usize;
    /// Bytes of scale data per block in the scales plane.
    const SCALE_BYTES: usize;
    /// Bytes of the GGUF block this comes from.
    const GGUF_BYTES: usize;

    /// Dot of one weight block (`qs`: its first `QS_WORDS` words are used; `scale_bits` from
    /// [`scale_bits`](Self::scale_bits)) with one activation
    /// block (`xq`: 32 i8 as 8 words; `xd` scale, `xs` = xd·Σxq): the exact integer dot of
    /// [`codes4`](Self::codes4) with `xq`, then [`scale_dot`](Self::scale_dot).
    #[inline(always)]
    fn block_dot(acc: f32, qs: &[u32; 8], scale_bits: u32, xq: &[u32; 8], xd: f32, xs: f32) -> f32 {
        Self::scale_dot(
            acc,
            Self::scales(scale_bits),
            Self::int_dot(qs, scale_bits, xq) as f32,
            xd,
            xs,
        )
    }

    /// Σ codes·xq over one block, exact (`dp4a`); formats with integer sub-block scales in
    /// `scale_bits` (Q6K) weight each sub-block's sum by its scale, still exactly.
    fn int_dot(qs: &[u32; 8], scale_bits: u32, xq: &[u32; 8]) -> i32;

    /// The block's scale data (`SCALE_BYTES` at `scale`, little-endian) in one aligned load.
    /// The mat-vec issues it together with the block's quants, so its latency overlaps theirs
    /// (loaded where it is used, it would be a second round trip after them).
    #[inline(always)]
    fn scale_bits(scale: *const u8) -> u32 {
        if Self::SCALE_BYTES == 4 {
            unsafe { (scale as *const u32).read() }
        } else {
            unsafe { (scale as *const u16).read() as u32 }
        }
    }

    /// [`scale_bits`](Self::scale_bits) as f32: `[d, m]` (`m` = 0 for formats without one).
    fn scales(bits: u32) -> [f32; 2];

    /// `acc` plus the float part of a block dot, from the exact integer dot `dot` of the codes
    /// with the activation codes (as f32: |dot| ≤ 32·128² is exact). The mat-vec and the GEMM
    /// both finish every block with this, so they agree up to the order in which blocks are
    /// summed. Fused multiply-adds: in the GEMM this runs once per output element and block, and
    /// the f32 pipe is its bound.
    /// This default is the scale-only form (`d_w·d_x·dot`); formats with a minimum override it.
    #[inline(always)]
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, _xs: f32) -> f32 {
        fma_f32(w[0], xd * dot, acc)
    }

    /// The quant word (0..QS_WORDS) holding elements `16s + 4t .. 16s + 4t + 4`: what lane
    /// `t` of a quad takes for k-step `s` (0, 1) of a block in the f16 GEMM (`kernels/mma.rs`).
    fn step_word(s: u32, t: u32) -> u32;

    /// Those four elements' codes, from their word, as unsigned bytes (lowest element lowest).
    fn step_codes(word: u32, s: u32) -> u32;

    /// The block's raw scale bits (`SCALE_BYTES`, little-endian) as f16 pairs `[d·(1,1),
    /// m·(1,1)]`: every scale is an f16 already, so this is a shuffle, not a conversion.
    fn scales_f16x2(raw: u32) -> [u32; 2];

    /// Two elements of k-step `s` as f16x2, rounded once from their exact values, given their
    /// unsigned codes `u` as the halves `1024 + u` (bits `0x6400 | u`, see [`biased_f16x2`])
    /// and the [`scales_f16x2`](Self::scales_f16x2).
    fn dequant_f16x2(biased: u32, s: u32, scales: [u32; 2]) -> u32;

    /// Element `i` (0..32) of a block, dequantized.
    fn element(qs: *const u8, scale: *const u8, i: usize) -> f32;

    /// Dot of one weight block (its quants already in registers) with 32 f32 activations,
    /// in f32: `Σ value(i)·x[i]`, no activation quantization.
    fn block_dot_f32(qs: &[u32; 8], scale: *const u8, x: &[f32; 32]) -> f32;
}

/// Σ q(i)·x[i] and Σ x[i] over a 4-bit block in f32 (nibble order as [`nibble_dot`]).
#[inline(always)]
fn nibble_dot_f32(qs: &[u32; 8], x: &[f32; 32]) -> (f32, f32) {
    let (mut s, mut sx) = (0.0, 0.0);
    let mut w = 0;
    while w < 4 {
        let mut k = 0;
        while k < 4 {
            let (lo, hi) = ((qs[w] >> (8 * k)) & 0xf, (qs[w] >> (8 * k + 4)) & 0xf);
            let (a, b) = (x[4 * w + k], x[16 + 4 * w + k]);
            s += lo as f32 * a + hi as f32 * b;
            sx += a + b;
            k += 1;
        }
        w += 1;
    }
    (s, sx)
}

#[inline(always)]
fn half_at(p: *const u8) -> f32 {
    f16_to_f32(unsafe { (p as *const u16).read_unaligned() })
}

/// Σ over a 4-bit block: word w holds elements 4w..4w+3 in its low nibbles and 16+4w.. in its
/// high nibbles (llama.cpp's Q4 order).
#[inline(always)]
fn nibble_dot(qs: &[u32; 8], xq: &[u32; 8]) -> i32 {
    let mut s = 0;
    let mut w = 0;
    while w < 4 {
        s = dp4a_s32(qs[w] & 0x0f0f_0f0f, xq[w], s);
        s = dp4a_s32((qs[w] >> 4) & 0x0f0f_0f0f, xq[w + 4], s);
        w += 1;
    }
    s
}

#[inline(always)]
fn nibble(qs: *const u8, i: usize) -> f32 {
    let b = unsafe { *qs.add(i % 16) };
    (if i < 16 { b & 0xf } else { b >> 4 }) as f32
}

/// Low (`half == 0`) or high nibbles of a 4-bit block's quant word `w`, one per byte: elements
/// `4w..4w+4` or `16+4w..` in llama.cpp's Q4 order.
#[inline(always)]
fn nibbles(word: u32, half: u32) -> u32 {
    (word >> (4 * half)) & 0x0f0f_0f0f
}

/// Bytes `lo` and `lo + 1` of `codes` (unsigned codes `u < 256`) as f16x2 `1024 + u`: an f16 in
/// [1024, 2048) has unit spacing, so its low byte of mantissa is the code itself.
#[inline(always)]
pub fn biased_f16x2(codes: u32, lo: u32) -> u32 {
    // prmt picks bytes of (0x64646464 : codes); selector nibbles (code, 0x64, code + 1, 0x64).
    prmt(codes, 0x6464_6464, 0x4040 + lo + ((lo + 1) << 8))
}

/// Σ over a block of one signed byte code per element (8 `dp4a`).
#[inline(always)]
fn byte_dot(qs: &[u32; 8], xq: &[u32; 8]) -> i32 {
    let mut s = 0;
    let mut w = 0;
    while w < 8 {
        s = dp4a_s32(qs[w], xq[w], s);
        w += 1;
    }
    s
}

/// The formats with a minimum (value = d·q + m; Q4_1, Q5K): `[d, m]` from their two halves.
#[inline(always)]
fn min_scales(bits: u32) -> [f32; 2] {
    [f16_to_f32(bits as u16), f16_to_f32((bits >> 16) as u16)]
}

/// [`SplitFormat::scale_dot`] of the formats with a minimum: `d_w·d_x·dot + m·s`, `s` being
/// the activation block's stored `d_x·Σq`.
#[inline(always)]
fn min_scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, xs: f32) -> f32 {
    fma_f32(w[0] * xd, dot, fma_f32(w[1], xs, acc))
}

#[inline(always)]
fn min_scales_f16x2(raw: u32) -> [u32; 2] {
    [f16x2_splat(raw & 0xffff), f16x2_splat(raw >> 16)]
}

/// `d·u + m` of unsigned codes `u` given as the halves `1024 + u`.
#[inline(always)]
fn min_dequant_f16x2(biased: u32, scales: [u32; 2]) -> u32 {
    fma_f16x2(sub_f16x2(biased, F16_1024), scales[0], scales[1])
}

/// [`SplitFormat::step_word`] of the byte-code formats (Q8_0, Q6K): one code per byte, so the
/// word of elements `16s + 4t ..` is `4s + t`.
#[inline(always)]
fn s8_step_word(s: u32, t: u32) -> u32 {
    4 * s + t
}

/// [`SplitFormat::step_codes`] of the byte-code formats: s8 `c` → u8 `c + 128`.
#[inline(always)]
fn s8_step_codes(word: u32) -> u32 {
    word ^ 0x8080_8080
}

/// f16x2 of (`v`, `v`).
const fn f16x2_splat(v: u32) -> u32 {
    v | v << 16
}
/// f16 bits of 1024, 1032 (1024 + Q4_0's offset 8) and 1152 (1024 + the 128 that makes an s8
/// code unsigned).
const F16_1024: u32 = f16x2_splat(0x6400);
const F16_1032: u32 = f16x2_splat(0x6408);
const F16_1152: u32 = f16x2_splat(0x6480);

/// Q4_0: value = d·(q − 8). Its codes are q − 8 (s8), so the integer dot already holds the
/// −8·Σx term exactly; the mat-vec gets the same integer from the raw nibbles and the exact
/// Σx (four more `dp4a`). Using the f16-rounded `d·Σq` instead would cost ~1e-2 relative
/// error: the −8·Σx term is large and nearly cancels.
pub struct Q4_0;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q4_0 {
    const QS_WORDS: usize = 4;
    const SCALE_BYTES: usize = 2;
    const GGUF_BYTES: usize = 18;
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _scale_bits: u32, xq: &[u32; 8]) -> i32 {
        let mut sum_x = 0;
        let mut w = 0;
        while w < 8 {
            sum_x = dp4a_s32(0x0101_0101, xq[w], sum_x);
            w += 1;
        }
        nibble_dot(qs, xq) - 8 * sum_x
    }
    #[inline(always)]
    fn scales(bits: u32) -> [f32; 2] {
        [f16_to_f32(bits as u16), 0.0]
    }
    #[inline(always)]
    fn step_word(_s: u32, t: u32) -> u32 {
        t
    }
    #[inline(always)]
    fn step_codes(word: u32, s: u32) -> u32 {
        nibbles(word, s)
    }
    #[inline(always)]
    fn scales_f16x2(raw: u32) -> [u32; 2] {
        [f16x2_splat(raw & 0xffff), 0]
    }
    #[inline(always)]
    fn dequant_f16x2(biased: u32, _s: u32, scales: [u32; 2]) -> u32 {
        // 1024 + q − 1032 = q − 8 is exact in f16; the product is the one rounding.
        mul_f16x2(sub_f16x2(biased, F16_1032), scales[0])
    }
    #[inline(always)]
    fn element(qs: *const u8, scale: *const u8, i: usize) -> f32 {
        half_at(scale) * (nibble(qs, i) - 8.0)
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], scale: *const u8, x: &[f32; 32]) -> f32 {
        let (s, sx) = nibble_dot_f32(qs, x);
        half_at(scale) * (s - 8.0 * sx)
    }
}

/// Q4_1: value = d·q + m (scales plane holds d, m as two halves).
pub struct Q4_1;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q4_1 {
    const QS_WORDS: usize = 4;
    const SCALE_BYTES: usize = 4;
    const GGUF_BYTES: usize = 20;
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _scale_bits: u32, xq: &[u32; 8]) -> i32 {
        nibble_dot(qs, xq)
    }
    #[inline(always)]
    fn scales(bits: u32) -> [f32; 2] {
        min_scales(bits)
    }
    #[inline(always)]
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, xs: f32) -> f32 {
        min_scale_dot(acc, w, dot, xd, xs)
    }
    #[inline(always)]
    fn step_word(_s: u32, t: u32) -> u32 {
        t
    }
    #[inline(always)]
    fn step_codes(word: u32, s: u32) -> u32 {
        nibbles(word, s)
    }
    #[inline(always)]
    fn scales_f16x2(raw: u32) -> [u32; 2] {
        min_scales_f16x2(raw)
    }
    #[inline(always)]
    fn dequant_f16x2(biased: u32, _s: u32, scales: [u32; 2]) -> u32 {
        min_dequant_f16x2(biased, scales)
    }
    #[inline(always)]
    fn element(qs: *const u8, scale: *const u8, i: usize) -> f32 {
        half_at(scale) * nibble(qs, i) + half_at(unsafe { scale.add(2) })
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], scale: *const u8, x: &[f32; 32]) -> f32 {
        let (s, sx) = nibble_dot_f32(qs, x);
        half_at(scale) * s + half_at(unsafe { scale.add(2) }) * sx
    }
}

/// Q8_0: value = d·q.
pub struct Q8_0;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q8_0 {
    const QS_WORDS: usize = 8;
    const SCALE_BYTES: usize = 2;
    const GGUF_BYTES: usize = 34;
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _scale_bits: u32, xq: &[u32; 8]) -> i32 {
        byte_dot(qs, xq)
    }
    #[inline(always)]
    fn scales(bits: u32) -> [f32; 2] {
        [f16_to_f32(bits as u16), 0.0]
    }
    #[inline(always)]
    fn step_word(s: u32, t: u32) -> u32 {
        s8_step_word(s, t)
    }
    #[inline(always)]
    fn step_codes(word: u32, _s: u32) -> u32 {
        s8_step_codes(word)
    }
    #[inline(always)]
    fn scales_f16x2(raw: u32) -> [u32; 2] {
        [f16x2_splat(raw & 0xffff), 0]
    }
    #[inline(always)]
    fn dequant_f16x2(biased: u32, _s: u32, scales: [u32; 2]) -> u32 {
        mul_f16x2(sub_f16x2(biased, F16_1152), scales[0])
    }
    #[inline(always)]
    fn element(qs: *const u8, scale: *const u8, i: usize) -> f32 {
        half_at(scale) * unsafe { *qs.add(i) } as i8 as f32
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], scale: *const u8, x: &[f32; 32]) -> f32 {
        let mut s = 0.0;
        let mut i = 0;
        while i < 32 {
            s += ((qs[i / 4] >> (8 * (i % 4))) as u8 as i8) as f32 * x[i];
            i += 1;
        }
        half_at(scale) * s
    }
}

/// Q6_K re-blocked by 32 at load ([`crate::quant::reblock::q6_k`], exact): value = d·sc·c with
/// the super-block's `d` (f16), the 16-element sub-block's 8-bit scale `sc` and the 6-bit code
/// `c = q − 32` stored as an i8. The scales word is `[sc_a, sc_b, d]`: `sc_a` for elements
/// 0..16, `sc_b` for 16..32. The block is kiln's own (`GGUF_BYTES` names its 36 bytes, the
/// scales word then the codes); no GGUF file holds it.
pub struct Q6K;

/// The i8 sub-block scale `i` (0, 1) of a [`Q6K`] scales word.
#[inline(always)]
fn q6_sub_scale(bits: u32, i: u32) -> i32 {
    (bits >> (8 * i)) as u8 as i8 as i32
}

#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q6K {
    const QS_WORDS: usize = 8;
    const SCALE_BYTES: usize = 4;
    const GGUF_BYTES: usize = 36;
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], scale_bits: u32, xq: &[u32; 8]) -> i32 {
        // |c| ≤ 32, |xq| ≤ 127, |sc| ≤ 128: each half ≤ 2²³, the sum < 2²⁴ (exact as f32).
        let (mut a, mut b) = (0, 0);
        let mut w = 0;
        while w < 4 {
            a = dp4a_s32(qs[w], xq[w], a);
            b = dp4a_s32(qs[w + 4], xq[w + 4], b);
            w += 1;
        }
        a * q6_sub_scale(scale_bits, 0) + b * q6_sub_scale(scale_bits, 1)
    }
    #[inline(always)]
    fn scales(bits: u32) -> [f32; 2] {
        [f16_to_f32((bits >> 16) as u16), 0.0]
    }
    #[inline(always)]
    fn step_word(s: u32, t: u32) -> u32 {
        s8_step_word(s, t)
    }
    #[inline(always)]
    fn step_codes(word: u32, _s: u32) -> u32 {
        s8_step_codes(word)
    }
    #[inline(always)]
    fn scales_f16x2(raw: u32) -> [u32; 2] {
        // Kept raw: a d·sc rounded to f16 would make each element two roundings.
        [raw, 0]
    }
    #[inline(always)]
    fn dequant_f16x2(biased: u32, s: u32, scales: [u32; 2]) -> u32 {
        // Step s covers elements 16s..16s+16: sub-block s. c·sc (≤ 2¹² in magnitude) times the
        // f16 d is exact in f32, so the conversion to f16 is the one rounding.
        let (sc, d) = (
            q6_sub_scale(scales[0], s),
            f16_to_f32((scales[0] >> 16) as u16),
        );
        let value = |half: u32| ((((biased >> (16 * half)) & 0xff) as i32 - 128) * sc) as f32 * d;
        f32_to_f16(value(0)) as u32 | (f32_to_f16(value(1)) as u32) << 16
    }
    #[inline(always)]
    fn element(qs: *const u8, scale: *const u8, i: usize) -> f32 {
        let bits = Self::scale_bits(scale);
        let c = unsafe { *qs.add(i) } as i8 as i32;
        (c * q6_sub_scale(bits, (i / 16) as u32)) as f32 * Self::scales(bits)[0]
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], scale: *const u8, x: &[f32; 32]) -> f32 {
        let bits = Self::scale_bits(scale);
        let mut half = [0f32; 2];
        let mut i = 0;
        while i < 32 {
            half[i / 16] += ((qs[i / 4] >> (8 * (i % 4))) as u8 as i8) as f32 * x[i];
            i += 1;
        }
        Self::scales(bits)[0]
            * (q6_sub_scale(bits, 0) as f32 * half[0] + q6_sub_scale(bits, 1) as f32 * half[1])
    }
}

/// Q5_K re-blocked by 32 at load ([`crate::quant::reblock::q5_k`]): value = d·q + m as Q4_1,
/// with the 5-bit code `q` kept as one unsigned byte (9 bits per weight in all: the 5-bit
/// packing would not give 16-byte aligned blocks). `d = f16(d_K·sc)` and `m = f16(−dmin·m_K)`
/// are the one inexact step, as for Q4_K. The block is kiln's own: `[d, m, 32 codes]`.
pub struct Q5K;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q5K {
    const QS_WORDS: usize = 8;
    const SCALE_BYTES: usize = 4;
    const GGUF_BYTES: usize = 36;
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _scale_bits: u32, xq: &[u32; 8]) -> i32 {
        byte_dot(qs, xq) // codes below 32: the same as signed bytes
    }
    #[inline(always)]
    fn scales(bits: u32) -> [f32; 2] {
        min_scales(bits)
    }
    #[inline(always)]
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, xs: f32) -> f32 {
        min_scale_dot(acc, w, dot, xd, xs)
    }
    #[inline(always)]
    fn step_word(s: u32, t: u32) -> u32 {
        s8_step_word(s, t)
    }
    #[inline(always)]
    fn step_codes(word: u32, _s: u32) -> u32 {
        word // unsigned already
    }
    #[inline(always)]
    fn scales_f16x2(raw: u32) -> [u32; 2] {
        min_scales_f16x2(raw)
    }
    #[inline(always)]
    fn dequant_f16x2(biased: u32, _s: u32, scales: [u32; 2]) -> u32 {
        min_dequant_f16x2(biased, scales)
    }
    #[inline(always)]
    fn element(qs: *const u8, scale: *const u8, i: usize) -> f32 {
        half_at(scale) * unsafe { *qs.add(i) } as f32 + half_at(unsafe { scale.add(2) })
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], scale: *const u8, x: &[f32; 32]) -> f32 {
        let (mut s, mut sx) = (0.0, 0.0);
        let mut i = 0;
        while i < 32 {
            s += ((qs[i / 4] >> (8 * (i % 4))) as u8) as f32 * x[i];
            sx += x[i];
            i += 1;
        }
        half_at(scale) * s + half_at(unsafe { scale.add(2) }) * sx
    }
}

/// Byte sizes of the two planes of a `rows × cols` matrix in split layout.
pub const fn split_plane_bytes<F: SplitFormat>(rows: usize, cols: usize) -> (usize, usize) {
    let blocks = rows * (cols / QK);
    (blocks * F::QS_WORDS * 4, blocks * F::SCALE_BYTES)
}

/// Split GGUF blocks (`src`, `rows × cols` elements) into the quants and scales planes.
/// Returns `false` if the sizes do not match (the caller reports which tensor).
pub fn split_gguf_blocks<F: SplitFormat>(
    src: &[u8],
    rows: usize,
    cols: usize,
    qs: &mut [u8],
    scales: &mut [u8],
) -> bool {
    let blocks = rows * (cols / QK);
    let (qb, sb) = split_plane_bytes::<F>(rows, cols);
    if cols % QK != 0 || src.len() != blocks * F::GGUF_BYTES || qs.len() != qb || scales.len() != sb
    {
        return false;
    }
    let q_bytes = F::QS_WORDS * 4;
    for b in 0..blocks {
        let blk = &src[b * F::GGUF_BYTES..(b + 1) * F::GGUF_BYTES];
        // GGUF blocks start with their scale(s); the quants follow.
        scales[b * F::SCALE_BYTES..(b + 1) * F::SCALE_BYTES]
            .copy_from_slice(&blk[..F::SCALE_BYTES]);
        qs[b * q_bytes..(b + 1) * q_bytes].copy_from_slice(&blk[F::SCALE_BYTES..]);
    }
    true
}
