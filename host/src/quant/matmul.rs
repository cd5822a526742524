//! [`QMatrix`]: a quantized weight matrix borrowed from a GGUF map, times f32 activations.

use super::{
    Dot4Fn, DotFn, Expanded, GgmlType, Isa, activation_type, dequantize_row, expanded, kernel,
    quantize_activations_in,
};
use crate::numerics::Numerics;
use anyhow::{Result, bail};
use rayon::prelude::*;

/// Row-major `rows × cols` weights of type `ty` (each row whole blocks, GGUF layout).
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

/// Weight bytes one rayon task should at least stream, so task overhead (~µs) stays small.
const MIN_TASK_BYTES: usize = 48 * 1024;
/// Bytes of weight rows kept hot in L1 while every activation row of a block passes over them.
const TILE_BYTES: usize = 16 * 1024;
/// Activation rows per pass over a weight tile (bounds the activation working set for big n).
const ACT_BLOCK: usize = 64;

/// Rows `r0..r1` of matrix `m` of a [`matmul_many`] call: one rayon task.
#[derive(Clone, Copy)]
struct Task {
    m: usize,
    r0: usize,
    r1: usize,
}

/// `ys[i] = x · ms[i]ᵀ` (each as in [`QMatrix::matmul`]) for matrices of equal width, such as
/// the q/k/v projections of one input: the activations are quantized once per weight type and
/// the rows of all the matrices are shared out in one parallel region, not one per matrix.
/// `numerics` rounds the 8-bit activation codes.
pub fn matmul_many(
    numerics: Numerics,
    ms: &[QMatrix],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) -> Result<()> {
    many(Isa::detect(), numerics, ms, x, n, ys, false)
}

/// [`matmul_many`] with a chosen kernel ISA, kiln's rounding.
pub fn matmul_many_with(
    isa: Isa,
    ms: &[QMatrix],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) -> Result<()> {
    many(isa, Numerics::Kiln, ms, x, n, ys, false)
}

/// `y = silu(x · gateᵀ) ⊙ (x · upᵀ)` (`y` is `n × gate.rows`): both mat-muls and the SwiGLU in
/// one parallel region, each task taking the same rows of both matrices. `numerics` rounds the
/// 8-bit activation codes and the SiLU.
pub fn matmul_swiglu(
    numerics: Numerics,
    gate: &QMatrix,
    up: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
    swiglu(Isa::detect(), numerics, gate, up, x, n, y)
}

/// [`matmul_swiglu`] with a chosen kernel ISA, kiln's rounding.
pub fn matmul_swiglu_with(
    isa: Isa,
    gate: &QMatrix,
    up: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
    swiglu(isa, Numerics::Kiln, gate, up, x, n, y)
}

fn swiglu(
    isa: Isa,
    numerics: Numerics,
    gate: &QMatrix,
    up: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
    if (gate.rows, gate.cols) != (up.rows, up.cols) {
        bail!(
            "matmul_swiglu: gate is {}x{}, up {}x{}",
            gate.rows,
            gate.cols,
            up.rows,
            up.cols
        );
    }
    let mut u = vec![0f32; y.len()];
    many(isa, numerics, &[*gate, *up], x, n, &mut [y, &mut u], true)
}

