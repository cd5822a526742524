//! Launch shapes, computed from the same policy constants the kernels are compiled with. The
//! CUDA runtime and the host grid executor both launch through these, so a kernel and its
//! launch can never disagree about warps, rows per block or shared memory.
use crate::kernels::attention;
use crate::kernels::norm::ROW_CHUNKS;
use policies::{TargetPolicy, WARP, matvec_rows_per_block};

/// A launch: 2-D grid of 1-D blocks plus dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub grid_x: u32,
    pub grid_y: u32,
    pub block: u32,
    pub shared_bytes: u32,
}

impl Dims {
    /// Blocks in the grid (saturating: no launchable grid comes near `u32::MAX`).
    pub const fn blocks(&self) -> u32 {
        self.grid_x.saturating_mul(self.grid_y)
    }
}

const fn div_ceil(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}

/// Mat-vec (any weight format): `rows` outputs for each of `n` activation rows, one block per
/// row group.
pub const fn matvec<P: TargetPolicy>(rows: u32, n: u32) -> Dims {
    Dims {
        grid_x: div_ceil(rows, matvec_rows_per_block::<P>()),
        grid_y: n,
        block: P::MATVEC_WARPS * WARP,
        shared_bytes: 0,
    }
}

/// The split-format mat-vec on a device with `sms` multiprocessors: at most one resident wave
/// (`P::MATVEC_BLOCKS_PER_SM` per SM); the kernel strides over the remaining row groups.
pub const fn matvec_resident<P: TargetPolicy>(rows: u32, n: u32, sms: u32) -> Dims {
    let all = matvec::<P>(rows, n);
    let wave = sms * P::MATVEC_BLOCKS_PER_SM;
    Dims {
        grid_x: if all.grid_x < wave { all.grid_x } else { wave },
        ..all
    }
}

/// Whether a split mat-vec of `rows` takes the wide instantiation (`matvec_split_wide`) on
/// `sms` multiprocessors: its row groups of `MATVEC_WIDE_ROWS_PER_WARP` rows per warp still
/// give every SM `MATVEC_WIDE_MIN_BLOCKS_PER_SM` blocks (never when that is 0).
pub const fn matvec_takes_wide<P: TargetPolicy>(rows: u32, sms: u32) -> bool {
    let groups = div_ceil(rows, P::MATVEC_WARPS * P::MATVEC_WIDE_ROWS_PER_WARP) as u64;
    P::MATVEC_WIDE_MIN_BLOCKS_PER_SM > 0
        && groups >= sms as u64 * P::MATVEC_WIDE_MIN_BLOCKS_PER_SM as u64
}

/// [`matvec_groups`] for the wide mat-vecs (`matvec_split_wide` over one matrix,
/// `matvec3_split_wide` over up to three) over matrices of `rows` each: row groups of
/// `MATVEC_WARPS × MATVEC_WIDE_ROWS_PER_WARP` rows per matrix.
pub const fn matvec_wide_groups<P: TargetPolicy>(rows: &[u32], n: u32, sms: u32) -> Dims {
    let (mut groups, mut m) = (0, 0);
    while m < rows.len() {
        groups += div_ceil(rows[m], P::MATVEC_WARPS * P::MATVEC_WIDE_ROWS_PER_WARP);
        m += 1;
    }
    matvec_groups::<P>(groups, n, sms)
}

/// The one-row-per-warp mat-vecs over several matrices (`matvec3_split`, `matvec_swiglu_split`):
/// `groups` = Σ over the matrices of ⌈rows / MATVEC_WARPS⌉, at most one resident wave.
pub const fn matvec_groups<P: TargetPolicy>(groups: u32, n: u32, sms: u32) -> Dims {
    let wave = sms * P::MATVEC_BLOCKS_PER_SM;
    Dims {
        grid_x: if groups < wave { groups } else { wave },
        grid_y: n,
        block: P::MATVEC_WARPS * WARP,
        shared_bytes: 0,
    }
}

/// `matvec_swiglu_q8`: a block per 32 output rows (one Q8_1 block) of each of `n` tokens,
/// `32 / rows_per_warp` warps (`rows_per_warp` 1, 2, 4 or 8), 32 floats of shared memory.
pub const fn matvec_swiglu_q8(rows: u32, n: u32, rows_per_warp: u32) -> Dims {
    Dims {
        grid_x: rows / 32,
        grid_y: n,
        block: 32 / rows_per_warp * WARP,
        shared_bytes: 32 * 4,
    }
}

