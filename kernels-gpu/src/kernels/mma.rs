//! Prefill GEMM on f16 tensor cores: `y` (`n × rows`) = `x` · Wᵀ (or `y +=`), W in split layout
//! `F`, `x` in f16 (see [`to_f16`](crate::kernels::elementwise::to_f16)).
//!
//! Weights are dequantized to f16 in registers as they are fed to `mma.m16n8k16`: each element
//! is `d·(q − 8)` (or `d·q + m`) rounded once, so the whole reduction over k runs on the tensor
//! cores in f32. (An int8 GEMM on Q8_1 activations needs the per-32-block f32 scaling of every
//! output element, ~3 instructions per 16×8×32 mma: that issue rate bounded it at ~120 TOP/s on
//! an H200; here a block's scales cost one f16x2 multiply per two weights, shared by all the
//! tokens of a warp tile.)
//!
//! Element order: the sum over k does not care how a block's 32 elements are dealt to the
//! fragment slots, only that A and B agree. Lane `t` of a quad takes, for k-step `s` (0, 1) of a
//! block, elements `16s + 4t .. 16s + 4t + 4` — one quant word for both Q4 steps (low and high
//! nibbles) and one per step for Q8 ([`SplitFormat::step_word`]); pairs (0, 1) go to the
//! fragment's "k = 2t, 2t+1" registers and (2, 3) to "k = 2t+8, 2t+9". Then a lane's B operand for
//! a step is 4 consecutive activations: one 8-byte shared-memory load.
//!
//! A block computes `TILE_M` rows × `TILE_N` tokens; each of its `GEMM_WARPS` warps owns a
//! `GEMM_WARP_M × GEMM_WARP_N` sub-tile. The reduction runs in stages of `TILE_K` elements
//! through a ring of `STAGES` shared-memory buffers, loads running `STAGES − 1` stages ahead:
//! quants and activations by 16-byte `cp.async`, weight scales by plain loads held in registers
//! over one stage's compute (an f16 scale sits at any 2-byte offset, below `cp.async`'s 4-byte
//! minimum). Rows and tokens past the edge load the last valid one (finite data; their results
//! are not stored).
use crate::device::*;
use crate::kernels::formats::{QK, SplitFormat, SplitOut, biased_f16x2, load_side, pick_matrix};
use policies::{MmaShape, TargetPolicy};

/// u32 words of one 16-byte activation plane (8 elements of each of `TILE_N` tokens), padded
/// by 64 bytes so the two planes a half-warp's 8-byte loads touch fall in different banks.
const fn x_plane_words<P: TargetPolicy>() -> u32 {
    4 * P::TILE_N + 16
}

/// 32-bit words of one shared-memory stage, for weights with `qs_words` words of quants and
/// `staged` words of scales ([`SplitFormat::STAGED_WORDS`]) per block. Per quant block `j` of
/// the stage, each a plane per 16 bytes so that the 8 rows × 4 words a quad-strided load
/// touches fall in 32 distinct banks: weight quants `[j][qs_words/4][TILE_M][4]`, weight scales
/// `[j][TILE_M][staged]` (`d·(1,1), m·(1,1)` as f16x2, then any high bits), activations
/// `[j][4][x_plane_words]` (plane p: elements 8p..8p+8 of each token).
pub const fn stage_words<P: TargetPolicy>(qs_words: u32, staged: u32) -> u32 {
    let kb = P::TILE_K / QK as u32;
    kb * (qs_words * P::TILE_M + staged * P::TILE_M + 4 * x_plane_words::<P>())
}

/// Dynamic shared memory of one GEMM block: the stages, or, if more, the k groups' sums
/// (`k_group_sums`), which reuse the stages' bytes once the reduction is done.
pub const fn smem_bytes<P: TargetPolicy>(qs_words: u32, staged: u32) -> u32 {
    let stages = P::STAGES * stage_words::<P>(qs_words, staged) * 4;
    let sums =
        (P::GEMM_WARPS - P::GEMM_WARPS / P::GEMM_K_GROUPS) * P::GEMM_WARP_M * P::GEMM_WARP_N * 4;
    if sums > stages { sums } else { stages }
}

/// Scale entries one thread loads per stage, held in registers (compile-time bound).
const MAX_STAGED: usize = 4;
/// Quant blocks one stage may hold (`TILE_K / 32`; compile-time bound of the unrolled k-loop).
const MAX_STAGE_BLOCKS: usize = 8;