/// [`matmul_many_with`]; with `swiglu`, `ms` is [gate, up], tasks are planned over the gate's
/// rows and run the same rows of both, then leave `silu(gate) · up` in `ys[0]`.
fn many(
    isa: Isa,
    numerics: Numerics,
    ms: &[QMatrix],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    swiglu: bool,
) -> Result<()> {
    if ms.len() != ys.len() {
        bail!("matmul: {} matrices but {} outputs", ms.len(), ys.len());
    }
    let ms = ms
        .iter()
        .zip(ys.iter())
        .map(|(m, y)| m.check_io(x, n, y))
        .collect::<Result<Vec<_>>>()?;
    if n == 0 {
        return Ok(());
    }
    let mut outs = Vec::with_capacity(ms.len());
    for (m, y) in ms.iter().zip(ys.iter_mut()) {
        if m.cols == 0 {
            y.fill(0.0);
        }
        outs.push(OutPtr(y.as_mut_ptr()));
    }
    let kernels = ms
        .iter()
        .map(|m| kernel(isa, m.ty, n == 1))
        .collect::<Result<Vec<_>>>()?;
    let expand: Vec<_> = ms
        .iter()
        .map(|m| if n > 1 { expanded(isa, m.ty) } else { None })
        .collect();
    // Activations, quantized once per partner format (q/k/v of one model share one).
    let mut acts: Vec<(GgmlType, Vec<u8>)> = Vec::new();
    for m in &ms {
        let at = activation_type(m.ty)?;
        if at != GgmlType::F32 && !acts.iter().any(|(t, _)| *t == at) {
            acts.push((at, quantize_activations_in(numerics, m.ty, x)?));
        }
    }
    // SAFETY: f32 has no padding, any byte view of it is valid; u8 alignment is 1.
    let x_bytes = unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) };
    let act_of = |m: &QMatrix| -> &[u8] {
        let at = activation_type(m.ty).unwrap_or(GgmlType::F32);
        acts.iter()
            .find(|(t, _)| *t == at)
            .map_or(x_bytes, |(_, a)| a.as_slice())
    };

    let threads = rayon::current_num_threads().max(1);
    let per_row = |m: &QMatrix| m.row_bytes() * n.min(ACT_BLOCK);
    let total: usize = ms.iter().map(|m| per_row(m) * m.rows).sum();
    let mut tasks = Vec::new();
    let planned = if swiglu { &ms[..1] } else { &ms[..] };
    for (i, m) in planned
        .iter()
        .enumerate()
        .filter(|(_, m)| m.rows > 0 && m.cols > 0)
    {
        // Small jobs: rayon's fork/join would cost more than it saves. Otherwise enough tasks
        // to balance (4 per thread over all the matrices), each with enough work; a multiple of
        // 4 rows so the four-row kernels cover every task but a matrix's last.
        let chunk = if threads == 1 || total < 2 * MIN_TASK_BYTES {
            m.rows
        } else {
            let share = (m.rows * per_row(m)).div_ceil(total / (4 * threads)).max(1);
            m.rows
                .div_ceil(share)
                .max(MIN_TASK_BYTES.div_ceil(per_row(m)))
                .next_multiple_of(4)
        };
        tasks.extend((0..m.rows).step_by(chunk).map(|r0| Task {
            m: i,
            r0,
            r1: (r0 + chunk).min(m.rows),
        }));
    }
    let run = |t: &Task| {
        let mats = if swiglu { 0..2 } else { t.m..t.m + 1 };
        for i in mats {
            let (m, act) = (&ms[i], act_of(&ms[i]));
            m.rows_range(
                kernels[i],
                expand[i],
                act,
                act.len() / n,
                n,
                t.r0,
                t.r1,
                outs[i],
            );
        }
        if swiglu {
            let rows = ms[0].rows;
            for a in 0..n {
                for r in t.r0..t.r1 {
                    // SAFETY: rows r0..r1 of activation row a belong to this task alone, in
                    // both outputs (each n × rows, checked).
                    unsafe {
                        let g = outs[0].0.add(a * rows + r);
                        *g = numerics.silu_mul(*g, *outs[1].0.add(a * rows + r));
                    }
                }
            }
        }
    };
    if tasks.len() <= 1 {
        tasks.iter().for_each(run);
    } else {
        tasks.par_iter().for_each(run);
    }
    Ok(())
}