/// `matvec_add_norm_q8`: a block per 32 output rows of each of `n` tokens, two rows per warp
/// (`residual_norm::ROWS_PER_WARP`), 32 floats of shared memory.
pub const fn matvec_add_norm_q8(rows: u32, n: u32) -> Dims {
    matvec_swiglu_q8(rows, n, crate::kernels::residual_norm::ROWS_PER_WARP as u32)
}

/// Quantized GEMM (`kernels/mma.rs`) over matrices of `rows[m]` rows each: one block per
/// `TILE_N` tokens (x) × `TILE_M` rows of one matrix (y), shared memory for `STAGES` stages of
/// weights with `qs_words` u32 of quants and `staged` u32 of scales per block
/// (`SplitFormat::QS_WORDS`, `SplitFormat::STAGED_WORDS`).
pub const fn mma<P: TargetPolicy>(rows: &[u32], n: u32, qs_words: u32, staged: u32) -> Dims {
    let (mut tiles, mut m) = (0, 0);
    while m < rows.len() {
        tiles += div_ceil(rows[m], P::TILE_M);
        m += 1;
    }
    Dims {
        grid_x: div_ceil(n, P::TILE_N),
        grid_y: tiles,
        block: P::GEMM_WARPS * WARP,
        shared_bytes: crate::kernels::mma::smem_bytes::<P>(qs_words, staged),
    }
}

/// How many ways a main-tile GEMM launch of `blocks` blocks over `cols` columns splits its
/// reduction over k on `sms` SMs (at most `max`; 1 = not split): only a launch with fewer
/// blocks than SMs splits, into as many shares as keep `GEMM_SPLIT_K_BLOCKS_PER_SM` blocks on
/// each SM, and never into more shares than it has stages.
pub const fn mma_split_k<P: TargetPolicy>(blocks: u32, cols: u32, sms: u32, max: u32) -> u32 {
    if max < 2 || blocks == 0 || blocks >= sms {
        return 1;
    }
    let fit = P::GEMM_SPLIT_K_BLOCKS_PER_SM * sms / blocks;
    let stages = div_ceil(cols, P::TILE_K);
    let s = if fit < max { fit } else { max };
    let s = if stages < s { stages } else { s };
    if s < 1 { 1 } else { s }
}

/// Scratch of a split-K GEMM launch ([`mma`] dims of `blocks` blocks, each tile's reduction
/// split `splits` ways): f32 shares (`splits` per output of each block tile) and u32 counters
/// (one per warp tile), the latter zero before the launch and again after it.
pub const fn mma_split_k_scratch<P: TargetPolicy>(blocks: u32, splits: u32) -> (usize, usize) {
    let tile = (P::TILE_M * P::TILE_N) as usize;
    let warp_tiles = (P::GEMM_WARPS / P::GEMM_K_GROUPS) as usize;
    (
        splits as usize * blocks as usize * tile,
        blocks as usize * warp_tiles,
    )
}

/// The paired GEMM + SwiGLU (`kernels/mma.rs`, `mma_swiglu_split`) over gate and up matrices
/// of `rows` rows each: one block per `TILE_N` tokens (x) × `TILE_M / 2` outputs (y), whose
/// weight tile holds those rows of both matrices.
pub const fn mma_swiglu<P: TargetPolicy>(rows: u32, n: u32, qs_words: u32, staged: u32) -> Dims {
    let mut d = mma::<P>(&[rows], n, qs_words, staged);
    d.grid_y = div_ceil(rows, P::TILE_M / 2);
    d
}

/// Activation quantization to Q8_1 blocks: one warp per 32-element block.
pub const fn quantize_q8_1<P: TargetPolicy>(cols: u32, n: u32) -> Dims {
    let warps = P::ROW_THREADS / WARP;
    Dims {
        grid_x: div_ceil(cols / 32, warps),
        grid_y: n,
        block: P::ROW_THREADS,
        shared_bytes: 0,
    }
}

/// `moe_sort`: one block, a `u32` of shared memory per expert and a byte per slot.
pub const fn moe_sort<P: TargetPolicy>(n_expert: u32, n_slots: u32) -> Dims {
    Dims {
        grid_x: 1,
        grid_y: 1,
        block: P::ROW_THREADS,
        shared_bytes: crate::kernels::moe::moe_sort_smem(n_expert, n_slots),
    }
}

/// Most token tiles of `tile_n` the `n_slots` slots of `n_expert` experts can make (each
/// expert's run ends in at most one partial tile): the length of `moe_sort`'s tile table and
/// the grouped GEMM's grid x.
pub const fn moe_gemm_tiles(n_slots: u32, n_expert: u32, tile_n: u32) -> u32 {
    let partial = if n_expert < n_slots {
        n_expert
    } else {
        n_slots
    };
    n_slots / tile_n + partial
}

