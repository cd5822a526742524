//! [`QMatrix`]: a quantized weight matrix borrowed from a GGUF map, times f32 activations.

use super::{dequantize_row, DotFn, Dot4Fn, GgmlType, Isa, activation_type, kernel, quantize_activations};
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
        if cols % qk != 0 {
            bail!("QMatrix {}: cols {cols} is not a multiple of the block size {qk}", ty.name());
        }
        let want = (cols / qk).checked_mul(bs).and_then(|r| r.checked_mul(rows));
        if want != Some(data.len()) {
            bail!(
                "QMatrix {} {rows}x{cols}: expected {} bytes of data, got {}",
                ty.name(),
                want.map_or("an overflowing number of".to_string(), |w| w.to_string()),
                data.len()
            );
        }
        Ok(Self { ty, data, rows, cols })
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
        // Re-validate: the fields are public, so `self` need not come from `try_new`.
        let m = Self::try_new(self.ty, self.data, self.rows, self.cols)?;
        if n.checked_mul(m.cols) != Some(x.len()) {
            bail!("matmul: x has {} values, expected n={n} × cols={}", x.len(), m.cols);
        }
        if n.checked_mul(m.rows) != Some(y.len()) {
            bail!("matmul: y has {} values, expected n={n} × rows={}", y.len(), m.rows);
        }
        if n == 0 || m.rows == 0 {
            return Ok(());
        }
        if m.cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        let k = kernel(isa, m.ty)?;

        // Activations, quantized once per call into the partner format.
        let owned;
        let act: &[u8] = if activation_type(m.ty)? == GgmlType::F32 {
            // SAFETY: f32 has no padding, any byte view of it is valid; u8 alignment is 1.
            unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) }
        } else {
            owned = quantize_activations(m.ty, x)?;
            &owned
        };
        let arb = act.len() / n;
        let rb = m.row_bytes();

        let threads = rayon::current_num_threads().max(1);
        let total = rb * m.rows * n.min(ACT_BLOCK);
        // Small jobs: rayon's fork/join would cost more than it saves.
        if threads == 1 || total < 2 * MIN_TASK_BYTES {
            m.rows_range(k, act, arb, n, 0, m.rows, OutPtr(y.as_mut_ptr()));
            return Ok(());
        }
        // Enough tasks to balance (4 per thread), each with enough work.
        let per_row = rb * n.min(ACT_BLOCK);
        // Multiple of 4 so the four-row kernels cover every task but the last.
        let chunk = m.rows.div_ceil(4 * threads).max(MIN_TASK_BYTES.div_ceil(per_row)).next_multiple_of(4);
        let out = OutPtr(y.as_mut_ptr());
        let n_chunks = m.rows.div_ceil(chunk);
        (0..n_chunks).into_par_iter().for_each(|c| {
            let r0 = c * chunk;
            let r1 = (r0 + chunk).min(m.rows);
            m.rows_range(k, act, arb, n, r0, r1, out);
        });
        Ok(())
    }

    /// [`Self::matmul`] without quantizing the activations: each weight row is dequantized to
    /// f32 and dotted with the f32 activations. Slower, but two devices computing it agree to
    /// float rounding (no 8-bit activation code can flip): kiln's `--f32-activations` mode.
    pub fn matmul_f32x(&self, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
        let m = Self::try_new(self.ty, self.data, self.rows, self.cols)?;
        if n.checked_mul(m.cols) != Some(x.len()) || n.checked_mul(m.rows) != Some(y.len()) {
            bail!("matmul: x has {} values and y {}, expected n={n} × {} and n × {}", x.len(), y.len(), m.cols, m.rows);
        }
        let rb = m.row_bytes();
        let out = OutPtr(y.as_mut_ptr());
        let chunk = 64;
        (0..m.rows.div_ceil(chunk)).into_par_iter().try_for_each(|c| -> Result<()> {
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
                    let tail: f32 = w.chunks_exact(8).remainder().iter().zip(xa.chunks_exact(8).remainder()).map(|(p, q)| p * q).sum();
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
    fn rows_range(&self, (dot, dot4): (DotFn, Option<Dot4Fn>), act: &[u8], arb: usize, n: usize, r0: usize, r1: usize, out: OutPtr) {
        let rb = self.row_bytes();
        // Decode (n = 1) streams each row once anyway: no tiling.
        let tile = if n == 1 { r1 - r0 } else { (TILE_BYTES / rb.max(1)).clamp(4, 64) & !3 };
        let mut t0 = r0;
        while t0 < r1 {
            let t1 = (t0 + tile).min(r1);
            let mut a0 = 0;
            while a0 < n {
                let a1 = (a0 + ACT_BLOCK).min(n);
                for a in a0..a1 {
                    let av = &act[a * arb..(a + 1) * arb];
                    let mut r = t0;
                    if let Some(dot4) = dot4 {
                        while r + 4 <= t1 {
                            let v = dot4(&self.data[r * rb..(r + 4) * rb], rb, av);
                            for (k, v) in v.into_iter().enumerate() {
                                // SAFETY: as below.
                                unsafe { *out.0.add(a * self.rows + r + k) = v };
                            }
                            r += 4;
                        }
                    }
                    for r in r..t1 {
                        let v = dot(&self.data[r * rb..(r + 1) * rb], av);
                        // SAFETY: a < n and r < rows, y has n*rows elements (checked), and
                        // each (a, r) is written by exactly one task (disjoint row ranges).
                        unsafe { *out.0.add(a * self.rows + r) = v };
                    }
                }
                a0 = a1;
            }
            t0 = t1;
        }
    }
}
