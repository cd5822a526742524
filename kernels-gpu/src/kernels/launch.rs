//! Launch shapes, computed from the same policy constants the kernels are compiled with. The
//! CUDA runtime and the host grid executor both launch through these, so a kernel and its
//! launch can never disagree about warps, rows per block or shared memory.
use policies::{TargetPolicy, WARP, matvec_rows_per_block};

/// A launch: 2-D grid of 1-D blocks plus dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub grid_x: u32,
    pub grid_y: u32,
    pub block: u32,
    pub shared_bytes: u32,
}

const fn div_ceil(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}

/// Mat-vec (any weight format): `rows` outputs for each of `n` activation rows, one block per
/// row group.
pub const fn matvec<P: TargetPolicy>(rows: u32, n: u32) -> Dims {
    Dims { grid_x: div_ceil(rows, matvec_rows_per_block::<P>()), grid_y: n, block: P::MATVEC_WARPS * WARP, shared_bytes: 0 }
}

/// The split-format mat-vec on a device with `sms` multiprocessors: at most one resident wave
/// (`P::MATVEC_BLOCKS_PER_SM` per SM); the kernel strides over the remaining row groups.
pub const fn matvec_resident<P: TargetPolicy>(rows: u32, n: u32, sms: u32) -> Dims {
    let all = matvec::<P>(rows, n);
    let wave = sms * P::MATVEC_BLOCKS_PER_SM;
    Dims { grid_x: if all.grid_x < wave { all.grid_x } else { wave }, ..all }
}

/// Quantized GEMM (`kernels/mma.rs`): one block per `TILE_M` rows × `TILE_N` tokens, shared
/// memory for `STAGES` stages of weights with `qs_words` u32 of quants per block
/// (`SplitFormat::QS_WORDS`).
pub const fn mma<P: TargetPolicy>(rows: u32, n: u32, qs_words: u32) -> Dims {
    Dims {
        grid_x: div_ceil(rows, P::TILE_M),
        grid_y: div_ceil(n, P::TILE_N),
        block: P::GEMM_WARPS * WARP,
        shared_bytes: crate::kernels::mma::smem_bytes::<P>(qs_words),
    }
}

/// Activation quantization to Q8_1 blocks: one warp per 32-element block.
pub const fn quantize_q8_1<P: TargetPolicy>(cols: u32, n: u32) -> Dims {
    let warps = P::ROW_THREADS / WARP;
    Dims { grid_x: div_ceil(cols / 32, warps), grid_y: n, block: P::ROW_THREADS, shared_bytes: 0 }
}

/// One block per row (RMSNorm, softmax): needs one f32 of scratch per warp.
pub const fn per_row<P: TargetPolicy>(rows: u32) -> Dims {
    Dims { grid_x: rows, grid_y: 1, block: P::ROW_THREADS, shared_bytes: (P::ROW_THREADS / WARP) * 4 }
}

/// One thread per element (or per pair, for RoPE).
pub const fn flat<P: TargetPolicy>(threads: u32) -> Dims {
    Dims { grid_x: div_ceil(threads, P::ROW_THREADS), grid_y: 1, block: P::ROW_THREADS, shared_bytes: 0 }
}

/// Attention: one block per (query head, query token); scores for the longest row in shared memory.
pub const fn attention<P: TargetPolicy>(n_heads: u32, n_tokens: u32, max_len: u32) -> Dims {
    Dims {
        grid_x: n_heads,
        grid_y: n_tokens,
        block: P::ATTN_WARPS * WARP,
        shared_bytes: (max_len + P::ATTN_WARPS) * 4,
    }
}
