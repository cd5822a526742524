//! Row kernels: one block per row, reductions through warp shuffles and a few words of shared
//! memory. Launch: [`launch::per_row`](crate::kernels::launch::per_row).
use crate::device::*;
use crate::kernels::attention::kv_row;
use crate::kernels::elementwise::{rope_factor, rope_pair, rotate};
use crate::kernels::matvec::{q8_1_code, q8_1_scale, q8_1_stored};
use policies::TargetPolicy;

/// `out[r] = x[r] / rms(x[r]) * w` for each of the grid's rows (`cols` each). `w` (`cols`) is
/// shared by all rows, so per-head QK-norm is this kernel with rows = tokens × heads.
/// `out` may equal `x`.
pub unsafe fn rms_norm<P: TargetPolicy>(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    cols: u32,
    eps: f32,
) {
    let row = block_idx() as usize * cols as usize;
    let inv = unsafe { inv_rms(x.add(row), cols, eps) };
    let mut c = thread_idx();
    while c < cols {
        let i = row + c as usize;
        unsafe { *out.add(i) = *x.add(i) * inv * *w.add(c as usize) };
        c += block_dim();
    }
}

/// `1/rms(x[0..cols])` with `eps`, for the whole block (every thread gets it): the reduction the
/// strided RMSNorm kernels share, so they normalize a row to the same bits. Uses the block's
/// shared scratch (one f64 per warp); every thread must call.
#[inline(always)]
unsafe fn inv_rms(x: *const f32, cols: u32, eps: f32) -> f32 {
    let mut ss = 0.0;
    let mut c = thread_idx();
    while c < cols {
        let v = unsafe { *x.add(c as usize) } as f64;
        ss += v * v;
        c += block_dim();
    }
    inv_rms_of(unsafe { block_sum_f64(ss, shared_mem()) }, cols, eps)
}

/// `1/sqrt(ss/cols + eps)` from a sum of squares, in f64 and correctly rounded, then to f32: the
/// CPU backend's arithmetic. Squares of f32 values are exact in f64 and the sum's rounding
/// error is far below an f32 ulp, so the summation order (thread layout) does not show and both
/// backends get the same scale bit for bit (an `rsqrt.approx.f32` differed by an ulp or two,
/// enough to move 8-bit activation codes downstream).
#[inline(always)]
pub(crate) fn inv_rms_of(ss: f64, cols: u32, eps: f32) -> f32 {
    (1.0 / sqrt_f64(ss / cols as f64 + eps as f64)) as f32
}

/// Chunks of 4 consecutive floats a thread of [`rms_norm_q8`] holds in
/// registers: chunk `thread + k·block_dim` for `k < ROW_CHUNKS`. The row is loaded once with
/// 16-byte loads and never re-read, so a norm costs one memory round trip instead of a
/// latency-bound strided loop per pass (a single 256-thread block took ~20 µs for 4096 columns).
pub const ROW_CHUNKS: usize = 4;
/// Widest row the register-resident norms take: 1024 threads × [`ROW_CHUNKS`] × 4.
pub const MAX_ROW_COLS: u32 = 1024 * ROW_CHUNKS as u32 * 4;

type Chunks = [[f32; 4]; ROW_CHUNKS];

/// This thread's chunks of row `x` (`cols % 4 == 0`, 16-byte aligned); zeros past the row.
#[inline(always)]
unsafe fn load_chunks(x: *const f32, cols: u32) -> Chunks {
    unsafe { load_chunks_where(x, cols, |_| true) }
}

/// [`load_chunks`] of the chunks `k` with `wanted(k)` only (the others zero).
#[inline(always)]
unsafe fn load_chunks_where(x: *const f32, cols: u32, wanted: impl Fn(usize) -> bool) -> Chunks {
    let mut v = [[0f32; 4]; ROW_CHUNKS];
    unroll::<ROW_CHUNKS>(|k| {
        let j = thread_idx() + k as u32 * block_dim();
        if j < cols / 4 && wanted(k) {
            v[k] = unsafe { ld_nc_v4(x.add(4 * j as usize) as *const u32) }.map(f32::from_bits);
        }
    });
    v
}

