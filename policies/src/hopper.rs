use crate::{M16N8K16, TargetPolicy};

/// sm_90 (H100, H200). Built as plain sm_90 so the module also JITs on later non-`a` parts;
/// wgmma/TMA kernels would go in an `sm_90a` module once measurements show they pay.
pub struct Hopper;

impl TargetPolicy for Hopper {
    const NAME: &'static str = "sm_90";
    const MIN_CC: u32 = 90;
    const PTX_TARGET: &'static str = "sm_90";
    const PTX_ISA: u32 = 80;

    const HAS_CP_ASYNC: bool = true;
    const HAS_LDMATRIX: bool = true;
    const HAS_WGMMA: bool = false;
    const HAS_TMA: bool = false;
    const HAS_PDL: bool = true;
    const PDL_EARLY_TRIGGER: bool = false;
    const MAX_SMEM_PER_BLOCK: u32 = 227 * 1024;

    const MATVEC_WARPS: u32 = 4;
    const MATVEC_ROWS_PER_WARP: u32 = 1;
    const MATVEC_PREFETCH_GROUPS: u32 = 1;
    const MATVEC_BLOCKS_IN_FLIGHT: u32 = 2;
    const MATVEC_BLOCKS_PER_SM: u32 = 8;
    // Two rows per warp where the launch still has ≥ 2 blocks per SM (8B's q/k/v, o and down
    // projections: 4096+ rows, 512+ blocks; 0.6B's 1024-row o/down stay at one row, where two
    // measured −0.9 %). Measured per launch (session 10): 8B decode +3.7 % (Q4_0) / +3.6 %
    // (Q8_0). Gate/up + SwiGLU two rows each: ±1 %, not kept (127–161 registers).
    const MATVEC_WIDE_ROWS_PER_WARP: u32 = 2;
    const MATVEC_WIDE_MIN_BLOCKS_PER_SM: u32 = 2;
    // At most 2 rows per warp. Measured on an H100: session 18, with 4 allowed, the SwiGLU
    // that emits Q8_1 itself lost 7 % on 8B decode (Q4_0 and Q8_0) against the separate
    // quantize launch, whose short grid lets the down projection's blocks start their weight
    // prefetch early under PDL. Session 22, with the norms deferred and at most 2 (one resident
    // wave: taken for 0.6B's 3072 rows, not for 8B's 12288): 0.6B tg128 +3.5 %, 8B unchanged.
    // KILN_SWIGLU_Q8_ROWS overrides it (0 = the separate quantize).
    const SWIGLU_Q8_MAX_ROWS_PER_WARP: u32 = 2;
    // The two norms of a decode layer folded into the o and down projections before them.
    // Measured on an H100 (session 22), tg128: 0.6B Q4_0 +8.5 %, 30B-A3B +0.4 % (n_embd
    // 2048); 8B Q4_0 (4096 rows) +2.4 % in one build and −0.7 % in the landed one, so rows
    // up to 2048 only; 8B Q8_0 −0.8 % (the host leaves Q8_0 projections out). Four rows per
    // warp instead of two: +5 % and −7 %.
    const NORM_DEFER: bool = true;
    const NORM_DEFER_MAX_ROWS: u32 = 2048;
    const VECTOR_BYTES: u32 = 16;

