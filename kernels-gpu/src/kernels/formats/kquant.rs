//! The K formats. A GGUF K-quant super-block (256 elements) is eight 32-element blocks that
//! share `d` (and `dmin`) and each have their own small integer scale(s); kiln keeps exactly
//! that: the blocks' low 4 code bits in the quants plane in Q4 order (16 bytes, so every lane
//! still loads its block with one aligned 16-byte load), and per super-block one record holding
//! `d`, the eight blocks' integer scales and their high code bits. 4.625 / 5.625 / 6.75 bits per
//! weight for Q4_K / Q5_K / Q6_K (the files: 4.5 / 5.5 / 6.5625). The host turns GGUF
//! super-blocks into kiln's unpacked blocks ([`crate::quant::reblock`], exact) and `pack`s those.
//!
//! High bits: element `16·half + 4w + i` of a block (the `i`-th byte of nibble word `w`, low
//! nibbles for half 0) has its fifth bit (Q5K) at bit `2w + half` of byte `i` of the block's
//! high word, and its fifth and sixth bits (Q6K) at bits `2w, 2w + 1` of byte `i` of high word
//! `half`, so one shift and mask moves a whole code word's high bits into place.
use super::{SplitFormat, f16x2_splat, nibble, nibble_dot, nibbles};
use crate::device::{dp4a_s32, f16_to_f32, f32_to_f16};

/// The K formats' side data: scale bits in word 0, high code bits in the others (Q4K: `(sc,
/// m)` in word 1).
type KSide = [u32; 3];

/// Fifth code bits of nibble word `w`, half `half` of a [`Q5K`] block, at bit 4 of each byte.
#[inline(always)]
fn q5_high(h: u32, w: u32, half: u32) -> u32 {
    ((h >> (2 * w + half)) & 0x0101_0101) << 4
}

/// Fifth and sixth code bits of nibble word `w` of a [`Q6K`] block (`h`: the high word of its
/// half), at bits 4 and 5 of each byte.
#[inline(always)]
fn q6_high(h: u32, w: u32) -> u32 {
    ((h >> (2 * w)) & 0x0303_0303) << 4
}

/// Q6_K's codes `q` (0..64, one per byte) as the signed `q − 32`, bytewise without borrows:
/// `128 + q − 32` stays in 96..160, and flipping bit 7 is two's complement's `− 128`.
#[inline(always)]
fn q6_signed(q: u32) -> u32 {
    ((q | 0x8080_8080) - 0x2020_2020) ^ 0x8080_8080
}

/// The eight code words of a K block in element order (word `k` = elements `4k..4k + 4`, one
/// unsigned code per byte), `code(w, half)` giving nibble word `w`'s half `half`.
#[inline(always)]
fn k_code_words(code: impl Fn(usize, u32) -> u32) -> [u32; 8] {
    let mut out = [0; 8];
    let mut k = 0;
    while k < 8 {
        out[k] = code(k % 4, (k / 4) as u32);
        k += 1;
    }
    out
}

/// `[d·sc, −dmin·m]` of a [`Q4K`]/[`Q5K`] block, exact in f32 (an f16 times a 6-bit integer),
/// from its side words `[d | dmin << 16, sc | m << 8, ..]`.
#[inline(always)]
fn k_min_scales(side: KSide) -> [f32; 2] {
    let (d, dmin) = (
        f16_to_f32(side[0] as u16),
        f16_to_f32((side[0] >> 16) as u16),
    );
    let (sc, m) = ((side[1] & 0xff) as f32, ((side[1] >> 8) & 0xff) as f32);
    [d * sc, -(dmin * m)]
}

/// The GEMM's staged words of a [`Q4K`]/[`Q5K`] block: `[d·sc, −dmin·m]` rounded once to f16
/// (as pairs), then the high word.
#[inline(always)]
fn k_min_staged(side: KSide) -> [u32; 4] {
    let [d, m] = k_min_scales(side);
    let (d, m) = (f32_to_f16(d) as u32, f32_to_f16(m) as u32);
    [f16x2_splat(d), f16x2_splat(m), side[2], 0]
}