/// [`rms_norm`] that also emits its output as Q8_1 activation blocks (`xq`, `xds`, exactly as
/// [`quantize_q8_1`](crate::kernels::matvec::quantize_q8_1) writes them for `out`): the
/// consumer of a norm is a quantized mat-vec, which then needs no quantize launch of its own.
/// Row `block_idx().x`; the grid's y blocks of a row each reduce the whole row (it is in L2,
/// re-reading it costs less than a block-wide wait) and emit one slice of it: chunk `k` of every
/// thread goes to block `y = k mod grid_dim().y`. A decode step's single row is then spread over
/// several small blocks instead of one large block's long reduction (measured: one 1024-thread
/// block took ~7 µs for a 4096-wide row on the H200).
/// `cols % 32 == 0`, `cols <= MAX_ROW_COLS`. Launch: [`launch::norm_q8`](crate::kernels::launch::norm_q8).
pub unsafe fn rms_norm_q8<P: TargetPolicy>(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    xq: *mut i8,
    xds: *mut f32,
    cols: u32,
    eps: f32,
) {
    let row = block_idx() as usize * cols as usize;
    let v = unsafe { load_chunks(x.add(row), cols) };
    unsafe {
        norm_q8_chunks(
            v,
            w,
            out.add(row),
            xq.add(row),
            xds.add(row / 16),
            cols,
            eps,
        )
    }
}

/// Normalizes one row held as [`Chunks`] and writes it as f32 and as Q8_1 blocks. A 32-element
/// block is the chunks of 8 neighbouring lanes (block_dim is a multiple of 32, so a group never
/// straddles warps), reduced with 3 butterfly rounds; the arithmetic is
/// [`quantize_block`](crate::kernels::matvec::quantize_block)'s shared `q8_1_*` steps.
#[inline(always)]
unsafe fn norm_q8_chunks(
    v: Chunks,
    w: *const f32,
    out: *mut f32,
    xq: *mut i8,
    xds: *mut f32,
    cols: u32,
    eps: f32,
) {
    // The weights load before the reduction's barriers, so their latency overlaps it.
    let mine = |k: usize| k as u32 % grid_dim_y() == block_idx_y();
    let w = unsafe { load_chunks_where(w, cols, mine) };
    let ss: f64 = v.iter().flatten().map(|&a| a as f64 * a as f64).sum();
    let inv = inv_rms_of(unsafe { block_sum_f64(ss, shared_mem()) }, cols, eps);
    unroll::<ROW_CHUNKS>(|k| {
        if !mine(k) {
            return; // block-uniform: this slice is another block's
        }
        let j = thread_idx() + k as u32 * block_dim();
        let y: [f32; 4] = core::array::from_fn(|e| v[k][e] * inv * w[k][e]);
        // Every lane joins the butterflies (a group past the row reduces zeros).
        let (d, id) = q8_1_scale(lane_group_max(
            y.iter().fold(0f32, |m, a| m.max(a.abs())),
            8,
        ));
        let codes = y.map(|a| q8_1_code(a, id));
        let sum = lane_group_sum(codes.iter().map(|&c| c as f32).sum(), 8);
        if j < cols / 4 {
            let at = 4 * j as usize;
            let packed = codes
                .iter()
                .enumerate()
                .fold(0u32, |p, (e, &c)| p | ((c as u8 as u32) << (8 * e)));
            unsafe {
                st_v4(out.add(at) as *mut u32, y.map(f32::to_bits));
                *(xq.add(at) as *mut u32) = packed;
                if j.is_multiple_of(8) {
                    (*xds.add(at / 16), *xds.add(at / 16 + 1)) = q8_1_stored(d, sum);
                }
            }
        }
    });
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
    factors: *const f32,
    neox: u32,
    eps: f32,
) {
    let row = block_idx() as usize * head_dim as usize;
    let p = unsafe { *pos } + block_idx() / heads;
    let rope = HeadRope {
        rot_dim,
        log2_base,
        factors,
        neox,
    };
    unsafe {
        norm_rope_head(
            Team::Block,
            x.add(row),
            head_dim,
            w,
            eps,
            p,
            Some(rope),
            |c, v| *out.add(row + c as usize) = v,
        )
    };
}

/// The attention inputs of a step made ready in one launch: per-head RMSNorm of queries and
/// keys (QK-norm, when `norm != 0`), RoPE of both at positions `*pos + t`, and keys and values
/// appended to the f16 caches (`kv_heads × max_ctx × head_dim`). Block `(r, t)`: `r < heads` a
/// query head (into `q_out`, f32), then `kv_heads` key heads (into `k_cache`), then `kv_heads`
/// value heads (into `v_cache`, copied). Each value is computed as [`rms_norm_rope`] (or
/// `rope`) then `kv_store` compute it; this replaces those three or four launches.
/// Launch: [`launch::rope_store`](crate::kernels::launch::rope_store).
#[allow(clippy::too_many_arguments)]
pub unsafe fn rope_store<P: TargetPolicy>(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    q_norm: *const f32,
    k_norm: *const f32,
    q_out: *mut f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    max_ctx: u32,
    pos: *const u32,
    log2_base: f32,
    factors: *const f32,
    neox: u32,
    norm: u32,
    eps: f32,
) {
    let (r, t) = (block_idx(), block_idx_y());
    let p = unsafe { *pos } + t;
    let rope = HeadRope {
        rot_dim,
        log2_base,
        factors,
        neox,
    };
    let hd = head_dim as usize;
    let w = |w: *const f32| if norm != 0 { w } else { core::ptr::null() };
    if r < heads {
        let row = (t * heads + r) as usize * hd;
        unsafe {
            norm_rope_head(
                Team::Block,
                q.add(row),
                head_dim,
                w(q_norm),
                eps,
                p,
                Some(rope),
                |c, x| *q_out.add(row + c as usize) = x,
            )
        };
        return;
    }
    let (h, is_v) = ((r - heads) % kv_heads, r >= heads + kv_heads);
    let src = unsafe { if is_v { v } else { k }.add((t * kv_heads + h) as usize * hd) };
    let dst = unsafe {
        let row = kv_row::<P>(h, p, kv_heads, max_ctx);
        if is_v { v_cache } else { k_cache }.add((row * head_dim) as usize)
    };
    let (w, rope) = if is_v {
        (core::ptr::null(), None)
    } else {
        (w(k_norm), Some(rope))
    };
    unsafe {
        norm_rope_head(Team::Block, src, head_dim, w, eps, p, rope, |c, x| {
            *dst.add(c as usize) = f32_to_f16(x)
        })
    };
}

