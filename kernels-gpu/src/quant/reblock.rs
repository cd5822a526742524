//! K-quant super-blocks (256 elements) as the eight 32-element unpacked blocks the GPU's K
//! formats [`pack`](crate::kernels::formats::SplitFormat::pack) ([`Q4K`], [`Q5K`], [`Q6K`]):
//! the super-block's `d` (and `dmin`) repeated in each, the block's own integer scale(s), one
//! code per byte; and Q5_0 blocks as Q8_0 blocks ([`q5_0_as_q8_0`]). Exact: every value is
//! copied, none is rounded, so the packed planes hold the file's weights bit for bit.
//!
//! [`Q4K`]: crate::kernels::formats::Q4K
//! [`Q5K`]: crate::kernels::formats::Q5K
//! [`Q6K`]: crate::kernels::formats::Q6K

use super::{
    BlockQ4K, BlockQ5_0, BlockQ5K, BlockQ6K, BlockQ8_0, QK_K, QuantBlock, code5, f16_to_f32,
    f32_to_f16, get_scale_min_k4,
};
use crate::kernels::formats::{Q4K, Q5K, Q6K, SplitFormat};

/// Why a tensor could not be re-blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReblockError {
    /// `src` is not whole super-blocks, or `dst` is not the matching size.
    Size,
    /// A Q4_K/Q5_K block's `d·sc` or `dmin·m` is outside f16's range: the GEMM rounds them
    /// to f16 once per block, so such a tensor cannot take the K kernels.
    ScaleRange,
}

/// Each GGUF super-block of `src` (`B`, `bytes` each) → 8 unpacked blocks of `out_bytes` in
/// `dst`, `write(block, j, out)` filling block `j`'s.
fn each_block<B: QuantBlock>(
    src: &[u8],
    dst: &mut [u8],
    bytes: usize,
    out_bytes: usize,
    mut write: impl FnMut(&B, usize, &mut [u8]) -> Result<(), ReblockError>,
) -> Result<(), ReblockError> {
    let supers = src.len() / bytes;
    if !src.len().is_multiple_of(bytes) || dst.len() != supers * 8 * out_bytes {
        return Err(ReblockError::Size);
    }
    for (sb, out) in src
        .chunks_exact(bytes)
        .zip(dst.chunks_exact_mut(8 * out_bytes))
    {
        let b = B::read(sb).ok_or(ReblockError::Size)?;
        for (j, blk) in out.chunks_exact_mut(out_bytes).enumerate() {
            write(&b, j, blk)?;
        }
    }
    Ok(())
}

/// Q5_0 blocks (`src`, 22 bytes each) → Q8_0 blocks (`dst`, 34 each): the same `d`, and each
/// 5-bit code `q` as the signed byte `q − 16` (−16..=15), so `(q − 16)·d` is every weight's
/// value as the file holds it. The GPU has no 5-bit format with its own scale per 32 weights
/// (Q5K shares `d` over 256), so Q5_0 tensors take the Q8_0 kernels: 8.5 bits per weight
/// instead of 5.5, every weight exact.
pub fn q5_0_as_q8_0(src: &[u8], dst: &mut [u8]) -> Result<(), ReblockError> {
    let blocks = src.len() / BlockQ5_0::BYTES;
    if !src.len().is_multiple_of(BlockQ5_0::BYTES) || dst.len() != blocks * BlockQ8_0::BYTES {
        return Err(ReblockError::Size);
    }
    for (from, to) in src
        .chunks_exact(BlockQ5_0::BYTES)
        .zip(dst.chunks_exact_mut(BlockQ8_0::BYTES))
    {
        let b = BlockQ5_0::read(from).ok_or(ReblockError::Size)?;
        to[0..2].copy_from_slice(&b.d.to_le_bytes());
        for (i, code) in to[2..].iter_mut().enumerate() {
            *code = (code5(&b.qh, &b.qs, i) as i8 - 16) as u8;
        }
    }
    Ok(())
}

