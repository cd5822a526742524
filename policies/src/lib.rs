//! Compile-time target policies.
//!
//! A policy is a zero-sized type whose associated consts read like a table: what instructions the
//! target may use, how kernels tile their work, how many warps a block has. Kernels are generic over
//! `P: TargetPolicy` and never branch on the GPU model at run time; host launch code reads the very
//! same constants, so a launch configuration can never disagree with what a kernel baked in.
//!
//! A new GPU is a new file here (data only) plus the micro-kernels measurements prove necessary.
#![no_std]

mod ampere;
mod hopper;
mod spark;

pub use ampere::Ampere;
pub use hopper::Hopper;
pub use spark::SparkGb10;

/// Threads in a warp on every NVIDIA target kiln supports.
pub const WARP: u32 = 32;

/// One warp-level matrix-multiply-accumulate instruction shape (`mma.sync.aligned.mMnNkK`).
pub trait MmaShape {
    const M: u32;
    const N: u32;
    const K: u32;
}

/// `mma.sync.aligned.m16n8k16` (f16/bf16 inputs, f32 accumulators): sm_80 and later. The
/// quantized GEMM dequantizes weights to f16 in registers and is built on it, as is the
/// prefill attention.
pub struct M16N8K16;
impl MmaShape for M16N8K16 {
    const M: u32 = 16;
    const N: u32 = 8;
    const K: u32 = 16;
}

/// `mma.sync.aligned.m16n8k32` (s8/u8 inputs, s32 accumulators): sm_80 and later. K = 32 is one
/// GGUF quant block; an int8 GEMM on it needs f32 scaling per block and output element, which
/// measured slower than dequantizing to f16 (docs/benchmarks.md).
pub struct M16N8K32;
impl MmaShape for M16N8K32 {
    const M: u32 = 16;
    const N: u32 = 8;
    const K: u32 = 32;
}