/// The [`Q4K`]/[`Q5K`] record: `d`, `dmin` (f16), then `(sc, m)` per block, then (Q5K) the
/// blocks' high words. The side of block `j`: `[d | dmin << 16, sc | m << 8, high]`.
#[inline(always)]
fn k_min_side(record: *const u8, j: usize, high: bool) -> KSide {
    unsafe {
        [
            (record as *const u32).read(),
            (record.add(4 + 2 * j) as *const u16).read() as u32,
            if high {
                (record.add(20 + 4 * j) as *const u32).read()
            } else {
                0
            },
        ]
    }
}

/// Host side of [`SplitFormat::pack`] for the K formats: `header` bytes shared by the group
/// (`d` and `dmin`, or `d`) go to `record[..header]` and must be equal in all eight blocks;
/// each block's code bytes (after `block[code_at..]`) must be below `limit`; `block_scales`
/// writes a block's own scales and high bits into the record, `nibbles` of its codes go to `qs`.
fn k_pack(
    blocks: &[u8],
    qs: &mut [u8],
    record: &mut [u8],
    (block_bytes, header, code_at, limit): (usize, usize, usize, u8),
    header_at: usize,
    mut block_scales: impl FnMut(usize, &[u8], &[u8], &mut [u8]),
) -> bool {
    record.fill(0);
    record[header_at..header_at + header].copy_from_slice(&blocks[..header]);
    for (j, blk) in blocks.chunks_exact(block_bytes).enumerate() {
        let codes = &blk[code_at..];
        if blk[..header] != blocks[..header] || codes.iter().any(|&q| q >= limit) {
            return false;
        }
        for (i, q) in qs[16 * j..16 * (j + 1)].iter_mut().enumerate() {
            *q = (codes[i] & 0xf) | (codes[16 + i] & 0xf) << 4;
        }
        block_scales(j, &blk[header..code_at], codes, record);
    }
    true
}

/// Q4_K as it is in the file, 4.625 bits per weight: value = `(d·sc)·q − dmin·m` with the
/// super-block's f16 `d`, `dmin` and the block's 6-bit `sc`, `m`; 4-bit codes `q`. Unpacked
/// block: `[d, dmin: f16, sc, m: u8, 32 codes]`; record (20 bytes): `[d, dmin, 8 × (sc, m)]`.
pub struct Q4K;
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q4K {
    type Side = KSide;
    const QS_WORDS: usize = 4;
    const GROUP: usize = 8;
    const RECORD_BYTES: usize = 20;
    const BLOCK_BYTES: usize = 38;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn load_side(record: *const u8, j: usize) -> KSide {
        k_min_side(record, j, false)
    }
    fn pack(blocks: &[u8], qs: &mut [u8], record: &mut [u8]) -> bool {
        k_pack(blocks, qs, record, (38, 4, 6, 16), 0, |j, sm, _, rec| {
            rec[4 + 2 * j..6 + 2 * j].copy_from_slice(sm)
        })
    }
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], _side: KSide, xq: &[u32; 8]) -> i32 {
        nibble_dot(qs, xq)
    }
    #[inline(always)]
    fn scales(side: KSide) -> [f32; 2] {
        k_min_scales(side)
    }
    #[inline(always)]
    fn step_codes(word: u32, s: u32, _t: u32, _staged: [u32; 4]) -> u32 {
        nibbles(word, s)
    }
    #[inline(always)]
    fn staged(side: KSide) -> [u32; 4] {
        k_min_staged(side)
    }
}

/// Q5_K as it is in the file, 5.625 bits per weight: [`Q4K`] with 5-bit codes. Unpacked block
/// as Q4K's; record (52 bytes): `[d, dmin, 8 × (sc, m), 8 × high word]`.
pub struct Q5K;

impl Q5K {
    /// The block's codes of nibble word `w`, half `half` (unsigned, one per byte).
    #[inline(always)]
    fn codes(qs: &[u32; 8], side: KSide, w: usize, half: u32) -> u32 {
        nibbles(qs[w], half) | q5_high(side[2], w as u32, half)
    }
}

