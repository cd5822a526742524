//! Batch-1 (and small-batch) mat-vec: `y[t] = W · x[t]` for weights in split layout.
//!
//! Each warp owns `P::MATVEC_ROWS_PER_WARP` consecutive rows. A lane walks the row's blocks
//! `lane, lane+32, ...`, so a warp reads 32 consecutive blocks (512 or 1024 contiguous bytes) per
//! step with 16-byte loads, and each activation block it loads is reused for all of its rows.
use crate::device::*;
use crate::kernels::formats::{QK, SplitFormat, SplitOut, load_side, pick_matrix};
use crate::kernels::residual_norm::{NormInput, NormScale};
use policies::TargetPolicy;

/// Quantize activations `x` (`n × cols` f32) to 32-element blocks: `xq` (`n × cols` i8) and
/// `xds` (`n × cols/32` pairs of f32: `d`, `d·Σq`, both rounded to f16 precision). `cols % 32 == 0`. Launch: [`launch::quantize_q8_1`].
///
/// [`launch::quantize_q8_1`]: crate::kernels::launch::quantize_q8_1
pub unsafe fn quantize_q8_1<P: TargetPolicy>(x: *const f32, xq: *mut i8, xds: *mut f32, cols: u32) {
    let nb = cols / QK as u32;
    let b = block_idx() * (block_dim() / WARP) + warp_id();
    let t = block_idx_y();
    if b >= nb {
        return; // warp-uniform: the whole warp leaves together, no collective is skipped
    }
    let i = (t * cols + b * QK as u32 + lane()) as usize;
    unsafe { quantize_block(*x.add(i), xq.add(i), xds.add(2 * (t * nb + b) as usize)) };
}

/// One warp quantizes one 32-element block, lane `l` holding element `l`: writes its code to
/// `q` and (lane 0) the block's `d`, `d·Σq` to `ds[0..2]`. Every kernel that emits Q8_1
/// activations goes through here, so their codes are identical bit for bit.
#[inline(always)]
pub unsafe fn quantize_block(v: f32, q: *mut i8, ds: *mut f32) {
    let (d, id) = q8_1_scale(warp_max(v.abs()));
    let code = q8_1_code(v, id);
    let sum = warp_sum(code as f32);
    unsafe { *q = code as i8 };
    if lane() == 0 {
        unsafe { (*ds, *ds.add(1)) = q8_1_stored(d, sum) };
    }
}

// The Q8_1 arithmetic every activation quantizer shares (here and the register-resident norms),
// the same as the CPU backend's (and llama.cpp's q8_1): codes from v·(1/d) rounded half away
// from zero, then d and d·Σq stored at f16 precision. Matching it operation for operation is
// what keeps greedy decoding identical across the two backends.

/// `(d, 1/d)` of a block whose largest magnitude is `amax` (both 0 for an all-zero block).
#[inline(always)]
pub fn q8_1_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d == 0.0 { 0.0 } else { 1.0 / d })
}

/// The code of `v` given `id` = 1/d.
#[inline(always)]
pub fn q8_1_code(v: f32, id: f32) -> i32 {
    round_half_away_to_i32(v * id).clamp(-127, 127)
}

/// The block's stored pair: `d` and `d·Σq` (`sum` = Σ codes), each rounded to f16 precision.
#[inline(always)]
pub fn q8_1_stored(d: f32, sum: f32) -> (f32, f32) {
    (f16_round(d), f16_round(d * sum))
}

