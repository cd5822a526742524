use crate::{M16N8K16, TargetPolicy};

/// sm_121 (DGX Spark, GB10). LPDDR5x at ~273 GB/s: mat-vec is starved for bytes long before
/// arithmetic, so fewer rows per warp keep more blocks in flight per byte.
pub struct SparkGb10;

impl TargetPolicy for SparkGb10 {
    const NAME: &'static str = "sm_121";
    const MIN_CC: u32 = 121;
    const PTX_TARGET: &'static str = "sm_121";
    const PTX_ISA: u32 = 88;

    const HAS_CP_ASYNC: bool = true;
    const HAS_LDMATRIX: bool = true;
    const HAS_WGMMA: bool = false;
    const HAS_TMA: bool = true;
    const HAS_PDL: bool = true;
    const MAX_SMEM_PER_BLOCK: u32 = 99 * 1024;

    const MATVEC_WARPS: u32 = 4;
    const MATVEC_ROWS_PER_WARP: u32 = 1;
    const MATVEC_BLOCKS_IN_FLIGHT: u32 = 1;
    const MATVEC_BLOCKS_PER_SM: u32 = 8;
    // Measured on Hopper only (where 4096-row projections gained 1–3 % decode): off here.
    const MATVEC_WIDE_ROWS_PER_WARP: u32 = 1;
    const MATVEC_WIDE_MIN_BLOCKS_PER_SM: u32 = 0;
    // Not measured here: the separate quantize launch.
    const SWIGLU_Q8_MAX_ROWS_PER_WARP: u32 = 0;
    const VECTOR_BYTES: u32 = 16;

    type Mma = M16N8K16;
    const TILE_M: u32 = 64;
    const TILE_N: u32 = 64;
    const TILE_K: u32 = 128;
    const GEMM_WARPS: u32 = 4;
    const GEMM_WARP_M: u32 = 32;
    const GEMM_WARP_N: u32 = 32;
    const STAGES: u32 = 2;
    // No second GEMM configuration (0): the main one already takes 128-wide k-stages.
    const GEMM_DEEP_MAX_BLOCKS_PER_SM: u32 = 0;
    const GEMM_DEEP_TILE_K: u32 = Self::TILE_K;
    const GEMM_DEEP_STAGES: u32 = Self::STAGES;
    // The dense tile: not measured narrower on this target.
    const MOE_TILE_N: u32 = 64;
    const MOE_GEMM_WARP_N: u32 = 32;
    const GEMM_MIN_TOKENS: u32 = 8;

    const ROW_THREADS: u32 = 256;
    const ATTN_WARPS: u32 = 4;
    // 48 SMs on ~270 GB/s: few blocks saturate it, so longer chunks mean fewer partials.
    const ATTN_CHUNK: u32 = 256;
    // Fewest positions a split reads once a short context is spread over all the splits:
    // Hopper's value (measured there), not measured on this target.
    const ATTN_MIN_SPAN: u32 = 16;
    // 1024 partials per head: chunks of a cache up to 256k positions for decode, and a scratch of
    // heads × 1024 × (head_dim + 2) floats (17 MB for 32 heads of 128) for any prefill.
    const ATTN_MAX_PARTIALS: u32 = 1024;
}