#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q5K {
    type Side = KSide;
    const QS_WORDS: usize = 4;
    const GROUP: usize = 8;
    const RECORD_BYTES: usize = 52;
    const BLOCK_BYTES: usize = 38;
    const STAGED_WORDS: usize = 3;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn load_side(record: *const u8, j: usize) -> KSide {
        k_min_side(record, j, true)
    }
    fn pack(blocks: &[u8], qs: &mut [u8], record: &mut [u8]) -> bool {
        k_pack(
            blocks,
            qs,
            record,
            (38, 4, 6, 32),
            0,
            |j, sm, codes, rec| {
                rec[4 + 2 * j..6 + 2 * j].copy_from_slice(sm);
                let mut high = 0u32;
                for (e, &q) in codes.iter().enumerate() {
                    let (half, w, i) = (e / 16, (e % 16) / 4, e % 4);
                    high |= u32::from(q >> 4) << (8 * i + 2 * w + half);
                }
                rec[20 + 4 * j..24 + 4 * j].copy_from_slice(&high.to_le_bytes());
            },
        )
    }
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], side: KSide, xq: &[u32; 8]) -> i32 {
        let mut s = 0;
        let mut w = 0;
        while w < 4 {
            s = dp4a_s32(Self::codes(qs, side, w, 0), xq[w], s);
            s = dp4a_s32(Self::codes(qs, side, w, 1), xq[w + 4], s);
            w += 1;
        }
        s
    }
    #[inline(always)]
    fn scales(side: KSide) -> [f32; 2] {
        k_min_scales(side)
    }
    #[inline(always)]
    fn step_codes(word: u32, s: u32, t: u32, staged: [u32; 4]) -> u32 {
        nibbles(word, s) | q5_high(staged[2], t, s)
    }
    #[inline(always)]
    fn staged(side: KSide) -> [u32; 4] {
        k_min_staged(side)
    }
    #[inline(always)]
    fn element(qs: *const u8, side: KSide, i: usize) -> f32 {
        let (half, w, k) = (i / 16, (i % 16) / 4, i % 4);
        let high = (side[2] >> (8 * k + 2 * w + half)) & 1;
        let [d, m] = Self::scales(side);
        d * (nibble(qs, i) + 16.0 * high as f32) + m
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], side: KSide, x: &[f32; 32]) -> f32 {
        let words = k_code_words(|w, half| Self::codes(qs, side, w, half));
        let (mut s, mut sx) = (0.0, 0.0);
        let mut i = 0;
        while i < 32 {
            s += ((words[i / 4] >> (8 * (i % 4))) & 0xff) as f32 * x[i];
            sx += x[i];
            i += 1;
        }
        let [d, m] = Self::scales(side);
        d * s + m * sx
    }
}

/// Q6_K as it is in the file (bar `d` padded to 8 bytes per super-block), 6.75 bits per weight:
/// value = `d·sc·(q − 32)` with the super-block's f16 `d`, the 16-element sub-block's i8 `sc`
/// and the 6-bit code `q`. Unpacked block: `[d: f16, sc_a, sc_b: i8, 32 codes]` (`sc_a` for
/// elements 0..16); record (88 bytes): `[8 × two high words, 8 × (sc_a, sc_b), d, 6 × 0]`. The
/// side of block `j`: `[sc_a | sc_b << 8 | d << 16, high word 0, high word 1]`.
pub struct Q6K;

impl Q6K {
    /// The block's codes `q − 32` of nibble word `w`, half `half` (signed, one per byte).
    #[inline(always)]
    fn codes(qs: &[u32; 8], side: KSide, w: usize, half: u32) -> u32 {
        q6_signed(nibbles(qs[w], half) | q6_high(side[1 + half as usize], w as u32))
    }
}

/// The i8 sub-block scale `i` (0, 1) of a [`Q6K`] side's word 0.
#[inline(always)]
fn q6_sub_scale(bits: u32, i: u32) -> i32 {
    (bits >> (8 * i)) as u8 as i8 as i32
}

