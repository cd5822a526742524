//! K-quant super-blocks (256 elements) re-blocked by 32 at load, so the GPU's 32-element split
//! formats run them: Q6_K exactly, as [`Q6K`](crate::kernels::formats::Q6K) blocks; Q4_K as
//! Q4_1 blocks and Q5_K as [`Q5K`](crate::kernels::formats::Q5K) blocks, where each sub-block's
//! `d·sc` and `dmin·m` (exact in f32) are rounded to f16 — the one inexact step, at most 2⁻¹¹
//! relative per scale, the size of the f16 weight rounding the GEMM makes anyway.

use super::{
    BlockQ4K, BlockQ5K, BlockQ6K, QK_K, QuantBlock, f16_to_f32, f32_to_f16, get_scale_min_k4,
};

/// Bytes of one Q4_1 block, of one kiln Q6K block (scales word, then 32 i8 codes) and of one
/// kiln Q5K block (d, m, then 32 u8 codes).
pub const Q4_1_BYTES: usize = 20;
pub const Q6K_BYTES: usize = 36;
pub const Q5K_BYTES: usize = 36;

/// Why a tensor could not be re-blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReblockError {
    /// `src` is not whole super-blocks, or `dst` is not the matching size.
    Size,
    /// A Q4_K sub-block scale or minimum is outside f16's range once multiplied out.
    ScaleRange,
}

/// Q6_K super-blocks (`src`) → 8 [`Q6K`](crate::kernels::formats::Q6K) blocks each (`dst`,
/// `src.len() / 210 · 8 · 36` bytes). Exact: the codes and scales are copied, not rounded.
pub fn q6_k(src: &[u8], dst: &mut [u8]) -> Result<(), ReblockError> {
    let supers = src.len() / BlockQ6K::BYTES;
    if src.len() % BlockQ6K::BYTES != 0 || dst.len() != supers * 8 * Q6K_BYTES {
        return Err(ReblockError::Size);
    }
    for (sb, out) in src
        .chunks_exact(BlockQ6K::BYTES)
        .zip(dst.chunks_exact_mut(8 * Q6K_BYTES))
    {
        let Some(b) = BlockQ6K::read(sb) else {
            return Err(ReblockError::Size);
        };
        for (j, blk) in out.chunks_exact_mut(Q6K_BYTES).enumerate() {
            blk[0] = b.scales[2 * j] as u8;
            blk[1] = b.scales[2 * j + 1] as u8;
            blk[2..4].copy_from_slice(&b.d.to_le_bytes());
            for (l, code) in blk[4..].iter_mut().enumerate() {
                *code = (q6_k_code(&b, 32 * j + l) - 32) as u8;
            }
        }
    }
    Ok(())
}

/// The 6-bit code (0..64) of element `e` (0..256) of a Q6_K super-block: per 128-element half
/// `n`, element `i` takes nibble `i / 64` of `ql[64n + i % 32 + 32·((i / 32) & 1)]` and bits
/// `2·(i / 32)..` of `qh[32n + i % 32]` as its top two bits.
fn q6_k_code(b: &BlockQ6K, e: usize) -> i8 {
    let (n, i) = (e / 128, e % 128);
    let lo = (b.ql[64 * n + i % 32 + 32 * ((i / 32) & 1)] >> (4 * (i / 64))) & 0xf;
    let hi = (b.qh[32 * n + i % 32] >> (2 * (i / 32))) & 3;
    (lo | hi << 4) as i8
}

/// Q4_K super-blocks (`src`) → 8 Q4_1 blocks each (`dst`, `src.len() / 144 · 8 · 20` bytes):
/// sub-block `j`'s value `(d·sc_j)·q − dmin·m_j` becomes Q4_1's `d'·q + m'` with `d' =
/// f16(d·sc_j)`, `m' = f16(−dmin·m_j)`; the 4-bit codes are copied into Q4_1's nibble order.
pub fn q4_k_as_q4_1(src: &[u8], dst: &mut [u8]) -> Result<(), ReblockError> {
    let supers = src.len() / BlockQ4K::BYTES;
    if src.len() % BlockQ4K::BYTES != 0 || dst.len() != supers * 8 * Q4_1_BYTES {
        return Err(ReblockError::Size);
    }
    for (sb, out) in src
        .chunks_exact(BlockQ4K::BYTES)
        .zip(dst.chunks_exact_mut(8 * Q4_1_BYTES))
    {
        let Some(b) = BlockQ4K::read(sb) else {
            return Err(ReblockError::Size);
        };
        for (j, blk) in out.chunks_exact_mut(Q4_1_BYTES).enumerate() {
            blk[0..4].copy_from_slice(&k4_sub_block_scales(b.d, b.dmin, &b.scales, j)?);
            // Q4_K sub-block j: nibble j & 1 of qs[32·(j / 2) + l]; Q4_1: element i < 16 in the
            // low nibble of byte i, 16 + i in its high nibble.
            let code = |l: usize| (b.qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xf;
            for (i, q) in blk[4..].iter_mut().enumerate() {
                *q = code(i) | code(16 + i) << 4;
            }
        }
    }
    Ok(())
}

/// Q5_K super-blocks (`src`) → 8 [`Q5K`](crate::kernels::formats::Q5K) blocks each (`dst`,
/// `src.len() / 176 · 8 · 36` bytes): the scales as [`q4_k_as_q4_1`]'s, the 5-bit codes one per
/// byte.
pub fn q5_k(src: &[u8], dst: &mut [u8]) -> Result<(), ReblockError> {
    let supers = src.len() / BlockQ5K::BYTES;
    if src.len() % BlockQ5K::BYTES != 0 || dst.len() != supers * 8 * Q5K_BYTES {
        return Err(ReblockError::Size);
    }
    for (sb, out) in src
        .chunks_exact(BlockQ5K::BYTES)
        .zip(dst.chunks_exact_mut(8 * Q5K_BYTES))
    {
        let Some(b) = BlockQ5K::read(sb) else {
            return Err(ReblockError::Size);
        };
        for (j, blk) in out.chunks_exact_mut(Q5K_BYTES).enumerate() {
            blk[0..4].copy_from_slice(&k4_sub_block_scales(b.d, b.dmin, &b.scales, j)?);
            // Sub-block j: low nibble j & 1 of qs[32·(j / 2) + l], fifth bit j of qh[l].
            for (l, q) in blk[4..].iter_mut().enumerate() {
                let lo = (b.qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xf;
                *q = lo | ((b.qh[l] >> j) & 1) << 4;
            }
        }
    }
    Ok(())
}

/// Sub-block `j`'s `(d·sc, −dmin·m)` of a Q4_K/Q5_K super-block as the f16 pair Q4_1's scales
/// plane holds (both products are exact in f32; the f16 rounding is the one inexact step).
fn k4_sub_block_scales(
    d: u16,
    dmin: u16,
    scales: &[u8; 12],
    j: usize,
) -> Result<[u8; 4], ReblockError> {
    let (sc, m) = get_scale_min_k4(j, scales);
    let scale = f32_to_f16(f16_to_f32(d) * sc as f32);
    let min = f32_to_f16(-(f16_to_f32(dmin) * m as f32));
    if !f16_to_f32(scale).is_finite() || !f16_to_f32(min).is_finite() {
        return Err(ReblockError::ScaleRange);
    }
    let [s0, s1] = scale.to_le_bytes();
    let [m0, m1] = min.to_le_bytes();
    Ok([s0, s1, m0, m1])
}

const _: () = assert!(QK_K == 8 * 32);