/// Up to three GEMMs over the same activations in one launch (the q, k and v projections;
/// gate and up): `y_m` (`n × rows_m`) = `x` · W_mᵀ for each matrix `m` with `rows_m > 0`, or
/// `y_m +=` when `acc != 0`. W_m (`rows_m × cols`, quants 16-byte aligned) in split layout `F`,
/// `x` (`n × cols` f16, 16-byte aligned rows). One launch fills the machine where a small
/// matrix alone would not (1024 rows are 8 row tiles: 64 blocks at 512 tokens on 132 SMs), and
/// the activations are converted to f16 once. Launch: [`launch::mma`](crate::kernels::launch::mma)
/// over the row tiles of all matrices.
///
/// With `splits > 1` the reduction over k is split too (grid y = row tiles × `splits`): a
/// launch with fewer tiles than SMs (a short prompt's q/k/v, o and down) still fills the
/// machine without re-reading its activations per row tile, as narrower tiles would. Each
/// block leaves its share in `parts` ([`launch::mma_split_k_scratch`] floats) and the warp
/// that completes a warp tile adds the shares in split order, so the result does not depend
/// on which block finished last; `counters` (one u32 per warp tile, zero) are zero again when
/// the launch ends.
///
/// [`launch::mma_split_k_scratch`]: crate::kernels::launch::mma_split_k_scratch
#[inline(always)] // else LLVM keeps it out of line once its three instantiations grow
#[allow(clippy::too_many_arguments)] // the entry's parameter list, as the kernel table passes it
pub unsafe fn mma_split<P: TargetPolicy, F: SplitFormat>(
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
    x: *const u32,
    cols: u32,
    n: u32,
    acc: u32,
    splits: u32,
    parts: *mut f32,
    counters: *mut u32,
) {
    const { assert!(P::Mma::M == 16 && P::Mma::N == 8 && P::Mma::K == 16) };
    let splits = if P::GEMM_SPLIT_K_EPILOGUE { splits } else { 1 };
    // Row tiles are numbered across the matrices in turn (grid y), then by split.
    let mats = [
        (w0, s0, y0, rows0),
        (w1, s1, y1, rows1),
        (w2, s2, y2, rows2),
    ]
    .map(SplitOut::from);
    let row_tiles = mats.map(|m| m.rows.div_ceil(P::TILE_M));
    let row_tiles = (row_tiles[0] + row_tiles[1] + row_tiles[2]).max(1); // no divide-by-zero path
    let (split, ty) = match splits > 1 {
        true => (block_idx_y() / row_tiles, block_idx_y() % row_tiles),
        false => (0, block_idx_y()),
    };
    let Some((m, tile_m)) = pick_matrix(mats, |r| r.div_ceil(P::TILE_M), ty) else {
        return; // a grid larger than the tiles: the whole block leaves
    };
    let (qs, scales, y, rows) = (m.qs, m.scales, m.y, m.rows);
    let a = Args {
        qs,
        scales,
        x,
        y,
        rows,
        cols,
        n,
        acc: acc != 0,
        row0: tile_m * P::TILE_M,
        // Token tiles run fastest through the grid: the blocks of one weight tile are resident
        // together and share its bytes in L2, so the weights stream from memory about once.
        tok0: block_idx() * P::TILE_N,
        expert_row0: 0,
        order: core::ptr::null(),
        order_div: 1,
        up_qs: core::ptr::null(),
        up_scales: core::ptr::null(),
        yh: core::ptr::null_mut(),
        k: SplitK {
            split,
            splits: splits.max(1),
            tile: ty * grid_dim() + block_idx(),
            tiles: row_tiles * grid_dim(),
            parts,
            counters,
        },
    };
    unsafe { tile_for::<P, F, false>(a) }
}

/// The first half of a SwiGLU feed-forward in one GEMM: `y` (`n × rows`) = `silu(x·Gᵀ) ⊙
/// (x·Uᵀ)`, also written to `yh` rounded to f16 (the down projection's GEMM input, so no
/// `to_f16` of its own). G and U (`rows × cols` each, split layout `F`) share each block's weight
/// tile: 16 gate rows, then the same 16 up rows, and so on (`Args::tile_row`), so a warp's two
/// 16-row fragments are the two factors of the same outputs and the product needs no exchange.
/// `silu` and the f16 rounding are the `swiglu` and `to_f16` kernels' own, so the outputs are
/// those of the unfused launches bit for bit. Launch:
/// [`launch::mma_swiglu`](crate::kernels::launch::mma_swiglu).
#[allow(clippy::too_many_arguments)] // the entry's parameter list
pub unsafe fn mma_swiglu_split<P: TargetPolicy, F: SplitFormat>(
    gate_qs: *const u32,
    gate_scales: *const u8,
    up_qs: *const u32,
    up_scales: *const u8,
    y: *mut f32,
    yh: *mut u16,
    rows: u32,
    x: *const u32,
    cols: u32,
    n: u32,
) {
    const { assert!(P::Mma::M == 16 && P::Mma::N == 8 && P::Mma::K == 16) };
    const {
        assert!(
            P::GEMM_WARP_M == 32,
            "a paired warp tile is 16 gate + 16 up rows"
        )
    };
    let a = Args {
        qs: gate_qs,
        scales: gate_scales,
        x,
        y,
        rows,
        cols,
        n,
        acc: false,
        row0: block_idx_y() * (P::TILE_M / 2),
        tok0: block_idx() * P::TILE_N,
        expert_row0: 0,
        order: core::ptr::null(),
        order_div: 1,
        up_qs,
        up_scales,
        yh,
        k: SplitK::NONE,
    };
    unsafe { tile_for::<P, F, true>(a) }
}

