//! Mixture-of-experts: the router's f32 mat-vec, top-k routing, and the experts' SwiGLU
//! feed-forward as two mat-vecs that find their expert's rows through the route.
//!
//! The route stays in device memory (`n × 2k` f32: k expert indices, then k weights), so the
//! whole layer is fixed launches over fixed buffers and a recorded decode step replays it. An
//! expert `e` of a stacked `[n_expert·rows, cols]` matrix is rows `e·rows ..`: the mat-vecs
//! only offset the row they read, the split layout is the dense one.
use crate::device::*;
use crate::kernels::formats::{QK, SplitFormat, load_side};
use crate::kernels::matvec::{
    WeightRow, lane_dot_f32x, load_block_quants, load_q8_block, q8_row, swiglu_rows,
    warp_dots_in_flight, warp_row_sums,
};
use crate::kernels::mma::MOE_TILE_WORDS;
use crate::kernels::residual_norm::NormScale;
use policies::TargetPolicy;

/// Most experts [`moe_route`] ranks (each lane holds `MOE_MAX_EXPERTS / 32` logits).
pub const MOE_MAX_EXPERTS: u32 = 256;

/// `y` (`n × rows`) = `x` (`n × cols`) · Wᵀ with W f32 (the router: one row per expert).
/// One row per warp, blocks striding over groups of `MATVEC_WARPS` rows; `cols % 4 == 0`.
/// A lane keeps `IN_FLIGHT` 16-byte loads of its row in flight: one at a time, a 2048-wide
/// router row was 16 round trips in a row (8 µs for the 1 MB router of a 30B-A3B layer).
/// Launch: [`launch::matvec_groups`](crate::kernels::launch::matvec_groups) over
/// ⌈rows / MATVEC_WARPS⌉.
pub unsafe fn matvec_f32<P: TargetPolicy>(
    w: *const f32,
    x: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
) {
    const IN_FLIGHT: usize = 4;
    let (t, rows, cols) = (block_idx_y() as usize, rows as usize, cols as usize);
    // The weights do not depend on the previous grid: ask for the block's first rows first.
    let row0 = block_idx() as usize * P::MATVEC_WARPS as usize;
    if P::HAS_PDL && t == 0 && row0 < rows {
        let n_rows = (P::MATVEC_WARPS as usize).min(rows - row0);
        prefetch_l2(w.wrapping_add(row0 * cols) as *const u8, n_rows * cols * 4);
    }
    pdl_wait::<P>();
    let x_row = unsafe { x.add(t * cols) } as *const u32;
    let lane_part = |row: usize| {
        let w_row = unsafe { w.add(row * cols) } as *const u32;
        let mut acc = [0f32; IN_FLIGHT];
        let mut c = lane() as usize * 4;
        while c < cols {
            let (mut wv, mut xv) = ([[0u32; 4]; IN_FLIGHT], [[0u32; 4]; IN_FLIGHT]);
            unroll::<IN_FLIGHT>(|i| {
                let at = c + i * 4 * WARP as usize;
                if at < cols {
                    (wv[i], xv[i]) = unsafe { (ld_nc_v4(w_row.add(at)), ld_nc_v4(x_row.add(at))) };
                }
            });
            unroll::<IN_FLIGHT>(|i| {
                unroll::<4>(|j| acc[i] += f32::from_bits(wv[i][j]) * f32::from_bits(xv[i][j]))
            });
            c += IN_FLIGHT * 4 * WARP as usize;
        }
        acc.iter().sum()
    };
    unsafe { warp_row_sums::<P>(y.add(t * rows), rows, lane_part) }
}

