//! Launch shapes of the loaded module's policy, chosen once at run time.
//!
//! Each kernel module is monomorphized for one policy at build time; the host learns which one
//! it loaded only at run time (from the device). This object-safe view over
//! `kernels_gpu::kernels::launch` for a fixed `P` lets the backend ask for shapes without being
//! generic itself, while the numbers still come from the policy's constants.
use kernels_gpu::kernels::launch::{self, Dims};
use policies::{Ampere, DeepK, Hopper, MoeTile, ShortTile, SparkGb10, TargetPolicy};
use std::marker::PhantomData;

pub trait LaunchShapes: Send + Sync {
    fn policy(&self) -> &'static str;
    /// Whether kernels of this policy wait for their predecessor on the device (`HAS_PDL`).
    fn pdl(&self) -> bool;
    fn matvec(&self, rows: u32, n: u32) -> Dims;
    /// Split-format mat-vec: one resident wave on `sms` multiprocessors, grid-striding.
    fn matvec_resident(&self, rows: u32, n: u32, sms: u32) -> Dims;
    /// Whether a split mat-vec of `rows` takes the wide instantiation.
    fn matvec_takes_wide(&self, rows: u32, sms: u32) -> bool;
    /// The wide mat-vecs (`kiln_matvec_wide_*` over one matrix, `kiln_matvec3_wide_*` over up
    /// to three) over matrices of `rows` each.
    fn matvec_wide_multi(&self, rows: &[u32], n: u32, sms: u32) -> Dims;
    /// One-row-per-warp mat-vec over matrices of `rows` each (fused projections).
    fn matvec_multi(&self, rows: &[u32], n: u32, sms: u32) -> Dims;
    fn quantize_q8_1(&self, cols: u32, n: u32) -> Dims;
    /// The gate/up + SwiGLU emitting Q8_1 (`kiln_matvec_swiglu_q8_*`) at `rows_per_warp`.
    fn matvec_swiglu_q8(&self, rows: u32, n: u32, rows_per_warp: u32) -> Dims;
    /// The policy's `SWIGLU_Q8_MAX_ROWS_PER_WARP`.
    fn swiglu_q8_max_rows(&self) -> u32;
    /// The residual projection deferring a norm (`kiln_matvec_add_norm_q8_*`).
    fn matvec_add_norm_q8(&self, rows: u32, n: u32) -> Dims;
    /// The policy's `NORM_DEFER` and `NORM_DEFER_MAX_ROWS`.
    fn norm_defer(&self) -> bool;
    fn norm_defer_max_rows(&self) -> u32;
    /// Row argmax pass 1 (blocks per row: [`LaunchShapes::argmax_parts`]) and pass 2.
    fn argmax_blocks(&self, rows: u32, cols: u32) -> Dims;
    fn argmax_parts(&self, cols: u32) -> u32;
    fn argmax_merge(&self, rows: u32) -> Dims;
    /// The register-resident norm emitting Q8_1 (`rms_norm_q8`).
    fn norm_q8(&self, rows: u32, cols: u32) -> Dims;
    /// The fused QK-norm + RoPE + KV-store launch of `n` tokens.
    fn rope_store(&self, heads: u32, kv_heads: u32, n: u32) -> Dims;
    /// Quantized GEMM over up to three matrices (`rows` each) with `qs_words` u32 of quants
    /// and `staged` u32 of scales per block (`SplitFormat::QS_WORDS`, `STAGED_WORDS`).
    fn mma(&self, rows: &[u32], n: u32, qs_words: u32, staged: u32) -> Dims;
    /// The same GEMM with the policy's deep k-stages (`policies::DeepK`, the `kiln_mma_deep_*`
    /// entries).
    fn mma_deep(&self, rows: &[u32], n: u32, qs_words: u32, staged: u32) -> Dims;
    /// The same GEMM on the short-prompt tile (`policies::ShortTile`, `kiln_mma_short_*`).
    fn mma_short(&self, rows: &[u32], n: u32, qs_words: u32, staged: u32) -> Dims;
    /// The paired GEMM on the short-prompt tile (`kiln_mma_swiglu_short_*`).
    fn mma_swiglu_short(&self, rows: u32, n: u32, qs_words: u32, staged: u32) -> Dims;
    /// The policy's `GEMM_SHORT_MAX_TOKENS`.
    fn gemm_short_max_tokens(&self) -> u32;
    /// The policy's `GEMM_SPLIT_K_MAX`.
    fn gemm_split_k_max(&self) -> u32;
    /// Shares of a main-tile GEMM launch of `blocks` blocks over `cols` columns on `sms` SMs,
    /// at most `max` (`launch::mma_split_k`; 1 = not split).
    fn mma_split_k(&self, blocks: u32, cols: u32, sms: u32, max: u32) -> u32;
    /// (f32 shares, u32 counters) a main-tile launch of `blocks` blocks split `splits` ways
    /// needs (`launch::mma_split_k_scratch`).
    fn mma_split_k_scratch(&self, blocks: u32, splits: u32) -> (usize, usize);
    /// The paired GEMM + SwiGLU (`kiln_mma_swiglu_*`) over gate and up matrices of `rows`.
    fn mma_swiglu(&self, rows: u32, n: u32, qs_words: u32, staged: u32) -> Dims;
    /// Most blocks per SM of a GEMM launch that takes the deep k-stages (0: never).
    fn gemm_deep_max_blocks_per_sm(&self) -> u32;
    /// Entries (by name prefix) launched with more than 256 threads per block and the block
    /// size: the module gets `.maxntid` for them ([`super::with_launch_bounds`]), so ptxas keeps
    /// their registers within one block's share of the SM (else the launch fails).
    fn launch_bounds(&self) -> Vec<(&'static str, u32)>;
    /// Fewest tokens for which the GEMM replaces the mat-vec (`P::GEMM_MIN_TOKENS`).
    fn gemm_min_tokens(&self) -> u32;
    fn per_row(&self, rows: u32) -> Dims;
    /// One warp per row (`moe_route`).
    fn per_warp(&self, rows: u32) -> Dims;
    /// The route's slots sorted by expert (`moe_sort`).
    fn moe_sort(&self, n_expert: u32, n_slots: u32) -> Dims;
    /// Expert-sorted mat-vecs over `slots` slots of `rows` outputs.
    fn moe_sorted(&self, slots: u32, rows: u32) -> Dims;
    /// Entries of `moe_sort`'s token-tile table for `slots` slots of `n_expert` experts.
    fn moe_gemm_tiles(&self, slots: u32, n_expert: u32) -> u32;
    /// `moe_sort`'s token-tile width (the grouped GEMM's, `policies::MoeTile`).
    fn moe_tile_n(&self) -> u32;
    /// The grouped expert GEMM over `n_mats` stacked matrices of `rows` rows per expert.
    fn moe_mma(
        &self,
        rows: u32,
        n_mats: u32,
        slots: u32,
        n_expert: u32,
        qs_words: u32,
        staged: u32,
    ) -> Dims;
    fn flat(&self, threads: u32) -> Dims;
    /// Split-KV attention pass 1 over a cache of `max_ctx` positions (not the position).
    fn attention_chunks(
        &self,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        n_tokens: u32,
        max_ctx: u32,
    ) -> Dims;
    /// Split-KV attention pass 2.
    /// Split-KV pass 1 on tensor cores (`flash_supports(head_dim)`).
    fn attention_chunks_mma(
        &self,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        n_tokens: u32,
        max_ctx: u32,
    ) -> Dims;
    fn attention_combine(&self, heads: u32, head_dim: u32, n_tokens: u32) -> Dims;
    /// One-launch decode attention of a short history (`flash_supports(head_dim)`).
    fn attention_short_mma(&self, heads: u32, kv_heads: u32, head_dim: u32, n_tokens: u32) -> Dims;
    /// Longest history (positions, the step's own included) the one-launch short attention
    /// takes ([`policies::TargetPolicy::ATTN_SHORT_MAX`]).
    fn attention_short_max(&self) -> u32;
    /// The one-launch attention with `rope_store` folded in (one token).
    fn attention_short_rope_mma(&self, heads: u32, kv_heads: u32, head_dim: u32) -> Dims;
    /// Whether the policy takes it (`ATTN_SHORT_ROPE`) for short histories of up to
    /// `short_max` positions: only where those are one tile round, and where the block's head
    /// rows (its query heads, K and V) are one per warp. Measured on an H100 (session 23):
    /// 0.6B +4.8 %; 8B (six rows on four warps) −1.0 %, and −3.5 % with 16-lane teams.
    fn attention_short_rope(&self, short_max: u32, heads: u32, kv_heads: u32) -> bool;
    /// f32 scratch between the two attention passes.
    fn attention_scratch(&self, heads: u32, head_dim: u32, n_tokens: u32, max_ctx: u32) -> usize;
    /// Tensor-core prefill attention.
    fn flash_prefill(&self, heads: u32, head_dim: u32, n_tokens: u32) -> Dims;
    fn max_shared_bytes(&self) -> u32;
}

struct Shapes<P>(PhantomData<P>);

impl<P: TargetPolicy + Send + Sync> LaunchShapes for Shapes<P> {
    fn policy(&self) -> &'static str {
        P::NAME
    }
    fn pdl(&self) -> bool {
        P::HAS_PDL
    }
    fn matvec(&self, rows: u32, n: u32) -> Dims {
        launch::matvec::<P>(rows, n)
    }
    fn matvec_resident(&self, rows: u32, n: u32, sms: u32) -> Dims {
        launch::matvec_resident::<P>(rows, n, sms)
    }
    fn matvec_takes_wide(&self, rows: u32, sms: u32) -> bool {
        launch::matvec_takes_wide::<P>(rows, sms)
    }
    fn matvec_wide_multi(&self, rows: &[u32], n: u32, sms: u32) -> Dims {
        launch::matvec_wide_groups::<P>(rows, n, sms)
    }
    fn matvec_multi(&self, rows: &[u32], n: u32, sms: u32) -> Dims {
        let groups = rows.iter().map(|r| r.div_ceil(P::MATVEC_WARPS)).sum();
        launch::matvec_groups::<P>(groups, n, sms)
    }
    fn matvec_swiglu_q8(&self, rows: u32, n: u32, rows_per_warp: u32) -> Dims {
        launch::matvec_swiglu_q8(rows, n, rows_per_warp)
    }
    fn swiglu_q8_max_rows(&self) -> u32 {
        P::SWIGLU_Q8_MAX_ROWS_PER_WARP
    }
    fn matvec_add_norm_q8(&self, rows: u32, n: u32) -> Dims {
        launch::matvec_add_norm_q8(rows, n)
    }
    fn norm_defer(&self) -> bool {
        P::NORM_DEFER
    }
    fn norm_defer_max_rows(&self) -> u32 {
        P::NORM_DEFER_MAX_ROWS
    }
    fn argmax_blocks(&self, rows: u32, cols: u32) -> Dims {
        launch::argmax_blocks::<P>(rows, cols)
    }
    fn argmax_parts(&self, cols: u32) -> u32 {
        launch::argmax_parts::<P>(cols)
    }
    fn argmax_merge(&self, rows: u32) -> Dims {
        launch::argmax_merge::<P>(rows)
    }
    fn norm_q8(&self, rows: u32, cols: u32) -> Dims {
        launch::norm_q8::<P>(rows, cols)
    }
    fn rope_store(&self, heads: u32, kv_heads: u32, n: u32) -> Dims {
        launch::rope_store::<P>(heads, kv_heads, n)
    }
    fn quantize_q8_1(&self, cols: u32, n: u32) -> Dims {
        launch::quantize_q8_1::<P>(cols, n)
    }
    fn mma(&self, rows: &[u32], n: u32, qs_words: u32, staged: u32) -> Dims {
        launch::mma::<P>(rows, n, qs_words, staged)
    }
    fn mma_deep(&self, rows: &[u32], n: u32, qs_words: u32, staged: u32) -> Dims {
        launch::mma::<DeepK<P>>(rows, n, qs_words, staged)
    }
    fn mma_swiglu(&self, rows: u32, n: u32, qs_words: u32, staged: u32) -> Dims {
        launch::mma_swiglu::<P>(rows, n, qs_words, staged)
    }
    fn mma_short(&self, rows: &[u32], n: u32, qs_words: u32, staged: u32) -> Dims {
        launch::mma::<ShortTile<P>>(rows, n, qs_words, staged)
    }
    fn mma_swiglu_short(&self, rows: u32, n: u32, qs_words: u32, staged: u32) -> Dims {
        launch::mma_swiglu::<ShortTile<P>>(rows, n, qs_words, staged)
    }
    fn gemm_short_max_tokens(&self) -> u32 {
        P::GEMM_SHORT_MAX_TOKENS
    }
    fn gemm_split_k_max(&self) -> u32 {
        P::GEMM_SPLIT_K_MAX
    }
    fn mma_split_k(&self, blocks: u32, cols: u32, sms: u32, max: u32) -> u32 {
        launch::mma_split_k::<P>(blocks, cols, sms, max)
    }
    fn mma_split_k_scratch(&self, blocks: u32, splits: u32) -> (usize, usize) {
        launch::mma_split_k_scratch::<P>(blocks, splits)
    }
    fn gemm_deep_max_blocks_per_sm(&self) -> u32 {
        P::GEMM_DEEP_MAX_BLOCKS_PER_SM
    }
    fn launch_bounds(&self) -> Vec<(&'static str, u32)> {
        let deep = DeepK::<P>::GEMM_WARPS * policies::WARP;
        let short = ShortTile::<P>::GEMM_WARPS * policies::WARP;
        [
            ("kiln_mma_deep_", deep),
            ("kiln_mma_short_", short),
            ("kiln_mma_swiglu_short_", short),
        ]
        .into_iter()
        .filter(|&(_, threads)| threads > 256)
        .collect()
    }
    fn gemm_min_tokens(&self) -> u32 {
        P::GEMM_MIN_TOKENS
    }
    fn per_row(&self, rows: u32) -> Dims {
        launch::per_row::<P>(rows)
    }
    fn per_warp(&self, rows: u32) -> Dims {
        launch::per_warp::<P>(rows)
    }
    fn moe_sort(&self, n_expert: u32, n_slots: u32) -> Dims {
        launch::moe_sort::<P>(n_expert, n_slots)
    }
    fn moe_sorted(&self, slots: u32, rows: u32) -> Dims {
        launch::moe_sorted::<P>(slots, rows)
    }
    fn moe_gemm_tiles(&self, slots: u32, n_expert: u32) -> u32 {
        launch::moe_gemm_tiles(slots, n_expert, MoeTile::<P>::TILE_N)
    }
    fn moe_tile_n(&self) -> u32 {
        MoeTile::<P>::TILE_N
    }
    fn moe_mma(
        &self,
        rows: u32,
        n_mats: u32,
        slots: u32,
        n_expert: u32,
        qs_words: u32,
        staged: u32,
    ) -> Dims {
        launch::moe_mma::<MoeTile<P>>(rows, n_mats, slots, n_expert, qs_words, staged)
    }
    fn flat(&self, threads: u32) -> Dims {
        launch::flat::<P>(threads)
    }
    fn attention_chunks(
        &self,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        n_tokens: u32,
        max_ctx: u32,
    ) -> Dims {
        launch::attention_chunks::<P>(heads, kv_heads, head_dim, n_tokens, max_ctx)
    }
    fn attention_chunks_mma(
        &self,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        n_tokens: u32,
        max_ctx: u32,
    ) -> Dims {
        launch::attention_chunks_mma::<P>(heads, kv_heads, head_dim, n_tokens, max_ctx)
    }
    fn attention_combine(&self, heads: u32, head_dim: u32, n_tokens: u32) -> Dims {
        launch::attention_combine::<P>(heads, head_dim, n_tokens)
    }
    fn attention_short_mma(&self, heads: u32, kv_heads: u32, head_dim: u32, n_tokens: u32) -> Dims {
        launch::attention_short_mma::<P>(heads, kv_heads, head_dim, n_tokens)
    }
    fn attention_short_max(&self) -> u32 {
        P::ATTN_SHORT_MAX
    }
    fn attention_short_rope_mma(&self, heads: u32, kv_heads: u32, head_dim: u32) -> Dims {
        launch::attention_short_rope_mma::<P>(heads, kv_heads, head_dim)
    }
    fn attention_short_rope(&self, short_max: u32, heads: u32, kv_heads: u32) -> bool {
        let (per_block, _) = kernels_gpu::kernels::attention::head_slices(heads, kv_heads);
        P::ATTN_SHORT_ROPE
            && short_max <= kernels_gpu::kernels::flash::split_tile::<P>()
            && per_block + 2 <= P::ATTN_WARPS
    }
    fn attention_scratch(&self, heads: u32, head_dim: u32, n_tokens: u32, max_ctx: u32) -> usize {
        launch::attention_scratch::<P>(heads, head_dim, n_tokens, max_ctx)
    }
    fn flash_prefill(&self, heads: u32, head_dim: u32, n_tokens: u32) -> Dims {
        launch::flash_prefill(heads, head_dim, n_tokens)
    }
    fn max_shared_bytes(&self) -> u32 {
        P::MAX_SMEM_PER_BLOCK
    }
}

static AMPERE: Shapes<Ampere> = Shapes(PhantomData);
static HOPPER: Shapes<Hopper> = Shapes(PhantomData);
static SPARK: Shapes<SparkGb10> = Shapes(PhantomData);

/// Shapes for the module built from the policy named `name`.
pub fn for_module(name: &str) -> Option<&'static dyn LaunchShapes> {
    [&AMPERE as &'static dyn LaunchShapes, &HOPPER, &SPARK]
        .into_iter()
        .find(|s| s.policy() == name)
}
