//! Q4_0 / Q4_1 / Q8_0 / Q8_1: row (de)quantizers and portable dot products.

use super::GgmlType;
use crate::numerics::Numerics;
use kernels_gpu::quant::{
    BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QuantBlock, f16_to_f32, f32_to_f16,
};

fn deq<B: QuantBlock>(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(B::BYTES).zip(dst.chunks_exact_mut(B::QK)) {
        if let Some(blk) = B::read(b) {
            blk.dequant(out);
        }
    }
}

/// Sizes already checked by the caller.
pub(super) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::Q4_0 => deq::<BlockQ4_0>(src, dst),
        GgmlType::Q4_1 => deq::<BlockQ4_1>(src, dst),
        GgmlType::Q8_0 => deq::<BlockQ8_0>(src, dst),
        _ => deq::<BlockQ8_1>(src, dst),
    }
}

/// Sizes already checked by the caller.
/// `numerics` picks the rounding of the 8-bit formats (Q8_0, Q8_1).
pub(super) fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8], numerics: Numerics) {
    let bs = ty.block().1;
    for (x, out) in src.chunks_exact(32).zip(dst.chunks_exact_mut(bs)) {
        let x: &[f32; 32] = x.try_into().unwrap_or(&[0.0; 32]);
        match ty {
            GgmlType::Q4_0 => quantize_q4_0(x, out),
            GgmlType::Q4_1 => quantize_q4_1(x, out),
            GgmlType::Q8_0 => quantize_q8_0(x, out, numerics),
            _ => quantize_q8_1(x, out, numerics),
        }
    }
}

/// Packs 32 4-bit codes in Q4_0/Q4_1 order (element j low nibble, j+16 high nibble of byte j).
fn pack_nibbles(q: &[u8; 32], out: &mut [u8]) {
    for (j, o) in out.iter_mut().take(16).enumerate() {
        *o = q[j] | (q[j + 16] << 4);
    }
}

/// llama.cpp's reference: scale from the signed value of largest magnitude so it maps to -8,
/// codes `min(15, trunc(x/d + 8.5))`.
fn quantize_q4_0(x: &[f32; 32], out: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (qi, &v) in q.iter_mut().zip(x) {
        // `as u8` saturates (NaN -> 0), the C code's `(int8_t)` cast is in range for finite input.
        *qi = ((v * id + 8.5) as u8).min(15);
    }
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    pack_nibbles(&q, &mut out[2..]);
}

/// llama.cpp's reference: `d = (max - min) / 15`, `m = min`, codes `min(15, trunc((x-min)/d + 0.5))`.
fn quantize_q4_1(x: &[f32; 32], out: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        min = min.min(v);
        max = max.max(v);
    }
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = (((v - min) * id + 0.5) as u8).min(15);
    }
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    out[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
    pack_nibbles(&q, &mut out[4..]);
}

/// Symmetric 8-bit: `d = amax / 127`, codes `x / d` rounded as `numerics` says, always within
/// ±127 — the AVX2 dot products rely on never seeing -128 in activations.
/// Returns (d, sum of codes).
fn q8_codes(x: &[f32; 32], q: &mut [u8], numerics: Numerics) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = numerics.q8_inv_scale(amax);
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        let c = numerics.q8_code(v * id);
        sum += c as i32;
        *o = c as u8;
    }
    (amax / 127.0, sum)
}

fn quantize_q8_0(x: &[f32; 32], out: &mut [u8], numerics: Numerics) {
    let (d, _) = q8_codes(x, &mut out[2..34], numerics);
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
}

fn quantize_q8_1(x: &[f32; 32], out: &mut [u8], numerics: Numerics) {
    let (d, sum) = q8_codes(x, &mut out[4..36], numerics);
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    out[2..4].copy_from_slice(&f32_to_f16(d * sum as f32).to_le_bytes());
}

#[inline(always)]
fn h(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Integer dot of 32 codes per block, one float multiply-add per block.
pub(super) fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f32;
    for (wb, ab) in w.chunks_exact(18).zip(a.chunks_exact(34)) {
        let mut isum = 0i32;
        for j in 0..16 {
            let q = wb[2 + j];
            isum += ((q & 0xF) as i32 - 8) * ab[2 + j] as i8 as i32;
            isum += ((q >> 4) as i32 - 8) * ab[18 + j] as i8 as i32;
        }
        s += (h(wb, 0) * h(ab, 0)) * isum as f32;
    }
    s
}

/// `sum(d_w d_a q_w q_a) + m * s_a`: Q8_1's `s` carries `d_a * sum(q_a)` for the offset term.
pub(super) fn dot_q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let (mut s, mut sm) = (0f32, 0f32);
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(36)) {
        let mut isum = 0i32;
        for j in 0..16 {
            let q = wb[4 + j];
            isum += (q & 0xF) as i32 * ab[4 + j] as i8 as i32;
            isum += (q >> 4) as i32 * ab[20 + j] as i8 as i32;
        }
        s += (h(wb, 0) * h(ab, 0)) * isum as f32;
        sm += h(wb, 2) * h(ab, 2);
    }
    s + sm
}

pub(super) fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f32;
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(34)) {
        let mut isum = 0i32;
        for j in 0..32 {
            isum += wb[2 + j] as i8 as i32 * ab[2 + j] as i8 as i32;
        }
        s += (h(wb, 0) * h(ab, 0)) * isum as f32;
    }
    s
}