/// Routes each of `n` rows of router logits (`n × n_expert`, `n_expert ≤ MOE_MAX_EXPERTS`)
/// into `route` (`n × 2k`): the `k` experts with the largest logits in descending order (the
/// lower index first on ties) as f32 indices, then their softmax probabilities, rescaled to sum
/// to 1 when `norm != 0`. One warp per row. Launch:
/// [`launch::per_warp`](crate::kernels::launch::per_warp) over `n`.
pub unsafe fn moe_route<P: TargetPolicy>(
    logits: *const f32,
    route: *mut f32,
    n_expert: u32,
    k: u32,
    norm: u32,
    n: u32,
) {
    const PER_LANE: usize = (MOE_MAX_EXPERTS / WARP) as usize;
    let t = block_idx() * (block_dim() / WARP) + warp_id();
    if t >= n {
        return; // warp-uniform: the whole warp leaves together
    }
    let row = unsafe { logits.add((t * n_expert) as usize) };
    let expert = |i: usize| lane() + (i as u32) * WARP;
    let mut v = [f32::NEG_INFINITY; PER_LANE];
    unroll::<PER_LANE>(|i| {
        if expert(i) < n_expert {
            v[i] = unsafe { *row.add(expert(i) as usize) };
        }
    });
    let max = warp_max(v.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)));
    let mut s = 0f32;
    unroll::<PER_LANE>(|i| {
        if expert(i) < n_expert {
            s += exp(v[i] - max);
        }
    });
    let sum = warp_sum(s);
    let out = unsafe { route.add((t * 2 * k) as usize) };
    let (mut taken, mut chosen) = (0u32, 0f32);
    for j in 0..k as usize {
        // This lane's best untaken expert, then the warp's: the larger logit, the lower
        // index on ties.
        let mut best = (f32::NEG_INFINITY, u32::MAX);
        unroll::<PER_LANE>(|i| {
            if expert(i) < n_expert && taken & (1 << i) == 0 {
                best = better(best, (v[i], expert(i)));
            }
        });
        let best = warp_argmax(best);
        if best.1 % WARP == lane() {
            taken |= 1 << (best.1 / WARP);
        }
        let p = exp(best.0 - max) / sum;
        chosen += p;
        if lane() == 0 {
            unsafe { (*out.add(j), *out.add(k as usize + j)) = (best.1 as f32, p) };
        }
    }
    if norm != 0 && lane() == 0 {
        for j in 0..k as usize {
            unsafe { *out.add(k as usize + j) /= chosen };
        }
    }
}

/// The expert index in slot `j` of token `t`'s route.
#[inline(always)]
unsafe fn routed_expert(route: *const f32, k: usize, t: usize, j: usize) -> usize {
    unsafe { *route.add(t * 2 * k + j) as usize }
}

/// Route slot `slot = t·k + j`'s token `t` and the expert `e` in it.
#[inline(always)]
unsafe fn slot_expert(route: *const f32, k: usize, slot: usize) -> (usize, usize) {
    let t = slot / k;
    (t, unsafe { routed_expert(route, k, t, slot % k) })
}

/// The mixing weight of slot `j` of token `t`'s route.
#[inline(always)]
unsafe fn routed_weight(route: *const f32, k: usize, t: usize, j: usize) -> f32 {
    unsafe { *route.add(t * 2 * k + k + j) }
}

/// Gate, up and SwiGLU of each token's routed experts: block row `y = t·k + j` computes
/// `act[y] = silu(x[t]·G_eᵀ) ⊙ (x[t]·U_eᵀ)` (`rows` wide) for expert `e` in slot `j` of token
/// `t`'s route. `x` is Q8_1 ([`quantize_q8_1`](super::matvec::quantize_q8_1)); `G`, `U` are
/// stacked `[n_expert·rows, cols]`. Launch:
/// [`launch::matvec_groups`](crate::kernels::launch::matvec_groups) over ⌈rows /
/// MATVEC_WARPS⌉ and `n·k` rows.
#[allow(clippy::too_many_arguments)]
pub unsafe fn moe_swiglu_split<P: TargetPolicy, F: SplitFormat>(
    gate_qs: *const u32,
    gate_scales: *const u8,
    up_qs: *const u32,
    up_scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    route: *const f32,
    act: *mut f32,
    rows: u32,
    cols: u32,
    k: u32,
) {
    let (nb, slot, k) = (
        (cols / QK as u32) as usize,
        block_idx_y() as usize,
        k as usize,
    );
    let ((t, e), rows) = (unsafe { slot_expert(route, k, slot) }, rows as usize);
    let x = unsafe { q8_row(xq, xds, t, nb) };
    let (gate, up) = ((gate_qs, gate_scales), (up_qs, up_scales));
    let y = unsafe { act.add(slot * rows) };
    unsafe { swiglu_rows::<P, F>(gate, up, x, y, e * rows, rows, nb, (NormScale::NONE, 0)) }
}

