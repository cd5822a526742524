//! The 32-element formats: Q4_0, Q4_1 (weights), Q8_0 (weights and activations), Q8_1
//! (activations for Q4_1 weights).

use super::{QuantBlock, f16_to_f32};

pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
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

/// `value = q * d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; 32],
}

/// Activation format paired with Q4_1: `s = d * sum(qs)` lets the dot product fold Q4_1's
/// offset `m` in with one multiply per block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; 32],
}

const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(core::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(core::mem::size_of::<BlockQ8_1>() == 36);

impl Default for BlockQ8_0 {
    fn default() -> Self {
        Self { d: 0, qs: [0; 32] }
    }
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        Self {
            d: 0,
            s: 0,
            qs: [0; 32],
        }
    }
}

/// The 4-bit code of element `i` (0..32) in Q4_0/Q4_1's nibble order.
#[inline(always)]
fn nibble(qs: &[u8; 16], i: usize) -> u8 {
    (qs[i & 15] >> ((i & 16) >> 2)) & 0xF
}

impl QuantBlock for BlockQ4_0 {
    const QK: usize = QK4_0;
    const BYTES: usize = 18;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, o) in out.iter_mut().take(32).enumerate() {
            *o = (nibble(&self.qs, i) as i32 - 8) as f32 * d;
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        (nibble(&self.qs, i & 31) as i32 - 8) as f32 * f16_to_f32(self.d)
    }
}

impl QuantBlock for BlockQ4_1 {
    const QK: usize = QK4_1;
    const BYTES: usize = 20;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        for (i, o) in out.iter_mut().take(32).enumerate() {
            *o = d * nibble(&self.qs, i) as f32 + m;
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        f16_to_f32(self.d) * nibble(&self.qs, i & 31) as f32 + f16_to_f32(self.m)
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
