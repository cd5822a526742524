//! Weight formats as the GPU keeps them: GGUF blocks split into a quants plane and a scales
//! plane at upload, so every lane reads its 16 or 32 bytes of quants with aligned 16-byte loads
//! (an 18-byte Q4_0 block can never be loaded that way in place). The K formats (`kquant`) keep
//! one scales record per 256-element super-block, as the file does.
//!
//! Activations for the integer formats are quantized once per mat-vec to [`Q8_1`]-style blocks
//! (32 × i8 plus `d` and `d·Σq`), so a block dot is eight `dp4a` instead of 32 float FMAs.
use crate::device::{dp4a_s32, f16_to_f32, fma_f16x2, fma_f32, mul_f16x2, prmt, sub_f16x2};

mod kquant;
pub use kquant::{Q4K, Q5K, Q6K};

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

/// One 32-element block format in split layout: a quants plane of `QS_WORDS` words per block
/// and a scales plane of one `RECORD_BYTES` record per `GROUP` consecutive blocks of a row.
///
/// `scale`/`qs` pointers point into the device planes; the methods are safe to call only from
/// kernel bodies that uphold the kernel's own pointer contract (hence the lint allowance: they
/// are leaf helpers of `unsafe` kernels, not a public safe API).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub trait SplitFormat: 'static {
    /// What a block's dot needs beside its quant words, loaded together with them from the
    /// scales plane ([`load_side`](Self::load_side)): the legacy formats' scale bits (`u32`),
    /// the K formats' scale bits and high code bits (`[u32; 3]`). A type per format, so the
    /// legacy mat-vecs keep one register per block for it.
    type Side: Copy + Default;
    /// u32 words of quants per block (16 bytes for 4-bit low bits, 32 for 8-bit).
    const QS_WORDS: usize;
    /// Blocks sharing one record of the scales plane: 1, or 8 for the K formats (a GGUF
    /// super-block, whose `d` is stored once as in the file).
    const GROUP: usize = 1;
    /// Bytes of one scales-plane record.
    const RECORD_BYTES: usize;
    /// Bytes of one block as [`pack`](Self::pack) takes it: the GGUF block for the legacy
    /// formats, kiln's unpacked block (scales, then one code per byte) for the K formats.
    const BLOCK_BYTES: usize;
    /// u32 words the GEMM stages per block and row ([`staged`](Self::staged)).
    const STAGED_WORDS: usize = 2;
    /// Whether a block has a minimum: value = `d·q + m` (Q4_1, Q4K, Q5K) rather than
    /// `d·(q − CODE_OFFSET)`. Picks the form of the defaults below at compile time.
    const HAS_MIN: bool = false;
    /// What the stored unsigned code is offset by (Q4_0: 8; Q8_0: 128, its s8 codes made
    /// unsigned by [`step_codes`](Self::step_codes)).
    const CODE_OFFSET: u32 = 0;

    /// Block `j` (0..GROUP) of the group whose record starts at `record`: its side data.
    fn load_side(record: *const u8, j: usize) -> Self::Side;

    /// Host side: `GROUP` consecutive blocks of one row (`blocks`, `BLOCK_BYTES` each) into
    /// their quants (`qs`, `GROUP · QS_WORDS · 4` bytes) and their record. `false` if the
    /// blocks cannot share a record (a K group whose blocks differ in `d`).
    /// This default is the legacy split: the record is the GGUF block's leading scale bytes.
    fn pack(blocks: &[u8], qs: &mut [u8], record: &mut [u8]) -> bool {
        record.copy_from_slice(&blocks[..Self::RECORD_BYTES]);
        qs.copy_from_slice(&blocks[Self::RECORD_BYTES..]);
        true
    }

    /// Dot of one weight block (`qs`: its first `QS_WORDS` words are used; `side` from
    /// [`load_side`]) with one activation block (`xq`: 32 i8 as 8 words; `xd` scale, `xs` =
    /// xd·Σxq): the exact integer dot of the codes with `xq`, then
    /// [`scale_dot`](Self::scale_dot).
    #[inline(always)]
    fn block_dot(
        acc: f32,
        qs: &[u32; 8],
        side: Self::Side,
        xq: &[u32; 8],
        xd: f32,
        xs: f32,
    ) -> f32 {
        Self::scale_dot(
            acc,
            Self::scales(side),
            Self::int_dot(qs, side, xq) as f32,
            xd,
            xs,
        )
    }

    /// Σ codes·xq over one block, exact (`dp4a`); formats with integer sub-block scales (Q6K)
    /// weight each sub-block's sum by its scale, still exactly.
    fn int_dot(qs: &[u32; 8], side: Self::Side, xq: &[u32; 8]) -> i32;

    /// The block's float scales `[d, m]` (`m` = 0 for formats without a minimum).
    fn scales(side: Self::Side) -> [f32; 2];

    /// `acc` plus the float part of a block dot, from the exact integer dot `dot` of the codes
    /// with the activation codes (as f32: |dot| ≤ 32·128² is exact). The mat-vec and the GEMM
    /// both finish every block with this, so they agree up to the order in which blocks are
    /// summed. Fused multiply-adds: in the GEMM this runs once per output element and block, and
    /// the f32 pipe is its bound.
    /// Scale-only formats: `d_w·d_x·dot`; with a minimum: `d_w·d_x·dot + m·s`, `s` being the
    /// activation block's stored `d_x·Σq`.
    #[inline(always)]
    fn scale_dot(acc: f32, w: [f32; 2], dot: f32, xd: f32, xs: f32) -> f32 {
        if Self::HAS_MIN {
            fma_f32(w[0] * xd, dot, fma_f32(w[1], xs, acc))
        } else {
            fma_f32(w[0], xd * dot, acc)
        }
    }

    /// The quant word (0..QS_WORDS) holding elements `16s + 4t .. 16s + 4t + 4`: what lane
    /// `t` of a quad takes for k-step `s` (0, 1) of a block in the f16 GEMM (`kernels/mma.rs`).
    /// This default is the 4-bit planes' Q4 order: word `t` holds both steps' (low and high
    /// nibbles); Q8_0 overrides it.
    #[inline(always)]
    fn step_word(_s: u32, t: u32) -> u32 {
        t
    }

    /// Those four elements' codes, from their word (and the block's [`staged`](Self::staged)
    /// words, which hold the K formats' high bits), as unsigned bytes (lowest element lowest).
    fn step_codes(word: u32, s: u32, t: u32, staged: [u32; 4]) -> u32;

    /// What the GEMM keeps of a block's [`Side`] in shared memory (`STAGED_WORDS` words):
    /// the scales as f16 pairs `[d·(1,1), m·(1,1)]` (a shuffle for the legacy formats, whose
    /// scales are f16 already), then any high bits.
    fn staged(side: Self::Side) -> [u32; 4];

    /// Two elements of k-step `s` as f16x2, rounded once from their exact values, given their
    /// unsigned codes `u` as the halves `1024 + u` (bits `0x6400 | u`, see [`biased_f16x2`])
    /// and the [`staged`](Self::staged) words. This default covers the formats whose staged
    /// words are `[d, m]` pairs: `1024 + u − (1024 + CODE_OFFSET)` is exact in f16, so the
    /// product (and the minimum's add, fused) is the one rounding.
    #[inline(always)]
    fn dequant_f16x2(biased: u32, _s: u32, staged: [u32; 4]) -> u32 {
        let codes = sub_f16x2(biased, f16x2_splat(0x6400 + Self::CODE_OFFSET));
        if Self::HAS_MIN {
            fma_f16x2(codes, staged[0], staged[1])
        } else {
            mul_f16x2(codes, staged[0])
        }
    }

    /// Element `i` (0..32) of a block (`qs`: its quants), dequantized. This default and
    /// [`block_dot_f32`](Self::block_dot_f32)'s are the 4-bit formats' (codes as nibbles in
    /// Q4 order, `[d, m]` from [`scales`](Self::scales)).
    #[inline(always)]
    fn element(qs: *const u8, side: Self::Side, i: usize) -> f32 {
        let [d, m] = Self::scales(side);
        if Self::HAS_MIN {
            d * nibble(qs, i) + m
        } else {
            d * (nibble(qs, i) - Self::CODE_OFFSET as f32)
        }
    }

    /// Dot of one weight block (its quants already in registers) with 32 f32 activations,
    /// in f32: `Σ value(i)·x[i]`, no activation quantization.
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], side: Self::Side, x: &[f32; 32]) -> f32 {
        let (s, sx) = nibble_dot_f32(qs, x);
        let [d, m] = Self::scales(side);
        if Self::HAS_MIN {
            d * s + m * sx
        } else {
            d * (s - Self::CODE_OFFSET as f32 * sx)
        }
    }
}