/// The experts' down projections, mixed into the residual stream: for token `t` (block row)
/// `x[t] += Σ_j w_j · (act[t·k + j] · D_{e_j}ᵀ)`. `act` is Q8_1 (`n·k × cols`), `D` stacked
/// `[n_expert·rows, cols]`. One row per warp for all `k` slots: the lanes walk the row's
/// (slot, block) pairs as one flat list, so every slot's loads are in flight together (a
/// slot-by-slot walk waited out `k` memory round trips one after another, and an expert row
/// narrower than 32 blocks left lanes idle). Launch:
/// [`launch::matvec_groups`](crate::kernels::launch::matvec_groups) over ⌈rows /
/// MATVEC_WARPS⌉ and `n` rows.
#[allow(clippy::too_many_arguments)]
pub unsafe fn moe_down_add_split<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    aq: *const u32,
    ads: *const f32,
    route: *const f32,
    x: *mut f32,
    rows: u32,
    cols: u32,
    k: u32,
) {
    let (nb, t, k) = (
        (cols / QK as u32) as usize,
        block_idx_y() as usize,
        k as usize,
    );
    let (rows, warps) = (rows as usize, P::MATVEC_WARPS as usize);
    let mut group = block_idx() as usize;
    while group * warps < rows {
        let row = group * warps + warp_id() as usize;
        let live = row < rows; // warp-uniform: every lane still reaches the warp_sum
        let part = match live {
            true => unsafe { slot_pairs_dot::<F>(qs, scales, aq, ads, route, row, rows, nb, t, k) },
            false => 0.0,
        };
        let sum = warp_sum(part);
        if lane() == 0 && live {
            unsafe { *x.add(t * rows + row) += sum };
        }
        group += grid_dim() as usize;
    }
}

/// (slot, block) pairs a lane of [`moe_down_add_split`] loads before it computes: a
/// 30B-A3B row (8 slots × 24 blocks) is then two steps.
const PAIRS_IN_FLIGHT: usize = 4;

/// This lane's share of `Σ_j w_j · (act[t·k + j] · D_{e_j}[row])`: pairs `p = lane, lane + 32,
/// ...` of the `k·nb` (slot `p / nb`, block `p % nb`) pairs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn slot_pairs_dot<F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    aq: *const u32,
    ads: *const f32,
    route: *const f32,
    row: usize,
    rows: usize,
    nb: usize,
    t: usize,
    k: usize,
) -> f32 {
    const U: usize = PAIRS_IN_FLIGHT;
    let pairs = k * nb;
    let mut acc = 0f32;
    let mut p0 = lane() as usize;
    while p0 < pairs {
        let mut wq = [[0u32; 8]; U];
        let mut ws = [F::Side::default(); U];
        let mut xw = [[0u32; 8]; U];
        let mut xd = [(0f32, 0f32); U];
        let mut weight = [0f32; U];
        unroll::<U>(|u| {
            let p = p0 + u * WARP as usize;
            if p < pairs {
                let (j, b) = (p / nb, p % nb);
                let blk = unsafe { (routed_expert(route, k, t, j) * rows + row) * nb + b };
                wq[u] = unsafe { load_block_quants::<F>(qs.add(blk * F::QS_WORDS)) };
                ws[u] = load_side::<F>(scales, blk);
                (xw[u], xd[u]) = unsafe { load_q8_block(q8_row(aq, ads, t * k + j, nb), b) };
                weight[u] = unsafe { routed_weight(route, k, t, j) };
            }
        });
        unroll::<U>(|u| {
            if p0 + u * (WARP as usize) < pairs {
                let d = F::block_dot(0.0, &wq[u], ws[u], &xw[u], xd[u].0, xd[u].1);
                acc += weight[u] * d;
            }
        });
        p0 += U * WARP as usize;
    }
    acc
}

// --- f32 activations (`--f32-activations`) -------------------------------------------------

/// `y[s] = x[s / div] · W_eᵀ` (`rows` wide) for every route slot `s = t·k + j` (block row),
/// `e` the expert in slot `j` of token `t`'s route and W stacked `[n_expert·rows, cols]` in
/// split layout `F`; `x` f32, not quantized (as `matvec::matvec_split_f32x`). `div` is `k`
/// when `x` has a row per token (gate, up) and 1 when it has one per slot (down). Launch:
/// [`launch::matvec_groups`](crate::kernels::launch::matvec_groups) over ⌈rows /
/// MATVEC_WARPS⌉ and `n·k` rows.
#[allow(clippy::too_many_arguments)]
pub unsafe fn moe_matvec_f32x<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    x: *const f32,
    route: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    k: u32,
    div: u32,
) {
    let (nb, slot, k) = (
        (cols / QK as u32) as usize,
        block_idx_y() as usize,
        k as usize,
    );
    let (rows, (_, e)) = (rows as usize, unsafe { slot_expert(route, k, slot) });
    let x_row = unsafe { x.add(slot / div as usize * cols as usize) };
    let lane_part = |r: usize| unsafe { lane_dot_f32x::<F>(qs, scales, e * rows + r, x_row, nb) };
    unsafe { warp_row_sums::<P>(y.add(slot * rows), rows, lane_part) }
}