/// RoPE parameters of one head: its first `rot_dim` dims rotate (pairing and angles as
/// [`rope`](crate::kernels::elementwise::rope)).
#[derive(Clone, Copy)]
pub(crate) struct HeadRope {
    pub rot_dim: u32,
    pub log2_base: f32,
    pub factors: *const f32,
    pub neox: u32,
}

/// Who computes one head row in [`norm_rope_head`]: the whole block (a block per head, as
/// `rope_store` launches it), or one warp (a head among a block's other work: the fused short
/// attention). Only the striding and the norm's reduction differ, so both give the same bits.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Team {
    Block,
    Warp,
}

impl Team {
    #[inline(always)]
    fn first(self) -> u32 {
        match self {
            Team::Block => thread_idx(),
            Team::Warp => lane(),
        }
    }
    #[inline(always)]
    fn stride(self) -> u32 {
        match self {
            Team::Block => block_dim(),
            Team::Warp => WARP,
        }
    }
    /// `1/rms(x[0..cols])` for every member (every member must call).
    #[inline(always)]
    unsafe fn inv_rms(self, x: *const f32, cols: u32, eps: f32) -> f32 {
        match self {
            Team::Block => unsafe { inv_rms(x, cols, eps) },
            Team::Warp => {
                let mut ss = 0.0;
                let mut c = lane();
                while c < cols {
                    let v = unsafe { *x.add(c as usize) } as f64;
                    ss += v * v;
                    c += WARP;
                }
                inv_rms_of(warp_sum_f64(ss), cols, eps)
            }
        }
    }
}

/// One head row `x` (`head_dim` long): RMSNorm scaled by `w` (none when `w` is null), then
/// RoPE at position `p` (none when `rope` is `None`), each result handed to `store(dim, value)`.
/// Every member of `team` must call (the norm's reduction).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn norm_rope_head(
    team: Team,
    x: *const f32,
    head_dim: u32,
    w: *const f32,
    eps: f32,
    p: u32,
    rope: Option<HeadRope>,
    store: impl Fn(u32, f32),
) {
    let inv = if w.is_null() {
        1.0
    } else {
        unsafe { team.inv_rms(x, head_dim, eps) }
    };
    let normed = |c: u32| {
        let v = unsafe { *x.add(c as usize) };
        if w.is_null() {
            v
        } else {
            v * inv * unsafe { *w.add(c as usize) }
        }
    };
    let rot_dim = rope.map_or(0, |r| r.rot_dim);
    if let Some(r) = rope {
        let mut i = team.first();
        while i < rot_dim / 2 {
            let (a, b) = rope_pair(i, rot_dim, r.neox);
            let factor = unsafe { rope_factor(r.factors, i) };
            let (ra, rb) = rotate(normed(a), normed(b), p, i, rot_dim, r.log2_base, factor);
            store(a, ra);
            store(b, rb);
            i += team.stride();
        }
    }
    let mut c = rot_dim + team.first();
    while c < head_dim {
        store(c, normed(c));
        c += team.stride();
    }
}

/// The largest of the `cols` values at `x[row..]`, shared by the whole block (softmax and
/// `row_nll` subtract it before `exp`).
#[inline(always)]
unsafe fn row_max(x: *const f32, row: usize, cols: u32, scratch: *mut f32) -> f32 {
    let mut m = f32::NEG_INFINITY;
    let mut c = thread_idx();
    while c < cols {
        m = m.max(unsafe { *x.add(row + c as usize) });
        c += block_dim();
    }
    unsafe { block_max(m, scratch) }
}

