//! The 256-element "K" super-block formats: Q4_K, Q5_K, Q6_K (weights) and Q8_K (their
//! activation format).

use super::{QuantBlock, f16_to_f32};

pub const QK_K: usize = 256;

/// 8 sub-blocks of 32: `value = (d * sc[j]) * q - dmin * m[j]`, with 6-bit `sc`/`m` packed in
/// `scales` (see [`get_scale_min_k4`]). `qs[32*g + l]` holds element `64g + l` in its low nibble
/// and element `64g + 32 + l` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// Q4_K plus a fifth bit per element: bit `j` of `qh[l]` is the high bit of element `32j + l`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

/// 16 sub-blocks of 16: `value = (d * scales[k]) * (q - 32)` with 6-bit `q` = 4 low bits from
/// `ql` and 2 high bits from `qh`. Per 128-element half `n`, element `e` (0..128) uses
/// `ql[64n + e%32 + 32*((e/32)&1)]` nibble `(e/64)`, `qh[32n + e%32]` bits `2*(e/32)..`, and
/// `scales[8n + e/16]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: u16,
}

/// Activation format for the K-quants: f32 scale, `bsums[k]` = sum of `qs[16k..16k+16]` so
/// the dot product can apply per-sub-block offsets (mins, Q6_K's -32) without touching `qs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}

const _: () = assert!(core::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(core::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(core::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(core::mem::size_of::<BlockQ8K>() == 292);

impl Default for BlockQ8K {
    fn default() -> Self {
        Self {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        }
    }
}

/// (scale, min) of sub-block `j` (0..8) from Q4_K/Q5_K's 12 packed bytes: sub-blocks 0..4 keep
/// their 6 bits in the low bits of bytes `j` / `j+4`; 4..8 split into a nibble of byte `j+4`
/// and the top two bits of bytes `j-4` / `j`.
#[inline(always)]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    let j = j & 7;
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl QuantBlock for BlockQ4K {
    const QK: usize = QK_K;
    const BYTES: usize = 144;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        for (j, chunk) in out.chunks_mut(32).take(8).enumerate() {
            let (sc, m) = get_scale_min_k4(j, &self.scales);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            let shift = 4 * (j & 1);
            let qs = &self.qs[32 * (j >> 1)..];
            for (o, &q) in chunk.iter_mut().zip(qs.iter()) {
                *o = d1 * ((q >> shift) & 0xF) as f32 - m1;
            }
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        let i = i & 255;
        let j = i >> 5;
        let (sc, m) = get_scale_min_k4(j, &self.scales);
        let q = (self.qs[32 * (j >> 1) + (i & 31)] >> (4 * (j & 1))) & 0xF;
        f16_to_f32(self.d) * sc as f32 * q as f32 - f16_to_f32(self.dmin) * m as f32
    }
}

impl QuantBlock for BlockQ5K {
    const QK: usize = QK_K;
    const BYTES: usize = 176;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        for (j, chunk) in out.chunks_mut(32).take(8).enumerate() {
            let (sc, m) = get_scale_min_k4(j, &self.scales);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            let shift = 4 * (j & 1);
            let qs = &self.qs[32 * (j >> 1)..];
            for ((o, &q), &h) in chunk.iter_mut().zip(qs.iter()).zip(self.qh.iter()) {
                let v = ((q >> shift) & 0xF) | (((h >> j) & 1) << 4);
                *o = d1 * v as f32 - m1;
            }
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        let i = i & 255;
        let j = i >> 5;
        let l = i & 31;
        let (sc, m) = get_scale_min_k4(j, &self.scales);
        let q =
            ((self.qs[32 * (j >> 1) + l] >> (4 * (j & 1))) & 0xF) | (((self.qh[l] >> j) & 1) << 4);
        f16_to_f32(self.d) * sc as f32 * q as f32 - f16_to_f32(self.dmin) * m as f32
    }
}

impl BlockQ6K {
    /// The unsigned 6-bit code (0..64) of element `i` (0..256).
    #[inline(always)]
    pub fn code(&self, i: usize) -> u8 {
        let i = i & 255;
        let n = i >> 7;
        let e = i & 127;
        let l = e & 31;
        let t = e >> 5;
        let lo = (self.ql[64 * n + l + 32 * (t & 1)] >> (4 * (t >> 1))) & 0xF;
        let hi = (self.qh[32 * n + l] >> (2 * t)) & 3;
        lo | (hi << 4)
    }
}

impl QuantBlock for BlockQ6K {
    const QK: usize = QK_K;
    const BYTES: usize = 210;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (k, chunk) in out.chunks_mut(16).take(16).enumerate() {
            let dk = d * self.scales[k] as f32;
            for (t, o) in chunk.iter_mut().enumerate() {
                *o = dk * (self.code(16 * k + t) as i32 - 32) as f32;
            }
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        let i = i & 255;
        f16_to_f32(self.d) * self.scales[i >> 4] as f32 * (self.code(i) as i32 - 32) as f32
    }
}

impl QuantBlock for BlockQ8K {
    const QK: usize = QK_K;
    const BYTES: usize = 292;

    #[inline]
    fn dequant(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(self.qs.iter()) {
            *o = self.d * q as f32;
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        self.d * self.qs[i & 255] as f32
    }
}
