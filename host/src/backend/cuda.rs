//! The CUDA backend: every op is a kiln kernel (Rust compiled to PTX) launched through
//! [`crate::cuda::Gpu`]. Weights are uploaded once, in the split layout the mat-vec kernels read
//! with 16-byte loads; activations and the f16 KV cache stay on the device. Activation buffers
//! come from a small size-keyed pool, so decoding allocates nothing after the first token.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Result, bail, ensure};
use kernels_gpu::entries::names;
use kernels_gpu::kernels::formats::{self, SplitFormat};

use super::{Attention, Backend, KvSpec, Rope, RopeStyle, Shape};
use crate::cuda::{Arg, DBuf, Gpu, PtxModule};
use crate::gguf::{GgmlType, GgufFile};

type Pool = Rc<RefCell<HashMap<usize, Vec<DBuf<f32>>>>>;

pub struct Cuda {
    gpu: Rc<Gpu>,
    pool: Pool,
}

impl Cuda {
    /// Opens GPU `ordinal` with the embedded kernel modules (the `kiln` package's `PTX_MODULES`).
    pub fn new(modules: &[PtxModule], ordinal: usize) -> Result<Self> {
        Ok(Cuda { gpu: Rc::new(Gpu::new(modules, ordinal)?), pool: Rc::default() })
    }
    /// The CUDA backend over the host grid executor with policy `P`: the same backend code and
    /// kernel bodies, run on the CPU (slow; tests and debugging).
    pub fn host<P: policies::TargetPolicy>() -> Self {
        Cuda { gpu: Rc::new(Gpu::host::<P>()), pool: Rc::default() }
    }
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let n = (rows * cols).max(1);
        let buf = match self.pool.borrow_mut().get_mut(&n).and_then(Vec::pop) {
            Some(b) => b,
            None => self.gpu.alloc::<f32>(n)?,
        };
        Ok(CudaTensor { buf: Some(buf), rows, cols, pool: self.pool.clone() })
    }
}

/// An activation matrix on the GPU; its buffer goes back to the pool when dropped.
pub struct CudaTensor {
    buf: Option<DBuf<f32>>,
    rows: usize,
    cols: usize,
    pool: Pool,
}

impl CudaTensor {
    fn buf(&self) -> &DBuf<f32> {
        self.buf.as_ref().expect("tensor buffer present until drop")
    }
    fn arg(&self) -> Arg {
        self.buf().arg()
    }
    fn len(&self) -> usize {
        self.rows * self.cols
    }
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.borrow_mut().entry(b.len()).or_default().push(b);
        }
    }
}