/// Everything a kernel or a launch needs to know about one GPU target.
pub trait TargetPolicy: 'static {
    /// Short name, also the PTX module's name (`sm_90`).
    const NAME: &'static str;
    /// Lowest compute capability (major*10+minor) the module runs on.
    const MIN_CC: u32;
    /// `.target` and `.version` the module is built for.
    const PTX_TARGET: &'static str;
    const PTX_ISA: u32;

    // --- instructions the target may use -------------------------------------------------
    const HAS_CP_ASYNC: bool;
    const HAS_LDMATRIX: bool;
    const HAS_WGMMA: bool;
    const HAS_TMA: bool;
    /// Programmatic dependent launch (`griddepcontrol`, sm_90+): a kernel may be launched
    /// while its predecessor in the stream still runs, and waits for it on the device, so
    /// launch latency overlaps the previous kernel instead of adding to every decode node.
    const HAS_PDL: bool;
    /// With PDL: kernels let the next grid launch before they wait for their own predecessor
    /// (instead of after), so launches run up to two grids ahead and a mat-vec's weight
    /// prefetch overlaps the kernel two places before it.
    const PDL_EARLY_TRIGGER: bool = false;
    /// Shared memory one block may ask for (bytes, after opting in).
    const MAX_SMEM_PER_BLOCK: u32;

    // --- batch-1 mat-vec -------------------------------------------------------------------
    /// Warps per block of the mat-vec kernels.
    const MATVEC_WARPS: u32;
    /// Output rows each warp computes; the activation chunk a lane loads is reused this often.
    const MATVEC_ROWS_PER_WARP: u32;
    /// Row groups of its own a grid-striding mat-vec block pulls into L2 before the PDL wait
    /// (only the gate/up + SwiGLU and LM-head launches have more than one per block).
    const MATVEC_PREFETCH_GROUPS: u32 = 1;
    /// Resident mat-vec blocks per multiprocessor: the grid is one wave of this many per SM.
    const MATVEC_BLOCKS_PER_SM: u32;
    /// 32-element blocks per row each lane loads before it computes (memory-level parallelism).
    const MATVEC_BLOCKS_IN_FLIGHT: u32;
    /// Rows per warp of the wide split mat-vec (`kiln_matvec_wide_*`), which the host picks for
    /// launches whose wide row groups still give every SM at least
    /// `MATVEC_WIDE_MIN_BLOCKS_PER_SM` blocks (0: never): each activation block a lane loads
    /// feeds that many rows, and each lane keeps that many rows' blocks in flight.
    const MATVEC_WIDE_ROWS_PER_WARP: u32;
    const MATVEC_WIDE_MIN_BLOCKS_PER_SM: u32;
    /// Most rows per warp of the decode gate/up + SwiGLU that emits the down projection's Q8_1
    /// blocks itself (`kiln_matvec_swiglu_q8_*`: a block per 32 rows, no quantize launch); the
    /// host takes the fewest of 1, 2, 4, 8 up to this whose grid is one resident wave, and the
    /// separate quantize otherwise (0: never).
    const SWIGLU_Q8_MAX_ROWS_PER_WARP: u32;
    /// Decode's residual projections defer the next RMSNorm to its consumers
    /// (`kiln_matvec_add_norm_q8_*`: a block per 32 rows writes `x ⊙ g`, its Q8_1 blocks and
    /// `Σx²`; the q/k/v and gate/up mat-vecs apply `1/rms`), where the grid is one resident
    /// wave; false: a norm launch between them.
    const NORM_DEFER: bool = false;
    /// Widest residual stream (the projection's rows) [`NORM_DEFER`](Self::NORM_DEFER) takes.
    const NORM_DEFER_MAX_ROWS: u32 = 0;
    /// Width of one global load, in bytes (16 = `ld.global.v4.u32`).
    const VECTOR_BYTES: u32;

    // --- tiled matrix-matrix (prefill): `kernels/mma.rs` ---------------------------------------
    /// The tensor-core instruction the quantized GEMM is built on.
    type Mma: MmaShape;
    /// Weight rows per block.
    const TILE_M: u32;
    /// Tokens per block.
    const TILE_N: u32;
    /// Elements of the reduction one pipeline stage holds (whole 32-element quant blocks).
    const TILE_K: u32;
    /// Warps per block; they split the block tile into `GEMM_WARP_M × GEMM_WARP_N` warp tiles,
    /// `GEMM_K_GROUPS` warps per warp tile.
    const GEMM_WARPS: u32;
    /// Warp groups that split each stage's quant blocks between them, each over the whole
    /// block tile, their sums added in shared memory at the end (1: no split). More warps per
    /// block at the same warp tile, so the same dequantization per mma.
    const GEMM_K_GROUPS: u32 = 1;
    /// Weight rows and tokens of one warp's tile (multiples of the mma's M and N).
    const GEMM_WARP_M: u32;
    const GEMM_WARP_N: u32;
    /// Shared-memory stages of the `cp.async` pipeline (loads run `STAGES - 1` tiles ahead).
    const STAGES: u32;
    /// GEMM launches of at most this many blocks per SM take the deep k-stages below (the host
    /// picks per launch, [`DeepK`]); 0: never.
    const GEMM_DEEP_MAX_BLOCKS_PER_SM: u32;
    /// `TILE_K` and `STAGES` of the deep k-stage GEMM.
    const GEMM_DEEP_TILE_K: u32;
    const GEMM_DEEP_STAGES: u32;
    /// `GEMM_K_GROUPS` of the deep k-stage GEMM (its `GEMM_WARPS` are the main ones times this).
    const GEMM_DEEP_K_GROUPS: u32 = 1;
    /// Launches of at most this many tokens whose main grid would leave SMs idle take the
    /// short-prompt tile ([`ShortTile`]): a short prompt has one token tile, so the main GEMM
    /// runs one block per `TILE_M` rows (32 for a 4096-row projection: a quarter of an H100)
    /// however few its tokens. 0: never.
    const GEMM_SHORT_MAX_TOKENS: u32 = 0;
    /// Most ways a main-tile GEMM launch with fewer blocks than SMs splits its reduction over k
    /// (`kernels::mma::mma_split`'s `splits`), taken before the deep and short-prompt tiles;
    /// 0 or 1: never. The split count keeps `GEMM_SPLIT_K_BLOCKS_PER_SM` blocks on every SM.
    const GEMM_SPLIT_K_MAX: u32 = 0;
    const GEMM_SPLIT_K_BLOCKS_PER_SM: u32 = 2;
    /// Whether this GEMM instantiation carries split-K's share sum. The main tile's does; the
    /// deep, short-prompt and expert tiles ([`DeepK`], [`ShortTile`], [`MoeTile`]), whose
    /// launches the host never splits, leave the dead code out of their entries.
    const GEMM_SPLIT_K_EPILOGUE: bool = true;
    /// Weight rows, tokens, warp width and k groups of the short-prompt tile; its warp height is
    /// `GEMM_WARP_M` and its stages the deep ones (`GEMM_DEEP_TILE_K`, `GEMM_DEEP_STAGES`).
    const GEMM_SHORT_TILE_M: u32 = 32;
    const GEMM_SHORT_TILE_N: u32 = 64;
    const GEMM_SHORT_WARP_N: u32 = 32;
    const GEMM_SHORT_K_GROUPS: u32 = 4;
    /// Token tile and warp width of the grouped expert GEMM ([`MoeTile`]): a prompt's slots
    /// spread over many experts, so an expert's run is short (pp512 over 128 experts, 8 per
    /// token: ~32 slots) and most of a dense-width token tile would be padding.
    const MOE_TILE_N: u32;
    const MOE_GEMM_WARP_N: u32;
    /// Fewest tokens for which the host picks the GEMM over the mat-vec. Below it the GEMM's
    /// grid (rows / TILE_M blocks) is too small to draw full bandwidth and most of its token
    /// columns are padding, while re-reading the weights once per token costs little.
    const GEMM_MIN_TOKENS: u32;

    // --- row kernels (norms, softmax) and attention -----------------------------------------
    /// Threads per block for one-row-per-block kernels.
    const ROW_THREADS: u32;
    /// Warps per block of both attention passes (split-KV partials, then their combine).
    const ATTN_WARPS: u32;
    /// Cache positions one attention block reads (a KV "chunk"): decode launches one block per
    /// (KV head, chunk of the whole cache), so this trades blocks in flight against partials to
    /// write and merge.
    const ATTN_CHUNK: u32;
    /// Fewest cache positions a split covers when a short context is spread over all the
    /// splits of the grid (rounded up to whole block steps); at most `ATTN_CHUNK`.
    const ATTN_MIN_SPAN: u32;
    /// Softmax partials (token × KV split) one query head may leave in the attention scratch. A
    /// split is one chunk while `tokens × chunks` fits; a long prefill over a large cache gets
    /// fewer, longer splits instead of a scratch that grows with both.
    const ATTN_MAX_PARTIALS: u32;
    /// Longest history (positions, the step's own included) for which decode attention runs as
    /// one launch with one split per KV head (`kiln_attention_short_mma`: no scratch, no
    /// combine) instead of split-KV's two; 0: never. Short histories leave the splits little to
    /// read, and the second launch's dependency then costs more than their parallelism saves.
    const ATTN_SHORT_MAX: u32 = 0;
    /// Decode of one token with a short history folds `rope_store` (QK-norm, RoPE, the KV
    /// store) into the one-launch attention (`kiln_attention_short_rope_mma`), where that
    /// history fits one tile round: one launch fewer per layer.
    const ATTN_SHORT_ROPE: bool = false;
    /// KV cache rows position-major (`max_ctx × kv_heads × head_dim` per layer, llama.cpp's
    /// order) instead of head-major (`kv_heads × max_ctx × head_dim`): at a short context the
    /// rows a decode step reads then share a few pages instead of one page per head. Every
    /// kernel that addresses the cache goes through `attention::kv_row`. An A/B switch until
    /// measured (`scripts/ptx-variant.sh hopper v.ptx KV_POSITION_MAJOR=true`).
    const KV_POSITION_MAJOR: bool = false;
}