/// One block's quants with one or two 16-byte loads (the branch folds away per format).
#[inline(always)]
pub(crate) unsafe fn load_block_quants<F: SplitFormat>(p: *const u32) -> [u32; 8] {
    let a = unsafe { ld_stream_v4(p) };
    if F::QS_WORDS == 4 {
        [a[0], a[1], a[2], a[3], 0, 0, 0, 0]
    } else {
        let b = unsafe { ld_stream_v4(p.add(4)) };
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

/// `y` (`n × rows`) = `x` · Wᵀ with W (`rows × cols`) in split layout `F` (`qs` 16-byte aligned)
/// and `x` already quantized by [`quantize_q8_1`]; with `acc != 0`, `y += x · Wᵀ` instead (a
/// projection into the residual stream, the add costing no launch of its own; each `y[r]` gets
/// the bits `add_assign` would give it). Launch: [`launch::matvec`], or fewer blocks along
/// x (`launch::matvec_resident`): blocks stride over the row groups.
///
/// [`launch::matvec`]: crate::kernels::launch::matvec
#[allow(clippy::too_many_arguments)] // a kernel's parameters are its launch arguments
pub unsafe fn matvec_split<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    acc: u32,
) {
    unsafe {
        split_rows::<P, F>(
            P::MATVEC_ROWS_PER_WARP,
            qs,
            scales,
            xq,
            xds,
            y,
            rows,
            cols,
            acc,
        )
    }
}

/// [`matvec_split`] with `P::MATVEC_WIDE_ROWS_PER_WARP` rows per warp, for launches with rows
/// to spare (`launch::matvec_takes_wide`). Launch: [`launch::matvec_wide_groups`] over `rows`.
///
/// [`launch::matvec_wide_groups`]: crate::kernels::launch::matvec_wide_groups
#[allow(clippy::too_many_arguments)]
pub unsafe fn matvec_split_wide<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    acc: u32,
) {
    let r = P::MATVEC_WIDE_ROWS_PER_WARP;
    unsafe { split_rows::<P, F>(r, qs, scales, xq, xds, y, rows, cols, acc) }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn split_rows<P: TargetPolicy, F: SplitFormat>(
    rows_per_warp: u32,
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    acc: u32,
) {
    // Rows per warp (a policy constant at every call) and blocks in flight become const
    // generics so the accumulators and the loaded blocks are fixed-size register arrays (a
    // run-time bound would spill them to local memory).
    unsafe {
        match rows_per_warp {
            1 => split_unrolled::<P, F, 1>(qs, scales, xq, xds, y, rows, cols, acc),
            2 => split_unrolled::<P, F, 2>(qs, scales, xq, xds, y, rows, cols, acc),
            _ => split_unrolled::<P, F, 4>(qs, scales, xq, xds, y, rows, cols, acc),
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn split_unrolled<P: TargetPolicy, F: SplitFormat, const R: usize>(
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    acc: u32,
) {
    unsafe {
        match P::MATVEC_BLOCKS_IN_FLIGHT {
            1 => matvec_split_tile::<P, F, R, 1>(qs, scales, xq, xds, y, rows, cols, acc),
            2 => matvec_split_tile::<P, F, R, 2>(qs, scales, xq, xds, y, rows, cols, acc),
            _ => matvec_split_tile::<P, F, R, 4>(qs, scales, xq, xds, y, rows, cols, acc),
        }
    }
}

/// `R` rows per warp; each lane keeps `U` blocks per row in flight: all loads of a step are
/// issued before the first dot product uses them, so a warp has `R·U·32` 16-byte weight loads
/// outstanding instead of one row's worth.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matvec_split_tile<P: TargetPolicy, F: SplitFormat, const R: usize, const U: usize>(
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    acc: u32,
) {
    let (nb, t) = ((cols / QK as u32) as usize, block_idx_y() as usize);
    let x = unsafe { q8_row(xq, xds, t, nb) };
    // Grid-stride over groups of `MATVEC_WARPS·R` rows: `launch::matvec_resident` launches
    // at most one resident wave of blocks, fewer than there are groups. The loop condition is
    // the same for the whole block, so every lane reaches the warp_sum inside `warp_dots`.
    let rows = rows as usize;
    let group_rows = (P::MATVEC_WARPS as usize) * R;
    let mut group = block_idx() as usize;
    for g in 0..P::MATVEC_PREFETCH_GROUPS as usize {
        let at = (group + g * grid_dim() as usize) * group_rows;
        prefetch_rows::<P, F>(qs, scales, at, group_rows, rows, nb);
    }
    pdl_wait::<P>();
    while group * group_rows < rows {
        let row0 = (group * P::MATVEC_WARPS as usize + warp_id() as usize) * R;
        let w = core::array::from_fn(|r| WeightRow {
            qs,
            scales,
            row: row0 + r,
            live: row0 + r < rows,
        });
        let dots = unsafe { warp_dots::<F, R, U>(&w, x, nb) };
        for (r, s) in dots.iter().enumerate() {
            if lane() == 0 && w[r].live {
                let out = unsafe { y.add(t * rows + row0 + r) };
                unsafe { *out = if acc != 0 { *out + *s } else { *s } };
            }
        }
        group += grid_dim() as usize;
    }
}

/// Starts pulling `rows` weight rows from `row0` (quants and scales; clipped to `total`) into L2.
/// Mat-vecs call this before [`pdl_wait`]: the weights do not depend on the previous grid, so
/// under programmatic dependent launch their first bytes arrive while it still finishes.
#[inline(always)]
pub(crate) fn prefetch_rows<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    row0: usize,
    rows: usize,
    total: usize,
    nb: usize,
) {
    let rows = rows.min(total.saturating_sub(row0));
    if P::HAS_PDL && block_idx_y() == 0 && rows > 0 {
        let (q_row, s_row) = (nb * F::QS_WORDS * 4, nb / F::GROUP * F::RECORD_BYTES);
        prefetch_l2((qs as *const u8).wrapping_add(row0 * q_row), rows * q_row);
        prefetch_l2(scales.wrapping_add(row0 * s_row), rows * s_row);
    }
}

/// `y[row]` = the warp sum of `lane_part(row)` (each lane's share of the row's dot product)
/// for `row < rows`: one row per warp, blocks striding over groups of `MATVEC_WARPS` rows. A
/// block's last group may run past `rows`; `row` is warp-uniform, so every lane of such a warp
/// still reaches the `warp_sum`. The Q8_1 mat-vecs keep this loop written out: routing them
/// through a closure made ptxas give the Q5_K/Q6_K SwiGLU 10 more registers (sm_90).
#[inline(always)]
pub(crate) unsafe fn warp_row_sums<P: TargetPolicy>(
    y: *mut f32,
    rows: usize,
    lane_part: impl Fn(usize) -> f32,
) {
    let warps = P::MATVEC_WARPS as usize;
    let mut group = block_idx() as usize;
    while group * warps < rows {
        let row = group * warps + warp_id() as usize;
        let live = row < rows;
        let s = warp_sum(if live { lane_part(row) } else { 0.0 });
        if lane() == 0 && live {
            unsafe { *y.add(row) = s };
        }
        group += grid_dim() as usize;
    }
}

/// Row `row` of a Q8_1 activation matrix ([`quantize_q8_1`]) with `nb` blocks per row: its
/// codes (8 words a block) and its per-block (scale, sum) pairs.
#[inline(always)]
pub(crate) unsafe fn q8_row(
    xq: *const u32,
    xds: *const f32,
    row: usize,
    nb: usize,
) -> (*const u32, *const f32) {
    unsafe { (xq.add(row * nb * 8), xds.add(row * nb * 2)) }
}

/// One weight row a warp reduces: row `row` of the split-layout matrix (`qs`, `scales`);
/// `live == false` marks a padding row past the matrix (loads and dots skipped).
#[derive(Clone, Copy)]
pub(crate) struct WeightRow {
    pub qs: *const u32,
    pub scales: *const u8,
    pub row: usize,
    pub live: bool,
}

/// The full dot products (every lane gets them) of the activation row `x` = (`xq`, `xds`) with
/// `R` weight rows, which may come from different matrices. Every lane of the warp must call.
#[inline(always)]
unsafe fn warp_dots<F: SplitFormat, const R: usize, const U: usize>(
    w: &[WeightRow; R],
    x: (*const u32, *const f32),
    nb: usize,
) -> [f32; R] {
    let (xq_row, xds_row) = x;
    let mut acc = [0f32; R];
    let mut b0 = lane() as usize;
    // `unroll` writes the loops over U and R out, so these arrays stay in registers (a rolled
    // loop would index them at run time and put them in local memory).
    while b0 < nb {
        let mut xw = [[0u32; 8]; U];
        let mut xd = [(0f32, 0f32); U];
        let mut wq = [[[0u32; 8]; U]; R];
        let mut ws = [[F::Side::default(); U]; R];
        unroll::<U>(|u| {
            let b = b0 + u * WARP as usize;
            if b < nb {
                (xw[u], xd[u]) = unsafe { load_q8_block((xq_row, xds_row), b) };
                unroll::<R>(|r| {
                    if w[r].live {
                        let blk = w[r].row * nb + b;
                        wq[r][u] =
                            unsafe { load_block_quants::<F>(w[r].qs.add(blk * F::QS_WORDS)) };
                        ws[r][u] = load_side::<F>(w[r].scales, blk);
                    }
                });
            }
        });
        unroll::<U>(|u| {
            let b = b0 + u * WARP as usize;
            if b < nb {
                unroll::<R>(|r| {
                    if w[r].live {
                        acc[r] =
                            F::block_dot(acc[r], &wq[r][u], ws[r][u], &xw[u], xd[u].0, xd[u].1);
                    }
                });
            }
        });
        b0 += U * WARP as usize;
    }
    unroll::<R>(|r| acc[r] = warp_sum(acc[r]));
    acc
}

/// Block `b` of a Q8_1 activation row ([`q8_row`]): its 32 codes (two 16-byte loads) and its
/// (d, d·Σq) pair.
#[inline(always)]
pub(crate) unsafe fn load_q8_block(
    x: (*const u32, *const f32),
    b: usize,
) -> ([u32; 8], (f32, f32)) {
    let (xq_row, xds_row) = x;
    let lo = unsafe { ld_nc_v4(xq_row.add(b * 8)) };
    let hi = unsafe { ld_nc_v4(xq_row.add(b * 8 + 4)) };
    let codes = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
    (codes, unsafe {
        (*xds_row.add(2 * b), *xds_row.add(2 * b + 1))
    })
}

/// [`warp_dots`] with the policy's blocks in flight (a const generic, hence the match).
#[inline(always)]
pub(crate) unsafe fn warp_dots_in_flight<P: TargetPolicy, F: SplitFormat, const R: usize>(
    w: &[WeightRow; R],
    x: (*const u32, *const f32),
    nb: usize,
) -> [f32; R] {
    unsafe {
        match P::MATVEC_BLOCKS_IN_FLIGHT {
            1 => warp_dots::<F, R, 1>(w, x, nb),
            2 => warp_dots::<F, R, 2>(w, x, nb),
            _ => warp_dots::<F, R, 4>(w, x, nb),
        }
    }
}

/// Up to three mat-vecs over the same quantized activations in one launch (e.g. the q, k and v
/// projections): `y_m = x · W_mᵀ` for each matrix `m` with `rows_m > 0` (all `cols` wide). A
/// warp owns one row; blocks stride over the row groups of all matrices in turn. Launch:
/// [`launch::matvec_groups`] over Σ ⌈rows_m / MATVEC_WARPS⌉ groups (one row per warp, so the
/// policy's rows-per-warp is not used here). With `N` = `residual_norm::Deferred`, `x` is a
/// deferred norm's `x ⊙ g` and every output is scaled by its `1/rms` from `(ss, ss_parts, eps)`;
/// the `Finished` instantiation ignores those three (the same holds for the SwiGLU kernels).
///
/// [`launch::matvec_groups`]: crate::kernels::launch::matvec_groups
#[allow(clippy::too_many_arguments)]
pub unsafe fn matvec3_split<P: TargetPolicy, F: SplitFormat, N: NormInput>(
    w0: *const u32,
    s0: *const u8,
    y0: *mut f32,
    rows0: u32,
    w1: *const u32,
    s1: *const u8,
    y1: *mut f32,
    rows1: u32,
    w2: *const u32,
    s2: *const u8,
    y2: *mut f32,
    rows2: u32,
    xq: *const u32,
    xds: *const f32,
    cols: u32,
    ss: *const f64,
    ss_parts: u32,
    eps: f32,
) {
    let scale = NormScale::of::<N>(ss, ss_parts, cols, eps);
    unsafe {
        matvec3_with::<P, F>(
            1, w0, s0, y0, rows0, w1, s1, y1, rows1, w2, s2, y2, rows2, xq, xds, cols, scale,
        )
    }
}

/// [`matvec3_split`] with `P::MATVEC_WIDE_ROWS_PER_WARP` rows per warp (`R` consecutive rows
/// of one matrix). Launch: [`launch::matvec_wide_groups`] over the three row counts.
///
/// [`launch::matvec_wide_groups`]: crate::kernels::launch::matvec_wide_groups
#[allow(clippy::too_many_arguments)]
pub unsafe fn matvec3_split_wide<P: TargetPolicy, F: SplitFormat, N: NormInput>(
    w0: *const u32,
    s0: *const u8,
    y0: *mut f32,
    rows0: u32,
    w1: *const u32,
    s1: *const u8,
    y1: *mut f32,
    rows1: u32,
    w2: *const u32,
    s2: *const u8,
    y2: *mut f32,
    rows2: u32,
    xq: *const u32,
    xds: *const f32,
    cols: u32,
    ss: *const f64,
    ss_parts: u32,
    eps: f32,
) {
    let r = P::MATVEC_WIDE_ROWS_PER_WARP;
    let scale = NormScale::of::<N>(ss, ss_parts, cols, eps);
    unsafe {
        matvec3_with::<P, F>(
            r, w0, s0, y0, rows0, w1, s1, y1, rows1, w2, s2, y2, rows2, xq, xds, cols, scale,
        )
    }
}

/// The three matrices as [`SplitOut`]s and `rows_per_warp` (a policy constant at every call) as
/// the const generic [`matvec3_rows`] needs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matvec3_with<P: TargetPolicy, F: SplitFormat>(
    rows_per_warp: u32,
    w0: *const u32,
    s0: *const u8,
    y0: *mut f32,
    rows0: u32,
    w1: *const u32,
    s1: *const u8,
    y1: *mut f32,
    rows1: u32,
    w2: *const u32,
    s2: *const u8,
    y2: *mut f32,
    rows2: u32,
    xq: *const u32,
    xds: *const f32,
    cols: u32,
    scale: NormScale,
) {
    let mats = [
        (w0, s0, y0, rows0),
        (w1, s1, y1, rows1),
        (w2, s2, y2, rows2),
    ]
    .map(SplitOut::from);
    unsafe {
        match rows_per_warp {
            1 => matvec3_rows::<P, F, 1>(mats, xq, xds, cols, scale),
            2 => matvec3_rows::<P, F, 2>(mats, xq, xds, cols, scale),
            _ => matvec3_rows::<P, F, 4>(mats, xq, xds, cols, scale),
        }
    }
}

#[inline(always)]
unsafe fn matvec3_rows<P: TargetPolicy, F: SplitFormat, const R: usize>(
    mats: [SplitOut; 3],
    xq: *const u32,
    xds: *const f32,
    cols: u32,
    scale: NormScale,
) {
    let (nb, t) = ((cols / QK as u32) as usize, block_idx_y() as usize);
    let x = unsafe { q8_row(xq, xds, t, nb) };
    let warps = P::MATVEC_WARPS as usize;
    // Groups of `warps · R` rows, numbered across the three matrices; the matrix a group
    // belongs to is block-uniform, so the whole block takes the same branch.
    let group_rows = warps * R;
    let groups = |rows: u32| rows.div_ceil(group_rows as u32);
    let mut group = block_idx();
    if let Some((m, g)) = pick_matrix(mats, groups, group) {
        let (row0, rows) = (g as usize * group_rows, m.rows as usize);
        prefetch_rows::<P, F>(m.qs, m.scales, row0, group_rows, rows, nb);
    }
    pdl_wait::<P>();
    let partials = unsafe { scale.start(t) };
    while let Some((m, g)) = pick_matrix(mats, groups, group) {
        let (y, rows) = (m.y, m.rows as usize);
        let row0 = (g as usize * warps + warp_id() as usize) * R;
        let w = core::array::from_fn(|r| WeightRow {
            qs: m.qs,
            scales: m.scales,
            row: row0 + r,
            live: row0 + r < rows,
        });
        let dots = unsafe { warp_dots_in_flight::<P, F, R>(&w, x, nb) };
        let k = scale.finish(partials);
        for (r, s) in dots.iter().enumerate() {
            if lane() == 0 && w[r].live {
                unsafe { *y.add(t * rows + row0 + r) = *s * k };
            }
        }
        group += grid_dim();
    }
}

/// The gate and up projections and SwiGLU in one launch: `y = silu(x·Gᵀ) ⊙ (x·Uᵀ)`, G and U
/// both `rows × cols`. A warp computes row `r` of both matrices, so the two products never
/// leave registers. Launch: [`launch::matvec_resident`] over `rows` (one row per warp).
///
/// [`launch::matvec_resident`]: crate::kernels::launch::matvec_resident
#[allow(clippy::too_many_arguments)]
pub unsafe fn matvec_swiglu_split<P: TargetPolicy, F: SplitFormat, N: NormInput>(
    gate_qs: *const u32,
    gate_scales: *const u8,
    up_qs: *const u32,
    up_scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    ss: *const f64,
    ss_parts: u32,
    eps: f32,
) {
    let (nb, t) = ((cols / QK as u32) as usize, block_idx_y() as usize);
    let x = unsafe { q8_row(xq, xds, t, nb) };
    let (rows, warps) = (rows as usize, P::MATVEC_WARPS as usize);
    let scale = NormScale::of::<N>(ss, ss_parts, cols, eps);
    for g in 0..P::MATVEC_PREFETCH_GROUPS as usize {
        let at = (block_idx() as usize + g * grid_dim() as usize) * warps;
        prefetch_rows::<P, F>(gate_qs, gate_scales, at, warps, rows, nb);
        prefetch_rows::<P, F>(up_qs, up_scales, at, warps, rows, nb);
    }
    pdl_wait::<P>();
    let (gate, up) = ((gate_qs, gate_scales), (up_qs, up_scales));
    let y = unsafe { y.add(t * rows) };
    unsafe { swiglu_rows::<P, F>(gate, up, x, y, 0, rows, nb, (scale, t)) }
}

/// [`matvec_swiglu_split`] that also emits its output as the Q8_1 blocks the down projection
/// reads (`yq`, `yds`, bit for bit as [`quantize_q8_1`] would write them for `y`), so a decode
/// layer needs no quantize launch. A Q8_1 block is 32 consecutive outputs, so a thread block
/// owns exactly 32 rows: its warps take rows `w, w + warps, ...`, park the products in shared
/// memory, and after one barrier the first warp quantizes them. No counters or fences cross
/// blocks (session 8's counter-fused form lost to its fences). `rows % 32 == 0`. Launch:
/// [`launch::matvec_swiglu_q8`] (`rows / 32` blocks × tokens, `32 / rows_per_warp` warps).
///
/// [`launch::matvec_swiglu_q8`]: crate::kernels::launch::matvec_swiglu_q8
#[allow(clippy::too_many_arguments)]
pub unsafe fn matvec_swiglu_q8<P: TargetPolicy, F: SplitFormat, N: NormInput>(
    gate_qs: *const u32,
    gate_scales: *const u8,
    up_qs: *const u32,
    up_scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    yq: *mut i8,
    yds: *mut f32,
    rows: u32,
    cols: u32,
    ss: *const f64,
    ss_parts: u32,
    eps: f32,
) {
    let (nb, t) = ((cols / QK as u32) as usize, block_idx_y() as usize);
    let x = unsafe { q8_row(xq, xds, t, nb) };
    let (rows, row0) = (rows as usize, block_idx() as usize * QK);
    let scale = NormScale::of::<N>(ss, ss_parts, cols, eps);
    prefetch_rows::<P, F>(gate_qs, gate_scales, row0, QK, rows, nb);
    prefetch_rows::<P, F>(up_qs, up_scales, row0, QK, rows, nb);
    pdl_wait::<P>();
    let partials = unsafe { scale.start(t) };
    let parked: *mut f32 = shared_mem();
    let warps = (block_dim() / WARP) as usize;
    // `r` is warp-uniform, so every lane reaches the warp sums inside `warp_dots`.
    let mut r = warp_id() as usize;
    while r < QK {
        let gate_up = ((gate_qs, gate_scales), (up_qs, up_scales));
        let [g, u] = unsafe { swiglu_dots::<P, F>(gate_up, x, row0 + r, true, nb) };
        let k = scale.finish(partials);
        let v = silu(g * k) * (u * k);
        if lane() == 0 {
            unsafe { *parked.add(r) = v };
        }
        r += warps;
    }
    sync_threads();
    if warp_id() == 0 {
        let v = unsafe { *parked.add(lane() as usize) };
        let at = t * rows + row0 + lane() as usize;
        unsafe {
            *y.add(at) = v;
            quantize_block(v, yq.add(at), yds.add(2 * (at / QK)));
        }
    }
}

/// `y[r] = silu(x·G[first + r]) · (x·U[first + r])` for `r < rows`: one row per warp, blocks
/// striding over groups of `MATVEC_WARPS` rows. `first` selects one expert's rows of stacked
/// expert matrices (`kernels::moe`); the dense SwiGLU passes 0. `(scale, t)`: the deferred
/// norm of `x` (token `t`'s partials) the products are scaled by before the SwiGLU.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn swiglu_rows<P: TargetPolicy, F: SplitFormat>(
    gate: (*const u32, *const u8),
    up: (*const u32, *const u8),
    x: (*const u32, *const f32),
    y: *mut f32,
    first: usize,
    rows: usize,
    nb: usize,
    (scale, t): (NormScale, usize),
) {
    let warps = P::MATVEC_WARPS as usize;
    let partials = unsafe { scale.start(t) };
    let mut group = block_idx() as usize;
    while group * warps < rows {
        let row = group * warps + warp_id() as usize;
        let live = row < rows;
        let [g, u] = unsafe { swiglu_dots::<P, F>((gate, up), x, first + row, live, nb) };
        let k = scale.finish(partials);
        let v = silu(g * k) * (u * k);
        if lane() == 0 && live {
            unsafe { *y.add(row) = v };
        }
        group += grid_dim() as usize;
    }
}

