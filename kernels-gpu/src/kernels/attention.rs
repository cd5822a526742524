//! Attention of `n` query tokens over one sequence's f16 KV cache, causal, with grouped-query
//! heads. Decode is `n = 1`; prefill runs the same kernel with one block per (head, token).
use crate::device::*;
use policies::TargetPolicy;

/// Largest head dimension: each lane keeps `head_dim / 32` query values in registers.
pub const MAX_HEAD_DIM: u32 = 256;

/// `out[t, h] = softmax(scale · q[t, h] · Kᵀ) · V` over cache positions `0..=pos0 + t`.
/// `q`, `out`: `n × heads × head_dim` f32; `k`, `v`: `kv_heads × max_ctx × head_dim` f16.
/// `head_dim % 32 == 0`, `head_dim <= MAX_HEAD_DIM`, `heads % kv_heads == 0`.
/// Launch: [`launch::attention`](crate::kernels::launch::attention) with `max_len ≥ pos0 + n` (`pos0 = *pos`, read from device memory).
pub unsafe fn attention<P: TargetPolicy>(
    q: *const f32,
    k: *const u16,
    v: *const u16,
    out: *mut f32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    max_ctx: u32,
    pos: *const u32,
    scale: f32,
) {
    let pos0 = unsafe { *pos };
    let (h, t) = (block_idx(), block_idx_y());
    let len = pos0 + t + 1;
    let kvh = h / (heads / kv_heads);
    let warps = block_dim() / WARP;
    let scores: *mut f32 = shared_mem();
    let scratch = unsafe { scores.add((pos0 + grid_dim_y()) as usize) };
    let per_lane = (head_dim / WARP) as usize;
    let q_row = unsafe { q.add(((t * heads + h) * head_dim) as usize) };
    let mut qv = [0f32; (MAX_HEAD_DIM / WARP) as usize];
    for (j, qj) in qv.iter_mut().enumerate() {
        // Constant trip count keeps `qv` in registers; the guard skips the unused tail.
        if j < per_lane {
            *qj = unsafe { *q_row.add(lane() as usize + 32 * j) } * scale;
        }
    }
    let cache_base = (kvh * max_ctx) as usize;
    // Scores: a warp per key, lanes split the head dimension.
    let mut p = warp_id();
    while p < len {
        let k_row = unsafe { k.add((cache_base + p as usize) * head_dim as usize) };
        let mut s = 0.0;
        for (j, qj) in qv.iter().enumerate() {
            if j < per_lane {
                s += qj * f16_to_f32(unsafe { *k_row.add(lane() as usize + 32 * j) });
            }
        }
        let s = warp_sum(s);
        if lane() == 0 {
            unsafe { *scores.add(p as usize) = s };
        }
        p += warps;
    }
    sync_threads();
    let mut m = f32::NEG_INFINITY;
    let mut p = thread_idx();
    while p < len {
        m = m.max(unsafe { *scores.add(p as usize) });
        p += block_dim();
    }
    let m = unsafe { block_max(m, scratch) };
    let mut sum = 0.0;
    let mut p = thread_idx();
    while p < len {
        let e = exp(unsafe { *scores.add(p as usize) } - m);
        unsafe { *scores.add(p as usize) = e };
        sum += e;
        p += block_dim();
    }
    // block_sum's first barrier also publishes the exponentiated scores to every thread.
    let inv = 1.0 / unsafe { block_sum(sum, scratch) };
    let out_row = unsafe { out.add(((t * heads + h) * head_dim) as usize) };
    let mut d = thread_idx();
    while d < head_dim {
        let mut acc = 0.0;
        for p in 0..len as usize {
            acc += unsafe { *scores.add(p) } * f16_to_f32(unsafe { *v.add((cache_base + p) * head_dim as usize + d as usize) });
        }
        unsafe { *out_row.add(d as usize) = acc * inv };
        d += block_dim();
    }
}

