//! Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q8_1: row (de)quantizers and portable dot products.

use super::GgmlType;
use crate::numerics::Numerics;
use kernels_gpu::quant::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QuantBlock, code5,
    f16_to_f32, f32_to_f16,
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
        GgmlType::Q5_0 => deq::<BlockQ5_0>(src, dst),
        GgmlType::Q5_1 => deq::<BlockQ5_1>(src, dst),
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
            GgmlType::Q4_0 => quantize_offset(x, out, 4),
            GgmlType::Q4_1 => quantize_min(x, out, 4),
            GgmlType::Q5_0 => quantize_offset(x, out, 5),
            GgmlType::Q5_1 => quantize_min(x, out, 5),
            GgmlType::Q8_0 => quantize_q8_0(x, out, numerics),
            _ => quantize_q8_1(x, out, numerics),
        }
    }
}

/// Packs the low four bits of 32 codes in Q4_0/Q4_1 order (element j low nibble, j+16 high
/// nibble of byte j); masked, so 5-bit codes leave their fifth bit to [`pack_high`].
fn pack_nibbles(q: &[u8; 32], out: &mut [u8]) {
    for (j, o) in out.iter_mut().take(16).enumerate() {
        *o = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
    }
}

/// The fifth bits of 32 codes as Q5_0/Q5_1's `qh`: element j's at bit j, little-endian.
fn pack_high(q: &[u8; 32], out: &mut [u8]) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &c)| h | (u32::from(c >> 4) & 1) << j);
    out[..4].copy_from_slice(&qh.to_le_bytes());
}

/// llama.cpp's reference for the symmetric `bits`-bit formats (Q4_0, Q5_0), half = 2^(bits-1):
/// the signed value of largest magnitude maps to code 0, i.e. `d = max / -half`, codes
/// `min(2·half - 1, trunc(x/d + half + 0.5))`. Returns d.
fn symmetric_codes(x: &[f32; 32], half: f32, q: &mut [u8; 32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let top = (2.0 * half - 1.0) as u8;
    for (qi, &v) in q.iter_mut().zip(x) {
        // `as u8` saturates (NaN -> 0), the C code's `(int8_t)` cast is in range for finite input.
        *qi = ((v * id + (half + 0.5)) as u8).min(top);
    }
    d
}

/// llama.cpp's reference for the formats with a minimum (Q4_1, Q5_1), `levels` = 2^bits - 1:
/// `d = (max - min) / levels`, `m = min`, codes `trunc((x-min)/d + 0.5)`, at most `clamp`.
/// Returns (d, m).
fn min_codes(x: &[f32; 32], levels: f32, clamp: u8, q: &mut [u8; 32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        min = min.min(v);
        max = max.max(v);
    }
    let d = (max - min) / levels;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = (((v - min) * id + 0.5) as u8).min(clamp);
    }
    (d, min)
}

/// The codes as Q4_0/Q4_1 (`bits` = 4: nibbles) or Q5_0/Q5_1 (5: `qh`, then nibbles) store
/// them after the scales.
fn pack_codes(q: &[u8; 32], bits: u32, out: &mut [u8]) {
    let at = if bits == 5 {
        pack_high(q, &mut out[..4]);
        4
    } else {
        0
    };
    pack_nibbles(q, &mut out[at..]);
}

/// Q4_0 / Q5_0 (`bits`): `[d, codes]`.
fn quantize_offset(x: &[f32; 32], out: &mut [u8], bits: u32) {
    let mut q = [0u8; 32];
    let d = symmetric_codes(x, (1u32 << (bits - 1)) as f32, &mut q);
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    pack_codes(&q, bits, &mut out[2..]);
}

/// Q4_1 / Q5_1 (`bits`): `[d, m, codes]`.
fn quantize_min(x: &[f32; 32], out: &mut [u8], bits: u32) {
    let mut q = [0u8; 32];
    // Q5_1's reference does not clamp its codes; only a degenerate (subnormal) scale could take
    // one past 31, and then the packing keeps its low five bits as the C code's does.
    let clamp = if bits == 4 { 15 } else { u8::MAX };
    let (d, m) = min_codes(x, ((1u32 << bits) - 1) as f32, clamp, &mut q);
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    out[2..4].copy_from_slice(&f32_to_f16(m).to_le_bytes());
    pack_codes(&q, bits, &mut out[4..]);
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

/// Σ (code - offset) · a over one Q5_0/Q5_1 block's 32 codes (`qh`, `qs` as stored) and the
/// activation block's 32 i8 codes.
fn q5_int_dot(qh: &[u8], qs: &[u8], a: &[u8], offset: i32) -> i32 {
    let (qh, qs): (&[u8; 4], &[u8; 16]) = match (qh.try_into(), qs.try_into()) {
        (Ok(h), Ok(s)) => (h, s),
        _ => return 0,
    };
    (0..32)
        .map(|i| (code5(qh, qs, i) as i32 - offset) * a[i] as i8 as i32)
        .sum()
}

/// As [`dot_q4_0_q8_0`], codes offset by 16.
pub(super) fn dot_q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f32;
    for (wb, ab) in w.chunks_exact(22).zip(a.chunks_exact(34)) {
        let isum = q5_int_dot(&wb[2..6], &wb[6..22], &ab[2..34], 16);
        s += (h(wb, 0) * h(ab, 0)) * isum as f32;
    }
    s
}

/// As [`dot_q4_1_q8_1`]: the minimum through Q8_1's `s`.
pub(super) fn dot_q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let (mut s, mut sm) = (0f32, 0f32);
    for (wb, ab) in w.chunks_exact(24).zip(a.chunks_exact(36)) {
        let isum = q5_int_dot(&wb[4..8], &wb[8..24], &ab[4..36], 0);
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