/// The grouped GEMM of a mixture-of-experts layer over the route's slots sorted by expert
/// (`moe::moe_sort`): for each sorted position `p` of expert `e`'s run, slot `s = order[p]`,
/// `y_m[s] = x[s / order_div] · W_m,eᵀ` (`rows` wide), W_m,e being rows `e·rows ..` of the
/// stacked `[n_expert·rows, cols]` matrix `m` (`n_mats` of them: 2 for gate and up, 1 for
/// down). `order_div` is `k` when `x` holds one row per token (gate/up read the token's
/// activations) and 1 when it holds one per slot (down reads the slot's SwiGLU). Block x takes
/// token tile x of the `tiles` table `moe_sort` wrote (`[expert, first, end)` sorted positions;
/// `u32::MAX` past the last tile), block y a row tile of one matrix. The tile body is the dense
/// GEMM's: only which rows of `x` and `y` a token column reads and writes differ. Launch:
/// [`launch::moe_mma`](crate::kernels::launch::moe_mma).
#[allow(clippy::too_many_arguments)] // the entry's parameter list
pub unsafe fn moe_mma_split<P: TargetPolicy, F: SplitFormat>(
    w0: *const u32,
    s0: *const u8,
    y0: *mut f32,
    w1: *const u32,
    s1: *const u8,
    y1: *mut f32,
    n_mats: u32,
    rows: u32,
    x: *const u32,
    cols: u32,
    order: *const u32,
    order_div: u32,
    tiles: *const u32,
) {
    const { assert!(P::Mma::M == 16 && P::Mma::N == 8 && P::Mma::K == 16) };
    let tile = unsafe { tiles.add(MOE_TILE_WORDS * block_idx() as usize) };
    let (expert, first, end) = unsafe { (*tile, *tile.add(1), *tile.add(2)) };
    let tiles_m = rows.div_ceil(P::TILE_M);
    let m = block_idx_y() / tiles_m;
    if expert == u32::MAX || m >= n_mats {
        return; // past the last token tile: the whole block leaves
    }
    let (qs, scales, y) = if m == 0 { (w0, s0, y0) } else { (w1, s1, y1) };
    let a = Args {
        qs,
        scales,
        x,
        y,
        rows,
        cols,
        n: end,
        acc: false,
        row0: (block_idx_y() % tiles_m) * P::TILE_M,
        tok0: first,
        expert_row0: expert * rows,
        order,
        order_div,
        up_qs: core::ptr::null(),
        up_scales: core::ptr::null(),
        yh: core::ptr::null_mut(),
        k: SplitK::NONE,
    };
    unsafe { tile_for::<P, F, false>(a) }
}

/// u32 words of one entry of `moe_sort`'s token-tile table: expert, first and end position.
pub const MOE_TILE_WORDS: usize = 3;

/// The tile body for the policy's warp tile in fragments, as const generics so accumulators and
/// fragments are fixed-size register arrays (`policies::check` admits exactly these).
#[inline(always)]
unsafe fn tile_for<P: TargetPolicy, F: SplitFormat, const PAIR: bool>(a: Args) {
    unsafe {
        match (P::GEMM_WARP_M / 16, P::GEMM_WARP_N / 8) {
            (1, 2) => tile::<P, F, 1, 2, PAIR>(a),
            (1, 4) => tile::<P, F, 1, 4, PAIR>(a),
            (1, 8) => tile::<P, F, 1, 8, PAIR>(a),
            (2, 2) => tile::<P, F, 2, 2, PAIR>(a),
            (2, 4) => tile::<P, F, 2, 4, PAIR>(a),
            (2, 8) => tile::<P, F, 2, 8, PAIR>(a),
            (4, 2) => tile::<P, F, 4, 2, PAIR>(a),
            (4, 4) => tile::<P, F, 4, 4, PAIR>(a),
            _ => tile::<P, F, 4, 8, PAIR>(a),
        }
    }
}