/// The grouped expert GEMM (`moe_mma_split`) over `n_mats` stacked matrices of `rows` rows per
/// expert: a block per (token tile of the table, row tile of a matrix).
pub const fn moe_mma<P: TargetPolicy>(
    rows: u32,
    n_mats: u32,
    n_slots: u32,
    n_expert: u32,
    qs_words: u32,
    staged: u32,
) -> Dims {
    Dims {
        grid_x: moe_gemm_tiles(n_slots, n_expert, P::TILE_N),
        grid_y: n_mats * div_ceil(rows, P::TILE_M),
        block: P::GEMM_WARPS * WARP,
        shared_bytes: crate::kernels::mma::smem_bytes::<P>(qs_words, staged),
    }
}

/// The expert-sorted mat-vecs (`moe_swiglu_sorted`, `moe_down_sorted`): one block per sorted
/// slot along x, per group of `MATVEC_WARPS` rows along y (one row per warp).
pub const fn moe_sorted<P: TargetPolicy>(slots: u32, rows: u32) -> Dims {
    Dims {
        grid_x: slots,
        grid_y: div_ceil(rows, P::MATVEC_WARPS),
        block: P::MATVEC_WARPS * WARP,
        shared_bytes: 0,
    }
}

/// One warp per row (`moe_route`), `ROW_THREADS / 32` rows per block.
pub const fn per_warp<P: TargetPolicy>(rows: u32) -> Dims {
    Dims {
        grid_x: div_ceil(rows, P::ROW_THREADS / WARP),
        grid_y: 1,
        block: P::ROW_THREADS,
        shared_bytes: 0,
    }
}

/// One block per row (RMSNorm, softmax): needs one f64 of scratch per warp (the norms sum in f64).
pub const fn per_row<P: TargetPolicy>(rows: u32) -> Dims {
    Dims {
        grid_x: rows,
        grid_y: 1,
        block: P::ROW_THREADS,
        shared_bytes: (P::ROW_THREADS / WARP) * 8,
    }
}

/// Most rows for which [`norm_q8`] splits a row over several blocks.
pub const NORM_SLICED_ROWS: u32 = 8;

/// The register-resident norm (`rms_norm_q8`): per row, `grid_y` blocks of one thread per
/// `ROW_CHUNKS` chunks of 4 columns (at least a warp, at most 1024 threads); each block reduces
/// the whole row and emits one of the `grid_y` slices (block `y` the chunks `k` with
/// `k mod grid_y == y`: one per thread when `grid_y` is `ROW_CHUNKS`). One f64
/// scratch per warp. Slices only for a few rows (decode): with many rows (prefill) the grid is
/// full anyway and each row is reduced once.
pub const fn norm_q8<P: TargetPolicy>(rows: u32, cols: u32) -> Dims {
    let chunks = div_ceil(cols, 4);
    let threads = div_ceil(div_ceil(chunks, ROW_CHUNKS as u32), WARP) * WARP;
    let threads = if threads > 1024 { 1024 } else { threads };
    Dims {
        grid_x: rows,
        grid_y: if rows <= NORM_SLICED_ROWS {
            div_ceil(chunks, threads)
        } else {
            1
        },
        block: threads,
        shared_bytes: (threads / WARP) * 8,
    }
}

/// Blocks of row argmax pass 1 for rows of `cols`: about 4 elements per thread, at most 256.
pub const fn argmax_parts<P: TargetPolicy>(cols: u32) -> u32 {
    let parts = div_ceil(cols, P::ROW_THREADS * 4);
    if parts > 256 {
        256
    } else if parts == 0 {
        1
    } else {
        parts
    }
}

/// Row argmax pass 1: [`argmax_parts`] blocks per row; a (value, index) pair of scratch per warp.
pub const fn argmax_blocks<P: TargetPolicy>(rows: u32, cols: u32) -> Dims {
    Dims {
        grid_x: argmax_parts::<P>(cols),
        grid_y: rows,
        block: P::ROW_THREADS,
        shared_bytes: (P::ROW_THREADS / WARP) * 8,
    }
}

/// Row argmax pass 2: one block per row.
pub const fn argmax_merge<P: TargetPolicy>(rows: u32) -> Dims {
    Dims {
        grid_x: 1,
        grid_y: rows,
        block: P::ROW_THREADS,
        shared_bytes: (P::ROW_THREADS / WARP) * 8,
    }
}

/// `rope_store`: one block per (query, key or value head, token), as [`per_row`] blocks.
pub const fn rope_store<P: TargetPolicy>(heads: u32, kv_heads: u32, n: u32) -> Dims {
    Dims {
        grid_x: heads + 2 * kv_heads,
        grid_y: n,
        ..per_row::<P>(1)
    }
}