impl Shape for CudaTensor {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

enum Storage {
    /// 32-element block formats, split into a quants plane and a scales plane.
    Split { ty: GgmlType, qs: DBuf<u8>, scales: DBuf<u8> },
    F16(DBuf<u16>),
    F32(DBuf<f32>),
}

pub struct CudaWeight {
    name: String,
    storage: Storage,
    rows: usize,
    cols: usize,
}

impl Shape for CudaWeight {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

pub struct CudaKvCache {
    k: Vec<DBuf<u16>>,
    v: Vec<DBuf<u16>>,
    spec: KvSpec,
}

fn split<F: SplitFormat>(gpu: &Gpu, ty: GgmlType, data: &[u8], rows: usize, cols: usize, name: &str) -> Result<Storage> {
    let (qb, sb) = formats::split_plane_bytes::<F>(rows, cols);
    let (mut qs, mut scales) = (vec![0u8; qb], vec![0u8; sb]);
    ensure!(
        formats::split_gguf_blocks::<F>(data, rows, cols, &mut qs, &mut scales),
        "tensor {name}: {} bytes do not hold {rows}x{cols} {} values",
        data.len(),
        ty.name()
    );
    Ok(Storage::Split { ty, qs: gpu.upload(&qs)?, scales: gpu.upload(&scales)? })
}

fn u32_arg(v: usize, what: &str) -> Result<Arg> {
    u32::try_from(v).map(Arg::U32).map_err(|_| anyhow::anyhow!("{what} = {v} is too large for the GPU kernels"))
}

impl Backend for Cuda {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvCache = CudaKvCache;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<CudaWeight> {
        let info = file.tensor(name)?;
        let cols = info.row_len() as usize;
        let rows = info.rows() as usize;
        let data = file.tensor_data(info);
        let gpu = &self.gpu;
        let storage = match info.ggml_type {
            GgmlType::Q4_0 => split::<formats::Q4_0>(gpu, info.ggml_type, data, rows, cols, name)?,
            GgmlType::Q4_1 => split::<formats::Q4_1>(gpu, info.ggml_type, data, rows, cols, name)?,
            GgmlType::Q8_0 => split::<formats::Q8_0>(gpu, info.ggml_type, data, rows, cols, name)?,
            GgmlType::F16 => {
                ensure!(cols % 8 == 0, "tensor {name}: f16 rows of {cols} are not a multiple of 8");
                let v: Vec<u16> = data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                Storage::F16(gpu.upload(&v)?)
            }
            GgmlType::F32 => {
                let v: Vec<f32> = data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                Storage::F32(gpu.upload(&v)?)
            }
            other => bail!(
                "tensor {name}: {} weights are not supported by the CUDA backend yet (Q4_0, Q4_1, Q8_0, F16, F32 are); use --device cpu",
                other.name()
            ),
        };
        Ok(CudaWeight { name: name.to_string(), storage, rows, cols })
    }

    fn kv_cache(&self, spec: &KvSpec) -> Result<CudaKvCache> {
        let per_layer = spec.n_kv_head * spec.max_seq * spec.head_dim;
        let mut k = Vec::with_capacity(spec.n_layer);
        let mut v = Vec::with_capacity(spec.n_layer);
        for _ in 0..spec.n_layer {
            k.push(self.gpu.alloc::<u16>(per_layer)?);
            v.push(self.gpu.alloc::<u16>(per_layer)?);
        }
        Ok(CudaKvCache { k, v, spec: *spec })
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        ensure!(data.len() == rows * cols, "upload of {} values as {rows}x{cols}", data.len());
        let mut t = self.tensor(rows, cols)?;
        self.gpu.write(t.buf.as_mut().expect("fresh buffer"), data)?;
        Ok(t)
    }

    fn read(&self, x: &CudaTensor) -> Result<Vec<f32>> {
        self.gpu.download_prefix(x.buf(), x.len())
    }

    fn argmax(&self, x: &CudaTensor) -> Result<Vec<u32>> {
        let v = self.read(x)?;
        Ok(v.chunks(x.cols)
            .map(|r| r.iter().enumerate().fold((0u32, f32::NEG_INFINITY), |b, (i, &y)| if y > b.1 { (i as u32, y) } else { b }).0)
            .collect())
    }

    fn rows(&self, x: &CudaTensor, start: usize, n: usize) -> Result<CudaTensor> {
        ensure!(start + n <= x.rows, "rows {start}..{} of a {}-row tensor", start + n, x.rows);
        let t = self.tensor(n, x.cols)?;
        self.gpu.copy_range(x.buf(), start * x.cols, t.buf(), 0, n * x.cols)?;
        Ok(t)
    }