/// `[x·G[row], x·U[row]]` (every lane gets them) for the split-layout gate and up matrices
/// `(qs, scales)`: one warp reduces both rows together, so the two products never leave
/// registers. `live == false` skips the loads (a padding row). All lanes must call.
#[inline(always)]
unsafe fn swiglu_dots<P: TargetPolicy, F: SplitFormat>(
    (gate, up): ((*const u32, *const u8), (*const u32, *const u8)),
    x: (*const u32, *const f32),
    row: usize,
    live: bool,
    nb: usize,
) -> [f32; 2] {
    let w = [gate, up].map(|(qs, scales)| WeightRow {
        qs,
        scales,
        row,
        live,
    });
    unsafe { warp_dots_in_flight::<P, F, 2>(&w, x, nb) }
}

/// `y` (`n × rows`) = `x` · Wᵀ with W in split layout `F` and `x` f32, not quantized: each
/// weight block is dequantized in registers and multiplied in f32. Eight times the activation
/// traffic of the Q8_1 path, but no 8-bit activation codes, so two backends computing this
/// agree to float rounding (kiln's `--f32-activations` mode). One row per warp, grid-striding.
/// Launch: [`launch::matvec_groups`](crate::kernels::launch::matvec_groups) over ⌈rows/warps⌉.
pub unsafe fn matvec_split_f32x<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    x: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
) {
    let (nb, t, rows) = (
        (cols / QK as u32) as usize,
        block_idx_y() as usize,
        rows as usize,
    );
    let x_row = unsafe { x.add(t * cols as usize) };
    let lane_part = |row: usize| unsafe { lane_dot_f32x::<F>(qs, scales, row, x_row, nb) };
    unsafe { warp_row_sums::<P>(y.add(t * rows), rows, lane_part) }
}