#[derive(Clone, Copy)]
struct Args {
    qs: *const u32,
    scales: *const u8,
    x: *const u32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    n: u32,
    acc: bool,
    /// The block's first row of its matrix.
    row0: u32,
    /// The block's first token column: a token `t` of `tok0 .. n`.
    tok0: u32,
    /// Where the matrix starts in the weights (an expert's rows of a stacked matrix; else 0).
    expert_row0: u32,
    /// Null: token `t` is row `t` of `x` and `y`. Else (grouped GEMM) slot `order[t]`, row
    /// `order[t] / order_div` of `x` and `order[t]` of `y`.
    order: *const u32,
    order_div: u32,
    /// The paired GEMM ([`mma_swiglu_split`]): `qs`/`scales` are the gate matrix, these the up
    /// matrix, and `yh` takes the SwiGLU output in f16 beside `y`'s f32 (null otherwise).
    up_qs: *const u32,
    up_scales: *const u8,
    yh: *mut u16,
    k: SplitK,
}

/// Which share of the reduction over k a block computes ([`mma_split`]'s `splits`).
#[derive(Clone, Copy)]
struct SplitK {
    /// This block's share: stages `split·⌈stages/splits⌉ ..` of the tile's reduction.
    split: u32,
    splits: u32,
    /// The block's tile among the launch's `tiles` (row tile × token tile).
    tile: u32,
    tiles: u32,
    parts: *mut f32,
    counters: *mut u32,
}

impl SplitK {
    /// The whole reduction in one block.
    const NONE: SplitK = SplitK {
        split: 0,
        splits: 1,
        tile: 0,
        tiles: 1,
        parts: core::ptr::null_mut(),
        counters: core::ptr::null_mut(),
    };
}

impl Args {
    /// The row of `x` token column `t` reads.
    #[inline(always)]
    fn x_row(&self, t: u32) -> u32 {
        match self.order.is_null() {
            true => t,
            false => unsafe { *self.order.add(t as usize) / self.order_div },
        }
    }

    /// The row of `y` token column `t` writes.
    #[inline(always)]
    fn y_row(&self, t: u32) -> u32 {
        match self.order.is_null() {
            true => t,
            false => unsafe { *self.order.add(t as usize) },
        }
    }

    /// Row `r` of the block's matrix as a row of the weights, clamped to the last valid one.
    #[inline(always)]
    fn weight_row(&self, r: u32) -> u32 {
        self.expert_row0 + r.min(self.rows - 1)
    }

    /// Where row `r` of the block's weight tile comes from: quants, scales and weight row. A
    /// paired tile ([`mma_swiglu_split`]) interleaves 16 gate rows and the same 16 up rows, so
    /// a 32-row warp tile holds both factors of 16 outputs in the same fragment slots.
    #[inline(always)]
    fn tile_row<const PAIR: bool>(&self, row0: u32, r: u32) -> (*const u32, *const u8, u32) {
        if PAIR {
            let row = self.weight_row(row0 + r / 32 * 16 + r % 16);
            match (r / 16) % 2 {
                0 => (self.qs, self.scales, row),
                _ => (self.up_qs, self.up_scales, row),
            }
        } else {
            (self.qs, self.scales, self.weight_row(row0 + r))
        }
    }
}

/// Where one stage lives in shared memory.
#[derive(Clone, Copy)]
struct Stage {
    wq: *mut u32,
    ws: *mut u32,
    x: *mut u32,
}

impl Stage {
    #[inline(always)]
    fn at<P: TargetPolicy, F: SplitFormat>(slot: u32) -> Stage {
        let kb = P::TILE_K / QK as u32;
        let words = stage_words::<P>(F::QS_WORDS as u32, F::STAGED_WORDS as u32);
        let wq = unsafe { shared_mem::<u32>().add((slot * words) as usize) };
        let ws = unsafe { wq.add((kb * F::QS_WORDS as u32 * P::TILE_M) as usize) };
        let x = unsafe { ws.add((kb * F::STAGED_WORDS as u32 * P::TILE_M) as usize) };
        Stage { wq, ws, x }
    }
}

/// The problem as one block sees it.
#[derive(Clone, Copy)]
struct Problem {
    a: Args,
    nb: u32,
    row0: u32,
    tok0: u32,
    /// The block's first stage (its split's share of k); `st` arguments below count from it.
    st0: u32,
}