/// One thread per element (or per pair, for RoPE).
pub const fn flat<P: TargetPolicy>(threads: u32) -> Dims {
    Dims {
        grid_x: div_ceil(threads, P::ROW_THREADS),
        grid_y: 1,
        block: P::ROW_THREADS,
        shared_bytes: 0,
    }
}

/// Split-KV attention, pass 1: along x one block per (KV head, split of the cache, slice of the
/// head group), slices innermost so blocks reading the same K/V rows run together; along y one
/// per token. Shared memory: the block's per-(warp row, head) partials. Depends on the cache
/// size, not the position, so a recorded launch replays at every step.
pub const fn attention_chunks<P: TargetPolicy>(
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    max_ctx: u32,
) -> Dims {
    let (splits, _) = attention::kv_splits::<P>(n_tokens, max_ctx);
    let (per_block, slices) = attention::head_slices(heads, kv_heads);
    Dims {
        grid_x: kv_heads * splits * slices,
        grid_y: n_tokens,
        block: P::ATTN_WARPS * WARP,
        shared_bytes: attention::merge_floats(
            attention::chunk_slots::<P>(head_dim),
            per_block,
            head_dim,
        ) * 4,
    }
}

/// Split-KV attention, pass 1 on tensor cores (`flash::attention_chunks_mma`): the grid of
/// [`attention_chunks`], shared memory for a K/V tile and the warps' partials.
pub const fn attention_chunks_mma<P: TargetPolicy>(
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_tokens: u32,
    max_ctx: u32,
) -> Dims {
    let (per_block, _) = attention::head_slices(heads, kv_heads);
    Dims {
        shared_bytes: crate::kernels::flash::split_smem_bytes::<P>(per_block, head_dim),
        ..attention_chunks::<P>(heads, kv_heads, head_dim, n_tokens, max_ctx)
    }
}

/// One-launch decode attention of a short history (`flash::attention_short_mma`): one block per
/// (KV head, slice of its query heads) and token, shared memory as [`attention_chunks_mma`].
pub const fn attention_short_mma<P: TargetPolicy>(
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_tokens: u32,
) -> Dims {
    let (per_block, slices) = attention::head_slices(heads, kv_heads);
    Dims {
        grid_x: kv_heads * slices,
        grid_y: n_tokens,
        block: P::ATTN_WARPS * WARP,
        shared_bytes: crate::kernels::flash::split_smem_bytes::<P>(per_block, head_dim),
    }
}

/// [`attention_short_mma`] with `rope_store` folded in (`flash::attention_short_rope_mma`):
/// one token, its block's query rows in shared memory too.
pub const fn attention_short_rope_mma<P: TargetPolicy>(
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
) -> Dims {
    let (per_block, _) = attention::head_slices(heads, kv_heads);
    Dims {
        shared_bytes: crate::kernels::flash::short_rope_smem_bytes::<P>(per_block, head_dim),
        ..attention_short_mma::<P>(heads, kv_heads, head_dim, 1)
    }
}

/// Split-KV attention, pass 2: one block per (query head, token); shared memory: one partial per warp.
pub const fn attention_combine<P: TargetPolicy>(heads: u32, head_dim: u32, n_tokens: u32) -> Dims {
    Dims {
        grid_x: heads,
        grid_y: n_tokens,
        block: P::ATTN_WARPS * WARP,
        shared_bytes: attention::merge_floats(P::ATTN_WARPS, 1, head_dim) * 4,
    }
}

/// Tensor-core prefill attention (`kernels/flash.rs`): one block per (query head, tile of
/// `FLASH_Q` tokens), heads fastest so the heads of one KV group read its tiles together.
pub const fn flash_prefill(heads: u32, head_dim: u32, n_tokens: u32) -> Dims {
    Dims {
        grid_x: heads,
        grid_y: div_ceil(n_tokens, crate::kernels::flash::FLASH_Q),
        block: crate::kernels::flash::FLASH_WARPS * WARP,
        shared_bytes: crate::kernels::flash::flash_smem_bytes(head_dim),
    }
}

/// f32 scratch the two attention passes exchange: one partial record per (token, query head, split).
pub const fn attention_scratch<P: TargetPolicy>(
    heads: u32,
    head_dim: u32,
    n_tokens: u32,
    max_ctx: u32,
) -> usize {
    let (splits, _) = attention::kv_splits::<P>(n_tokens, max_ctx);
    n_tokens as usize
        * heads as usize
        * splits as usize
        * attention::record_floats(head_dim) as usize
}