    fn embed(&self, table: &CudaWeight, ids: &[u32]) -> Result<CudaTensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.rows) {
            bail!("token id {bad} is outside the vocabulary of {} ({} rows)", table.name, table.rows);
        }
        let ids_d = self.gpu.upload(ids)?;
        let out = self.tensor(ids.len(), table.cols)?;
        let threads = ids.len() * table.cols;
        let dims = self.gpu.shapes().flat(threads as u32);
        let (cols, threads) = (u32_arg(table.cols, "embedding width")?, u32_arg(threads, "embedding size")?);
        match &table.storage {
            Storage::Split { ty, qs, scales } => {
                let k = match ty {
                    GgmlType::Q4_0 => names::kiln_embed_q4_0,
                    GgmlType::Q4_1 => names::kiln_embed_q4_1,
                    _ => names::kiln_embed_q8_0,
                };
                self.gpu.launch(k, dims, &[qs.arg(), scales.arg(), ids_d.arg(), out.arg(), cols, threads])?
            }
            Storage::F16(w) => self.gpu.launch(names::kiln_embed_f16, dims, &[w.arg(), ids_d.arg(), out.arg(), cols, threads])?,
            Storage::F32(_) => bail!("tensor {}: f32 embedding tables are not supported by the CUDA backend", table.name),
        }
        Ok(out)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaWeight) -> Result<CudaTensor> {
        ensure!(x.cols == w.cols, "matmul: activations have {} columns, {} has {}", x.cols, w.name, w.cols);
        let out = self.tensor(x.rows, w.rows)?;
        let sh = self.gpu.shapes();
        let (rows, cols, n) = (u32_arg(w.rows, "rows")?, u32_arg(w.cols, "cols")?, x.rows as u32);
        match &w.storage {
            Storage::Split { ty, qs, scales } => {
                ensure!(w.cols.is_multiple_of(32), "tensor {}: rows of {} are not whole 32-blocks", w.name, w.cols);
                let xq = self.tensor(x.rows, x.cols / 4)?; // i8 activations, 4 per f32 slot
                let xds = self.tensor(x.rows, x.cols / 16)?; // (d, d·Σq) per 32-block
                self.gpu.launch(names::kiln_quantize_q8_1, sh.quantize_q8_1(w.cols as u32, n), &[x.arg(), xq.arg(), xds.arg(), cols])?;
                let args = [qs.arg(), scales.arg(), xq.arg(), xds.arg(), out.arg(), rows, cols];
                // Prefill: the tensor-core GEMM reads the weights once per token tile; the
                // mat-vec reads them once per token, which only pays for a few tokens.
                if n >= sh.gemm_min_tokens() {
                    let (k, qs_words) = match ty {
                        GgmlType::Q4_0 => (names::kiln_mma_q4_0, formats::Q4_0::QS_WORDS),
                        GgmlType::Q4_1 => (names::kiln_mma_q4_1, formats::Q4_1::QS_WORDS),
                        _ => (names::kiln_mma_q8_0, formats::Q8_0::QS_WORDS),
                    };
                    let dims = sh.mma(w.rows as u32, n, qs_words as u32);
                    self.gpu.launch(k, dims, &[&args[..], &[Arg::U32(n)]].concat())?;
                } else {
                    let k = match ty {
                        GgmlType::Q4_0 => names::kiln_matvec_q4_0,
                        GgmlType::Q4_1 => names::kiln_matvec_q4_1,
                        _ => names::kiln_matvec_q8_0,
                    };
                    self.gpu.launch(k, sh.matvec_resident(w.rows as u32, n, self.gpu.sm_count()), &args)?;
                }
            }
            Storage::F16(wd) => self.gpu.launch(names::kiln_matvec_f16, sh.matvec(w.rows as u32, n), &[wd.arg(), x.arg(), out.arg(), rows, cols])?,
            Storage::F32(_) => bail!("tensor {}: f32 weight matrices are not supported by the CUDA backend", w.name),
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32) -> Result<CudaTensor> {
        let Storage::F32(wd) = &w.storage else { bail!("norm weight {} must be f32", w.name) };
        ensure!(x.cols % w.cols == 0, "norm {}: {} columns are not groups of {}", w.name, x.cols, w.cols);
        let out = self.tensor(x.rows, x.cols)?;
        let groups = x.len() / w.cols;
        self.gpu.launch(
            names::kiln_rms_norm,
            self.gpu.shapes().per_row(groups as u32),
            &[x.arg(), wd.arg(), out.arg(), u32_arg(w.cols, "norm width")?, Arg::F32(eps)],
        )?;
        Ok(out)
    }

    fn rope(&self, x: &mut CudaTensor, pos: usize, rope: &Rope) -> Result<()> {
        ensure!(x.cols % rope.head_dim == 0 && rope.rot_dim % 2 == 0 && rope.rot_dim <= rope.head_dim, "rope: bad head layout");
        let heads = x.cols / rope.head_dim;
        let threads = x.rows * heads * rope.rot_dim / 2;
        let neox = u32::from(rope.style == RopeStyle::Neox);
        self.gpu.launch(
            names::kiln_rope,
            self.gpu.shapes().flat(threads as u32),
            &[
                x.arg(),
                u32_arg(heads, "heads")?,
                u32_arg(rope.head_dim, "head_dim")?,
                u32_arg(rope.rot_dim, "rot_dim")?,
                u32_arg(pos, "position")?,
                Arg::F32(rope.freq_base.log2()),
                Arg::U32(neox),
                u32_arg(threads, "rope size")?,
            ],
        )
    }

    fn swiglu(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        ensure!(gate.rows == up.rows && gate.cols == up.cols, "swiglu: shapes differ");
        let out = self.tensor(gate.rows, gate.cols)?;
        let n = gate.len();
        self.gpu.launch(names::kiln_swiglu, self.gpu.shapes().flat(n as u32), &[gate.arg(), up.arg(), out.arg(), u32_arg(n, "len")?])?;
        Ok(out)
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        ensure!(x.rows == y.rows && x.cols == y.cols, "add: shapes differ");
        let n = x.len();
        self.gpu.launch(names::kiln_add_assign, self.gpu.shapes().flat(n as u32), &[x.arg(), y.arg(), u32_arg(n, "len")?])
    }

    fn attention(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        pos: usize,
        attn: &Attention,
    ) -> Result<CudaTensor> {
        let spec = cache.spec;
        let n = q.rows;
        ensure!(layer < spec.n_layer, "attention: layer {layer} of {}", spec.n_layer);
        ensure!(pos + n <= spec.max_seq, "context full: position {} exceeds the cache of {} tokens", pos + n, spec.max_seq);
        ensure!(attn.head_dim % 32 == 0 && attn.head_dim <= 256, "head_dim {} unsupported on the GPU (multiple of 32, ≤ 256)", attn.head_dim);
        let sh = self.gpu.shapes();
        let store_threads = n * spec.n_kv_head * spec.head_dim;
        for (src, dst) in [(k, &cache.k[layer]), (v, &cache.v[layer])] {
            self.gpu.launch(
                names::kiln_kv_store,
                sh.flat(store_threads as u32),
                &[
                    src.arg(),
                    dst.arg(),
                    u32_arg(spec.n_kv_head, "kv heads")?,
                    u32_arg(spec.head_dim, "head_dim")?,
                    u32_arg(spec.max_seq, "context")?,
                    u32_arg(pos, "position")?,
                    u32_arg(store_threads, "kv size")?,
                ],
            )?;
        }
        let dims = sh.attention(attn.n_head as u32, n as u32, (pos + n) as u32);
        ensure!(dims.shared_bytes <= sh.max_shared_bytes(), "context of {} tokens exceeds the attention kernel's shared memory", pos + n);
        let out = self.tensor(n, attn.n_head * attn.head_dim)?;
        self.gpu.launch(
            names::kiln_attention,
            dims,
            &[
                q.arg(),
                cache.k[layer].arg(),
                cache.v[layer].arg(),
                out.arg(),
                u32_arg(attn.n_head, "heads")?,
                u32_arg(attn.n_kv_head, "kv heads")?,
                u32_arg(attn.head_dim, "head_dim")?,
                u32_arg(spec.max_seq, "context")?,
                u32_arg(pos, "position")?,
                Arg::F32(attn.scale),
            ],
        )?;
        Ok(out)
    }
}
