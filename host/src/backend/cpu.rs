//! The CPU backend: weights stay in the GGUF memory map (zero-copy, so resident memory is about
//! the file plus the KV cache), mat-muls go through [`crate::quant::QMatrix`], the rest is plain
//! f32 loops, threaded with rayon where the work is large enough to pay for it.

mod attention;
pub mod moe;

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use half::f16;
use half::vec::HalfBitsVecExt;
use rayon::prelude::*;

use super::{Attention, Backend, KvSpec, Moe, Rope, RopeStyle, Shape, check_row};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::numerics::Numerics;
use crate::quant::{self, QMatrix};

/// Below this many elements an elementwise op runs on the calling thread: waking the pool costs
/// more than the loop.
const PAR_MIN: usize = 1 << 14;

#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    f32_activations: bool,
    numerics: Numerics,
}

impl Cpu {
    pub fn new() -> Self {
        Cpu::default()
    }
    /// Matmuls keep activations in f32 instead of quantizing them to 8 bits (as llama.cpp
    /// does): slower, but the CUDA backend in the same mode agrees to float rounding.
    pub fn with_f32_activations(self) -> Self {
        Cpu {
            f32_activations: true,
            ..self
        }
    }
    /// Rounds as llama.cpp's CPU backend does, step for step ([`Numerics::Llama`]): the same
    /// logits, so the same greedy tokens; attention then accumulates in f16 and runs slower.
    pub fn with_llama_numerics(self) -> Self {
        Cpu {
            numerics: Numerics::Llama,
            ..self
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl CpuTensor {
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Result<Self> {
        ensure!(
            data.len() == rows * cols,
            "tensor data has {} elements, expected {rows}x{cols}",
            data.len()
        );
        Ok(CpuTensor { data, rows, cols })
    }
    fn zeros(rows: usize, cols: usize) -> Self {
        CpuTensor {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }
}

impl Shape for CpuTensor {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

/// A tensor still inside the memory map; one-row weights (norm scales) are also kept as f32,
/// since they are tiny and read on every token.
pub struct CpuWeight {
    file: Arc<GgufFile>,
    info: TensorInfo,
    rows: usize,
    cols: usize,
    dense: Option<Vec<f32>>,
}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        self.file.tensor_data(&self.info)
    }
    fn ty(&self) -> GgmlType {
        self.info.ggml_type
    }
    fn qmatrix(&self) -> QMatrix<'_> {
        QMatrix {
            ty: self.ty(),
            data: self.bytes(),
            rows: self.rows,
            cols: self.cols,
        }
    }
    fn dense(&self) -> Result<&[f32]> {
        self.dense
            .as_deref()
            .with_context(|| format!("tensor {} is not a vector", self.info.name))
    }
}

impl Shape for CpuWeight {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

/// f16 keys and values, head-major per layer (`[n_kv_head][max_seq][head_dim]`) so that one
/// head's keys are contiguous for the attention dot products.
pub struct CpuKvCache {
    spec: KvSpec,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

fn check_same(a: &CpuTensor, b: &CpuTensor, op: &str) -> Result<()> {
    ensure!(
        a.rows == b.rows && a.cols == b.cols,
        "{op}: shapes differ ({}x{} vs {}x{})",
        a.rows,
        a.cols,
        b.rows,
        b.cols
    );
    Ok(())
}

fn check_width(x: &CpuTensor, w: &CpuWeight) -> Result<()> {
    ensure!(
        x.cols == w.cols,
        "matmul: activations have {} columns, {} expects {}",
        x.cols,
        w.info.name,
        w.cols
    );
    Ok(())
}

impl Backend for Cpu {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvCache = CpuKvCache;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<CpuWeight> {
        let info = file
            .tensor(name)
            .with_context(|| format!("model has no tensor {name}"))?
            .clone();
        let cols = *info
            .dims
            .first()
            .with_context(|| format!("tensor {name} has no dimensions"))?
            as usize;
        let rows = info.dims[1..].iter().product::<u64>() as usize;
        let expect = info.ggml_type.bytes_for((rows * cols) as u64);
        ensure!(
            expect == Some(file.tensor_data(&info).len() as u64),
            "tensor {name}: {:?} {:?} does not match its {} data bytes",
            info.ggml_type,
            info.dims,
            file.tensor_data(&info).len()
        );
        let mut w = CpuWeight {
            file: file.clone(),
            info,
            rows,
            cols,
            dense: None,
        };
        if rows == 1 {
            let mut v = vec![0.0; cols];
            quant::dequantize_row(w.ty(), w.bytes(), &mut v)
                .with_context(|| format!("tensor {name}"))?;
            w.dense = Some(v);
        }
        Ok(w)
    }

    fn kv_cache(&self, spec: &KvSpec) -> Result<CpuKvCache> {
        let per_layer = spec
            .n_kv_head
            .checked_mul(spec.max_seq)
            .and_then(|x| x.checked_mul(spec.head_dim))
            .context("KV cache size overflows")?;
        // Zeroed u16s come from calloc: pages are only touched (made resident) as positions fill.
        let layer = || vec![0u16; per_layer].reinterpret_into::<f16>();
        Ok(CpuKvCache {
            spec: *spec,
            k: (0..spec.n_layer).map(|_| layer()).collect(),
            v: (0..spec.n_layer).map(|_| layer()).collect(),
        })
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        CpuTensor::new(data.to_vec(), rows, cols)
    }

    fn read(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn argmax(&self, x: &CpuTensor) -> Result<Vec<u32>> {
        Ok(x.data
            .chunks_exact(x.cols.max(1))
            .map(|row| {
                let mut best = 0;
                for (i, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = i;
                    }
                }
                best as u32
            })
            .collect())
    }

    fn rows(&self, x: &CpuTensor, start: usize, n: usize) -> Result<CpuTensor> {
        ensure!(
            start + n <= x.rows,
            "rows {start}..{} of a {}-row tensor",
            start + n,
            x.rows
        );
        CpuTensor::new(
            x.data[start * x.cols..(start + n) * x.cols].to_vec(),
            n,
            x.cols,
        )
    }

    fn embed(&self, table: &CpuWeight, ids: &[u32]) -> Result<CpuTensor> {
        let (ty, cols) = (table.ty(), table.cols);
        let row_bytes = ty
            .bytes_for(cols as u64)
            .context("embedding row is not whole blocks")? as usize;
        let mut out = CpuTensor::zeros(ids.len(), cols);
        for (&id, dst) in ids.iter().zip(out.data.chunks_exact_mut(cols)) {
            let id = id as usize;
            ensure!(
                id < table.rows,
                "token id {id} is outside the vocabulary ({})",
                table.rows
            );
            quant::dequantize_row(
                ty,
                &table.bytes()[id * row_bytes..(id + 1) * row_bytes],
                dst,
            )?;
        }
        Ok(out)
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuWeight) -> Result<CpuTensor> {
        check_width(x, w)?;
        let mut y = CpuTensor::zeros(x.rows, w.rows);
        if self.f32_activations {
            w.qmatrix().matmul_f32x(&x.data, x.rows, &mut y.data)?;
        } else {
            quant::matmul_many(
                self.numerics,
                &[w.qmatrix()],
                &x.data,
                x.rows,
                &mut [&mut y.data],
            )?;
        }
        Ok(y)
    }

    /// One activation quantization and one parallel region for all the matrices (q/k/v).
    fn matmul_many(&self, x: &CpuTensor, ws: &[&CpuWeight]) -> Result<Vec<CpuTensor>> {
        if self.f32_activations {
            return ws.iter().map(|w| self.matmul(x, w)).collect();
        }
        for w in ws {
            check_width(x, w)?;
        }
        let mut ys: Vec<CpuTensor> = ws
            .iter()
            .map(|w| CpuTensor::zeros(x.rows, w.rows))
            .collect();
        let ms: Vec<QMatrix> = ws.iter().map(|w| w.qmatrix()).collect();
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.data.as_mut_slice()).collect();
        quant::matmul_many(self.numerics, &ms, &x.data, x.rows, &mut outs)?;
        Ok(ys)
    }

    /// Gate, up and SwiGLU in one parallel region (each task: the same rows of both).
    fn matmul_swiglu(&self, x: &CpuTensor, gate: &CpuWeight, up: &CpuWeight) -> Result<CpuTensor> {
        if self.f32_activations {
            return self.swiglu(&self.matmul(x, gate)?, &self.matmul(x, up)?);
        }
        check_width(x, gate)?;
        check_width(x, up)?;
        let mut y = CpuTensor::zeros(x.rows, gate.rows);
        quant::matmul_swiglu(
            self.numerics,
            &gate.qmatrix(),
            &up.qmatrix(),
            &x.data,
            x.rows,
            &mut y.data,
        )?;
        Ok(y)
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32) -> Result<CpuTensor> {
        let scale = w.dense()?;
        let g = scale.len();
        ensure!(
            g > 0 && x.cols.is_multiple_of(g),
            "rms_norm: {} columns in groups of {g}",
            x.cols
        );
        let mut out = CpuTensor::zeros(x.rows, x.cols);
        let norm = |(src, dst): (&[f32], &mut [f32])| {
            let r = self.numerics.rms_scale(src, eps);
            for ((d, &s), &w) in dst.iter_mut().zip(src).zip(scale) {
                *d = s * r * w;
            }
        };
        let pairs = x.data.chunks_exact(g).zip(out.data.chunks_exact_mut(g));
        if x.data.len() >= PAR_MIN {
            pairs.par_bridge().for_each(norm);
        } else {
            pairs.for_each(norm);
        }
        Ok(out)
    }

    fn rope(&self, x: &mut CpuTensor, pos: usize, rope: &Rope) -> Result<()> {
        let (hd, rd) = (rope.head_dim, rope.rot_dim);
        ensure!(
            hd > 0 && x.cols.is_multiple_of(hd),
            "rope: {} columns is not whole heads of {hd}",
            x.cols
        );
        ensure!(
            rd % 2 == 0 && rd <= hd,
            "rope: rotary dims {rd} must be even and <= {hd}"
        );
        let half = rd / 2;
        if let Some(f) = &rope.factors {
            ensure!(
                f.len() == rd / 2,
                "rope: {} frequency factors for {rd} rotary dims",
                f.len()
            );
        }
        let freqs = self
            .numerics
            .rope_freqs(rope.freq_base, rd, rope.factors.as_deref());
        let cols = x.cols;
        let rotate_row = |(r, row): (usize, &mut [f32])| {
            let cs = freqs.cos_sin(pos + r);
            for head in row.chunks_exact_mut(hd) {
                for (i, &(c, s)) in cs.iter().enumerate() {
                    let (a, b) = match rope.style {
                        RopeStyle::Normal => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + half),
                    };
                    (head[a], head[b]) = self.numerics.rotate(head[a], head[b], c, s);
                }
            }
        };
        if x.data.len() >= PAR_MIN {
            x.data
                .par_chunks_exact_mut(cols)
                .enumerate()
                .for_each(rotate_row);
        } else {
            x.data
                .chunks_exact_mut(cols)
                .enumerate()
                .for_each(rotate_row);
        }
        Ok(())
    }

    fn swiglu(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        check_same(gate, up, "swiglu")?;
        let mut out = CpuTensor::zeros(gate.rows, gate.cols);
        let f = |((o, &g), &u): ((&mut f32, &f32), &f32)| *o = self.numerics.silu_mul(g, u);
        if out.data.len() >= PAR_MIN {
            out.data
                .par_iter_mut()
                .zip(&gate.data)
                .zip(&up.data)
                .for_each(f);
        } else {
            out.data
                .iter_mut()
                .zip(&gate.data)
                .zip(&up.data)
                .for_each(f);
        }
        Ok(out)
    }

    fn moe_route(&self, logits: &CpuTensor, moe: &Moe) -> Result<CpuTensor> {
        moe::route(logits, moe)
    }

    fn moe_swiglu_add(
        &self,
        x: &mut CpuTensor,
        h: &CpuTensor,
        route: &CpuTensor,
        gate: &CpuWeight,
        up: &CpuWeight,
        down: &CpuWeight,
        m: &Moe,
    ) -> Result<()> {
        moe::swiglu_add(self, x, h, route, gate, up, down, m)
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        check_same(x, y, "add")?;
        x.data.iter_mut().zip(&y.data).for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn add_row(&self, x: &mut CpuTensor, row: &CpuTensor) -> Result<()> {
        check_row(x, row)?;
        for r in x.data.chunks_exact_mut(x.cols) {
            r.iter_mut().zip(&row.data).for_each(|(a, &b)| *a += b);
        }
        Ok(())
    }

    fn attention(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        pos: usize,
        attn: &Attention,
    ) -> Result<CpuTensor> {
        let spec = cache.spec;
        let (n, hd, nkv) = (q.rows, attn.head_dim, attn.n_kv_head);
        ensure!(
            layer < spec.n_layer,
            "attention: layer {layer} of a {}-layer cache",
            spec.n_layer
        );
        ensure!(
            hd == spec.head_dim && nkv == spec.n_kv_head,
            "attention: {nkv} kv heads of {hd} do not match the cache"
        );
        ensure!(
            attn.n_head > 0 && nkv > 0 && attn.n_head.is_multiple_of(nkv),
            "attention: {} heads cannot share {nkv} kv heads",
            attn.n_head
        );
        ensure!(
            q.cols == attn.n_head * hd,
            "attention: q has {} columns",
            q.cols
        );
        ensure!(
            k.cols == nkv * hd && v.cols == nkv * hd,
            "attention: k/v have {} columns",
            k.cols
        );
        ensure!(
            k.rows == n && v.rows == n,
            "attention: q, k, v row counts differ"
        );
        if pos + n > spec.max_seq {
            bail!(
                "context full: positions up to {} exceed the {}-token KV cache",
                pos + n,
                spec.max_seq
            );
        }
        attention::store(&mut cache.k[layer], k, pos, &spec);
        attention::store(&mut cache.v[layer], v, pos, &spec);
        let mut out = CpuTensor::zeros(n, q.cols);
        attention::attend(
            &cache.k[layer],
            &cache.v[layer],
            q,
            &mut out,
            pos,
            attn,
            spec.max_seq,
            self.numerics,
        );
        Ok(out)
    }
}