/// The side data of block `blk` (row-major block index) of a matrix whose scales plane starts at
/// `scales` (rows never share a record: a row's blocks are a whole number of groups).
#[inline(always)]
pub fn load_side<F: SplitFormat>(scales: *const u8, blk: usize) -> F::Side {
    F::load_side(
        scales.wrapping_add(blk / F::GROUP * F::RECORD_BYTES),
        blk % F::GROUP,
    )
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

/// Q4_1's `[d, m]` from the two halves of its scale bits.
#[inline(always)]
fn min_scales(bits: u32) -> [f32; 2] {
    [f16_to_f32(bits as u16), f16_to_f32((bits >> 16) as u16)]
}

/// f16x2 of (`v`, `v`).
const fn f16x2_splat(v: u32) -> u32 {
    v | v << 16
}

/// A legacy format's side: its record (the GGUF block's leading f16 scale, or scale and
/// minimum) as one word.
#[inline(always)]
fn legacy_side<F: SplitFormat>(record: *const u8) -> u32 {
    if F::RECORD_BYTES == 4 {
        unsafe { (record as *const u32).read() }
    } else {
        unsafe { (record as *const u16).read() as u32 }
    }
}

/// The f16x2 pairs `[d·(1,1), 0, 0, 0]` the GEMM stages for a format with one f16 scale.
#[inline(always)]
fn scale_staged(bits: u32) -> [u32; 4] {
    [f16x2_splat(bits & 0xffff), 0, 0, 0]
}

/// Q4_0: value = d·(q − 8). Its codes are q − 8 (s8), so the integer dot already holds the
/// −8·Σx term exactly; the mat-vec gets the same integer from the raw nibbles and the exact
/// Σx (four more `dp4a`). Using the f16-rounded `d·Σq` instead would cost ~1e-2 relative
/// error: the −8·Σx term is large and nearly cancels.
pub struct Q4_0;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q4_0 {
    type Side = u32;
    const QS_WORDS: usize = 4;
    const RECORD_BYTES: usize = 2;
    const BLOCK_BYTES: usize = 18;
    const CODE_OFFSET: u32 = 8;
    #[inline(always)]
    fn load_side(record: *const u8, _j: usize) -> u32 {
        legacy_side::<Self>(record)
    }
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _side: Self::Side, xq: &[u32; 8]) -> i32 {
        let mut sum_x = 0;
        let mut w = 0;
        while w < 8 {
            sum_x = dp4a_s32(0x0101_0101, xq[w], sum_x);
            w += 1;
        }
        nibble_dot(qs, xq) - 8 * sum_x
    }
    #[inline(always)]
    fn scales(side: Self::Side) -> [f32; 2] {
        [f16_to_f32(side as u16), 0.0]
    }
    #[inline(always)]
    fn step_codes(word: u32, s: u32, _t: u32, _staged: [u32; 4]) -> u32 {
        nibbles(word, s)
    }
    #[inline(always)]
    fn staged(side: Self::Side) -> [u32; 4] {
        scale_staged(side)
    }
}