/// Forwarding impl of a policy wrapper: everything as `P` except the GEMM's block tile, stage
/// depth, warp width and k groups (the warps follow from them).
macro_rules! gemm_variant {
    ($wrapper:ident, tile_m: $tile_m:expr, tile_n: $tile_n:expr, tile_k: $tile_k:expr, warp_n: $warp_n:expr, stages: $stages:expr, k_groups: $k_groups:expr) => {
        impl<P: TargetPolicy> TargetPolicy for $wrapper<P> {
            const NAME: &'static str = P::NAME;
            const MIN_CC: u32 = P::MIN_CC;
            const PTX_TARGET: &'static str = P::PTX_TARGET;
            const PTX_ISA: u32 = P::PTX_ISA;
            const HAS_CP_ASYNC: bool = P::HAS_CP_ASYNC;
            const HAS_LDMATRIX: bool = P::HAS_LDMATRIX;
            const HAS_WGMMA: bool = P::HAS_WGMMA;
            const HAS_TMA: bool = P::HAS_TMA;
            const HAS_PDL: bool = P::HAS_PDL;
            const PDL_EARLY_TRIGGER: bool = P::PDL_EARLY_TRIGGER;
            const MAX_SMEM_PER_BLOCK: u32 = P::MAX_SMEM_PER_BLOCK;
            const MATVEC_WARPS: u32 = P::MATVEC_WARPS;
            const MATVEC_ROWS_PER_WARP: u32 = P::MATVEC_ROWS_PER_WARP;
            const MATVEC_PREFETCH_GROUPS: u32 = P::MATVEC_PREFETCH_GROUPS;
            const MATVEC_BLOCKS_PER_SM: u32 = P::MATVEC_BLOCKS_PER_SM;
            const MATVEC_BLOCKS_IN_FLIGHT: u32 = P::MATVEC_BLOCKS_IN_FLIGHT;
            const MATVEC_WIDE_ROWS_PER_WARP: u32 = P::MATVEC_WIDE_ROWS_PER_WARP;
            const MATVEC_WIDE_MIN_BLOCKS_PER_SM: u32 = P::MATVEC_WIDE_MIN_BLOCKS_PER_SM;
            const SWIGLU_Q8_MAX_ROWS_PER_WARP: u32 = P::SWIGLU_Q8_MAX_ROWS_PER_WARP;
            const NORM_DEFER: bool = P::NORM_DEFER;
            const NORM_DEFER_MAX_ROWS: u32 = P::NORM_DEFER_MAX_ROWS;
            const VECTOR_BYTES: u32 = P::VECTOR_BYTES;
            type Mma = P::Mma;
            const TILE_M: u32 = $tile_m;
            const TILE_N: u32 = $tile_n;
            const TILE_K: u32 = $tile_k;
            const GEMM_WARPS: u32 = ($tile_m / P::GEMM_WARP_M) * ($tile_n / $warp_n) * $k_groups;
            const GEMM_K_GROUPS: u32 = $k_groups;
            const GEMM_WARP_M: u32 = P::GEMM_WARP_M;
            const GEMM_WARP_N: u32 = $warp_n;
            const STAGES: u32 = $stages;
            const GEMM_DEEP_MAX_BLOCKS_PER_SM: u32 = P::GEMM_DEEP_MAX_BLOCKS_PER_SM;
            const GEMM_DEEP_TILE_K: u32 = P::GEMM_DEEP_TILE_K;
            const GEMM_DEEP_STAGES: u32 = P::GEMM_DEEP_STAGES;
            const GEMM_DEEP_K_GROUPS: u32 = P::GEMM_DEEP_K_GROUPS;
            const GEMM_SHORT_MAX_TOKENS: u32 = P::GEMM_SHORT_MAX_TOKENS;
            const GEMM_SPLIT_K_MAX: u32 = P::GEMM_SPLIT_K_MAX;
            const GEMM_SPLIT_K_BLOCKS_PER_SM: u32 = P::GEMM_SPLIT_K_BLOCKS_PER_SM;
            const GEMM_SPLIT_K_EPILOGUE: bool = false;
            const GEMM_SHORT_TILE_M: u32 = P::GEMM_SHORT_TILE_M;
            const GEMM_SHORT_TILE_N: u32 = P::GEMM_SHORT_TILE_N;
            const GEMM_SHORT_WARP_N: u32 = P::GEMM_SHORT_WARP_N;
            const GEMM_SHORT_K_GROUPS: u32 = P::GEMM_SHORT_K_GROUPS;
            const MOE_TILE_N: u32 = P::MOE_TILE_N;
            const MOE_GEMM_WARP_N: u32 = P::MOE_GEMM_WARP_N;
            const GEMM_MIN_TOKENS: u32 = P::GEMM_MIN_TOKENS;
            const ROW_THREADS: u32 = P::ROW_THREADS;
            const ATTN_WARPS: u32 = P::ATTN_WARPS;
            const ATTN_CHUNK: u32 = P::ATTN_CHUNK;
            const ATTN_MIN_SPAN: u32 = P::ATTN_MIN_SPAN;
            const ATTN_MAX_PARTIALS: u32 = P::ATTN_MAX_PARTIALS;
            const ATTN_SHORT_MAX: u32 = P::ATTN_SHORT_MAX;
            const ATTN_SHORT_ROPE: bool = P::ATTN_SHORT_ROPE;
            const KV_POSITION_MAJOR: bool = P::KV_POSITION_MAJOR;
        }
    };
}

