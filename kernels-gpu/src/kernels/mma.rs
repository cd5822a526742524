//! Prefill GEMM on int8 tensor cores: `y` (`n × rows`) = `x` · Wᵀ for W in split layout `F` and
//! `x` quantized by [`quantize_q8_1`](crate::kernels::matvec::quantize_q8_1).
//!
//! One 32-element quant block is exactly one k-step of `mma.m16n8k32.s8`, so the tensor cores
//! produce every (row, token) block's exact integer dot, and each is finished in f32 by
//! [`SplitFormat::scale_dot`], the mat-vec's own block arithmetic: the two paths differ only in
//! the order blocks are summed. (Scaling per block costs more than the mma itself, but that is
//! the price of 32-element scales; the weights are read once per token tile instead of once per
//! token.)
//!
//! A block computes `TILE_M` rows × `TILE_N` tokens; each of its `GEMM_WARPS` warps owns a
//! `GEMM_WARP_M × GEMM_WARP_N` sub-tile. The reduction runs in stages of `TILE_K` elements
//! through a ring of `STAGES` shared-memory buffers, loads running `STAGES − 1` stages ahead:
//! quants by 16-byte `cp.async`, scales by plain loads held in registers over one stage's compute
//! (an f16 scale sits at any 2-byte offset, below `cp.async`'s 4-byte minimum). Rows and tokens
//! past the edge load the last valid one (finite data; their results are not stored), so shared
//! memory is always fully written.
use crate::device::*;
use crate::kernels::formats::{QK, SplitFormat};
use policies::{MmaShape, TargetPolicy};

/// 32-bit words of one shared-memory stage, for weights with `qs_words` words of quants per
/// block. Per quant block `j` of the stage, each a plane per 16 bytes so that the 8 rows (tokens)
/// × 4 words a warp reads for one fragment register fall in 32 distinct banks:
/// weight quants `[j][qs_words/4][TILE_M][4]`, activation quants `[j][2][TILE_N][4]`,
/// weight scales `[j][TILE_M][d, m]`, activation scales `[j][TILE_N][d, d·Σq]`.
pub const fn stage_words<P: TargetPolicy>(qs_words: u32) -> u32 {
    let kb = P::TILE_K / QK as u32;
    kb * (qs_words * P::TILE_M + 8 * P::TILE_N + 2 * P::TILE_M + 2 * P::TILE_N)
}

/// Dynamic shared memory of one GEMM block.
pub const fn smem_bytes<P: TargetPolicy>(qs_words: u32) -> u32 {
    P::STAGES * stage_words::<P>(qs_words) * 4
}

/// Scale entries one thread loads per stage, held in registers (compile-time bound).
const MAX_STAGED: usize = 4;
/// Quant blocks one stage may hold (`TILE_K / 32`; compile-time bound of the unrolled k-loop).
const MAX_STAGE_BLOCKS: usize = 8;

/// Every mma accumulates onto these f32 bits (1.5·2²³) instead of 0: while |dot| < 2²² (a block
/// dot is at most 32·128·128 = 2¹⁹) the s32 result, read as f32 bits, is exactly 1.5·2²³ + dot, so
/// one f32 subtraction recovers the dot. The int→float conversion it replaces runs at a quarter
/// of the f32 rate and, once per output element and block, was the GEMM's bottleneck.
const DOT_BIAS_BITS: i32 = 0x4B40_0000;
const DOT_BIAS: f32 = 12_582_912.0;