/// Raw output pointer for disjoint writes from rayon tasks.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl<'a> QMatrix<'a> {
    /// Checks that `ty` has a CPU dot product, `cols` is whole blocks and `data` is exactly
    /// `rows` rows.
    pub fn try_new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self> {
        activation_type(ty)?;
        let (qk, bs) = ty.block();
        if !cols.is_multiple_of(qk) {
            bail!(
                "QMatrix {}: cols {cols} is not a multiple of the block size {qk}",
                ty.name()
            );
        }
        let want = (cols / qk)
            .checked_mul(bs)
            .and_then(|r| r.checked_mul(rows));
        if want != Some(data.len()) {
            bail!(
                "QMatrix {} {rows}x{cols}: expected {} bytes of data, got {}",
                ty.name(),
                want.map_or("an overflowing number of".to_string(), |w| w.to_string()),
                data.len()
            );
        }
        Ok(Self {
            ty,
            data,
            rows,
            cols,
        })
    }

    /// Bytes of one weight row.
    pub fn row_bytes(&self) -> usize {
        let (qk, bs) = self.ty.block();
        self.cols / qk * bs
    }

    /// `y[a][r] = sum_c W[r][c] * x[a][c]` for `n` activation rows: `x` is `n × cols`, `y` is
    /// `n × rows`, both row-major.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
        self.matmul_with(Isa::detect(), x, n, y)
    }

    /// [`Self::matmul`] with a chosen kernel ISA.
    pub fn matmul_with(&self, isa: Isa, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
        many(isa, Numerics::Kiln, &[*self], x, n, &mut [y], false)
    }

    /// Checks `self` (the fields are public, so it need not come from `try_new`) against `n`
    /// activation rows `x` and an output `y`.
    fn check_io(&self, x: &[f32], n: usize, y: &[f32]) -> Result<Self> {
        let m = Self::try_new(self.ty, self.data, self.rows, self.cols)?;
        if n.checked_mul(m.cols) != Some(x.len()) {
            bail!(
                "matmul: x has {} values, expected n={n} × cols={}",
                x.len(),
                m.cols
            );
        }
        if n.checked_mul(m.rows) != Some(y.len()) {
            bail!(
                "matmul: y has {} values, expected n={n} × rows={}",
                y.len(),
                m.rows
            );
        }
        Ok(m)
    }
    /// [`Self::matmul`] without quantizing the activations: each weight row is dequantized to
    /// f32 and dotted with the f32 activations. Slower, but two devices computing it agree to
    /// float rounding (no 8-bit activation code can flip): kiln's `--f32-activations` mode.
    pub fn matmul_f32x(&self, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
        let m = Self::try_new(self.ty, self.data, self.rows, self.cols)?;
        if n.checked_mul(m.cols) != Some(x.len()) || n.checked_mul(m.rows) != Some(y.len()) {
            bail!(
                "matmul: x has {} values and y {}, expected n={n} × {} and n × {}",
                x.len(),
                y.len(),
                m.cols,
                m.rows
            );
        }
        let rb = m.row_bytes();
        let out = OutPtr(y.as_mut_ptr());
        let chunk = 64;
        (0..m.rows.div_ceil(chunk))
            .into_par_iter()
            .try_for_each(|c| -> Result<()> {
                let out = &out; // the whole Send + Sync wrapper, not its raw-pointer field
                let mut w = vec![0f32; m.cols];
                for r in c * chunk..((c + 1) * chunk).min(m.rows) {
                    dequantize_row(m.ty, &m.data[r * rb..(r + 1) * rb], &mut w)?;
                    for (a, xa) in x.chunks_exact(m.cols).enumerate() {
                        // Eight partial sums: lets the compiler vectorize without reassociating.
                        let mut acc = [0f32; 8];
                        for (wc, xc) in w.chunks_exact(8).zip(xa.chunks_exact(8)) {
                            for k in 0..8 {
                                acc[k] += wc[k] * xc[k];
                            }
                        }
                        let tail: f32 = w
                            .chunks_exact(8)
                            .remainder()
                            .iter()
                            .zip(xa.chunks_exact(8).remainder())
                            .map(|(p, q)| p * q)
                            .sum();
                        // SAFETY: row r of activation row a is written by this task only.
                        unsafe { *out.0.add(a * m.rows + r) = acc.iter().sum::<f32>() + tail };
                    }
                }
                Ok(())
            })
    }

    /// Rows `r0..r1` for all `n` activation rows. For n > 1 the weight rows go in L1-sized
    /// tiles and every activation row of a block passes over a tile before the next one is
    /// loaded, so weights stream from memory once per block of activations.
    #[allow(clippy::too_many_arguments)]
    /// With `expand` (batches only), each weight tile is first expanded ([`Expanded`]) and
    /// the expanded kernels run over it.
    #[allow(clippy::too_many_arguments)]
    fn rows_range(
        &self,
        plain: (DotFn, Option<Dot4Fn>),
        expand: Option<Expanded>,
        act: &[u8],
        arb: usize,
        n: usize,
        r0: usize,
        r1: usize,
        out: OutPtr,
    ) {
        let rb = self.row_bytes();
        let xrb = expand.map_or(rb, |e| self.cols / self.ty.block().0 * e.block_bytes);
        // Decode (n = 1) streams each row once anyway: no tiling. Tiles are sized by the packed
        // rows even when expanded (twice the bytes): sized by the expanded bytes instead, a
        // prefill-shaped Q4_1 1536×576, n = 64 mat-mul took 1.63 ms instead of 0.89.
        let tile = if n == 1 {
            r1 - r0
        } else {
            (TILE_BYTES / rb.max(1)).clamp(4, 64) & !3
        };
        let mut buf = Vec::new();
        let mut t0 = r0;
        while t0 < r1 {
            let t1 = (t0 + tile).min(r1);
            let (w, wrb, (dot, dot4)) = match expand {
                Some(e) => {
                    buf.resize((t1 - t0) * xrb, 0);
                    (e.expand)(&self.data[t0 * rb..t1 * rb], &mut buf);
                    (&buf[..], xrb, (e.dot, Some(e.dot4)))
                }
                None => (&self.data[t0 * rb..t1 * rb], rb, plain),
            };
            let mut a0 = 0;
            while a0 < n {
                let a1 = (a0 + ACT_BLOCK).min(n);
                for a in a0..a1 {
                    let av = &act[a * arb..(a + 1) * arb];
                    let mut r = 0;
                    if let Some(dot4) = dot4 {
                        while t0 + r + 4 <= t1 {
                            let v = dot4(&w[r * wrb..(r + 4) * wrb], wrb, av);
                            for (k, v) in v.into_iter().enumerate() {
                                // SAFETY: as below.
                                unsafe { *out.0.add(a * self.rows + t0 + r + k) = v };
                            }
                            r += 4;
                        }
                    }
                    for r in r..t1 - t0 {
                        let v = dot(&w[r * wrb..(r + 1) * wrb], av);
                        // SAFETY: a < n and t0 + r < rows, y has n*rows elements (checked), and
                        // each (a, row) is written by exactly one task (disjoint row ranges).
                        unsafe { *out.0.add(a * self.rows + t0 + r) = v };
                    }
                }
                a0 = a1;
            }
            t0 = t1;
        }
    }
}