impl Problem {
    /// Issue the `cp.async` copies of stage `st`'s weight quants and activations into `dst`.
    #[inline(always)]
    unsafe fn copy_stage<P: TargetPolicy, F: SplitFormat, const PAIR: bool>(
        &self,
        st: u32,
        dst: Stage,
    ) {
        let kb = P::TILE_K / QK as u32;
        let threads = P::GEMM_WARPS * WARP;
        let hw = F::QS_WORDS as u32 / 4;
        // 16-byte chunks, half-block fastest (a Q8 block's 32 contiguous bytes go to neighbouring
        // threads), then row: consecutive threads fill consecutive 16-byte shared slots.
        let st = self.st0 + st;
        let mut c = thread_idx();
        while c < P::TILE_M * kb * hw {
            let (h, r, j) = (c % hw, (c / hw) % P::TILE_M, c / (hw * P::TILE_M));
            let b = st * kb + j;
            if b < self.nb {
                let (qs, _, row) = self.a.tile_row::<PAIR>(self.row0, r);
                let src =
                    unsafe { qs.add(((row * self.nb + b) * F::QS_WORDS as u32 + 4 * h) as usize) };
                unsafe {
                    cp_async_16(
                        dst.wq.add((((j * hw + h) * P::TILE_M + r) * 4) as usize),
                        src,
                    )
                };
            }
            c += threads;
        }
        // Activations: 64 bytes per token and block, as 4 chunks (planes). Token columns past
        // `n` get zeros, not a copy: had they all loaded the last token's row, every block
        // would read that one line for each such column at once, an L2 hot spot that made a
        // 20-token prompt's GEMMs slower than a 120-token one's (docs/benchmarks.md, session
        // 29). Their outputs are not stored; an mma column depends on its own token only.
        let mut c = thread_idx();
        while c < P::TILE_N * kb * 4 {
            let (p, t, j) = (c % 4, (c / 4) % P::TILE_N, c / (4 * P::TILE_N));
            let b = st * kb + j;
            if b < self.nb {
                let to = unsafe {
                    dst.x
                        .add(((j * 4 + p) * x_plane_words::<P>() + 4 * t) as usize)
                };
                if self.tok0 + t < self.a.n {
                    let tok = self.a.x_row(self.tok0 + t);
                    let src = unsafe {
                        self.a
                            .x
                            .add((tok * (self.a.cols / 2) + b * 16 + 4 * p) as usize)
                    };
                    unsafe { cp_async_16(to, src) };
                } else {
                    unsafe { *(to as *mut [u32; 4]) = [0; 4] };
                }
            }
            c += threads;
        }
    }

    /// Entry `i` of this thread's share of a stage's `TILE_M × kb` weight scales, as (row,
    /// block in stage); `None` past the stage or past the last block.
    #[inline(always)]
    fn staged_entry<P: TargetPolicy>(&self, st: u32, i: usize) -> Option<(u32, u32)> {
        let kb = P::TILE_K / QK as u32;
        // A compile-time trip count: entries no thread has are not even tested.
        if i as u32 >= (P::TILE_M * kb).div_ceil(P::GEMM_WARPS * WARP) {
            return None;
        }
        let e = thread_idx() + i as u32 * P::GEMM_WARPS * WARP;
        let (r, j) = (e % P::TILE_M, e / P::TILE_M);
        (j < kb && (self.st0 + st) * kb + j < self.nb).then_some((r, j))
    }

    /// This thread's block sides of stage `st`, loaded now and stored after the compute.
    #[inline(always)]
    unsafe fn load_scales<P: TargetPolicy, F: SplitFormat, const PAIR: bool>(
        &self,
        st: u32,
    ) -> [F::Side; MAX_STAGED] {
        let kb = P::TILE_K / QK as u32;
        let mut s = [F::Side::default(); MAX_STAGED];
        unroll::<MAX_STAGED>(|i| {
            if let Some((r, j)) = self.staged_entry::<P>(st, i) {
                let (_, scales, row) = self.a.tile_row::<PAIR>(self.row0, r);
                let blk = (row * self.nb + (self.st0 + st) * kb + j) as usize;
                s[i] = load_side::<F>(scales, blk);
            }
        });
        s
    }

    #[inline(always)]
    unsafe fn store_scales<P: TargetPolicy, F: SplitFormat>(
        &self,
        st: u32,
        s: &[F::Side; MAX_STAGED],
        dst: Stage,
    ) {
        unroll::<MAX_STAGED>(|i| {
            if let Some((r, j)) = self.staged_entry::<P>(st, i) {
                let words = F::staged(s[i]);
                let o = (F::STAGED_WORDS as u32 * (j * P::TILE_M + r)) as usize;
                unroll::<4>(|k| {
                    if k < F::STAGED_WORDS {
                        unsafe { *dst.ws.add(o + k) = words[k] };
                    }
                });
            }
        });
    }
}

/// The kernel body for a warp tile of `MI × NI` mma tiles (16 rows × 8 tokens each).
#[inline(always)]
unsafe fn tile<
    P: TargetPolicy,
    F: SplitFormat,
    const MI: usize,
    const NI: usize,
    const PAIR: bool,