/// `y` (`n × rows`) = `x` · Wᵀ with W (`rows × cols`, `qs` 16-byte aligned) in split layout `F`
/// and `x` (`n × cols`) quantized to `xq`/`xds`. Launch: [`launch::mma`].
///
/// [`launch::mma`]: crate::kernels::launch::mma
#[allow(clippy::too_many_arguments)] // the entry's parameter list, as the kernel table passes it
pub unsafe fn mma_split<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
    n: u32,
) {
    // The warp tile in fragments becomes const generics so accumulators and fragments are
    // fixed-size register arrays (`policies::check` admits exactly these).
    const { assert!(P::Mma::M == 16 && P::Mma::N == 8 && P::Mma::K == QK as u32) };
    let a = (qs, scales, xq, xds, y, rows, cols, n);
    unsafe {
        match (P::GEMM_WARP_M / 16, P::GEMM_WARP_N / 8) {
            (1, 2) => tile::<P, F, 1, 2>(a),
            (1, 4) => tile::<P, F, 1, 4>(a),
            (1, 8) => tile::<P, F, 1, 8>(a),
            (2, 2) => tile::<P, F, 2, 2>(a),
            (2, 4) => tile::<P, F, 2, 4>(a),
            (2, 8) => tile::<P, F, 2, 8>(a),
            (4, 2) => tile::<P, F, 4, 2>(a),
            (4, 4) => tile::<P, F, 4, 4>(a),
            _ => tile::<P, F, 4, 8>(a),
        }
    }
}

type Args = (*const u32, *const u8, *const u32, *const f32, *mut f32, u32, u32, u32);

/// Where one stage lives in shared memory.
#[derive(Clone, Copy)]
struct Stage {
    wq: *mut u32,
    xq: *mut u32,
    ws: *mut f32,
    xs: *mut f32,
}

impl Stage {
    #[inline(always)]
    fn at<P: TargetPolicy, F: SplitFormat>(slot: u32) -> Stage {
        let kb = P::TILE_K / QK as u32;
        let base = unsafe { shared_mem::<u32>().add((slot * stage_words::<P>(F::QS_WORDS as u32)) as usize) };
        let wq = base;
        let xq = unsafe { wq.add((kb * F::QS_WORDS as u32 * P::TILE_M) as usize) };
        let ws = unsafe { xq.add((kb * 8 * P::TILE_N) as usize) } as *mut f32;
        let xs = unsafe { ws.add((kb * 2 * P::TILE_M) as usize) };
        Stage { wq, xq, ws, xs }
    }
}

/// A stage's scales, loaded into registers while the previous stage computes.
struct Staged {
    w: [u32; MAX_STAGED],
    x: [(f32, f32); MAX_STAGED],
}

/// The problem as one block sees it.
#[derive(Clone, Copy)]
struct Problem {
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    rows: u32,
    n: u32,
    nb: u32,
    row0: u32,
    tok0: u32,
}

impl Problem {
    /// Issue the `cp.async` copies of stage `st`'s quants into `dst`.
    #[inline(always)]
    unsafe fn copy_quants<P: TargetPolicy, F: SplitFormat>(&self, st: u32, dst: Stage) {
        let kb = P::TILE_K / QK as u32;
        let threads = P::GEMM_WARPS * WARP;
        let hw = F::QS_WORDS as u32 / 4;
        // 16-byte chunks, half-block fastest (a Q8 block's 32 contiguous bytes go to neighbouring
        // threads), then row: consecutive threads fill consecutive 16-byte shared slots.
        let mut c = thread_idx();
        while c < P::TILE_M * kb * hw {
            let (h, r, j) = (c % hw, (c / hw) % P::TILE_M, c / (hw * P::TILE_M));
            let b = st * kb + j;
            if b < self.nb {
                let row = (self.row0 + r).min(self.rows - 1);
                let src = unsafe { self.qs.add(((row * self.nb + b) * F::QS_WORDS as u32 + 4 * h) as usize) };
                unsafe { cp_async_16(dst.wq.add((((j * hw + h) * P::TILE_M + r) * 4) as usize), src) };
            }
            c += threads;
        }
        let mut c = thread_idx();
        while c < P::TILE_N * kb * 2 {
            let (h, t, j) = (c % 2, (c / 2) % P::TILE_N, c / (2 * P::TILE_N));
            let b = st * kb + j;
            if b < self.nb {
                let tok = (self.tok0 + t).min(self.n - 1);
                let src = unsafe { self.xq.add(((tok * self.nb + b) * 8 + 4 * h) as usize) };
                unsafe { cp_async_16(dst.xq.add((((j * 2 + h) * P::TILE_N + t) * 4) as usize), src) };
            }
            c += threads;
        }
    }