#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl SplitFormat for Q6K {
    type Side = KSide;
    const QS_WORDS: usize = 4;
    const GROUP: usize = 8;
    const RECORD_BYTES: usize = 88;
    const BLOCK_BYTES: usize = 36;
    const STAGED_WORDS: usize = 3;
    #[inline(always)]
    fn load_side(record: *const u8, j: usize) -> KSide {
        unsafe {
            let high = (record.add(8 * j) as *const u64).read();
            let sc = (record.add(64 + 2 * j) as *const u16).read() as u32;
            let d = (record.add(80) as *const u16).read() as u32;
            [sc | d << 16, high as u32, (high >> 32) as u32]
        }
    }
    fn pack(blocks: &[u8], qs: &mut [u8], record: &mut [u8]) -> bool {
        k_pack(
            blocks,
            qs,
            record,
            (36, 2, 4, 64),
            80,
            |j, sc, codes, rec| {
                rec[64 + 2 * j..66 + 2 * j].copy_from_slice(sc);
                let mut high = [0u32; 2];
                for (e, &q) in codes.iter().enumerate() {
                    let (half, w, i) = (e / 16, (e % 16) / 4, e % 4);
                    high[half] |= u32::from(q >> 4) << (8 * i + 2 * w);
                }
                rec[8 * j..8 * j + 4].copy_from_slice(&high[0].to_le_bytes());
                rec[8 * j + 4..8 * j + 8].copy_from_slice(&high[1].to_le_bytes());
            },
        )
    }
    #[inline(always)]
    fn int_dot(qs: &[u32; 8], side: KSide, xq: &[u32; 8]) -> i32 {
        // |c| ≤ 32, |xq| ≤ 127, |sc| ≤ 128: each half ≤ 2²³, the sum < 2²⁴ (exact as f32).
        let (mut a, mut b) = (0, 0);
        let mut w = 0;
        while w < 4 {
            a = dp4a_s32(Self::codes(qs, side, w, 0), xq[w], a);
            b = dp4a_s32(Self::codes(qs, side, w, 1), xq[w + 4], b);
            w += 1;
        }
        a * q6_sub_scale(side[0], 0) + b * q6_sub_scale(side[0], 1)
    }
    #[inline(always)]
    fn scales(side: KSide) -> [f32; 2] {
        [f16_to_f32((side[0] >> 16) as u16), 0.0]
    }
    #[inline(always)]
    fn step_codes(word: u32, s: u32, t: u32, staged: [u32; 4]) -> u32 {
        nibbles(word, s) | q6_high(if s == 0 { staged[1] } else { staged[2] }, t)
    }
    #[inline(always)]
    fn staged(side: KSide) -> [u32; 4] {
        // Kept raw: a d·sc rounded to f16 would make each element two roundings.
        [side[0], side[1], side[2], 0]
    }
    #[inline(always)]
    fn dequant_f16x2(biased: u32, s: u32, staged: [u32; 4]) -> u32 {
        // Step s covers elements 16s..16s+16: sub-block s. (q − 32)·sc (≤ 2¹² in magnitude)
        // times the f16 d is exact in f32, so the conversion to f16 is the one rounding.
        let (sc, d) = (
            q6_sub_scale(staged[0], s),
            f16_to_f32((staged[0] >> 16) as u16),
        );
        let value = |half: u32| ((((biased >> (16 * half)) & 0xff) as i32 - 32) * sc) as f32 * d;
        f32_to_f16(value(0)) as u32 | (f32_to_f16(value(1)) as u32) << 16
    }
    #[inline(always)]
    fn element(qs: *const u8, side: KSide, i: usize) -> f32 {
        let (half, w, k) = (i / 16, (i % 16) / 4, i % 4);
        let high = (side[1 + half] >> (8 * k + 2 * w)) & 3;
        let q = nibble(qs, i) as i32 + 16 * high as i32;
        ((q - 32) * q6_sub_scale(side[0], half as u32)) as f32 * Self::scales(side)[0]
    }
    #[inline(always)]
    fn block_dot_f32(qs: &[u32; 8], side: KSide, x: &[f32; 32]) -> f32 {
        let words = k_code_words(|w, half| Self::codes(qs, side, w, half));
        let mut half = [0f32; 2];
        let mut i = 0;
        while i < 32 {
            half[i / 16] += ((words[i / 4] >> (8 * (i % 4))) as u8 as i8) as f32 * x[i];
            i += 1;
        }
        Self::scales(side)[0]
            * (q6_sub_scale(side[0], 0) as f32 * half[0]
                + q6_sub_scale(side[0], 1) as f32 * half[1])
    }
}