/// Numerically safe softmax of each row (`cols`), `out` may equal `x`.
pub unsafe fn softmax<P: TargetPolicy>(x: *const f32, out: *mut f32, cols: u32) {
    let scratch: *mut f32 = shared_mem();
    let row = block_idx() as usize * cols as usize;
    let m = unsafe { row_max(x, row, cols, scratch) };
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

/// `−log softmax(x)[target]` of each row as two float64 parts the host combines (the device
/// has no f64 `ln`): `out[2r] = Σ exp(x − max)`, each term in f32 and the sum in f64, and
/// `out[2r + 1] = max − x[target]`. Perplexity scores a window this way instead of reading
/// every 150k-logit row to the host. `targets[r] < cols` (the host checks).
/// Launch: [`launch::per_row`](crate::kernels::launch::per_row).
pub unsafe fn row_nll<P: TargetPolicy>(
    x: *const f32,
    targets: *const u32,
    out: *mut f64,
    cols: u32,
) {
    let scratch: *mut f32 = shared_mem();
    let row = block_idx() as usize * cols as usize;
    let m = unsafe { row_max(x, row, cols, scratch) };
    let mut s = 0.0f64;
    let mut c = thread_idx();
    while c < cols {
        s += exp(unsafe { *x.add(row + c as usize) } - m) as f64;
        c += block_dim();
    }
    let s = unsafe { block_sum_f64(s, scratch.cast()) };
    if thread_idx() == 0 {
        let target = unsafe { *targets.add(block_idx() as usize) } as usize;
        let at = 2 * block_idx() as usize;
        unsafe {
            *out.add(at) = s;
            *out.add(at + 1) = m as f64 - *x.add(row + target) as f64;
        }
    }
}

/// Row argmax, pass 1: block `b` of row `block_idx_y()` reduces the row's elements
/// `b·block_dim + thread + k·grid_dim·block_dim` to one (value bits, index) pair in
/// `part[row × grid_dim + b]`. A vocabulary row (150k logits) spread over a grid is read in a
/// few microseconds; one block walking it alone took ~240 µs. Scratch: two words per warp.
/// Launch: [`launch::argmax_blocks`](crate::kernels::launch::argmax_blocks).
pub unsafe fn argmax_blocks<P: TargetPolicy>(x: *const f32, part: *mut u32, cols: u32) {
    let row = block_idx_y() as usize * cols as usize;
    let mut best = (f32::NEG_INFINITY, u32::MAX);
    let mut c = block_idx() * block_dim() + thread_idx();
    while c < cols {
        let v = unsafe { *x.add(row + c as usize) };
        if v > best.0 {
            best = (v, c);
        }
        c += grid_dim() * block_dim();
    }
    let best = unsafe { block_argmax(best) };
    if thread_idx() == 0 {
        let at = 2 * (block_idx_y() * grid_dim() + block_idx()) as usize;
        unsafe {
            *part.add(at) = best.0.to_bits();
            *part.add(at + 1) = best.1;
        }
    }
}

/// Row argmax, pass 2: `out[row]` = the index of the best of the row's `parts` pairs from
/// [`argmax_blocks`]: the first index of the maximum, NaN never chosen, 0 when no element exceeds
/// −∞ (the CPU backend's rule). Greedy decoding then moves one u32 per token to the host.
/// Launch: [`launch::argmax_merge`](crate::kernels::launch::argmax_merge).
pub unsafe fn argmax_merge<P: TargetPolicy>(part: *const u32, out: *mut u32, parts: u32) {
    let row = block_idx_y();
    let mut best = (f32::NEG_INFINITY, u32::MAX);
    let mut b = thread_idx();
    while b < parts {
        let at = 2 * (row * parts + b) as usize;
        best = better(best, unsafe {
            (f32::from_bits(*part.add(at)), *part.add(at + 1))
        });
        b += block_dim();
    }
    let best = unsafe { block_argmax(best) };
    if thread_idx() == 0 {
        unsafe { *out.add(row as usize) = if best.1 == u32::MAX { 0 } else { best.1 } };
    }
}

/// The best (value, index) pair of the block, valid in thread 0; two words of scratch per warp.
#[inline(always)]
unsafe fn block_argmax(best: (f32, u32)) -> (f32, u32) {
    let scratch: *mut u32 = shared_mem();
    let mut best = warp_argmax(best);
    if lane() == 0 {
        unsafe {
            *scratch.add(2 * warp_id() as usize) = best.0.to_bits();
            *scratch.add(2 * warp_id() as usize + 1) = best.1;
        }
    }
    sync_threads();
    if thread_idx() == 0 {
        for w in 1..block_dim() / WARP {
            let other = unsafe {
                (
                    f32::from_bits(*scratch.add(2 * w as usize)),
                    *scratch.add(2 * w as usize + 1),
                )
            };
            best = better(best, other);
        }
    }
    best
}