/// Policy `P` with its GEMM's deep k-stages (`GEMM_DEEP_TILE_K`, `GEMM_DEEP_STAGES`,
/// `GEMM_DEEP_K_GROUPS`) as `TILE_K`, `STAGES` and `GEMM_K_GROUPS`, everything else as `P`: the
/// second GEMM instantiation, for small launches (`GEMM_DEEP_MAX_BLOCKS_PER_SM`), where fewer,
/// longer stages and more warps per block pay.
pub struct DeepK<P>(core::marker::PhantomData<P>);
gemm_variant!(DeepK, tile_m: P::TILE_M, tile_n: P::TILE_N, tile_k: P::GEMM_DEEP_TILE_K, warp_n: P::GEMM_WARP_N, stages: P::GEMM_DEEP_STAGES, k_groups: P::GEMM_DEEP_K_GROUPS);

/// Policy `P` with the grouped expert GEMM's token tile (`MOE_TILE_N`, `MOE_GEMM_WARP_N`) as
/// `TILE_N` and `GEMM_WARP_N`: the instantiation of `kiln_moe_mma_*`.
pub struct MoeTile<P>(core::marker::PhantomData<P>);
gemm_variant!(MoeTile, tile_m: P::TILE_M, tile_n: P::MOE_TILE_N, tile_k: P::TILE_K, warp_n: P::MOE_GEMM_WARP_N, stages: P::STAGES, k_groups: P::GEMM_K_GROUPS);

