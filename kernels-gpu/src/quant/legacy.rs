//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1 (weights), Q8_0 (weights and activations),
//! Q8_1 (activations for Q4_1 and Q5_1 weights).

use super::{QuantBlock, f16_to_f32};

pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;

/// `value = (q - 8) * d`; element `j` is the low nibble of `qs[j]`, element `j + 16` the high one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; 16],
}

/// `value = q * d + m`; same nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; 16],
}

/// `value = (q - 16) * d` with 5-bit codes: the low four bits in Q4_0's nibble order, the fifth
/// bit of element `j` at bit `j` of the little-endian `qh` (bytes, so the block has no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// `value = q * d + m`; codes as Q5_0's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// `value = q * d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; 32],
}

/// Activation format paired with Q4_1: `s = d * sum(qs)` lets the dot product fold Q4_1's
/// offset `m` in with one multiply per block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; 32],
}

const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(core::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(core::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(core::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(core::mem::size_of::<BlockQ8_1>() == 36);

/// The 4-bit code of element `i` (0..32) in Q4_0/Q4_1's nibble order.
#[inline(always)]
fn nibble(qs: &[u8; 16], i: usize) -> u8 {
    (qs[i & 15] >> ((i & 16) >> 2)) & 0xF
}

/// `d·(q − offset)` (Q4_0, Q5_0): exact in f32 for an f16 `d` and a 5-bit code.
#[inline(always)]
fn offset_value(d: u16, offset: i32, q: u8) -> f32 {
    (q as i32 - offset) as f32 * f16_to_f32(d)
}

/// `d·q + m` (Q4_1, Q5_1), rounded once, as llama.cpp computes it.
#[inline(always)]
fn min_value(d: u16, m: u16, q: u8) -> f32 {
    f16_to_f32(d) * q as f32 + f16_to_f32(m)
}

impl QuantBlock for BlockQ4_0 {
    const QK: usize = QK4_0;
    const BYTES: usize = 18;

    #[inline]
    fn get(&self, i: usize) -> f32 {
        offset_value(self.d, 8, nibble(&self.qs, i & 31))
    }
}

impl QuantBlock for BlockQ4_1 {
    const QK: usize = QK4_1;
    const BYTES: usize = 20;

    #[inline]
    fn get(&self, i: usize) -> f32 {
        min_value(self.d, self.m, nibble(&self.qs, i & 31))
    }
}

/// The 5-bit code of element `i` (0..32) of a Q5_0/Q5_1 block.
#[inline(always)]
pub fn code5(qh: &[u8; 4], qs: &[u8; 16], i: usize) -> u8 {
    nibble(qs, i) | (((u32::from_le_bytes(*qh) >> i) & 1) << 4) as u8
}

impl QuantBlock for BlockQ5_0 {
    const QK: usize = QK5_0;
    const BYTES: usize = 22;

    #[inline]
    fn get(&self, i: usize) -> f32 {
        offset_value(self.d, 16, code5(&self.qh, &self.qs, i & 31))
    }
}

impl QuantBlock for BlockQ5_1 {
    const QK: usize = QK5_1;
    const BYTES: usize = 24;

    #[inline]
    fn get(&self, i: usize) -> f32 {
        min_value(self.d, self.m, code5(&self.qh, &self.qs, i & 31))
    }
}

impl QuantBlock for BlockQ8_0 {
    const QK: usize = QK8_0;
    const BYTES: usize = 34;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(self.qs.iter()) {
            *o = d * q as f32;
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        f16_to_f32(self.d) * self.qs[i & 31] as f32
    }
}

impl QuantBlock for BlockQ8_1 {
    const QK: usize = QK8_1;
    const BYTES: usize = 36;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(self.qs.iter()) {
            *o = d * q as f32;
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        f16_to_f32(self.d) * self.qs[i & 31] as f32
    }
}