// --- Prefill: slots sorted by expert ------------------------------------------------------
//
// With many tokens, the slot-major mat-vecs above read each slot's expert rows on their own.
// Sorted by expert, the blocks that run together belong to consecutive slots of one expert and
// read the same weight rows, which then come from L2 instead of memory: the grid's x is the
// sorted slot, y the row group.

/// Sorts the `n_slots = n·k` route slots by expert: `order` gets the slot indices (`t·k + j`)
/// of expert 0 in ascending order, then expert 1's, and so on. One block; thread `i` counts
/// and places experts `i, i + block_dim, ..`; `n_expert ≤ MOE_MAX_EXPERTS`. Also cuts each
/// expert's run of sorted positions into token tiles of `tile_n` for the grouped GEMM
/// ([`moe_mma_split`](crate::kernels::mma::moe_mma_split)): `tiles` gets `[expert, first,
/// end)` per tile, then `u32::MAX` entries up to `max_tiles`
/// ([`launch::moe_gemm_tiles`](crate::kernels::launch::moe_gemm_tiles)). Launch:
/// [`launch::moe_sort`](crate::kernels::launch::moe_sort).
#[allow(clippy::too_many_arguments)]
pub unsafe fn moe_sort<P: TargetPolicy>(
    route: *const f32,
    order: *mut u32,
    tiles: *mut u32,
    n_slots: u32,
    k: u32,
    n_expert: u32,
    tile_n: u32,
    max_tiles: u32,
) {
    // Shared memory: a counter (then a start) per expert, then each slot's expert as a byte
    // (n_expert ≤ 256), staged once so the per-expert scans below read 4 slots a word from
    // shared memory instead of one f32 a load from the route.
    let start: *mut u32 = shared_mem();
    let ids = unsafe { start.add(n_expert as usize) } as *mut u8;
    let mut s = thread_idx();
    while s < n_slots {
        let e = unsafe { *route.add((s / k * 2 * k + s % k) as usize) } as u32;
        unsafe { *ids.add(s as usize) = e as u8 };
        s += block_dim();
    }
    sync_threads();
    let mut e = thread_idx();
    while e < n_expert {
        let mut count = 0;
        unsafe { slots_of(ids, n_slots, e, |_| count += 1) };
        unsafe { *start.add(e as usize) = count };
        e += block_dim();
    }
    sync_threads();
    if thread_idx() == 0 {
        let (mut at, mut tile) = (0, 0);
        for e in 0..n_expert {
            let count = unsafe { *start.add(e as usize) };
            unsafe { *start.add(e as usize) = at };
            let mut first = at;
            while first < at + count && tile < max_tiles {
                unsafe { write_tile(tiles, tile, [e, first, at + count]) };
                (first, tile) = (first + tile_n, tile + 1);
            }
            at += count;
        }
        while tile < max_tiles {
            unsafe { write_tile(tiles, tile, [u32::MAX; MOE_TILE_WORDS]) };
            tile += 1;
        }
    }
    sync_threads();
    let mut e = thread_idx();
    while e < n_expert {
        let mut at = unsafe { *start.add(e as usize) };
        unsafe {
            slots_of(ids, n_slots, e, |s| {
                *order.add(at as usize) = s;
                at += 1;
            })
        };
        e += block_dim();
    }
}

/// Calls `f(s)` for each slot `s < n_slots` (ascending) whose expert byte in `ids` (shared
/// memory, 4-byte aligned) is `e`, reading a word of four at a time.
#[inline(always)]
unsafe fn slots_of(ids: *const u8, n_slots: u32, e: u32, mut f: impl FnMut(u32)) {
    for w in 0..n_slots.div_ceil(4) {
        let word = unsafe { *(ids as *const u32).add(w as usize) };
        unroll::<4>(|b| {
            let s = 4 * w + b as u32;
            if s < n_slots && (word >> (8 * b)) & 0xff == e {
                f(s);
            }
        });
    }
}

/// Dynamic shared memory of `moe_sort`: a counter per expert and a byte per slot.
pub const fn moe_sort_smem(n_expert: u32, n_slots: u32) -> u32 {
    4 * n_expert + n_slots.div_ceil(4) * 4
}

#[inline(always)]
unsafe fn write_tile(tiles: *mut u32, tile: u32, entry: [u32; MOE_TILE_WORDS]) {
    for (i, w) in entry.into_iter().enumerate() {
        unsafe { *tiles.add(tile as usize * MOE_TILE_WORDS + i) = w };
    }
}