/// Policy `P` with the short-prompt GEMM tile (`GEMM_SHORT_*`) and the deep k-stages: the
/// instantiation of `kiln_mma_short_*` and `kiln_mma_swiglu_short_*`, for launches of at most
/// `GEMM_SHORT_MAX_TOKENS` tokens whose main grid has fewer blocks than there are SMs.
pub struct ShortTile<P>(core::marker::PhantomData<P>);
gemm_variant!(ShortTile, tile_m: P::GEMM_SHORT_TILE_M, tile_n: P::GEMM_SHORT_TILE_N, tile_k: P::GEMM_DEEP_TILE_K, warp_n: P::GEMM_SHORT_WARP_N, stages: P::GEMM_DEEP_STAGES, k_groups: P::GEMM_SHORT_K_GROUPS);

/// Rows of output one mat-vec block produces.
pub const fn matvec_rows_per_block<P: TargetPolicy>() -> u32 {
    P::MATVEC_WARPS * P::MATVEC_ROWS_PER_WARP
}

/// Legality checks every policy must pass; evaluated at compile time by `check::<P>()`.
pub const fn check<P: TargetPolicy>() {
    assert!(P::VECTOR_BYTES == 16 || P::VECTOR_BYTES == 8 || P::VECTOR_BYTES == 4);
    assert!(P::MATVEC_WARPS >= 1 && P::MATVEC_WARPS * WARP <= 1024);
    assert!(P::ROW_THREADS % WARP == 0 && P::ROW_THREADS <= 1024);
    assert!(P::ATTN_WARPS >= 1 && P::ATTN_WARPS * WARP <= 1024);
    assert!(P::ATTN_CHUNK >= 1 && P::ATTN_MAX_PARTIALS >= 1);
    assert!(P::ATTN_MIN_SPAN >= 1 && P::ATTN_MIN_SPAN <= P::ATTN_CHUNK);
    assert!(P::TILE_M % P::Mma::M == 0);
    assert!(P::TILE_N % P::Mma::N == 0);
    assert!(P::TILE_K % P::Mma::K == 0);
    assert!(!P::HAS_WGMMA || P::MIN_CC >= 90);
    assert!(P::TILE_K % 32 == 0, "a stage holds whole quant blocks");
    assert!(P::TILE_M % P::GEMM_WARP_M == 0 && P::TILE_N % P::GEMM_WARP_N == 0);
    assert!(
        (P::TILE_M / P::GEMM_WARP_M) * (P::TILE_N / P::GEMM_WARP_N) * P::GEMM_K_GROUPS
            == P::GEMM_WARPS
    );
    assert!(P::GEMM_WARPS * WARP <= 1024);
    // Each k group takes every GEMM_K_GROUPS-th quant block of a stage: the same share for all.
    assert!(P::GEMM_K_GROUPS >= 1 && (P::TILE_K / 32) % P::GEMM_K_GROUPS == 0);
    assert!(P::GEMM_WARP_M % P::Mma::M == 0 && P::GEMM_WARP_N % P::Mma::N == 0);
    // The GEMM instantiates these warp tiles (`kernels/mma.rs`: fragment arrays are sized at
    // compile time).
    assert!(
        matches!(P::GEMM_WARP_M / P::Mma::M, 1 | 2 | 4)
            && matches!(P::GEMM_WARP_N / P::Mma::N, 2 | 4 | 8)
    );
    assert!(
        P::STAGES >= 2,
        "the GEMM pipeline overlaps at least one load with compute"
    );
    assert!(P::GEMM_MIN_TOKENS >= 2);
    assert!(matches!(P::MATVEC_BLOCKS_IN_FLIGHT, 1 | 2 | 4));
    assert!(matches!(P::MATVEC_ROWS_PER_WARP, 1 | 2 | 4));
    assert!(matches!(P::MATVEC_WIDE_ROWS_PER_WARP, 1 | 2 | 4));
}

const _: () = check::<Ampere>();
const _: () = check::<Hopper>();
const _: () = check::<SparkGb10>();
const _: () = check::<DeepK<Ampere>>();
const _: () = check::<DeepK<Hopper>>();
const _: () = check::<DeepK<SparkGb10>>();
const _: () = check::<MoeTile<Ampere>>();
const _: () = check::<MoeTile<Hopper>>();
const _: () = check::<MoeTile<SparkGb10>>();
const _: () = check::<ShortTile<Ampere>>();
const _: () = check::<ShortTile<Hopper>>();
const _: () = check::<ShortTile<SparkGb10>>();
