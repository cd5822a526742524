//! Row kernels: one block per row, reductions through warp shuffles and a few words of shared
//! memory. Launch: [`launch::per_row`](crate::kernels::launch::per_row).
use crate::device::*;
use crate::kernels::formats::QK;
use crate::kernels::elementwise::{rope_pair, rotate};
use crate::kernels::matvec::quantize_block;
use policies::TargetPolicy;

/// `out[r] = x[r] / rms(x[r]) * w` for each of the grid's rows (`cols` each). `w` (`cols`) is
/// shared by all rows, so per-head QK-norm is this kernel with rows = tokens × heads.
/// `out` may equal `x`.
pub unsafe fn rms_norm<P: TargetPolicy>(x: *const f32, w: *const f32, out: *mut f32, cols: u32, eps: f32) {
    let row = block_idx() as usize * cols as usize;
    let inv = unsafe { inv_rms(x.add(row), cols, eps) };
    let mut c = thread_idx();
    while c < cols {
        let i = row + c as usize;
        unsafe { *out.add(i) = *x.add(i) * inv * *w.add(c as usize) };
        c += block_dim();
    }
}

/// `1/rms(x[0..cols])` with `eps`, for the whole block (every thread gets it): the reduction every
/// RMSNorm kernel shares, so they normalize a row to the same bits. Uses the block's shared
/// scratch (one f32 per warp); every thread must call.
#[inline(always)]
unsafe fn inv_rms(x: *const f32, cols: u32, eps: f32) -> f32 {
    let mut ss = 0.0;
    let mut c = thread_idx();
    while c < cols {
        let v = unsafe { *x.add(c as usize) };
        ss += v * v;
        c += block_dim();
    }
    rsqrt(unsafe { block_sum(ss, shared_mem()) } / cols as f32 + eps)
}

/// `x += y`, then [`rms_norm_q8`] of the new `x`: a residual add and the following norm in one
/// launch (each value is computed exactly as [`add_assign`](crate::kernels::elementwise::add_assign)
/// then [`rms_norm_q8`] compute it). `cols % 32 == 0`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_rms_norm_q8<P: TargetPolicy>(x: *mut f32, y: *const f32, w: *const f32, out: *mut f32, xq: *mut i8, xds: *mut f32, cols: u32, eps: f32) {
    let row = block_idx() as usize * cols as usize;
    let mut c = thread_idx();
    while c < cols {
        let i = row + c as usize;
        unsafe { *x.add(i) += *y.add(i) };
        c += block_dim();
    }
    // rms_norm_q8 starts with a block reduction whose barrier publishes the sums to all threads.
    unsafe { rms_norm_q8::<P>(x, w, out, xq, xds, cols, eps) }
}

/// [`rms_norm`] that also emits its output as Q8_1 activation blocks (`xq`, `xds`, as
/// [`quantize_q8_1`](crate::kernels::matvec::quantize_q8_1) writes them, bit for bit): the consumer of a norm is a quantized mat-vec,
/// which then needs no quantize launch of its own. `cols % 32 == 0`.
pub unsafe fn rms_norm_q8<P: TargetPolicy>(x: *const f32, w: *const f32, out: *mut f32, xq: *mut i8, xds: *mut f32, cols: u32, eps: f32) {
    let row = block_idx() as usize * cols as usize;
    let inv = unsafe { inv_rms(x.add(row), cols, eps) };
    // A warp per 32-element block: the loop bound is warp-uniform, so every lane reaches the
    // shuffles inside `quantize_block`.
    let nb = cols / QK as u32;
    let mut b = warp_id();
    while b < nb {
        let c = (b * QK as u32 + lane()) as usize;
        let v = unsafe { *x.add(row + c) } * inv * unsafe { *w.add(c) };
        unsafe {
            *out.add(row + c) = v;
            quantize_block(v, xq.add(row + c), xds.add(2 * (block_idx() * nb + b) as usize));
        }
        b += block_dim() / WARP;
    }
}