/// Q4_1: value = d·q + m (scales plane holds d, m as two halves).
pub struct Q4_1;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q4_1 {
    type Side = u32;
    const QS_WORDS: usize = 4;
    const RECORD_BYTES: usize = 4;
    const BLOCK_BYTES: usize = 20;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn load_side(record: *const u8, _j: usize) -> u32 {
        legacy_side::<Self>(record)
    }
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _side: Self::Side, xq: &[u32; 8]) -> i32 {
        nibble_dot(qs, xq)
    }
    #[inline(always)]
    fn scales(side: Self::Side) -> [f32; 2] {
        min_scales(side)
    }
    #[inline(always)]
    fn step_codes(word: u32, s: u32, _t: u32, _staged: [u32; 4]) -> u32 {
        nibbles(word, s)
    }
    #[inline(always)]
    fn staged(side: Self::Side) -> [u32; 4] {
        [f16x2_splat(side & 0xffff), f16x2_splat(side >> 16), 0, 0]
    }
}

/// Q8_0: value = d·q.
pub struct Q8_0;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q8_0 {
    type Side = u32;
    const QS_WORDS: usize = 8;
    const RECORD_BYTES: usize = 2;
    const BLOCK_BYTES: usize = 34;
    const CODE_OFFSET: u32 = 128;
    #[inline(always)]
    fn load_side(record: *const u8, _j: usize) -> u32 {
        legacy_side::<Self>(record)
    }
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _side: Self::Side, xq: &[u32; 8]) -> i32 {
        byte_dot(qs, xq)
    }
    #[inline(always)]
    fn scales(side: Self::Side) -> [f32; 2] {
        [f16_to_f32(side as u16), 0.0]
    }
    #[inline(always)]
    fn step_word(s: u32, t: u32) -> u32 {
        4 * s + t // one code per byte
    }
    #[inline(always)]
    fn step_codes(word: u32, _s: u32, _t: u32, _staged: [u32; 4]) -> u32 {
        word ^ 0x8080_8080 // s8 c → u8 c + 128
    }
    #[inline(always)]
    fn staged(side: Self::Side) -> [u32; 4] {
        scale_staged(side)
    }
    #[inline(always)]
    fn element(qs: *const u8, side: Self::Side, i: usize) -> f32 {
        Self::scales(side)[0] * unsafe { *qs.add(i) } as i8 as f32
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], side: Self::Side, x: &[f32; 32]) -> f32 {
        let mut s = 0.0;
        let mut i = 0;
        while i < 32 {
            s += ((qs[i / 4] >> (8 * (i % 4))) as u8 as i8) as f32 * x[i];
            i += 1;
        }
        Self::scales(side)[0] * s
    }
}

