//! Quant block layouts shared by the GPU kernels and the CPU backend.
//!
//! Every type here is byte-for-byte the block of the same name in llama.cpp's GGUF files
//! (little-endian, `#[repr(C)]`, no padding — asserted below), so a tensor's bytes can be read
//! as `[Block]` without conversion. Only integer fields: any bit pattern is a valid block, which
//! is what makes [`QuantBlock::read`] sound on untrusted file data. f16 scales are stored as raw
//! bits (`u16`) and widened with [`f16_to_f32`].
//!
//! The dequantizers reproduce llama.cpp's float operation order exactly (e.g. Q4_K computes
//! `(d * sc) * q - dmin * m`, two roundings, no FMA), so results are bit-identical to the
//! reference `gguf` Python package; the host tests check that against fixtures.

mod kquants;
mod legacy;
pub mod reblock;

pub use kquants::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, get_scale_min_k4};
pub use legacy::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK4_0, QK4_1, QK5_0, QK5_1,
    QK8_0, QK8_1, code5,
};

/// One block of a block-quantized format.
pub trait QuantBlock: Copy {
    /// Elements per block.
    const QK: usize;
    /// Bytes per block (== `size_of::<Self>()`).
    const BYTES: usize;

    /// Writes the block's `QK` values into `out[..QK]` (fewer if `out` is shorter). The default
    /// goes through `get`, so the two cannot disagree; formats with a faster whole-block path
    /// override it.
    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        for (i, o) in out.iter_mut().take(Self::QK).enumerate() {
            *o = self.get(i);
        }
    }

    /// Element `i` (taken modulo `QK`, so it never panics), identical to `dequant`'s `out[i]`.
    /// One thread per element on the GPU uses this.
    fn get(&self, i: usize) -> f32;

    /// Reads one block from the front of `bytes` (any alignment); `None` if too short.
    #[inline(always)]
    fn read(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < Self::BYTES {
            return None;
        }
        // SAFETY: length checked; Self is repr(C) of integers only (every bit pattern valid),
        // and read_unaligned has no alignment requirement.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const Self) })
    }
}

/// IEEE half (raw bits) to f32; exact.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits) as f32
}

/// f32 to IEEE half bits, round to nearest even (what llama.cpp's `GGML_FP32_TO_FP16` does).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    (x as f16).to_bits()
}

/// bfloat16 (raw bits) to f32; exact.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16 bits, round to nearest even, NaN kept quiet (as ggml's `fp32_to_bf16`).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}