/// Q6_K super-blocks (`src`) → 8 [`Q6K`] blocks each (`dst`, `src.len() / 210 · 8 · 36`
/// bytes): `[d, sc_a, sc_b, 32 codes]`.
pub fn q6_k(src: &[u8], dst: &mut [u8]) -> Result<(), ReblockError> {
    each_block::<BlockQ6K>(src, dst, BlockQ6K::BYTES, Q6K::BLOCK_BYTES, |b, j, blk| {
        blk[0..2].copy_from_slice(&b.d.to_le_bytes());
        blk[2] = b.scales[2 * j] as u8;
        blk[3] = b.scales[2 * j + 1] as u8;
        for (l, code) in blk[4..].iter_mut().enumerate() {
            *code = q6_k_code(b, 32 * j + l);
        }
        Ok(())
    })
}

/// The 6-bit code (0..64) of element `e` (0..256) of a Q6_K super-block: per 128-element half
/// `n`, element `i` takes nibble `i / 64` of `ql[64n + i % 32 + 32·((i / 32) & 1)]` and bits
/// `2·(i / 32)..` of `qh[32n + i % 32]` as its top two bits.
fn q6_k_code(b: &BlockQ6K, e: usize) -> u8 {
    let (n, i) = (e / 128, e % 128);
    let lo = (b.ql[64 * n + i % 32 + 32 * ((i / 32) & 1)] >> (4 * (i / 64))) & 0xf;
    let hi = (b.qh[32 * n + i % 32] >> (2 * (i / 32))) & 3;
    lo | hi << 4
}

/// Q4_K super-blocks (`src`) → 8 [`Q4K`] blocks each (`dst`, `src.len() / 144 · 8 · 38`
/// bytes): `[d, dmin, sc, m, 32 codes]`, sub-block `j`'s codes being nibble `j & 1` of
/// `qs[32·(j / 2) + l]`.
pub fn q4_k(src: &[u8], dst: &mut [u8]) -> Result<(), ReblockError> {
    each_block::<BlockQ4K>(src, dst, BlockQ4K::BYTES, Q4K::BLOCK_BYTES, |b, j, blk| {
        k_min_header(b.d, b.dmin, &b.scales, j, blk)?;
        for (l, q) in blk[6..].iter_mut().enumerate() {
            *q = (b.qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xf;
        }
        Ok(())
    })
}

/// Q5_K super-blocks (`src`) → 8 [`Q5K`] blocks each (`dst`, `src.len() / 176 · 8 · 38`
/// bytes): as [`q4_k`], the fifth bit of sub-block `j`'s element `l` being bit `j` of `qh[l]`.
pub fn q5_k(src: &[u8], dst: &mut [u8]) -> Result<(), ReblockError> {
    each_block::<BlockQ5K>(src, dst, BlockQ5K::BYTES, Q5K::BLOCK_BYTES, |b, j, blk| {
        k_min_header(b.d, b.dmin, &b.scales, j, blk)?;
        for (l, q) in blk[6..].iter_mut().enumerate() {
            let lo = (b.qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xf;
            *q = lo | ((b.qh[l] >> j) & 1) << 4;
        }
        Ok(())
    })
}

/// Block `j`'s `[d, dmin, sc, m]` of a Q4_K/Q5_K super-block; `ScaleRange` if `d·sc` or
/// `dmin·m` would not fit f16 (see [`ReblockError::ScaleRange`]).
fn k_min_header(
    d: u16,
    dmin: u16,
    scales: &[u8; 12],
    j: usize,
    blk: &mut [u8],
) -> Result<(), ReblockError> {
    let (sc, m) = get_scale_min_k4(j, scales);
    let fits = |h: u16, k: u8| f16_to_f32(f32_to_f16(f16_to_f32(h) * k as f32)).is_finite();
    if !fits(d, sc) || !fits(dmin, m) {
        return Err(ReblockError::ScaleRange);
    }
    blk[0..2].copy_from_slice(&d.to_le_bytes());
    blk[2..4].copy_from_slice(&dmin.to_le_bytes());
    (blk[4], blk[5]) = (sc, m);
    Ok(())
}

const _: () = assert!(QK_K == 8 * 32);