>(
    a: Args,
) {
    let kb = P::TILE_K / QK as u32;
    const {
        assert!(P::TILE_M * P::TILE_K / (QK as u32) <= (MAX_STAGED as u32) * P::GEMM_WARPS * WARP);
        assert!(smem_bytes::<P>(8, 2) <= P::MAX_SMEM_PER_BLOCK);
        assert!(
            smem_bytes::<P>(F::QS_WORDS as u32, F::STAGED_WORDS as u32) <= P::MAX_SMEM_PER_BLOCK
        );
        assert!(P::TILE_K / (QK as u32) <= MAX_STAGE_BLOCKS as u32);
    };
    let nb = a.cols / QK as u32;
    // A split's share of the stages (the last may be short, or even empty).
    let per_split = nb.div_ceil(kb).div_ceil(a.k.splits);
    let st0 = a.k.split * per_split;
    let pr = Problem {
        a,
        nb,
        row0: a.row0,
        tok0: a.tok0,
        st0,
    };
    // Warp `w` computes warp tile `w % tile_warps` over k group `w / tile_warps`'s blocks.
    let tile_warps = P::GEMM_WARPS / P::GEMM_K_GROUPS;
    let (tw, k_group) = match P::GEMM_K_GROUPS {
        1 => (warp_id(), 0), // folds the group's offsets away
        _ => (warp_id() % tile_warps, warp_id() / tile_warps),
    };
    let warps_m = P::TILE_M / P::GEMM_WARP_M;
    let (wr0, wt0) = (
        (tw % warps_m) * P::GEMM_WARP_M,
        (tw / warps_m) * P::GEMM_WARP_N,
    );
    let hw = F::QS_WORDS as u32 / 4;
    let (g, t) = (lane() / 4, lane() % 4);
    let stages = per_split.min(nb.div_ceil(kb).saturating_sub(st0));
    // A warp whose tokens all lie past the tile's last one skips its dequantization and mma
    // (warp-uniform; the loads and barriers still run for all). That is most of a grouped
    // GEMM's tiles (an expert's run is often far shorter than TILE_N), and half the warps of
    // a short prompt's only tile. Skipping per 8-token mma tile as well measured +30
    // registers in ptxas (sm_90: 124 → 159, one block per SM), so not done.
    let warp_live = pr.tok0 + wt0 < a.n;

    // Prologue: the first STAGES − 1 stages in flight. One commit per stage, empty or not, so
    // "stage st has landed" is always "at most STAGES − 2 newer groups are pending".
    for st in 0..P::STAGES - 1 {
        if st < stages {
            unsafe {
                pr.copy_stage::<P, F, PAIR>(st, Stage::at::<P, F>(st));
                let s = pr.load_scales::<P, F, PAIR>(st);
                pr.store_scales::<P, F>(st, &s, Stage::at::<P, F>(st));
            }
        }
        cp_async_commit();
    }

    let mut acc = [[[0f32; 4]; NI]; MI];
    for st in 0..stages {
        cp_async_wait(P::STAGES - 2);
        // Stage st is visible to all, and every warp is done with stage st − 1, whose slot the
        // loads below reuse.
        sync_threads();
        let next = st + P::STAGES - 1;
        let next_slot = Stage::at::<P, F>(next % P::STAGES);
        let staged = if next < stages {
            unsafe { pr.copy_stage::<P, F, PAIR>(next, next_slot) };
            unsafe { pr.load_scales::<P, F, PAIR>(next) }
        } else {
            [F::Side::default(); MAX_STAGED]
        };
        cp_async_commit();

        let cur = Stage::at::<P, F>(st % P::STAGES);
        // Unrolled (`kb` is a constant per policy): every shared-memory offset below becomes an
        // immediate instead of per-load address arithmetic (plus, with k groups, the group's
        // one offset: its blocks are `k_group`, `k_group + GEMM_K_GROUPS`, ...).
        unroll::<MAX_STAGE_BLOCKS>(
            #[inline(always)]
            |jj| {
                let j = jj as u32 * P::GEMM_K_GROUPS + k_group;
                if jj as u32 >= kb / P::GEMM_K_GROUPS || (st0 + st) * kb + j >= nb || !warp_live {
                    return; // the same for the whole block (the k tail) or warp
                }
                // A fragments of both k-steps: a[mi][s] = (row g, pair 0), (g+8, pair 0), (g, pair 1),
                // (g+8, pair 1), dequantized once and used by all NI token tiles.
                let mut frag = [[[0u32; 4]; 2]; MI];
                unroll::<MI>(
                    #[inline(always)]
                    |mi| {
                        unroll::<2>(
                            #[inline(always)]
                            |h| {
                                let row = wr0 + 16 * mi as u32 + g + 8 * h as u32;
                                let so = (F::STAGED_WORDS as u32 * (j * P::TILE_M + row)) as usize;
                                let sc: [u32; 4] = core::array::from_fn(|k| {
                                    if k < F::STAGED_WORDS {
                                        unsafe { *cur.ws.add(so + k) }
                                    } else {
                                        0
                                    }
                                });
                                unroll::<2>(
                                    #[inline(always)]
                                    |s| {
                                        let w = F::step_word(s as u32, t);
                                        let word = unsafe {
                                            *cur.wq.add(
                                                (((j * hw + w / 4) * P::TILE_M + row) * 4 + w % 4)
                                                    as usize,
                                            )
                                        };
                                        let codes = F::step_codes(word, s as u32, t, sc);
                                        frag[mi][s][h] =
                                            F::dequant_f16x2(biased_f16x2(codes, 0), s as u32, sc);
                                        frag[mi][s][2 + h] =
                                            F::dequant_f16x2(biased_f16x2(codes, 2), s as u32, sc);
                                    },
                                )
                            },
                        )
                    },
                );
                unroll::<NI>(
                    #[inline(always)]
                    |ni| {
                        unroll::<2>(
                            #[inline(always)]
                            |s| {
                                // Elements 16s + 4t .. + 4 of token g: plane 2s + t/2, half t%2 of its 16 bytes.
                                let tok = wt0 + 8 * ni as u32 + g;
                                let o = (j * 4 + 2 * s as u32 + t / 2) * x_plane_words::<P>()
                                    + 4 * tok
                                    + 2 * (t % 2);
                                let v = unsafe { *(cur.x.add(o as usize) as *const u64) }; // o is even
                                let b = [v as u32, (v >> 32) as u32];
                                unroll::<MI>(
                                    #[inline(always)]
                                    |mi| {
                                        acc[mi][ni] =
                                            mma_m16n8k16_f32_f16(frag[mi][s], b, acc[mi][ni])
                                    },
                                );
                            },
                        )
                    },
                );
            },
        );
        if next < stages {
            unsafe { pr.store_scales::<P, F>(next, &staged, next_slot) };
        }
    }

    if P::GEMM_K_GROUPS > 1 && !unsafe { k_group_sums::<P, MI, NI>(&mut acc, tw, k_group) } {
        return;
    }
    // A warp with no live token has nothing to store in any split, so it skips the count too.
    if !PAIR
        && a.k.splits > 1
        && !(warp_live && unsafe { split_k_sums::<P, MI, NI>(&mut acc, &a.k, tw) })
    {
        return;
    }
    // C fragment: element i is (row g + 8·(i/2), token 2t + i%2).
    if PAIR {
        // Fragment 0 holds 16 gate rows, fragment 1 the same 16 up rows (`Args::tile_row`).
        if MI == 2 {
            unroll::<NI>(|ni| {
                unroll::<4>(|i| {
                    let row = pr.row0 + wr0 / 2 + g + 8 * (i as u32 / 2);
                    let tok = pr.tok0 + wt0 + 8 * ni as u32 + 2 * t + i as u32 % 2;
                    if row < a.rows && tok < a.n {
                        let v = silu(acc[0][ni][i]) * acc[1 % MI][ni][i];
                        let at = (tok * a.rows + row) as usize;
                        unsafe { (*a.y.add(at), *a.yh.add(at)) = (v, f32_to_f16(v)) };
                    }
                })
            });
        }
        return;
    }
    each_acc::<MI, NI>(
        #[inline(always)]
        |mi, ni, i| {
            let row = pr.row0 + wr0 + 16 * mi as u32 + g + 8 * (i as u32 / 2);
            let tok = pr.tok0 + wt0 + 8 * ni as u32 + 2 * t + i as u32 % 2;
            if row < a.rows && tok < a.n {
                let out = unsafe { a.y.add((a.y_row(tok) * a.rows + row) as usize) };
                let v = acc[mi][ni][i];
                unsafe { *out = if a.acc { *out + v } else { v } };
            }
        },
    );
}