/// Byte sizes of the two planes of a `rows × cols` matrix in split layout.
pub const fn split_plane_bytes<F: SplitFormat>(rows: usize, cols: usize) -> (usize, usize) {
    let blocks = rows * (cols / QK);
    (
        blocks * F::QS_WORDS * 4,
        blocks / F::GROUP * F::RECORD_BYTES,
    )
}

/// Split blocks (`src`, `rows × cols` elements, `BLOCK_BYTES` per block) into the quants and
/// scales planes. Returns `false` if the sizes do not match, a row is not a whole number of
/// groups, or a group's blocks cannot be packed (the caller reports which tensor).
pub fn split_gguf_blocks<F: SplitFormat>(
    src: &[u8],
    rows: usize,
    cols: usize,
    qs: &mut [u8],
    scales: &mut [u8],
) -> bool {
    let blocks = rows * (cols / QK);
    let (qb, sb) = split_plane_bytes::<F>(rows, cols);
    if !cols.is_multiple_of(QK)
        || !(cols / QK).is_multiple_of(F::GROUP)
        || src.len() != blocks * F::BLOCK_BYTES
        || qs.len() != qb
        || scales.len() != sb
    {
        return false;
    }
    let q_group = F::GROUP * F::QS_WORDS * 4;
    src.chunks_exact(F::GROUP * F::BLOCK_BYTES)
        .zip(qs.chunks_exact_mut(q_group))
        .zip(scales.chunks_exact_mut(F::RECORD_BYTES))
        .all(|((b, q), r)| F::pack(b, q, r))
}