    type Mma = M16N8K16;
    const TILE_M: u32 = 128;
    const TILE_N: u32 = 128;
    const TILE_K: u32 = 64;
    const GEMM_WARPS: u32 = 8;
    // 128×128 block tiles of 32×64 warp tiles (124 registers: 2 blocks per SM): a dequantized
    // weight fragment feeds eight mma per k-step, an activation fragment two. Against 128×64
    // tiles of 16×64 with 4 stages, pp512 on qwen3-8b measured +8 % (Q4_0) and +16 % (Q8_0; 3
    // stages gave Q8_0 +2 % of that) — docs/benchmarks.md, session 7. It pays only with the
    // multi-matrix GEMM launches: k/v alone are 8 row tiles × 4 token tiles, a quarter of the SMs.
    const GEMM_WARP_M: u32 = 32;
    const GEMM_WARP_N: u32 = 64;
    const STAGES: u32 = 3;
    // Launches of at most one block per SM take 128-wide k-stages (half the block barriers, the
    // same bytes in flight): with no second block to cover a barrier, fewer pay. Measured with
    // them everywhere (session 9): 8B down projection (128 blocks) 6 % faster, gate/up (768
    // blocks) 6 % slower, 0.6B pp512 (all launches ≤ 192 blocks) +3.4 %.
    const GEMM_DEEP_MAX_BLOCKS_PER_SM: u32 = 1;
    const GEMM_DEEP_TILE_K: u32 = 128;
    const GEMM_DEEP_STAGES: u32 = 2;
    const GEMM_DEEP_K_GROUPS: u32 = 2;
    // The short-prompt tile (32 rows × 64 tokens, four k groups of 2 warps: four times the
    // blocks of 8B's 48/32/32-block q/k/v, o and down GEMMs at one token tile). H100, session
    // 30: 8B pp16/64/128 TTFT −32/−13/−11 %, 0.6B −37/−20/−32 %; at 256 it lost 22 % (each block
    // re-reads the prompt's activations), so 128.
    const GEMM_SHORT_MAX_TOKENS: u32 = 128;
    // Split-K (up to 8 shares, two blocks per SM) for the launches with fewer main-tile blocks
    // than SMs, before the short and deep tiles. H100, session 31, against split-K off: 8B
    // Q4_0 TTFT pp64 20.7 → 11.9 ms, pp128 27.1 → 15.9, pp256 35.9 → 26.1, pp512 45.5 → 43.1;
    // Q8_0 pp128 29.8 → 18.2; 0.6B pp512 54.3k → 68.1k t/s. At most 4 shares: pp128 17.5 ms.
    const GEMM_SPLIT_K_MAX: u32 = 8;
    // The dense tile until measured: 64 × 32 is the A/B candidate (an expert's run at pp512 on
    // 128 experts is ~32 slots; warps past it skip, but a live 64-wide warp is half padding).
    const MOE_TILE_N: u32 = 128;
    const MOE_GEMM_WARP_N: u32 = 64;
    const GEMM_MIN_TOKENS: u32 = 8;

    const ROW_THREADS: u32 = 256;
    const ATTN_WARPS: u32 = 4;
    // 132 SMs: decode of 8 KV heads at 4k context is 256 blocks, about two per SM.
    const ATTN_CHUNK: u32 = 128;
    // Fewest positions a split reads once a short context is spread over all the splits (two
    // steps of 8 rows at head_dim 128): decode at a few hundred positions then runs ~10
    // blocks per KV head instead of one. Measured: 8B Q4_0 tg128 +6 %, 0.6B +11 % against
    // whole 128-position chunks; 8 gave the same (docs/benchmarks.md, session 8).
    const ATTN_MIN_SPAN: u32 = 16;
    // 1024 partials per head: chunks of a cache up to 128k positions for decode, and a scratch of
    // heads × 1024 × (head_dim + 2) floats (17 MB for 32 heads of 128) for any prefill.
    const ATTN_MAX_PARTIALS: u32 = 1024;
    // One 128-position tile round: measured on an H100 (session 21), tg128 from depth 1 +5.3 %
    // on 0.6B Q4_0, +0.9 % on 8B; histories of 257–384 (three rounds) were 11 % / 6 % slower
    // than split-KV's two launches, so longer ones keep them.
    const ATTN_SHORT_MAX: u32 = 128;
    // Measured on an H100 (session 23), tg128: 0.6B +4.8 %. Taken only where the block's head
    // rows are one per warp (8B's six on four warps: −1.0 %, keeps the two launches).
    const ATTN_SHORT_ROPE: bool = true;
    const KV_POSITION_MAJOR: bool = false;
}
