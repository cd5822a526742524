//! Q4_K / Q5_K / Q6_K weights and Q8_K activations: dequantizers, the Q8_K quantizer and
//! portable dot products.

use super::GgmlType;
use kernels_gpu::quant::{
    BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QuantBlock, f16_to_f32, get_scale_min_k4,
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
        GgmlType::Q4_K => deq::<BlockQ4K>(src, dst),
        GgmlType::Q5_K => deq::<BlockQ5K>(src, dst),
        GgmlType::Q6_K => deq::<BlockQ6K>(src, dst),
        _ => deq::<BlockQ8K>(src, dst),
    }
}

/// Symmetric 8-bit per 256 values, `d = amax / 127` (f32, not rounded to f16), codes within
/// ±127, plus the 16 sums of 16 codes the K-quant dot products use for their offsets.
/// Sizes already checked by the caller.
pub(super) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..4].copy_from_slice(&d.to_le_bytes());
        let (qs, bsums) = out[4..].split_at_mut(256);
        for (k, (xs, qs)) in x.chunks_exact(16).zip(qs.chunks_exact_mut(16)).enumerate() {
            let mut sum = 0i16;
            for (o, &v) in qs.iter_mut().zip(xs) {
                let c = (v * id).round().clamp(-127.0, 127.0) as i8;
                sum += c as i16;
                *o = c as u8;
            }
            bsums[2 * k..2 * k + 2].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

#[inline(always)]
fn h(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Q8_K block fields: (d, codes, bsums).
#[inline(always)]
fn q8k(ab: &[u8]) -> (f32, &[u8], impl Fn(usize) -> i32 + '_) {
    let d = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
    let bs = &ab[260..292];
    (d, &ab[4..260], move |k: usize| {
        i16::from_le_bytes([bs[2 * k], bs[2 * k + 1]]) as i32
    })
}

/// `d_a * (d * sum_j sc_j * dot_j - dmin * sum_j m_j * sum(a_j))`: the mins only need the
/// activation sums, which Q8_K precomputes.
pub(super) fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f32;
    for (wb, ab) in w.chunks_exact(144).zip(a.chunks_exact(292)) {
        let (da, aq, bsum) = q8k(ab);
        let scales: &[u8; 12] = wb[4..16].try_into().unwrap_or(&[0; 12]);
        let qs = &wb[16..144];
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = get_scale_min_k4(j, scales);
            let shift = 4 * (j & 1);
            let mut dj = 0i32;
            for l in 0..32 {
                let q = (qs[32 * (j >> 1) + l] >> shift) & 0xF;
                dj += q as i32 * aq[32 * j + l] as i8 as i32;
            }
            isum += sc as i32 * dj;
            msum += m as i32 * (bsum(2 * j) + bsum(2 * j + 1));
        }
        s += da * (h(wb, 0) * isum as f32 - h(wb, 2) * msum as f32);
    }
    s
}

pub(super) fn dot_q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f32;
    for (wb, ab) in w.chunks_exact(176).zip(a.chunks_exact(292)) {
        let (da, aq, bsum) = q8k(ab);
        let scales: &[u8; 12] = wb[4..16].try_into().unwrap_or(&[0; 12]);
        let qh = &wb[16..48];
        let qs = &wb[48..176];
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = get_scale_min_k4(j, scales);
            let shift = 4 * (j & 1);
            let mut dj = 0i32;
            for l in 0..32 {
                let q = ((qs[32 * (j >> 1) + l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
                dj += q as i32 * aq[32 * j + l] as i8 as i32;
            }
            isum += sc as i32 * dj;
            msum += m as i32 * (bsum(2 * j) + bsum(2 * j + 1));
        }
        s += da * (h(wb, 0) * isum as f32 - h(wb, 2) * msum as f32);
    }
    s
}

/// Codes are unsigned 0..64 with the -32 folded in through the activation sums:
/// `sum sc_k (dot(q_k, a_k) - 32 * sum(a_k))`.
pub(super) fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut s = 0f32;
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let (da, aq, bsum) = q8k(ab);
        let Some(blk) = BlockQ6K::read(wb) else { break };
        let mut isum = 0i32;
        for k in 0..16 {
            let mut dk = 0i32;
            for t in 0..16 {
                let e = 16 * k + t;
                dk += blk.code(e) as i32 * aq[e] as i8 as i32;
            }
            isum += blk.scales[k] as i32 * (dk - 32 * bsum(k));
        }
        s += da * f16_to_f32(blk.d) * isum as f32;
    }
    s
}
