//! One-thread-per-element kernels. Launch: [`launch::flat`](crate::kernels::launch::flat) with the
//! thread count each doc names; threads past it return at once.
use crate::device::*;
use crate::kernels::attention::kv_row;
use crate::kernels::formats::{QK, SplitFormat, load_side};
use policies::TargetPolicy;

#[inline(always)]
fn global_id() -> u32 {
    block_idx() * block_dim() + thread_idx()
}

/// RoPE in place on `x` (`n × heads × head_dim`); token t is at position `*pos + t` (the step's
/// first position is read from device memory so a recorded decode step replays at any position).
/// Rotates the first `rot_dim` dims of each head: pairs (2i, 2i+1) (`neox == 0`, llama) or
/// (i, i + rot_dim/2) (`neox != 0`, Qwen/NeoX), by angle pos·base^(−2i/rot_dim) / factors[i]
/// (`factors` null: 1; Llama 3.1's long-context `rope_freqs`). Threads: `n × heads × rot_dim/2`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn rope<P: TargetPolicy>(
    x: *mut f32,
    heads: u32,
    head_dim: u32,
    rot_dim: u32,
    pos: *const u32,
    log2_base: f32,
    factors: *const f32,
    neox: u32,
    threads: u32,
) {
    let id = global_id();
    if id >= threads {
        return;
    }
    let half = rot_dim / 2;
    let (i, head_row) = (id % half, id / half); // head_row = t * heads + h
    let pos = unsafe { *pos } + head_row / heads;
    let base = (head_row * head_dim) as usize;
    let (a, b) = rope_pair(i, rot_dim, neox);
    unsafe {
        let pa = x.add(base + a as usize);
        let pb = x.add(base + b as usize);
        let factor = rope_factor(factors, i);
        (*pa, *pb) = rotate(*pa, *pb, pos, i, rot_dim, log2_base, factor);
    }
}

/// The two dims of a head that rotation pair `i` couples: (i, i + rot_dim/2) for NeoX/Qwen,
/// (2i, 2i+1) for llama.
#[inline(always)]
pub fn rope_pair(i: u32, rot_dim: u32, neox: u32) -> (u32, u32) {
    if neox != 0 {
        (i, i + rot_dim / 2)
    } else {
        (2 * i, 2 * i + 1)
    }
}

/// Pair `i`'s frequency divisor: `factors[i]`, or 1 when `factors` is null.
#[inline(always)]
pub unsafe fn rope_factor(factors: *const f32, i: u32) -> f32 {
    if factors.is_null() {
        1.0
    } else {
        unsafe { *factors.add(i as usize) }
    }
}

/// `(a, b)` rotated by pos·base^(−2i/rot_dim) / factor. Every RoPE kernel goes through here, so
/// the fused norm+RoPE and the plain RoPE produce the same bits.
#[inline(always)]
pub fn rotate(
    a: f32,
    b: f32,
    pos: u32,
    i: u32,
    rot_dim: u32,
    log2_base: f32,
    factor: f32,
) -> (f32, f32) {
    let freq = exp2(-((2 * i) as f32) / rot_dim as f32 * log2_base) / factor;
    let (s, c) = sin_cos(pos as f32 * freq);
    (a * c - b * s, a * s + b * c)
}

/// `h` = `x` rounded to f16 (nearest even), two per word: the GEMM's activations. Threads:
/// `pairs` (half the element count).
pub unsafe fn to_f16<P: TargetPolicy>(x: *const f32, h: *mut u32, pairs: u32) {
    let id = global_id();
    if id < pairs {
        let (a, b) = unsafe { (*x.add(2 * id as usize), *x.add(2 * id as usize + 1)) };
        unsafe { *h.add(id as usize) = f32_to_f16(a) as u32 | (f32_to_f16(b) as u32) << 16 };
    }
}

/// `out[i] = silu(gate[i]) · up[i]`. Threads: `len`.
pub unsafe fn swiglu<P: TargetPolicy>(gate: *const f32, up: *const f32, out: *mut f32, len: u32) {
    let i = global_id();
    if i < len {
        let i = i as usize;
        let g = unsafe { *gate.add(i) };
        unsafe { *out.add(i) = silu(g) * *up.add(i) };
    }
}

/// `acc[i] += x[i]` (residual connections). Threads: `len`.
pub unsafe fn add_assign<P: TargetPolicy>(acc: *mut f32, x: *const f32, len: u32) {
    let i = global_id();
    if i < len {
        unsafe { *acc.add(i as usize) += *x.add(i as usize) };
    }
}

/// `acc[i] += row[i % cols]`: one row added to every row of `acc` (a control vector steering
/// the residual stream). Threads: `len`.
pub unsafe fn add_row<P: TargetPolicy>(acc: *mut f32, row: *const f32, cols: u32, len: u32) {
    let i = global_id();
    if i < len {
        unsafe { *acc.add(i as usize) += *row.add((i % cols) as usize) };
    }
}

/// `out[t] = row ids[t]` of an embedding table in split layout `F` (`vocab × cols`).
/// Ids are validated by the host before launch. Threads: `n × cols`.
pub unsafe fn embed_split<P: TargetPolicy, F: SplitFormat>(
    qs: *const u8,
    scales: *const u8,
    ids: *const u32,
    out: *mut f32,
    cols: u32,
    threads: u32,
) {
    let id = global_id();
    if id >= threads {
        return;
    }
    let (t, c) = ((id / cols) as usize, (id % cols) as usize);
    let nb = cols as usize / QK;
    let blk = unsafe { *ids.add(t) } as usize * nb + c / QK;
    let v = unsafe {
        F::element(
            qs.add(blk * F::QS_WORDS * 4),
            load_side::<F>(scales, blk),
            c % QK,
        )
    };
    unsafe { *out.add(id as usize) = v };
}

/// Embedding lookup from an f16 table. Threads: `n × cols`.
pub unsafe fn embed_f16<P: TargetPolicy>(
    table: *const u16,
    ids: *const u32,
    out: *mut f32,
    cols: u32,
    threads: u32,
) {
    let id = global_id();
    if id >= threads {
        return;
    }
    let (t, c) = ((id / cols) as usize, (id % cols) as usize);
    let row = unsafe { *ids.add(t) } as usize;
    unsafe { *out.add(id as usize) = f16_to_f32(*table.add(row * cols as usize + c)) };
}

/// Append `n` tokens of K and V (each `n × kv_heads × head_dim` f32) to the f16 caches laid out
/// `kv_heads × max_ctx × head_dim`, at positions `*pos..*pos+n`: one launch for both. Threads:
/// `n × kv_heads × head_dim`. The position is read on the device so a recorded launch serves
/// every decode step.
#[allow(clippy::too_many_arguments)]
pub unsafe fn kv_store<P: TargetPolicy>(
    k: *const f32,
    v: *const f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    kv_heads: u32,
    head_dim: u32,
    max_ctx: u32,
    pos: *const u32,
    threads: u32,
) {
    let id = global_id();
    if id >= threads {
        return;
    }
    let d = id % head_dim;
    let h = (id / head_dim) % kv_heads;
    let t = id / (head_dim * kv_heads);
    let p = unsafe { *pos } + t;
    let dst = (kv_row::<P>(h, p, kv_heads, max_ctx) * head_dim + d) as usize;
    unsafe {
        *k_cache.add(dst) = f32_to_f16(*k.add(id as usize));
        *v_cache.add(dst) = f32_to_f16(*v.add(id as usize));
    }
}