/// Calls `f(mi, ni, i)` for element `i` of every accumulator fragment of an `MI`×`NI` warp
/// tile, fully unrolled: indexing the accumulators with loop counters would move them from
/// registers to local memory. `f` must be `#[inline(always)]` for the same reason.
#[inline(always)]
fn each_acc<const MI: usize, const NI: usize>(mut f: impl FnMut(usize, usize, usize)) {
    unroll::<MI>(
        #[inline(always)]
        |mi| {
            unroll::<NI>(
                #[inline(always)]
                |ni| {
                    unroll::<4>(
                        #[inline(always)]
                        |i| f(mi, ni, i),
                    )
                },
            )
        },
    );
}

/// Adds the k groups' accumulators of each warp tile, in group order, into group 0's `acc`
/// through shared memory (the stages' bytes: every `cp.async` has landed and every warp is past
/// its last stage once the first barrier is passed). Returns whether this warp holds the sums
/// (group 0), which then stores them. Every thread of the block must call.
#[inline(always)]
unsafe fn k_group_sums<P: TargetPolicy, const MI: usize, const NI: usize>(
    acc: &mut [[[f32; 4]; NI]; MI],
    tile_warp: u32,
    k_group: u32,
) -> bool {
    let tile_warps = P::GEMM_WARPS / P::GEMM_K_GROUPS;
    // Lane-fastest: a warp's 32 stores or loads of one accumulator element hit 32 banks.
    let slot = |group: u32, e: usize| {
        ((((group - 1) * tile_warps + tile_warp) as usize * MI * NI * 4 + e) * WARP as usize)
            + lane() as usize
    };
    let sums = shared_mem::<f32>();
    cp_async_wait(0);
    sync_threads();
    if k_group > 0 {
        each_acc::<MI, NI>(
            #[inline(always)]
            |mi, ni, i| unsafe {
                *sums.add(slot(k_group, (mi * NI + ni) * 4 + i)) = acc[mi][ni][i]
            },
        );
    }
    sync_threads();
    if k_group > 0 {
        return false;
    }
    for group in 1..P::GEMM_K_GROUPS {
        each_acc::<MI, NI>(
            #[inline(always)]
            |mi, ni, i| acc[mi][ni][i] += unsafe { *sums.add(slot(group, (mi * NI + ni) * 4 + i)) },
        );
    }
    true
}