/// This lane's share of row `row` (split layout `F`, `nb` blocks) dotted with the f32 row
/// `x_row` (16-byte aligned): blocks `lane, lane + 32, ..`, each dequantized in registers.
#[inline(always)]
pub(crate) unsafe fn lane_dot_f32x<F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    row: usize,
    x_row: *const f32,
    nb: usize,
) -> f32 {
    let x_row = x_row as *const u32;
    let mut acc = 0.0;
    let mut b = lane() as usize;
    while b < nb {
        let w = unsafe { load_block_quants::<F>(qs.add((row * nb + b) * F::QS_WORDS)) };
        let mut xv = [0f32; 32];
        unroll::<8>(|k| {
            let v = unsafe { ld_nc_v4(x_row.add(b * 32 + 4 * k)) };
            unroll::<4>(|j| xv[4 * k + j] = f32::from_bits(v[j]));
        });
        acc += F::block_dot_f32(&w, load_side::<F>(scales, row * nb + b), &xv);
        b += WARP as usize;
    }
    acc
}

/// `y` (`n × rows`) = `x` (`n × cols` f32) · Wᵀ with W f16 (`rows × cols`, 16-byte aligned,
/// `cols % 8 == 0`). Each lane takes 8 columns per step. Launch: [`launch::matvec`].
///
/// [`launch::matvec`]: crate::kernels::launch::matvec
pub unsafe fn matvec_f16<P: TargetPolicy>(
    w: *const u16,
    x: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
) {
    unsafe {
        match P::MATVEC_ROWS_PER_WARP {
            1 => matvec_f16_rows::<P, 1>(w, x, y, rows, cols),
            2 => matvec_f16_rows::<P, 2>(w, x, y, rows, cols),
            _ => matvec_f16_rows::<P, 4>(w, x, y, rows, cols),
        }
    }
}