    /// Entry `i` of this thread's share of a stage's `tile × kb` weight or activation scales,
    /// as (row or token, block in stage); `None` past the stage or past the last block.
    #[inline(always)]
    fn staged_entry<P: TargetPolicy>(&self, st: u32, i: usize, tile: u32) -> Option<(u32, u32)> {
        let kb = P::TILE_K / QK as u32;
        // A compile-time trip count: entries no thread has are not even tested.
        if i as u32 >= (tile * kb).div_ceil(P::GEMM_WARPS * WARP) {
            return None;
        }
        let e = thread_idx() + i as u32 * P::GEMM_WARPS * WARP;
        let (r, j) = (e % tile, e / tile);
        (j < kb && st * kb + j < self.nb).then_some((r, j))
    }

    #[inline(always)]
    unsafe fn load_scales<P: TargetPolicy, F: SplitFormat>(&self, st: u32) -> Staged {
        let kb = P::TILE_K / QK as u32;
        let mut s = Staged { w: [0; MAX_STAGED], x: [(0.0, 0.0); MAX_STAGED] };
        unroll::<MAX_STAGED>(|i| {
            if let Some((r, j)) = self.staged_entry::<P>(st, i, P::TILE_M) {
                let row = (self.row0 + r).min(self.rows - 1);
                let p = unsafe { self.scales.add(((row * self.nb + st * kb + j) * F::SCALE_BYTES as u32) as usize) };
                // Raw bits, converted only when stored: the conversion would otherwise wait for
                // the load in front of the stage's compute.
                s.w[i] = unsafe { if F::SCALE_BYTES == 4 { *(p as *const u32) } else { *(p as *const u16) as u32 } };
            }
            if let Some((t, j)) = self.staged_entry::<P>(st, i, P::TILE_N) {
                let tok = (self.tok0 + t).min(self.n - 1);
                let p = unsafe { self.xds.add((2 * (tok * self.nb + st * kb + j)) as usize) };
                s.x[i] = unsafe { (*p, *p.add(1)) };
            }
        });
        s
    }

    #[inline(always)]
    unsafe fn store_scales<P: TargetPolicy, F: SplitFormat>(&self, st: u32, s: &Staged, dst: Stage) {
        unroll::<MAX_STAGED>(|i| {
            if let Some((r, j)) = self.staged_entry::<P>(st, i, P::TILE_M) {
                let [d, m] = F::scales(&s.w[i] as *const u32 as *const u8);
                let o = (2 * (j * P::TILE_M + r)) as usize;
                unsafe { (*dst.ws.add(o), *dst.ws.add(o + 1)) = (d, m) };
            }
            if let Some((t, j)) = self.staged_entry::<P>(st, i, P::TILE_N) {
                let o = (2 * (j * P::TILE_N + t)) as usize;
                unsafe { (*dst.xs.add(o), *dst.xs.add(o + 1)) = s.x[i] };
            }
        });
    }
}