/// Per-head RMSNorm then RoPE (Qwen3's QK-norm): block `r` normalizes head row `r` of `x`
/// (`n × heads × head_dim`, scaled by `w`, `head_dim` long) into `out` and rotates it for
/// position `*pos + r / heads`. The same arithmetic as [`rms_norm`] then
/// [`rope`](crate::kernels::elementwise::rope), in one launch instead of two.
#[allow(clippy::too_many_arguments)]
pub unsafe fn rms_norm_rope<P: TargetPolicy>(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    heads: u32,
    head_dim: u32,
    rot_dim: u32,
    pos: *const u32,
    log2_base: f32,
    neox: u32,
    eps: f32,
) {
    let row = block_idx() as usize * head_dim as usize;
    let inv = unsafe { inv_rms(x.add(row), head_dim, eps) };
    let normed = |c: u32| unsafe { *x.add(row + c as usize) } * inv * unsafe { *w.add(c as usize) };
    let p = unsafe { *pos } + block_idx() / heads;
    let mut i = thread_idx();
    while i < rot_dim / 2 {
        let (a, b) = rope_pair(i, rot_dim, neox);
        let (ra, rb) = rotate(normed(a), normed(b), p, i, rot_dim, log2_base);
        unsafe {
            *out.add(row + a as usize) = ra;
            *out.add(row + b as usize) = rb;
        }
        i += block_dim();
    }
    let mut c = rot_dim + thread_idx();
    while c < head_dim {
        unsafe { *out.add(row + c as usize) = normed(c) };
        c += block_dim();
    }
}

/// Numerically safe softmax of each row (`cols`), `out` may equal `x`.
pub unsafe fn softmax<P: TargetPolicy>(x: *const f32, out: *mut f32, cols: u32) {
    let scratch: *mut f32 = shared_mem();
    let row = block_idx() as usize * cols as usize;
    let mut m = f32::NEG_INFINITY;
    let mut c = thread_idx();
    while c < cols {
        m = m.max(unsafe { *x.add(row + c as usize) });
        c += block_dim();
    }
    let m = unsafe { block_max(m, scratch) };
    let mut s = 0.0;
    let mut c = thread_idx();
    while c < cols {
        let i = row + c as usize;
        let e = exp(unsafe { *x.add(i) } - m);
        unsafe { *out.add(i) = e };
        s += e;
        c += block_dim();
    }
    let inv = 1.0 / unsafe { block_sum(s, scratch) };
    let mut c = thread_idx();
    while c < cols {
        unsafe { *out.add(row + c as usize) *= inv };
        c += block_dim();
    }
}

/// Index of the largest element of each row (`cols`) into `out[row]`: the first one on ties,
/// NaN never chosen, 0 when no element exceeds −∞ (the CPU backend's rule). Greedy decoding
/// then moves one u32 per token to the host instead of the logits row. Scratch: two words per warp.
pub unsafe fn argmax<P: TargetPolicy>(x: *const f32, out: *mut u32, cols: u32) {
    let scratch: *mut u32 = shared_mem();
    let row = block_idx() as usize * cols as usize;
    let mut best = (f32::NEG_INFINITY, u32::MAX);
    let mut c = thread_idx();
    while c < cols {
        let v = unsafe { *x.add(row + c as usize) };
        if v > best.0 {
            best = (v, c);
        }
        c += block_dim();
    }
    best = warp_argmax(best);
    if lane() == 0 {
        unsafe {
            *scratch.add(2 * warp_id() as usize) = best.0.to_bits();
            *scratch.add(2 * warp_id() as usize + 1) = best.1;
        }
    }
    sync_threads();
    if thread_idx() == 0 {
        for w in 1..block_dim() / WARP {
            let other = unsafe { (f32::from_bits(*scratch.add(2 * w as usize)), *scratch.add(2 * w as usize + 1)) };
            best = better(best, other);
        }
        unsafe { *out.add(block_idx() as usize) = if best.1 == u32::MAX { 0 } else { best.1 } };
    }
}

/// The larger of two (value, index) candidates; the lower index on equal values.
#[inline(always)]
fn better(a: (f32, u32), b: (f32, u32)) -> (f32, u32) {
    if b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) { b } else { a }
}

#[inline(always)]
fn warp_argmax(mut best: (f32, u32)) -> (f32, u32) {
    let mut m = WARP / 2;
    while m > 0 {
        let other = (shfl_xor(best.0, m), shfl_xor_u32(best.1, m));
        best = better(best, other);
        m /= 2;
    }
    best
}