/// Split-K ([`mma_split`]'s `splits`): leaves this warp's share of its warp tile in `parts` and
/// counts it in; the warp that completes the count replaces `acc` by the shares' sum in split
/// order (whichever block came last, the same sum) and resets the counter for the next launch.
/// Returns whether this warp holds the sum, which it then stores. Every lane must call.
#[inline(always)]
unsafe fn split_k_sums<P: TargetPolicy, const MI: usize, const NI: usize>(
    acc: &mut [[[f32; 4]; NI]; MI],
    k: &SplitK,
    tile_warp: u32,
) -> bool {
    let tile_warps = P::GEMM_WARPS / P::GEMM_K_GROUPS;
    let slot = (k.tile * tile_warps + tile_warp) as usize;
    let words = MI * NI * 4 * WARP as usize;
    // Lane-fastest: one warp's store or load of an accumulator element is one 128-byte line.
    let at = |split: u32, e: usize| share_word(k, tile_warps, slot, words, split, e);
    each_acc::<MI, NI>(
        #[inline(always)]
        |mi, ni, i| unsafe { *k.parts.add(at(k.split, (mi * NI + ni) * 4 + i)) = acc[mi][ni][i] },
    );
    // Every lane's share is visible GPU-wide before lane 0 counts it in.
    fence_gpu();
    sync_warp();
    let before = match lane() {
        0 => unsafe { atomic_add_u32(k.counters.add(slot), 1) },
        _ => 0,
    };
    if shfl_idx_u32(before, 0) != k.splits - 1 {
        return false;
    }
    fence_gpu();
    // One 16-row fragment's accumulators at a time: all of a share's loads in flight at once
    // would hold a second copy of the accumulators and push the whole kernel past the main
    // tile's 128 registers.
    unroll::<MI>(
        #[inline(always)]
        |mi| {
            for split in 0..k.splits {
                unroll::<NI>(
                    #[inline(always)]
                    |ni| {
                        unroll::<4>(
                            #[inline(always)]
                            |i| {
                                let v = unsafe {
                                    ld_cg_f32(k.parts.add(at(split, (mi * NI + ni) * 4 + i)))
                                };
                                acc[mi][ni][i] = if split == 0 { v } else { acc[mi][ni][i] + v };
                            },
                        )
                    },
                )
            }
        },
    );
    if lane() == 0 {
        unsafe { *k.counters.add(slot) = 0 };
    }
    true
}

/// Where element `e` of this lane's accumulators lies in split `split`'s share of warp-tile
/// `slot` (`words` accumulators per warp tile).
#[inline(always)]
fn share_word(
    k: &SplitK,
    tile_warps: u32,
    slot: usize,
    words: usize,
    split: u32,
    e: usize,
) -> usize {
    let share = split as usize * (k.tiles * tile_warps) as usize + slot;
    share * words + e * WARP as usize + lane() as usize
}
