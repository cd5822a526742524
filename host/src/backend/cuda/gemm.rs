//! Prefill's tensor-core GEMM launches: the main and deep k-stage entries and the paired
//! SwiGLU GEMM, over activations rounded to f16 once.

use anyhow::{Result, ensure};
use kernels_gpu::entries::names;
use kernels_gpu::kernels::formats::{self, SplitFormat};

use super::{Cuda, CudaTensor, CudaWeight, to_u32, u32_arg};
use crate::cuda::{Arg, DBuf};
use crate::gguf::GgmlType;
use kernels_gpu::kernels::launch::Dims;

impl Cuda {
    /// Whether `tokens` rows of activations take the tensor-core GEMM rather than the mat-vec
    /// (`P::GEMM_MIN_TOKENS`).
    pub(super) fn gemm_for(&self, tokens: usize) -> bool {
        tokens as u64 >= u64::from(self.gpu.shapes().gemm_min_tokens())
    }

    /// The tensor-core GEMMs `y_m = x·w_mᵀ` (or `y_m +=` with `acc`) of up to three weights
    /// (quants, scales, weight, output) in format `ty`, in one launch over `x` rounded to f16
    /// once.
    #[allow(clippy::type_complexity)]
    pub(super) fn launch_gemm(
        &self,
        ty: GgmlType,
        ws: &[(&DBuf<u8>, &DBuf<u8>, &CudaWeight, Arg)],
        x: &CudaTensor,
        acc: bool,
    ) -> Result<()> {
        let x = self.settled(x)?;
        let e = gemm_entries(ty);
        ensure!(
            (1..=3).contains(&ws.len()),
            "GEMM: {} weights in one launch (1 to 3 fit)",
            ws.len()
        );
        let mut args = Vec::with_capacity(16);
        let mut rows = Vec::with_capacity(3);
        for &(qs, scales, w, y) in ws {
            ensure!(
                x.cols == w.cols && w.cols.is_multiple_of(32),
                "matmul: activations have {} columns, {} has {}",
                x.cols,
                w.name,
                w.cols
            );
            let r = to_u32(w.rows, "rows")?;
            rows.push(r);
            args.extend([qs.arg(), scales.arg(), y, Arg::U32(r)]);
        }
        for _ in ws.len()..3 {
            args.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::U32(0)]);
        }
        let n = u32_arg(x.rows, "tokens")?;
        let (h, _alive) = self.f16_arg(x)?;
        // A short prompt whose main grid leaves SMs idle takes the short-prompt tile; else a
        // launch of at most `GEMM_DEEP_MAX_BLOCKS_PER_SM` blocks per SM takes the deep
        // k-stages: half the block barriers, which no second resident block would cover.
        let sh = self.gpu.shapes();
        let dims = sh.mma(&rows, x.rows as u32, e.qs_words, e.staged_words);
        let small = sh.gemm_deep_max_blocks_per_sm() * self.gpu.sm_count();
        let blocks = dims.blocks();
        // Only the main entries sum split-K shares (`GEMM_SPLIT_K_EPILOGUE`); the short and
        // deep entries take `splits = 1` as a constant, so shares are paired with `e.main` here.
        let whole = [Arg::U32(1), Arg::Ptr(0), Arg::Ptr(0)];
        let (k, dims, split_args) =
            if let Some((s, parts, counters)) = self.split_k(blocks, x.cols)? {
                let grid_y = dims.grid_y * s;
                (
                    e.main,
                    Dims { grid_y, ..dims },
                    [Arg::U32(s), parts, counters],
                )
            } else if self.takes_short_tile(x.rows, blocks) {
                let dims = sh.mma_short(&rows, x.rows as u32, e.qs_words, e.staged_words);
                (e.short, dims, whole)
            } else if self.gemm_deep && blocks <= small {
                let dims = sh.mma_deep(&rows, x.rows as u32, e.qs_words, e.staged_words);
                (e.deep, dims, whole)
            } else {
                (e.main, dims, whole)
            };
        args.extend([h, u32_arg(x.cols, "cols")?, n, Arg::U32(u32::from(acc))]);
        args.extend(split_args);
        self.gpu.launch(k, dims, &args)
    }

    /// Split-K for a main-tile GEMM launch of `blocks` blocks over `cols` columns: the shares
    /// and the (shares, counters) scratch, or `None` to run it whole. While a step is being
    /// recorded the scratch cannot grow (the graph would keep addressing the old buffers), so
    /// a launch that needs more runs whole.
    fn split_k(&self, blocks: u32, cols: usize) -> Result<Option<(u32, Arg, Arg)>> {
        let sh = self.gpu.shapes();
        let cols = to_u32(cols, "cols")?;
        let splits = sh.mma_split_k(blocks, cols, self.gpu.sm_count(), self.gemm_split_k);
        if splits < 2 {
            return Ok(None);
        }
        let (parts, counters) = sh.mma_split_k_scratch(blocks, splits);
        let mut slot = self.split_k_bufs.borrow_mut();
        let fits = matches!(&*slot, Some((p, c)) if p.len() >= parts && c.len() >= counters);
        if !fits {
            if self.pool.borrow().recording.is_some() {
                return Ok(None);
            }
            let grown = |have: usize, need: usize| need.max(have);
            let (have_p, have_c) = slot.as_ref().map_or((0, 0), |(p, c)| (p.len(), c.len()));
            // Dropping the old pair is stream-ordered after the launches that used it.
            *slot = Some((
                self.gpu.alloc::<f32>(grown(have_p, parts))?,
                self.gpu.alloc::<u32>(grown(have_c, counters))?,
            ));
        }
        let (p, c) = slot.as_ref().expect("allocated above");
        Ok(Some((splits, p.arg(), c.arg())))
    }

    /// `silu(x·gateᵀ) ⊙ (x·upᵀ)` by the paired tensor-core GEMM (`kiln_mma_swiglu_*`), with
    /// its f16 copy attached for the down projection's GEMM (`rows` even: two per f32 slot).
    pub(super) fn launch_gemm_swiglu(
        &self,
        ty: GgmlType,
        (gq, gs): (&DBuf<u8>, &DBuf<u8>),
        (uq, us): (&DBuf<u8>, &DBuf<u8>),
        rows: usize,
        x: &CudaTensor,
    ) -> Result<CudaTensor> {
        let x = self.settled(x)?;
        let e = gemm_entries(ty);
        let mut out = self.tensor(x.rows, rows)?;
        let out16 = self.tensor(x.rows, rows / 2)?;
        let (h, _alive) = self.f16_arg(x)?;
        let (r, n) = (to_u32(rows, "rows")?, to_u32(x.rows, "tokens")?);
        let sh = self.gpu.shapes();
        let dims = sh.mma_swiglu(r, n, e.qs_words, e.staged_words);
        let (k, dims) = match self.takes_short_tile(x.rows, dims.blocks()) {
            true => (
                e.swiglu_short,
                sh.mma_swiglu_short(r, n, e.qs_words, e.staged_words),
            ),
            false => (e.swiglu, dims),
        };
        let args = [
            gq.arg(),
            gs.arg(),
            uq.arg(),
            us.arg(),
            out.arg(),
            out16.arg(),
            Arg::U32(r),
        ];
        let rest = [h, u32_arg(x.cols, "cols")?, Arg::U32(n)];
        self.gpu.launch(k, dims, &[&args[..], &rest[..]].concat())?;
        out.f16 = Some(Box::new(out16));
        Ok(out)
    }

    /// Whether a GEMM launch of `tokens` tokens, whose main grid has `main_blocks` blocks,
    /// takes the short-prompt tile: few enough tokens, and too few blocks to give every SM one.
    fn takes_short_tile(&self, tokens: usize, main_blocks: u32) -> bool {
        tokens <= self.gemm_short_max && main_blocks < self.gpu.sm_count()
    }

    /// `x` rounded to f16 for the GEMMs: the copy its producer wrote (`CudaTensor::f16`), else
    /// a `to_f16` launch's, returned beside the argument to stay alive until the launch.
    pub(super) fn f16_arg(&self, x: &CudaTensor) -> Result<(Arg, Option<CudaTensor>)> {
        Ok(match &x.f16 {
            Some(h) => (h.arg(), None),
            None => {
                let h = self.to_f16(x)?;
                (h.arg(), Some(h))
            }
        })
    }

    /// `x` rounded to f16 for the GEMMs: pairs of halves, one pair per f32 slot of the result.
    pub(super) fn to_f16(&self, x: &CudaTensor) -> Result<CudaTensor> {
        let h = self.tensor(x.rows, x.cols / 2)?;
        let pairs = to_u32(x.len() / 2, "activation elements")?;
        self.gpu.launch(
            names::kiln_to_f16,
            self.gpu.shapes().flat(pairs),
            &[x.arg(), h.arg(), Arg::U32(pairs)],
        )?;
        Ok(h)
    }
}