#[inline(always)]
unsafe fn matvec_f16_rows<P: TargetPolicy, const R: usize>(
    w: *const u16,
    x: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
) {
    let (rows, cols, t) = (rows as usize, cols as usize, block_idx_y() as usize);
    let row0 = (block_idx() * P::MATVEC_WARPS + warp_id()) as usize * R;
    let x_row = unsafe { x.add(t * cols) } as *const u32;
    let mut acc = [0f32; R];
    let mut c = lane() as usize;
    while c < cols / 8 {
        let xa = unsafe { ld_nc_v4(x_row.add(c * 8)) };
        let xb = unsafe { ld_nc_v4(x_row.add(c * 8 + 4)) };
        let xv = [xa[0], xa[1], xa[2], xa[3], xb[0], xb[1], xb[2], xb[3]].map(f32::from_bits);
        for (r, a) in acc.iter_mut().enumerate() {
            let row = row0 + r;
            if row < rows {
                let wv = unsafe { ld_nc_v4((w.add(row * cols + c * 8)) as *const u32) };
                for (k, word) in wv.iter().enumerate() {
                    *a += f16_to_f32(*word as u16) * xv[2 * k]
                        + f16_to_f32((*word >> 16) as u16) * xv[2 * k + 1];
                }
            }
        }
        c += WARP as usize;
    }
    for (r, a) in acc.iter().enumerate() {
        let s = warp_sum(*a);
        let row = row0 + r;
        if lane() == 0 && row < rows {
            unsafe { *y.add(t * rows + row) = s };
        }
    }
}
