//! F32 / F16 / BF16 rows: conversion and scalar dot products against f32 activations.

use super::GgmlType;
use kernels_gpu::quant::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Sizes already checked by the caller.
pub(super) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        _ => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

pub(super) fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
            }
        }
        _ => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
            }
        }
    }
}

#[inline(always)]
fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Eight partial sums so the scalar loop is not one long dependency chain.
#[inline(always)]
fn dot_with(w: &[u8], a: &[u8], wsize: usize, conv: impl Fn(&[u8]) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let wc = w.chunks_exact(8 * wsize);
    let ac = a.chunks_exact(32);
    let (wr, ar) = (wc.remainder(), ac.remainder());
    for (wb, ab) in wc.zip(ac) {
        for k in 0..8 {
            acc[k] += conv(&wb[k * wsize..]) * f32_at(&ab[4 * k..]);
        }
    }
    let mut s = 0f32;
    for (wb, ab) in wr.chunks_exact(wsize).zip(ar.chunks_exact(4)) {
        s += conv(wb) * f32_at(ab);
    }
    acc.iter().sum::<f32>() + s
}

pub(super) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    dot_with(w, a, 4, f32_at)
}

pub(super) fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    dot_with(w, a, 2, |b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
}

pub(super) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    dot_with(w, a, 2, |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
}