/// The tensor-core GEMM entries of one split format and the sizes its launches are shaped by.
#[derive(Clone, Copy)]
pub(super) struct GemmEntries {
    /// The main k-stages (launches of several blocks per SM).
    main: &'static str,
    /// The deep k-stages (launches of at most `GEMM_DEEP_MAX_BLOCKS_PER_SM` blocks per SM).
    deep: &'static str,
    /// The short-prompt tile (`policies::ShortTile`).
    short: &'static str,
    /// Gate, up and SwiGLU in one paired GEMM, on the main and the short-prompt tile.
    swiglu: &'static str,
    swiglu_short: &'static str,
    /// Quant and staged scale words per block (`SplitFormat::QS_WORDS`, `STAGED_WORDS`).
    pub(super) qs_words: u32,
    pub(super) staged_words: u32,
}

/// The GEMM entries of split format `ty` (Q8_0 for any format without its own).
pub(super) fn gemm_entries(ty: GgmlType) -> GemmEntries {
    /// Entries in `GemmEntries` field order: main, deep, short, swiglu, swiglu_short.
    fn of<F: SplitFormat>(e: [&'static str; 5]) -> GemmEntries {
        GemmEntries {
            main: e[0],
            deep: e[1],
            short: e[2],
            swiglu: e[3],
            swiglu_short: e[4],
            qs_words: F::QS_WORDS as u32,
            staged_words: F::STAGED_WORDS as u32,
        }
    }
    use names::*;
    match ty {
        GgmlType::Q4_0 => of::<formats::Q4_0>([
            kiln_mma_q4_0,
            kiln_mma_deep_q4_0,
            kiln_mma_short_q4_0,
            kiln_mma_swiglu_q4_0,
            kiln_mma_swiglu_short_q4_0,
        ]),
        GgmlType::Q4_1 => of::<formats::Q4_1>([
            kiln_mma_q4_1,
            kiln_mma_deep_q4_1,
            kiln_mma_short_q4_1,
            kiln_mma_swiglu_q4_1,
            kiln_mma_swiglu_short_q4_1,
        ]),
        GgmlType::Q4_K => of::<formats::Q4K>([
            kiln_mma_q4k,
            kiln_mma_deep_q4k,
            kiln_mma_short_q4k,
            kiln_mma_swiglu_q4k,
            kiln_mma_swiglu_short_q4k,
        ]),
        GgmlType::Q5_K => of::<formats::Q5K>([
            kiln_mma_q5k,
            kiln_mma_deep_q5k,
            kiln_mma_short_q5k,
            kiln_mma_swiglu_q5k,
            kiln_mma_swiglu_short_q5k,
        ]),
        GgmlType::Q6_K => of::<formats::Q6K>([
            kiln_mma_q6k,
            kiln_mma_deep_q6k,
            kiln_mma_short_q6k,
            kiln_mma_swiglu_q6k,
            kiln_mma_swiglu_short_q6k,
        ]),
        _ => of::<formats::Q8_0>([
            kiln_mma_q8_0,
            kiln_mma_deep_q8_0,
            kiln_mma_short_q8_0,
            kiln_mma_swiglu_q8_0,
            kiln_mma_swiglu_short_q8_0,
        ]),
    }
}
