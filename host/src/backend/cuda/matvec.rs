//! Decode's mat-vec launches and the Q8_1 activations they read: quantized here, emitted by
//! their producer, or a deferred norm's, finished by its consumer or settled once.

use anyhow::{Result, ensure};
use kernels_gpu::entries::families::{
    FormatEntries, MATVEC, MATVEC_ADD_NORM_Q8, MATVEC_SWIGLU_Q8, MATVEC_SWIGLU_Q8_NORM, MATVEC_WIDE,
};
use kernels_gpu::entries::names;
use kernels_gpu::kernels::launch::Dims;
use kernels_gpu::kernels::residual_norm::MAX_DEFERRED_COLS;

use super::super::Backend;
use super::{Cuda, CudaTensor, CudaWeight, FUSED_MAX_TOKENS, Storage, by_format, u32_arg};
use crate::cuda::{Arg, DBuf};
use crate::gguf::GgmlType;

impl Cuda {
    /// The split-format mat-vec over `n` rows of Q8_1 activations `x` = (`xq`, `xds`): `y = x·wᵀ`,
    /// or `y += x·wᵀ` with `acc`. One resident wave, grid-striding over the row groups.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_matvec(
        &self,
        ty: GgmlType,
        qs: &DBuf<u8>,
        scales: &DBuf<u8>,
        w: &CudaWeight,
        n: u32,
        x: (Arg, Arg),
        y: Arg,
        acc: bool,
    ) -> Result<()> {
        let (rows, cols) = (u32_arg(w.rows, "rows")?, u32_arg(w.cols, "cols")?);
        let (sh, sms, r) = (self.gpu.shapes(), self.gpu.sm_count(), w.rows as u32);
        let wide = self.matvec_wide && sh.matvec_takes_wide(r, sms);
        let (k, dims) = match wide {
            true => (
                by_format(ty, MATVEC_WIDE),
                sh.matvec_wide_multi(&[r], n, sms),
            ),
            false => (by_format(ty, MATVEC), sh.matvec_resident(r, n, sms)),
        };
        let dims = self.gpu.one_wave(k, dims);
        self.gpu.launch(
            k,
            dims,
            &[
                qs.arg(),
                scales.arg(),
                x.0,
                x.1,
                y,
                rows,
                cols,
                Arg::U32(u32::from(acc)),
            ],
        )
    }

    /// `x += a·wᵀ` through a fresh output (the f32-activation and f16 paths, which do not
    /// accumulate).
    pub(super) fn add_matmul_output(
        &self,
        x: &mut CudaTensor,
        a: &CudaTensor,
        w: &CudaWeight,
    ) -> Result<()> {
        let y = self.matmul(a, w)?;
        self.add_assign(x, &y)
    }

    /// Calls `f` with the Q8_1 activations (`xq`, `xds`) of `x`: those its producer emitted, or
    /// quantized here.
    pub(super) fn with_q8<T>(
        &self,
        x: &CudaTensor,
        f: impl FnOnce(Arg, Arg) -> Result<T>,
    ) -> Result<T> {
        let x = self.settled(x)?;
        if let Some(q) = &x.q8 {
            return f(q.0.arg(), q.1.arg());
        }
        ensure!(
            x.cols % 32 == 0,
            "quantized matmul: {} columns are not whole 32-blocks",
            x.cols
        );
        let (xq, xds) = self.q8_buffers(x.rows, x.cols)?;
        let sh = self.gpu.shapes();
        self.gpu.launch(
            names::kiln_quantize_q8_1,
            sh.quantize_q8_1(x.cols as u32, x.rows as u32),
            &[x.arg(), xq.arg(), xds.arg(), Arg::U32(x.cols as u32)],
        )?;
        f(xq.arg(), xds.arg())
    }
    /// The consumer kernel family for `x`: `deferred` (the `residual_norm::Deferred`
    /// instantiations) where [`with_q8_scaled`](Self::with_q8_scaled) hands the launch a
    /// deferred norm's partial sums, `finished` otherwise.
    pub(super) fn consumer_family(
        x: &CudaTensor,
        finished: FormatEntries,
        deferred: FormatEntries,
    ) -> FormatEntries {
        match x.deferred_q8() {
            Some(_) => deferred,
            None => finished,
        }
    }
    /// [`with_q8`](Self::with_q8) for launches that apply a deferred norm themselves: `f` also
    /// gets the `(ss, ss_parts, eps)` arguments (a null `ss` and 0 parts when `x` is finished;
    /// the `Finished` kernels [`consumer_family`](Self::consumer_family) picks then ignore them).
    pub(super) fn with_q8_scaled<T>(
        &self,
        x: &CudaTensor,
        f: impl FnOnce(Arg, Arg, [Arg; 3]) -> Result<T>,
    ) -> Result<T> {
        match x.deferred_q8() {
            Some((d, q)) => f(
                q.0.arg(),
                q.1.arg(),
                [d.ss.arg(), Arg::U32(d.parts), Arg::F32(d.eps)],
            ),
            None => self.with_q8(x, |xq, xds| {
                f(xq, xds, [Arg::Ptr(0), Arg::U32(0), Arg::F32(0.0)])
            }),
        }
    }

    /// `x` itself, or for a deferred norm its finished values (`kiln_norm_settle_q8`: the
    /// values and their Q8_1 blocks), made at the first call and kept with `x`.
    pub(super) fn settled<'a>(&self, x: &'a CudaTensor) -> Result<&'a CudaTensor> {
        let Some(d) = &x.deferred else {
            return Ok(x);
        };
        if let Some(done) = d.settled.get() {
            return Ok(done);
        }
        let mut out = self.tensor(x.rows, x.cols)?;
        let (oq, ods) = self.q8_buffers(x.rows, x.cols)?;
        let dims = self
            .gpu
            .shapes()
            .quantize_q8_1(x.cols as u32, x.rows as u32);
        let cols = u32_arg(x.cols, "cols")?;
        self.gpu.launch(
            names::kiln_norm_settle_q8,
            dims,
            &[
                x.buf().arg(),
                d.ss.arg(),
                Arg::U32(d.parts),
                out.arg(),
                oq.arg(),
                ods.arg(),
                cols,
                Arg::F32(d.eps),
            ],
        )?;
        out.q8 = Some(Box::new((oq, ods)));
        Ok(d.settled.get_or_init(|| out))
    }

    /// The residual projection that leaves the norm after it to its consumers
    /// (`kiln_matvec_add_norm_q8_*`), when it applies: split weights, a decode-sized batch on
    /// the Q8_1 mat-vecs, whole 32-row blocks, a norm over the whole row, and a grid of one
    /// resident wave. Returns the entry, its shape, the projection's (quants, scales) and the
    /// norm weight's buffer.
    #[allow(clippy::type_complexity)]
    pub(super) fn norm_defer_launch<'w>(
        &self,
        x: &CudaTensor,
        a: &CudaTensor,
        w: &'w CudaWeight,
        norm: &'w CudaWeight,
    ) -> Option<(
        &'static str,
        Dims,
        (&'w DBuf<u8>, &'w DBuf<u8>),
        &'w DBuf<f32>,
    )> {
        let (Storage::Split { ty, qs, scales }, Storage::F32(g)) = (&w.storage, &norm.storage)
        else {
            return None;
        };
        let rows = w.rows;
        // Not Q8_0: measured on an H100 (session 22), 8B Q8_0 decode −0.8 % with it. Its
        // mat-vecs hide the norm launch (all small nodes together cost it 3 %), so the 32-row
        // producer's barrier costs more than the launch it saves.
        let applies = *ty != GgmlType::Q8_0
            && rows <= self.norm_defer_rows
            && !self.f32_activations
            && a.rows <= FUSED_MAX_TOKENS
            && !self.gemm_for(a.rows)
            && a.deferred.is_none()
            && a.cols == w.cols
            && w.cols.is_multiple_of(32)
            && x.rows == a.rows
            && x.cols == rows
            && norm.cols == rows
            && norm.rows == 1
            && rows.is_multiple_of(32)
            && rows <= MAX_DEFERRED_COLS as usize;
        if !applies {
            return None;
        }
        let k = by_format(*ty, MATVEC_ADD_NORM_Q8);
        let dims = self
            .gpu
            .shapes()
            .matvec_add_norm_q8(rows as u32, a.rows as u32);
        self.gpu
            .fits_one_wave(k, dims)
            .then_some((k, dims, (qs, scales), g))
    }

    /// The Q8_1-emitting gate/up + SwiGLU launch for `rows` outputs of `n` tokens: the fewest
    /// rows per warp (1, 2, 4, 8, up to `swiglu_q8_rows`) whose `rows / 32` blocks are all
    /// resident at once; `None` (the separate quantize) when none is, or `rows % 32 != 0`.
    pub(super) fn swiglu_q8_launch(
        &self,
        ty: GgmlType,
        x: &CudaTensor,
        rows: usize,
    ) -> Option<(&'static str, Dims)> {
        if !rows.is_multiple_of(32) || self.f32_activations {
            return None;
        }
        let n = x.rows;
        let k = by_format(
            ty,
            Self::consumer_family(x, MATVEC_SWIGLU_Q8, MATVEC_SWIGLU_Q8_NORM),
        );
        let (rows, n) = (u32::try_from(rows).ok()?, u32::try_from(n).ok()?);
        [1, 2, 4, 8]
            .into_iter()
            .take_while(|&r| r <= self.swiglu_q8_rows)
            .map(|r| self.gpu.shapes().matvec_swiglu_q8(rows, n, r))
            .find(|&dims| self.gpu.fits_one_wave(k, dims))
            .map(|dims| (k, dims))
    }

    /// Buffers for Q8_1 activations of `rows × cols`: i8 codes (4 per f32 slot) and (d, d·Σq)
    /// per 32-block.
    pub(super) fn q8_buffers(&self, rows: usize, cols: usize) -> Result<(CudaTensor, CudaTensor)> {
        Ok((self.tensor(rows, cols / 4)?, self.tensor(rows, cols / 16)?))
    }
}
