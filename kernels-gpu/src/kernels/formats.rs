//! Weight formats as the GPU keeps them: GGUF blocks split into a quants plane and a scales
//! plane at upload, so every lane reads its 16 or 32 bytes of quants with aligned 16-byte loads
//! (an 18-byte Q4_0 block can never be loaded that way in place).
//!
//! Activations for the integer formats are quantized once per mat-vec to [`Q8_1`]-style blocks
//! (32 × i8 plus `d` and `d·Σq`), so a block dot is eight `dp4a` instead of 32 float FMAs.
use crate::device::{dp4a_s32, f16_to_f32, fma_f32};

/// Elements per quant block of every split format.
pub const QK: usize = 32;

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

    /// Dot of one weight block (`qs`: its first `QS_WORDS` words are used) with one activation
    /// block (`xq`: 32 i8 as 8 words; `xd` scale, `xs` = xd·Σxq): the exact integer dot of
    /// [`codes4`](Self::codes4) with `xq`, then [`scale_dot`](Self::scale_dot).
    #[inline(always)]
    fn block_dot(acc: f32, qs: &[u32; 8], scale: *const u8, xq: &[u32; 8], xd: f32, xs: f32) -> f32 {
        Self::scale_dot(acc, Self::scales(scale), Self::int_dot(qs, xq) as f32, xd, xs)
    }

    /// Σ codes·xq over one block, exact (`dp4a`).
    fn int_dot(qs: &[u32; 8], xq: &[u32; 8]) -> i32;

    /// The block's scale data as f32: `[d, m]` (`m` = 0 for formats without one).
    fn scales(scale: *const u8) -> [f32; 2];

    /// `acc` plus the float part of a block dot, from the exact integer dot `dot` of the codes
    /// with the activation codes (as f32: |dot| ≤ 32·128² is exact). The mat-vec and the GEMM
    /// both finish every block with this, so they agree up to the order in which blocks are
    /// summed. Fused multiply-adds: in the GEMM this runs once per output element and block, and
    /// the f32 pipe is its bound.
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, xs: f32) -> f32;

    /// The quant word (0..QS_WORDS) holding elements `k0..k0+4` (`k0 % 4 == 0`).
    fn code_word(k0: u32) -> u32;

    /// Elements `k0..k0+4` of a block as four s8 codes (lowest k in the lowest byte), from their
    /// quant word `word` ([`code_word`](Self::code_word)): the integer operand of a
    /// tensor-core block dot.
    fn codes4(word: u32, k0: u32) -> u32;

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

/// Low (`k0 < 16`) or high nibbles of a 4-bit block's quant word, one per byte: elements
/// `k0..k0+4` in llama.cpp's Q4 order.
#[inline(always)]
fn nibbles4(word: u32, k0: u32) -> u32 {
    (if k0 < 16 { word } else { word >> 4 }) & 0x0f0f_0f0f
}

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
    fn int_dot(qs: &[u32; 8], xq: &[u32; 8]) -> i32 {
        let mut sum_x = 0;
        let mut w = 0;
        while w < 8 {
            sum_x = dp4a_s32(0x0101_0101, xq[w], sum_x);
            w += 1;
        }
        nibble_dot(qs, xq) - 8 * sum_x
    }
    #[inline(always)]
    fn scales(scale: *const u8) -> [f32; 2] {
        [half_at(scale), 0.0]
    }
    #[inline(always)]
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, _xs: f32) -> f32 {
        fma_f32(w[0], xd * dot, acc)
    }
    #[inline(always)]
    fn code_word(k0: u32) -> u32 {
        (k0 % 16) / 4
    }
    #[inline(always)]
    fn codes4(word: u32, k0: u32) -> u32 {
        // Per byte q − 8 without borrows between bytes: set each byte's top bit (q | 0x80 ≥ 8),
        // subtract 8, flip the top bit back: (128 + q − 8) ^ 128 ≡ q − 8 (mod 256).
        ((nibbles4(word, k0) | 0x8080_8080) - 0x0808_0808) ^ 0x8080_8080
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
    fn int_dot(qs: &[u32; 8], xq: &[u32; 8]) -> i32 {
        nibble_dot(qs, xq)
    }
    #[inline(always)]
    fn scales(scale: *const u8) -> [f32; 2] {
        [half_at(scale), half_at(unsafe { scale.add(2) })]
    }
    #[inline(always)]
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, xs: f32) -> f32 {
        fma_f32(w[0] * xd, dot, fma_f32(w[1], xs, acc))
    }
    #[inline(always)]
    fn code_word(k0: u32) -> u32 {
        (k0 % 16) / 4
    }
    #[inline(always)]
    fn codes4(word: u32, k0: u32) -> u32 {
        nibbles4(word, k0)
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
    fn int_dot(qs: &[u32; 8], xq: &[u32; 8]) -> i32 {
        let mut s = 0;
        let mut w = 0;
        while w < 8 {
            s = dp4a_s32(qs[w], xq[w], s);
            w += 1;
        }
        s
    }
    #[inline(always)]
    fn scales(scale: *const u8) -> [f32; 2] {
        [half_at(scale), 0.0]
    }
    #[inline(always)]
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, _xs: f32) -> f32 {
        fma_f32(w[0], xd * dot, acc)
    }
    #[inline(always)]
    fn code_word(k0: u32) -> u32 {
        k0 / 4
    }
    #[inline(always)]
    fn codes4(word: u32, _k0: u32) -> u32 {
        word
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

/// Byte sizes of the two planes of a `rows × cols` matrix in split layout.
pub const fn split_plane_bytes<F: SplitFormat>(rows: usize, cols: usize) -> (usize, usize) {
    let blocks = rows * (cols / QK);
    (blocks * F::QS_WORDS * 4, blocks * F::SCALE_BYTES)
}

/// Split GGUF blocks (`src`, `rows × cols` elements) into the quants and scales planes.
/// Returns `false` if the sizes do not match (the caller reports which tensor).
pub fn split_gguf_blocks<F: SplitFormat>(src: &[u8], rows: usize, cols: usize, qs: &mut [u8], scales: &mut [u8]) -> bool {
    let blocks = rows * (cols / QK);
    let (qb, sb) = split_plane_bytes::<F>(rows, cols);
    if cols % QK != 0 || src.len() != blocks * F::GGUF_BYTES || qs.len() != qb || scales.len() != sb {
        return false;
    }
    let q_bytes = F::QS_WORDS * 4;
    for b in 0..blocks {
        let blk = &src[b * F::GGUF_BYTES..(b + 1) * F::GGUF_BYTES];
        // GGUF blocks start with their scale(s); the quants follow.
        scales[b * F::SCALE_BYTES..(b + 1) * F::SCALE_BYTES].copy_from_slice(&blk[..F::SCALE_BYTES]);
        qs[b * q_bytes..(b + 1) * q_bytes].copy_from_slice(&blk[F::SCALE_BYTES..]);
    }
    true
}