/// The kernel body for a warp tile of `MI × NI` mma tiles (16 rows × 8 tokens each).
#[inline(always)]
unsafe fn tile<P: TargetPolicy, F: SplitFormat, const MI: usize, const NI: usize>(args: Args) {
    let (qs, scales, xq, xds, y, rows, cols, n) = args;
    let kb = P::TILE_K / QK as u32;
    const {
        assert!(P::TILE_M * P::TILE_K / (QK as u32) <= (MAX_STAGED as u32) * P::GEMM_WARPS * WARP);
        assert!(P::TILE_N * P::TILE_K / (QK as u32) <= (MAX_STAGED as u32) * P::GEMM_WARPS * WARP);
        assert!(smem_bytes::<P>(8) <= P::MAX_SMEM_PER_BLOCK);
        assert!(P::TILE_K / (QK as u32) <= MAX_STAGE_BLOCKS as u32);
    };
    let nb = cols / QK as u32;
    // Token tiles run fastest through the grid: the blocks of one weight tile are resident
    // together and share its bytes in L2, so the weights stream from memory about once.
    let pr = Problem { qs, scales, xq, xds, rows, n, nb, row0: block_idx_y() * P::TILE_M, tok0: block_idx() * P::TILE_N };
    let warps_m = P::TILE_M / P::GEMM_WARP_M;
    let (wr0, wt0) = ((warp_id() % warps_m) * P::GEMM_WARP_M, (warp_id() / warps_m) * P::GEMM_WARP_N);
    let hw = F::QS_WORDS as u32 / 4;
    let ln = lane();
    let stages = nb.div_ceil(kb);

    // Prologue: the first STAGES − 1 stages in flight. One commit per stage, empty or not, so
    // "stage st has landed" is always "at most STAGES − 2 newer groups are pending".
    for st in 0..P::STAGES - 1 {
        if st < stages {
            unsafe {
                pr.copy_quants::<P, F>(st, Stage::at::<P, F>(st));
                let s = pr.load_scales::<P, F>(st);
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
            unsafe { pr.copy_quants::<P, F>(next, next_slot) };
            unsafe { pr.load_scales::<P, F>(next) }
        } else {
            Staged { w: [0; MAX_STAGED], x: [(0.0, 0.0); MAX_STAGED] }
        };
        cp_async_commit();

        let cur = Stage::at::<P, F>(st % P::STAGES);
        // Unrolled (`kb` is a constant per policy): every shared-memory offset below becomes an
        // immediate instead of per-load address arithmetic, which dominated the integer pipe.
        unroll::<MAX_STAGE_BLOCKS>(#[inline(always)] |j| {
            let j = j as u32;
            if j >= kb || st * kb + j >= nb {
                return; // the same for the whole block: the k tail
            }
            let mut a = [[0u32; 4]; MI];
            unroll::<MI>(|mi| {
                unroll::<4>(|r| {
                    let (row, k0) = frag_k32::a(ln, r as u32);
                    let row = wr0 + 16 * mi as u32 + row;
                    let w = F::code_word(k0);
                    let word = unsafe { *cur.wq.add((((j * hw + w / 4) * P::TILE_M + row) * 4 + w % 4) as usize) };
                    a[mi][r] = F::codes4(word, k0);
                })
            });
            let mut b = [[0u32; 2]; NI];
            unroll::<NI>(|ni| {
                unroll::<2>(|r| {
                    let (tok, k0) = frag_k32::b(ln, r as u32);
                    let (tok, w) = (wt0 + 8 * ni as u32 + tok, k0 / 4);
                    b[ni][r] = unsafe { *cur.xq.add((((j * 2 + w / 4) * P::TILE_N + tok) * 4 + w % 4) as usize) };
                })
            });
            unroll::<MI>(|mi| {
                unroll::<NI>(|ni| {
                    let d = mma_m16n8k32_s32_s8(a[mi], b[ni], [DOT_BIAS_BITS; 4]);
                    unroll::<4>(|i| {
                        let (row, tok) = frag_k32::c(ln, i as u32);
                        let wo = (2 * (j * P::TILE_M + wr0 + 16 * mi as u32 + row)) as usize;
                        let xo = (2 * (j * P::TILE_N + wt0 + 8 * ni as u32 + tok)) as usize;
                        let (w, xd, xs) = unsafe { ([*cur.ws.add(wo), *cur.ws.add(wo + 1)], *cur.xs.add(xo), *cur.xs.add(xo + 1)) };
                        acc[mi][ni][i] = F::scale_dot(acc[mi][ni][i], w, f32::from_bits(d[i] as u32) - DOT_BIAS, xd, xs);
                    })
                })
            });
        });
        if next < stages {
            unsafe { pr.store_scales::<P, F>(next, &staged, next_slot) };
        }
    }

    unroll::<MI>(|mi| {
        unroll::<NI>(|ni| {
            unroll::<4>(|i| {
                let (row, tok) = frag_k32::c(ln, i as u32);
                let row = pr.row0 + wr0 + 16 * mi as u32 + row;
                let tok = pr.tok0 + wt0 + 8 * ni as u32 + tok;
                if row < rows && tok < n {
                    unsafe { *y.add((tok * rows + row) as usize) = acc[mi][ni][i] };
                }
            })
        })
    });
}