/// What block (x, y) of an expert-sorted launch computes: for slot `order[x]` (token `t`,
/// expert `e`) and row `r = y·MATVEC_WARPS + warp`, the dots of the slot's activation row
/// (`act_row(slot, t)`, Q8_1 with `nb` blocks) with row `r` of expert `e` of each stacked
/// matrix in `mats`. Returns the slot, `r`, and whether `r < rows`; every lane must call.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn sorted_dots<P: TargetPolicy, F: SplitFormat, const R: usize>(
    mats: [(*const u32, *const u8); R],
    route: *const f32,
    order: *const u32,
    k: usize,
    rows: usize,
    nb: usize,
    act_row: impl Fn(usize, usize) -> (*const u32, *const f32),
) -> (usize, usize, bool, [f32; R]) {
    let slot = unsafe { *order.add(block_idx() as usize) } as usize;
    let (t, e) = unsafe { slot_expert(route, k, slot) };
    let row = (block_idx_y() * P::MATVEC_WARPS + warp_id()) as usize;
    let live = row < rows;
    let w = mats.map(|(qs, scales)| WeightRow {
        qs,
        scales,
        row: e * rows + row,
        live,
    });
    let dots = unsafe { warp_dots_in_flight::<P, F, R>(&w, act_row(slot, t), nb) };
    (slot, row, live, dots)
}

/// [`moe_swiglu_split`] over slots sorted by [`moe_sort`]: block (x, y) computes rows
/// `y·MATVEC_WARPS ..` of slot `order[x]`'s `act` row. Launch:
/// [`launch::moe_sorted`](crate::kernels::launch::moe_sorted) over `n·k` slots and `rows`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn moe_swiglu_sorted<P: TargetPolicy, F: SplitFormat>(
    gate_qs: *const u32,
    gate_scales: *const u8,
    up_qs: *const u32,
    up_scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    route: *const f32,
    order: *const u32,
    act: *mut f32,
    rows: u32,
    cols: u32,
    k: u32,
) {
    let (nb, rows) = ((cols / QK as u32) as usize, rows as usize);
    let mats = [(gate_qs, gate_scales), (up_qs, up_scales)];
    let x_row = |_, t: usize| unsafe { q8_row(xq, xds, t, nb) };
    let (slot, row, live, [g, u]) =
        unsafe { sorted_dots::<P, F, 2>(mats, route, order, k as usize, rows, nb, x_row) };
    if lane() == 0 && live {
        unsafe { *act.add(slot * rows + row) = silu(g) * u };
    }
}

/// The experts' down projections over sorted slots, one output row per slot:
/// `y[slot] = act[slot] · D_eᵀ` (`rows` wide; [`moe_mix`] then weighs and adds them). Launch:
/// [`launch::moe_sorted`](crate::kernels::launch::moe_sorted) over `n·k` slots and `rows`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn moe_down_sorted<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    aq: *const u32,
    ads: *const f32,
    route: *const f32,
    order: *const u32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    k: u32,
) {
    let (nb, rows) = ((cols / QK as u32) as usize, rows as usize);
    let a_row = |slot: usize, _| unsafe { q8_row(aq, ads, slot, nb) };
    let (slot, row, live, [d]) = unsafe {
        sorted_dots::<P, F, 1>([(qs, scales)], route, order, k as usize, rows, nb, a_row)
    };
    if lane() == 0 && live {
        unsafe { *y.add(slot * rows + row) = d };
    }
}

/// `x[t][c] += Σ_j w_j · y[t·k + j][c]` (`x` is `n × cols`, `y` `n·k × cols`), slots summed in
/// route order and then added, as [`moe_down_add_split`] does. One thread per element.
/// Launch: [`launch::flat`](crate::kernels::launch::flat) over `n·cols`.
pub unsafe fn moe_mix<P: TargetPolicy>(
    y: *const f32,
    route: *const f32,
    x: *mut f32,
    cols: u32,
    k: u32,
    len: u32,
) {
    let i = block_idx() * block_dim() + thread_idx();
    if i >= len {
        return;
    }
    let (t, c, k) = ((i / cols) as usize, (i % cols) as usize, k as usize);
    let cols = cols as usize;
    let mut sum = 0f32;
    for j in 0..k {
        let w = unsafe { routed_weight(route, k, t, j) };
        sum += w * unsafe { *y.add((t * k + j) * cols + c) };
    }
    unsafe { *x.add(i as usize) += sum };
}
