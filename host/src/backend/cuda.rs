//! The CUDA backend: every op is a kiln kernel (Rust compiled to PTX) launched through
//! [`crate::cuda::Gpu`]. Weights are uploaded once, in the split layout the mat-vec kernels read
//! with 16-byte loads; activations and the f16 KV cache stay on the device. Activation buffers
//! come from a small size-keyed pool, so decoding allocates nothing after the first token.
//!
//! Decode steps are recorded once into a CUDA graph and replayed (see [`Backend::step`]): the
//! kernels read the step's position and token ids from a small device buffer, so one recording
//! serves every position. A norm feeding a quantized mat-vec also emits the Q8_1 activations
//! the mat-vec reads, and the q/k/v and gate/up projections run as one launch each.
//!
//! Beside this file: `weights` (upload and re-blocking), `gemm` (prefill GEMM launches),
//! `attention` (KV-cache attention), `graphs` (recording and replay), `moe` (expert routing),
//! `matvec` (decode's mat-vec launches and their Q8_1 activations), `switches` (construction
//! and the A/B switches).
mod attention;
mod gemm;
mod graphs;
mod matvec;
mod moe;
mod switches;
mod weights;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail, ensure};
use kernels_gpu::entries::families::{
    EMBED, FormatEntries, MATVEC_F32X, MATVEC_SWIGLU, MATVEC_SWIGLU_NORM, MATVEC3, MATVEC3_NORM,
    MATVEC3_WIDE, MATVEC3_WIDE_NORM,
};
use kernels_gpu::entries::names;

use super::{Attention, Backend, KvSpec, Moe, Rope, RopeStyle, Shape, StepFn, check_row};
use crate::cuda::{Arg, DBuf, Gpu, Graph, env_on};
use crate::gguf::{GgmlType, GgufFile};
use attention::check_attention;

/// A model's host RoPE frequency divisors and the device copy made from them.
type RopeFactors = (Arc<[f32]>, DBuf<f32>);

/// Free activation buffers by element count. While a step is recorded, buffers come from and
/// return to `recording` instead, which the recorded graph keeps: its buffers are then never
/// handed out again, so nothing held across a replay can be overwritten by it.
#[derive(Default)]
struct PoolState {
    free: HashMap<usize, Vec<DBuf<f32>>>,
    recording: Option<HashMap<usize, Vec<DBuf<f32>>>>,
}
type Pool = Rc<RefCell<PoolState>>;

/// Token counts up to which the q/k/v and gate/up projections use the fused mat-vec kernels;
/// larger batches (prefill) take one matmul per weight.
const FUSED_MAX_TOKENS: usize = 8;
/// Initial length of the step buffer (position and token ids).
const STEP_BUF_IDS: usize = 1024;
/// Fewest query tokens for the tensor-core prefill attention: below, most of its 64-token
/// query tile would be padding, and the split-KV kernels spread a short chunk over more blocks.
const FLASH_MIN_TOKENS: u32 = 16;

/// The step (position and token ids) kernels read from device memory, and recorded steps.
struct Steps {
    /// `[pos, id_0, id_1, ..]` of the current step.
    buf: DBuf<u32>,
    /// Inside [`Backend::step`]: `buf` already holds this step's position and tokens.
    in_step: bool,
    /// Step shapes (cache, tokens) run once eagerly: their buffers are in the pool, so a
    /// recording of the next one allocates nothing.
    warm: HashSet<StepKey>,
    graphs: HashMap<StepKey, Recorded>,
    /// While recording: rows of the embedding table the step reads (replays check ids).
    vocab: Option<usize>,
    /// Recording is on (CUDA device, `KILN_CUDA_GRAPHS` not `0`, recording has not kept failing).
    enabled: bool,
    failures: u32,
}

/// A recorded step's shape: (cache, tokens, whether its history is short enough for the
/// one-launch attention). Kernels read the position from device memory, so one graph serves
/// every position of its bucket; the attention's launch topology differs between buckets.
type StepKey = (u64, usize, bool);

struct Recorded {
    graph: Graph,
    /// The step's output (logits), copied out after each replay.
    out: DBuf<f32>,
    rows: usize,
    cols: usize,
    vocab: usize,
    /// Intermediate buffers the graph's kernels address.
    _buffers: Vec<DBuf<f32>>,
}

pub struct Cuda {
    gpu: Rc<Gpu>,
    pool: Pool,
    steps: RefCell<Steps>,
    /// Row argmax's (pass-1 pairs, result) buffers, reused every token.
    argmax_bufs: RefCell<Option<(DBuf<u32>, DBuf<u32>)>>,
    /// Quantized matmuls read f32 activations (no Q8_1): see [`Cuda::with_f32_activations`].
    f32_activations: bool,
    /// Untied token embeddings in mapped host memory ([`Backend::load_lookup_table`]), as
    /// llama.cpp keeps them: decode reads one row per token over the bus (measured on an H200:
    /// same speed, 320–640 MiB less VRAM on 8B). `KILN_MAPPED_EMBEDDING=0` uploads them instead.
    mapped_tables: bool,
    /// Small GEMM launches take the policy's deep k-stages (`GEMM_DEEP_MAX_BLOCKS_PER_SM`);
    /// `KILN_GEMM_DEEP=0` keeps every launch on the main configuration (the A/B switch).
    gemm_deep: bool,
    /// GEMM launches of at most this many tokens whose main grid leaves SMs idle take the
    /// short-prompt tile (the policy's `GEMM_SHORT_MAX_TOKENS`; `KILN_GEMM_SHORT_MAX` overrides
    /// it, 0 = never: the A/B switch).
    gemm_short_max: usize,
    /// Most ways a GEMM launch whose main grid leaves SMs idle splits its reduction over k
    /// (the policy's `GEMM_SPLIT_K_MAX`; `KILN_GEMM_SPLIT_K` overrides it, 0 = never: the A/B
    /// switch). Taken before the deep and short-prompt tiles.
    gemm_split_k: u32,
    /// The split-K launches' (shares, counters), grown as needed; the counters are zero
    /// between launches.
    split_k_bufs: RefCell<Option<(DBuf<f32>, DBuf<u32>)>>,
    /// Prefill's gate, up and SwiGLU in one paired GEMM (`kiln_mma_swiglu_*`);
    /// `KILN_GEMM_SWIGLU=0` runs the gate/up GEMM, `swiglu` and `to_f16` instead (the A/B switch).
    gemm_swiglu: bool,
    /// Mat-vecs with rows to spare take the wide instantiation (`MATVEC_WIDE_ROWS_PER_WARP`);
    /// `KILN_MATVEC_WIDE=0` keeps them at one row per warp (the A/B switch).
    matvec_wide: bool,
    /// The same for the q/k/v mat-vec (`KILN_MATVEC3_WIDE=0`), measured apart.
    matvec3_wide: bool,
    /// Split-KV attention's pass 1 on tensor cores in the default (Q8_1) mode;
    /// `KILN_ATTN_MMA=0` keeps the f32 kernel (the A/B switch).
    attention_mma: bool,
    /// A prompt's experts as grouped tensor-core GEMMs; `KILN_MOE_GEMM=0` keeps the
    /// expert-sorted Q8_1 mat-vecs (the A/B switch).
    pub(super) moe_gemm: bool,
    /// Most rows per warp of the decode gate/up + SwiGLU that emits Q8_1 itself (the policy's
    /// `SWIGLU_Q8_MAX_ROWS_PER_WARP`; `KILN_SWIGLU_Q8_ROWS` overrides it, 0 = the separate
    /// quantize launch: the A/B switch).
    swiglu_q8_rows: u32,
    /// Longest history (positions) decode attention runs as one launch for (the policy's
    /// `ATTN_SHORT_MAX`; `KILN_ATTN_SHORT_MAX` overrides it, 0 = always split-KV's two
    /// launches: the A/B switch).
    attention_short_max: usize,
    /// One-token decode over a short history folds `rope_store` into the one-launch attention
    /// where the policy takes it (`ATTN_SHORT_ROPE`); `KILN_ATTN_SHORT_ROPE=0` keeps the two
    /// launches (the A/B switch).
    attention_short_rope: bool,
    /// Decode's residual projections defer the next norm to its consumers for residual
    /// streams up to this many rows (the policy's `NORM_DEFER_MAX_ROWS`, 0 where `NORM_DEFER`
    /// is off; `KILN_NORM_DEFER=0` keeps the norm launch, `KILN_NORM_DEFER=ROWS` moves the
    /// limit: the A/B switch).
    norm_defer_rows: usize,
    /// The model's RoPE frequency divisors on the device, uploaded at first use.
    rope_factors: RefCell<Option<RopeFactors>>,
}

impl Cuda {
    /// The CUDA backend over the host grid executor with policy `P`: the same backend code and
    /// kernel bodies, run on the CPU (slow; tests and debugging).
    pub fn host<P: policies::TargetPolicy>() -> Self {
        Self::on(Gpu::host::<P>()).expect("host executor allocations cannot fail")
    }
    fn on(gpu: Gpu) -> Result<Self> {
        // Room for a position and a prefill chunk of ids up front: growing it later costs the
        // recorded decode steps (see `step_arg`).
        let buf = gpu.alloc::<u32>(STEP_BUF_IDS)?;
        let enabled = gpu.is_device() && env_on("KILN_CUDA_GRAPHS");
        let swiglu_q8_rows = gpu.shapes().swiglu_q8_max_rows();
        let attention_short_max = gpu.shapes().attention_short_max() as usize;
        let gemm_short_max = gpu.shapes().gemm_short_max_tokens() as usize;
        let gemm_split_k = gpu.shapes().gemm_split_k_max();
        let norm_defer_rows = if gpu.shapes().norm_defer() {
            gpu.shapes().norm_defer_max_rows() as usize
        } else {
            0
        };
        let steps = Steps {
            buf,
            in_step: false,
            warm: HashSet::new(),
            graphs: HashMap::new(),
            vocab: None,
            enabled,
            failures: 0,
        };
        Ok(Cuda {
            gpu: Rc::new(gpu),
            pool: Rc::default(),
            steps: RefCell::new(steps),
            argmax_bufs: RefCell::default(),
            f32_activations: false,
            mapped_tables: true,
            gemm_deep: true,
            gemm_short_max,
            gemm_split_k,
            split_k_bufs: RefCell::default(),
            gemm_swiglu: true,
            matvec_wide: true,
            matvec3_wide: true,
            attention_mma: true,
            moe_gemm: true,
            swiglu_q8_rows,
            attention_short_max,
            attention_short_rope: true,
            norm_defer_rows,
            rope_factors: RefCell::default(),
        })
    }
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let n = (rows * cols).max(1);
        let mut guard = self.pool.borrow_mut();
        let st = &mut *guard;
        let reused = st
            .recording
            .as_mut()
            .and_then(|r| r.get_mut(&n).and_then(Vec::pop));
        let buf = match reused.or_else(|| st.free.get_mut(&n).and_then(Vec::pop)) {
            Some(b) => b,
            None if st.recording.is_some() => {
                bail!("recording a step needs a new buffer of {n} values")
            }
            None => {
                drop(guard);
                self.gpu.alloc::<f32>(n)?
            }
        };
        Ok(CudaTensor {
            buf: Some(buf),
            rows,
            cols,
            pool: self.pool.clone(),
            q8: None,
            deferred: None,
            f16: None,
        })
    }

    /// Puts `values` at `at` of the step buffer unless a step already did (then they are there).
    fn step_arg(&self, at: usize, values: &[u32]) -> Result<Arg> {
        let mut st = self.steps.borrow_mut();
        if !st.in_step {
            if at + values.len() > st.buf.len() {
                st.buf = self
                    .gpu
                    .alloc::<u32>((at + values.len()).next_power_of_two())?;
                // Recorded steps read their position and tokens from the buffer just freed:
                // drop them, the next decode step records again (a longer prompt after decoding,
                // e.g. a chat's second turn, replayed stale positions or faulted).
                st.graphs.clear();
            }
            self.gpu.write_at(&mut st.buf, at, values)?;
        }
        Ok(Arg::Ptr(st.buf.ptr_at(at)))
    }
    /// Device address of the step's first position.
    /// The RoPE kernels' `factors` argument: null without divisors, else their device copy
    /// (uploaded once per set of factors, so recorded decode steps keep a valid address).
    fn rope_factors_arg(&self, rope: &Rope) -> Result<Arg> {
        let Some(f) = &rope.factors else {
            return Ok(Arg::Ptr(0));
        };
        ensure!(
            f.len() == rope.rot_dim / 2,
            "rope: {} frequency factors for {} rotary dims",
            f.len(),
            rope.rot_dim
        );
        let mut cached = self.rope_factors.borrow_mut();
        if !cached.as_ref().is_some_and(|(c, _)| Arc::ptr_eq(c, f)) {
            *cached = Some((f.clone(), self.gpu.upload(f)?));
        }
        Ok(cached.as_ref().map_or(Arg::Ptr(0), |(_, d)| d.arg()))
    }

    fn pos_arg(&self, pos: usize) -> Result<Arg> {
        self.step_arg(0, &[to_u32(pos, "position")?])
    }
}

/// An activation matrix on the GPU; its buffer goes back to the pool when dropped.
pub struct CudaTensor {
    buf: Option<DBuf<f32>>,
    rows: usize,
    cols: usize,
    pool: Pool,
    /// The same values as Q8_1 blocks, when the producing kernel emitted them (norms).
    q8: Option<Box<(CudaTensor, CudaTensor)>>,
    /// A norm output whose `1/rms` is still to be applied: see [`Deferred`].
    deferred: Option<Box<Deferred>>,
    /// The same values rounded to f16, two per f32 slot (`rows × cols/2`), when the producing
    /// kernel wrote them for a GEMM to read (the paired GEMM + SwiGLU).
    f16: Option<Box<CudaTensor>>,
}

/// A norm output left for its consumers to finish (`kiln_matvec_add_norm_q8_*`): the tensor
/// holds `x ⊙ g` and its Q8_1 blocks, `ss` the producer's Σx² per 32 columns (`parts` per
/// row). The q/k/v and gate/up mat-vecs apply `1/rms` to their dot products; any other op
/// reads the finished values, made once by `Cuda::settled`.
struct Deferred {
    ss: CudaTensor,
    parts: u32,
    eps: f32,
    settled: std::cell::OnceCell<CudaTensor>,
}

impl CudaTensor {
    /// Forgets the Q8_1 and f16 copies of the values: an op is about to change them in place.
    fn drop_copies(&mut self) {
        self.q8 = None;
        self.f16 = None;
    }

    fn buf(&self) -> &DBuf<f32> {
        self.buf.as_ref().expect("tensor buffer present until drop")
    }
    /// The values' device address. A deferred norm's buffer holds unfinished values, which
    /// only `Cuda::settled` and the scale-aware launches may read (they use `buf`).
    fn arg(&self) -> Arg {
        assert!(
            self.deferred.is_none(),
            "internal error: a deferred norm's values read before they were finished"
        );
        self.buf().arg()
    }
    fn len(&self) -> usize {
        self.rows * self.cols
    }
    /// A deferred norm with its Q8_1 blocks: what the scale-aware launches take as it is (the
    /// one test both the launch arguments and the kernel family are chosen by).
    fn deferred_q8(&self) -> Option<(&Deferred, &(CudaTensor, CudaTensor))> {
        match (&self.deferred, &self.q8) {
            (Some(d), Some(q)) => Some((d, q)),
            _ => None,
        }
    }
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut guard = self.pool.borrow_mut();
            let st = &mut *guard;
            let list = match &mut st.recording {
                Some(r) => r.entry(b.len()).or_default(),
                None => st.free.entry(b.len()).or_default(),
            };
            list.push(b);
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
    Split {
        ty: GgmlType,
        qs: DBuf<u8>,
        scales: DBuf<u8>,
    },
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
    /// Unique per cache: recorded steps address one cache's buffers.
    id: u64,
    k: Vec<DBuf<u16>>,
    v: Vec<DBuf<u16>>,
    spec: KvSpec,
}

/// Rows the register-resident Q8_1-emitting norms take (wider rows: norm, then quantize).
fn norm_q8_fits(cols: usize) -> bool {
    cols.is_multiple_of(32) && cols <= kernels_gpu::kernels::norm::MAX_ROW_COLS as usize
}

fn u32_arg(v: usize, what: &str) -> Result<Arg> {
    to_u32(v, what).map(Arg::U32)
}

fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| anyhow::anyhow!("{what} = {v} is too large for the GPU kernels"))
}

impl Backend for Cuda {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvCache = CudaKvCache;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<CudaWeight> {
        self.load(file, name, false)
    }

    /// With `mapped_tables`, quantized tables live in mapped host memory: the embedding kernel
    /// reads a step's rows over the bus, and the table (0.3–0.6 GB for an 8B model's 152k-token
    /// vocabulary) costs no VRAM.
    fn load_lookup_table(&self, file: &Arc<GgufFile>, name: &str) -> Result<CudaWeight> {
        self.load(file, name, self.mapped_tables)
    }

    fn kv_cache(&self, spec: &KvSpec) -> Result<CudaKvCache> {
        let per_layer = spec.n_kv_head * spec.max_seq * spec.head_dim;
        let mut k = Vec::with_capacity(spec.n_layer);
        let mut v = Vec::with_capacity(spec.n_layer);
        for _ in 0..spec.n_layer {
            k.push(self.gpu.alloc::<u16>(per_layer)?);
            v.push(self.gpu.alloc::<u16>(per_layer)?);
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(CudaKvCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            k,
            v,
            spec: *spec,
        })
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        ensure!(
            data.len() == rows * cols,
            "upload of {} values as {rows}x{cols}",
            data.len()
        );
        let mut t = self.tensor(rows, cols)?;
        self.gpu
            .write(t.buf.as_mut().expect("fresh buffer"), data)?;
        Ok(t)
    }

    fn read(&self, x: &CudaTensor) -> Result<Vec<f32>> {
        let x = self.settled(x)?;
        self.gpu.download_prefix(x.buf(), x.len())
    }

    fn argmax(&self, x: &CudaTensor) -> Result<Vec<u32>> {
        let x = self.settled(x)?;
        // Reuses two small buffers: greedy decoding calls this once per token.
        let (sh, cols) = (self.gpu.shapes(), to_u32(x.cols, "argmax width")?);
        let (rows, parts) = (to_u32(x.rows, "argmax rows")?, sh.argmax_parts(cols));
        let mut slot = self.argmax_bufs.borrow_mut();
        if slot
            .as_ref()
            .is_none_or(|(p, o)| o.len() < x.rows || p.len() < 2 * (rows * parts) as usize)
        {
            *slot = Some((
                self.gpu.alloc::<u32>(2 * (rows * parts) as usize)?,
                self.gpu.alloc::<u32>(x.rows)?,
            ));
        }
        let (part, out) = slot.as_ref().expect("allocated above");
        self.gpu.launch(
            names::kiln_argmax_blocks,
            sh.argmax_blocks(rows, cols),
            &[x.arg(), part.arg(), Arg::U32(cols)],
        )?;
        self.gpu.launch(
            names::kiln_argmax_merge,
            sh.argmax_merge(rows),
            &[part.arg(), out.arg(), Arg::U32(parts)],
        )?;
        self.gpu.download_prefix(out, x.rows)
    }

    fn token_nll(&self, x: &CudaTensor, targets: &[u32]) -> Result<Vec<f64>> {
        let x = self.settled(x)?;
        ensure!(
            targets.len() == x.rows,
            "{} targets for {} logits rows",
            targets.len(),
            x.rows
        );
        if let Some((i, t)) = targets
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= x.cols)
        {
            bail!(
                "logits row {i}: token id {t} is outside the {}-entry vocabulary of the logits",
                x.cols
            );
        }
        let rows = to_u32(x.rows, "token_nll rows")?;
        let (ids, out) = (
            self.gpu.upload(targets)?,
            self.gpu.alloc::<f64>(2 * x.rows)?,
        );
        self.gpu.launch(
            names::kiln_row_nll,
            self.gpu.shapes().per_row(rows),
            &[
                x.arg(),
                ids.arg(),
                out.arg(),
                Arg::U32(to_u32(x.cols, "token_nll width")?),
            ],
        )?;
        let parts = self.gpu.download_prefix(&out, 2 * x.rows)?;
        (parts.chunks_exact(2).enumerate())
            .map(|(i, p)| {
                let nll = p[0].ln() + p[1];
                // The sum is at least exp(0) = 1 when the row's max is finite.
                ensure!(
                    p[0] >= 1.0 && nll.is_finite(),
                    "logits row {i} is not finite (Σexp {}, max − target {})",
                    p[0],
                    p[1]
                );
                Ok(nll)
            })
            .collect()
    }

    fn rows(&self, x: &CudaTensor, start: usize, n: usize) -> Result<CudaTensor> {
        let x = self.settled(x)?;
        ensure!(
            start + n <= x.rows,
            "rows {start}..{} of a {}-row tensor",
            start + n,
            x.rows
        );
        let t = self.tensor(n, x.cols)?;
        self.gpu
            .copy_range(x.buf(), start * x.cols, t.buf(), 0, n * x.cols)?;
        Ok(t)
    }

    fn embed(&self, table: &CudaWeight, ids: &[u32]) -> Result<CudaTensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.rows) {
            bail!(
                "token id {bad} is outside the vocabulary of {} ({} rows)",
                table.name,
                table.rows
            );
        }
        let ids_d = self.step_arg(1, ids)?;
        {
            let mut st = self.steps.borrow_mut();
            if st.vocab.is_some() {
                st.vocab = Some(table.rows);
            }
        }
        let out = self.tensor(ids.len(), table.cols)?;
        let threads = ids.len() * table.cols;
        let dims = self.gpu.shapes().flat(threads as u32);
        let (cols, threads) = (
            u32_arg(table.cols, "embedding width")?,
            u32_arg(threads, "embedding size")?,
        );
        match &table.storage {
            Storage::Split { ty, qs, scales } => {
                let k = by_format(*ty, EMBED);
                self.gpu.launch(
                    k,
                    dims,
                    &[qs.arg(), scales.arg(), ids_d, out.arg(), cols, threads],
                )?
            }
            Storage::F16(w) => self.gpu.launch(
                names::kiln_embed_f16,
                dims,
                &[w.arg(), ids_d, out.arg(), cols, threads],
            )?,
            Storage::F32(_) => bail!(
                "tensor {}: f32 embedding tables are not supported by the CUDA backend",
                table.name
            ),
        }
        Ok(out)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaWeight) -> Result<CudaTensor> {
        let x = self.settled(x)?;
        ensure!(
            x.cols == w.cols,
            "matmul: activations have {} columns, {} has {}",
            x.cols,
            w.name,
            w.cols
        );
        let out = self.tensor(x.rows, w.rows)?;
        let sh = self.gpu.shapes();
        let (rows, cols, n) = (
            u32_arg(w.rows, "rows")?,
            u32_arg(w.cols, "cols")?,
            x.rows as u32,
        );
        match &w.storage {
            Storage::Split { ty, qs, scales } if self.f32_activations => {
                let k = by_format(*ty, MATVEC_F32X);
                let dims = self
                    .gpu
                    .one_wave(k, sh.matvec_multi(&[w.rows as u32], n, self.gpu.sm_count()));
                self.gpu.launch(
                    k,
                    dims,
                    &[qs.arg(), scales.arg(), x.arg(), out.arg(), rows, cols],
                )?;
            }
            Storage::Split { ty, qs, scales } => {
                ensure!(
                    w.cols.is_multiple_of(32),
                    "tensor {}: rows of {} are not whole 32-blocks",
                    w.name,
                    w.cols
                );
                // Prefill: the tensor-core GEMM reads the weights once per token tile; the
                // mat-vec reads them once per token, which only pays for a few tokens.
                if self.gemm_for(x.rows) {
                    self.launch_gemm(*ty, &[(qs, scales, w, out.arg())], x, false)?;
                } else {
                    self.with_q8(x, |xq, xds| {
                        self.launch_matvec(*ty, qs, scales, w, n, (xq, xds), out.arg(), false)
                    })?;
                }
            }
            Storage::F16(wd) => self.gpu.launch(
                names::kiln_matvec_f16,
                sh.matvec(w.rows as u32, n),
                &[wd.arg(), x.arg(), out.arg(), rows, cols],
            )?,
            // The MoE router: a few rows, kept at f32 as the files store it.
            Storage::F32(wd) => {
                ensure!(
                    w.cols.is_multiple_of(4),
                    "tensor {}: f32 rows of {} are not a multiple of 4",
                    w.name,
                    w.cols
                );
                let k = names::kiln_matvec_f32;
                let dims = self
                    .gpu
                    .one_wave(k, sh.matvec_multi(&[w.rows as u32], n, self.gpu.sm_count()));
                self.gpu
                    .launch(k, dims, &[wd.arg(), x.arg(), out.arg(), rows, cols])?;
            }
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32) -> Result<CudaTensor> {
        let x = self.settled(x)?;
        let Storage::F32(wd) = &w.storage else {
            bail!("norm weight {} must be f32", w.name)
        };
        ensure!(
            x.cols % w.cols == 0,
            "norm {}: {} columns are not groups of {}",
            w.name,
            x.cols,
            w.cols
        );
        let mut out = self.tensor(x.rows, x.cols)?;
        let groups = x.len() / w.cols;
        let cols = u32_arg(w.cols, "norm width")?;
        if w.cols == x.cols && norm_q8_fits(x.cols) {
            // A whole-row norm feeds a quantized projection: emit its Q8_1 blocks as well.
            let (xq, xds) = self.q8_buffers(x.rows, x.cols)?;
            let dims = self.gpu.shapes().norm_q8(x.rows as u32, w.cols as u32);
            self.gpu.launch(
                names::kiln_rms_norm_q8,
                dims,
                &[
                    x.arg(),
                    wd.arg(),
                    out.arg(),
                    xq.arg(),
                    xds.arg(),
                    cols,
                    Arg::F32(eps),
                ],
            )?;
            out.q8 = Some(Box::new((xq, xds)));
        } else {
            self.gpu.launch(
                names::kiln_rms_norm,
                self.gpu.shapes().per_row(groups as u32),
                &[x.arg(), wd.arg(), out.arg(), cols, Arg::F32(eps)],
            )?;
        }
        Ok(out)
    }

    fn rms_norm_rope(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        pos: usize,
        rope: &Rope,
    ) -> Result<CudaTensor> {
        let x = self.settled(x)?;
        let Storage::F32(wd) = &w.storage else {
            bail!("norm weight {} must be f32", w.name)
        };
        ensure!(
            w.cols == rope.head_dim && x.cols % rope.head_dim == 0,
            "norm {}: {} wide, heads are {}",
            w.name,
            w.cols,
            rope.head_dim
        );
        ensure!(
            rope.rot_dim.is_multiple_of(2) && rope.rot_dim <= rope.head_dim,
            "rope: bad head layout"
        );
        let out = self.tensor(x.rows, x.cols)?;
        let heads = x.cols / rope.head_dim;
        self.gpu.launch(
            names::kiln_rms_norm_rope,
            self.gpu.shapes().per_row((x.rows * heads) as u32),
            &[
                x.arg(),
                wd.arg(),
                out.arg(),
                u32_arg(heads, "heads")?,
                u32_arg(rope.head_dim, "head_dim")?,
                u32_arg(rope.rot_dim, "rot_dim")?,
                self.pos_arg(pos)?,
                Arg::F32(rope.freq_base.log2()),
                self.rope_factors_arg(rope)?,
                Arg::U32(u32::from(rope.style == RopeStyle::Neox)),
                Arg::F32(eps),
            ],
        )?;
        Ok(out)
    }

    fn rope(&self, x: &mut CudaTensor, pos: usize, rope: &Rope) -> Result<()> {
        ensure!(
            x.cols.is_multiple_of(rope.head_dim)
                && rope.rot_dim.is_multiple_of(2)
                && rope.rot_dim <= rope.head_dim,
            "rope: bad head layout"
        );
        let heads = x.cols / rope.head_dim;
        let threads = x.rows * heads * rope.rot_dim / 2;
        let neox = u32::from(rope.style == RopeStyle::Neox);
        x.drop_copies();
        self.gpu.launch(
            names::kiln_rope,
            self.gpu.shapes().flat(threads as u32),
            &[
                x.arg(),
                u32_arg(heads, "heads")?,
                u32_arg(rope.head_dim, "head_dim")?,
                u32_arg(rope.rot_dim, "rot_dim")?,
                self.pos_arg(pos)?,
                Arg::F32(rope.freq_base.log2()),
                self.rope_factors_arg(rope)?,
                Arg::U32(neox),
                u32_arg(threads, "rope size")?,
            ],
        )
    }

    fn swiglu(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        let (gate, up) = (self.settled(gate)?, self.settled(up)?);
        ensure!(
            gate.rows == up.rows && gate.cols == up.cols,
            "swiglu: shapes differ"
        );
        let out = self.tensor(gate.rows, gate.cols)?;
        let n = gate.len();
        self.gpu.launch(
            names::kiln_swiglu,
            self.gpu.shapes().flat(n as u32),
            &[gate.arg(), up.arg(), out.arg(), u32_arg(n, "len")?],
        )?;
        Ok(out)
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        let y = self.settled(y)?;
        ensure!(x.rows == y.rows && x.cols == y.cols, "add: shapes differ");
        let n = x.len();
        x.drop_copies();
        self.gpu.launch(
            names::kiln_add_assign,
            self.gpu.shapes().flat(n as u32),
            &[x.arg(), y.arg(), u32_arg(n, "len")?],
        )
    }

    fn add_row(&self, x: &mut CudaTensor, row: &CudaTensor) -> Result<()> {
        check_row(x, row)?;
        let n = x.len();
        x.drop_copies();
        self.gpu.launch(
            names::kiln_add_row,
            self.gpu.shapes().flat(to_u32(n, "len")?),
            &[
                x.arg(),
                row.arg(),
                u32_arg(x.cols, "cols")?,
                u32_arg(n, "len")?,
            ],
        )
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
        let spec = check_attention(cache, layer, q, k, v, pos, attn)?;
        let pos_d = self.pos_arg(pos)?;
        let store_threads = q.rows * spec.n_kv_head * spec.head_dim;
        self.gpu.launch(
            names::kiln_kv_store,
            self.gpu.shapes().flat(store_threads as u32),
            &[
                k.arg(),
                v.arg(),
                cache.k[layer].arg(),
                cache.v[layer].arg(),
                u32_arg(spec.n_kv_head, "kv heads")?,
                u32_arg(spec.head_dim, "head_dim")?,
                u32_arg(spec.max_seq, "context")?,
                pos_d,
                u32_arg(store_threads, "kv size")?,
            ],
        )?;
        self.attend_cached(cache, layer, q, pos, pos_d, attn)
    }

    fn rope_attention(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        q: CudaTensor,
        k: CudaTensor,
        v: &CudaTensor,
        qk_norm: Option<(&CudaWeight, &CudaWeight, f32)>,
        pos: usize,
        rope: &Rope,
        attn: &Attention,
    ) -> Result<CudaTensor> {
        let spec = check_attention(cache, layer, &q, &k, v, pos, attn)?;
        ensure!(
            rope.head_dim == attn.head_dim
                && rope.rot_dim.is_multiple_of(2)
                && rope.rot_dim <= rope.head_dim,
            "rope: bad head layout"
        );
        let (norms, eps) = match qk_norm {
            Some((qn, kn, eps)) => {
                let (Storage::F32(qw), Storage::F32(kw)) = (&qn.storage, &kn.storage) else {
                    bail!("norm weights {}, {} must be f32", qn.name, kn.name)
                };
                ensure!(
                    qn.cols == attn.head_dim && kn.cols == attn.head_dim,
                    "norm {}: {} wide, heads are {}",
                    qn.name,
                    qn.cols,
                    attn.head_dim
                );
                (Some((qw.arg(), kw.arg())), eps)
            }
            None => (None, 0.0),
        };
        let pos_d = self.pos_arg(pos)?;
        let (heads, kv_heads) = (
            to_u32(attn.n_head, "heads")?,
            to_u32(attn.n_kv_head, "kv heads")?,
        );
        let (qw, kw) = norms.unwrap_or((Arg::Ptr(0), Arg::Ptr(0)));
        let ctx = to_u32(spec.max_seq, "context")?;
        let rope_args = [
            u32_arg(rope.rot_dim, "rot_dim")?,
            Arg::U32(ctx),
            Arg::F32(rope.freq_base.log2()),
            self.rope_factors_arg(rope)?,
            Arg::U32(u32::from(rope.style == RopeStyle::Neox)),
            Arg::U32(u32::from(norms.is_some())),
            Arg::F32(eps),
        ];
        if let Some(dims) = self.short_rope_dims(q.rows, pos, attn, ctx)? {
            let mut out = self.tensor(q.rows, attn.n_head * attn.head_dim)?;
            let (xq, xds) = self.q8_buffers(q.rows, attn.n_head * attn.head_dim)?;
            self.gpu.launch(
                names::kiln_attention_short_rope_mma,
                dims,
                &[
                    &[
                        q.arg(),
                        k.arg(),
                        v.arg(),
                        qw,
                        kw,
                        cache.k[layer].arg(),
                        cache.v[layer].arg(),
                        out.arg(),
                        xq.arg(),
                        xds.arg(),
                        pos_d,
                        Arg::U32(heads),
                        Arg::U32(kv_heads),
                        u32_arg(rope.head_dim, "head_dim")?,
                    ][..],
                    &rope_args[..],
                    &[Arg::F32(attn.scale)],
                ]
                .concat(),
            )?;
            out.q8 = Some(Box::new((xq, xds)));
            return Ok(out);
        }
        let q_out = self.tensor(q.rows, q.cols)?;
        self.gpu.launch(
            names::kiln_rope_store,
            self.gpu
                .shapes()
                .rope_store(heads, kv_heads, to_u32(q.rows, "tokens")?),
            &[
                q.arg(),
                k.arg(),
                v.arg(),
                qw,
                kw,
                q_out.arg(),
                cache.k[layer].arg(),
                cache.v[layer].arg(),
                Arg::U32(heads),
                Arg::U32(kv_heads),
                u32_arg(rope.head_dim, "head_dim")?,
                u32_arg(rope.rot_dim, "rot_dim")?,
                u32_arg(spec.max_seq, "context")?,
                pos_d,
                Arg::F32(rope.freq_base.log2()),
                self.rope_factors_arg(rope)?,
                Arg::U32(u32::from(rope.style == RopeStyle::Neox)),
                Arg::U32(u32::from(norms.is_some())),
                Arg::F32(eps),
            ],
        )?;
        self.attend_cached(cache, layer, &q_out, pos, pos_d, attn)
    }

    fn matmul_add(&self, x: &mut CudaTensor, a: &CudaTensor, w: &CudaWeight) -> Result<()> {
        let Storage::Split { ty, qs, scales } = &w.storage else {
            return self.add_matmul_output(x, a, w);
        };
        if self.f32_activations {
            return self.add_matmul_output(x, a, w);
        }
        ensure!(
            a.cols == w.cols && w.cols.is_multiple_of(32),
            "matmul: activations have {} columns, {} has {}",
            a.cols,
            w.name,
            w.cols
        );
        ensure!(
            x.rows == a.rows && x.cols == w.rows,
            "matmul_add: residual is {}x{}, {} gives {}x{}",
            x.rows,
            x.cols,
            w.name,
            a.rows,
            w.rows
        );
        x.drop_copies();
        if self.gemm_for(a.rows) {
            return self.launch_gemm(*ty, &[(qs, scales, w, x.arg())], a, true);
        }
        self.with_q8(a, |xq, xds| {
            self.launch_matvec(*ty, qs, scales, w, a.rows as u32, (xq, xds), x.arg(), true)
        })
    }

    fn matmul_add_norm(
        &self,
        x: &mut CudaTensor,
        a: &CudaTensor,
        w: &CudaWeight,
        norm: &CudaWeight,
        eps: f32,
    ) -> Result<CudaTensor> {
        let Some((k, dims, (qs, scales), g)) = self.norm_defer_launch(x, a, w, norm) else {
            self.matmul_add(x, a, w)?;
            return self.rms_norm(x, norm, eps);
        };
        let (n, rows) = (x.rows, x.cols);
        let parts = rows / 32;
        let mut h = self.tensor(n, rows)?;
        let (hq, hds) = self.q8_buffers(n, rows)?;
        // Σx² in f64: two f32 slots per partial.
        let ss = self.tensor(n, parts * 2)?;
        x.drop_copies();
        self.with_q8(a, |aq, ads| {
            let args = [
                qs.arg(),
                scales.arg(),
                aq,
                ads,
                x.arg(),
                g.arg(),
                h.arg(),
                hq.arg(),
                hds.arg(),
                ss.arg(),
                u32_arg(rows, "rows")?,
                u32_arg(a.cols, "cols")?,
            ];
            self.gpu.launch(k, dims, &args)
        })?;
        h.q8 = Some(Box::new((hq, hds)));
        h.deferred = Some(Box::new(Deferred {
            ss,
            parts: parts as u32,
            eps,
            settled: Default::default(),
        }));
        Ok(h)
    }

    fn matmul_many(&self, x: &CudaTensor, ws: &[&CudaWeight]) -> Result<Vec<CudaTensor>> {
        if ws.len() > 1 && split_parts(ws).is_none() {
            // Mixed formats (a Q4_K_M layer's Q6_K v beside Q4_K q and k): one launch per
            // format instead of one per matrix.
            let key = |w: &CudaWeight| match w.storage {
                Storage::Split { ty, .. } => Some(ty),
                _ => None,
            };
            let mut outs: Vec<Option<CudaTensor>> = ws.iter().map(|_| None).collect();
            for (i, w) in ws.iter().enumerate() {
                if outs[i].is_some() {
                    continue;
                }
                let group: Vec<usize> = match key(w) {
                    Some(ty) => (i..ws.len()).filter(|&j| key(ws[j]) == Some(ty)).collect(),
                    None => vec![i],
                };
                let mats: Vec<&CudaWeight> = group.iter().map(|&j| ws[j]).collect();
                for (j, out) in group.into_iter().zip(self.matmul_many(x, &mats)?) {
                    outs[j] = Some(out);
                }
            }
            return Ok(outs.into_iter().flatten().collect());
        }
        let Some((ty, parts)) =
            split_parts(ws).filter(|_| (2..=3).contains(&ws.len()) && !self.f32_activations)
        else {
            return ws.iter().map(|w| self.matmul(x, w)).collect();
        };
        if x.rows > FUSED_MAX_TOKENS {
            if !self.gemm_for(x.rows) {
                return ws.iter().map(|w| self.matmul(x, w)).collect();
            }
            // Prefill: one GEMM launch over all the matrices.
            let outs = ws
                .iter()
                .map(|w| self.tensor(x.rows, w.rows))
                .collect::<Result<Vec<_>>>()?;
            let list: Vec<_> = parts
                .iter()
                .zip(ws)
                .zip(&outs)
                .map(|(((qs, sc), w), o)| (*qs, *sc, *w, o.arg()))
                .collect();
            self.launch_gemm(ty, &list, x, false)?;
            return Ok(outs);
        }
        let w0 = ws[0];
        ensure!(
            ws.iter().all(|w| w.cols == x.cols),
            "matmul_many: activations have {} columns, {} has {}",
            x.cols,
            w0.name,
            w0.cols
        );
        let outs = ws
            .iter()
            .map(|w| self.tensor(x.rows, w.rows))
            .collect::<Result<Vec<_>>>()?;
        let mut args = Vec::with_capacity(15);
        for i in 0..3 {
            match (parts.get(i), outs.get(i), ws.get(i)) {
                (Some((qs, sc)), Some(o), Some(w)) => {
                    args.extend([qs.arg(), sc.arg(), o.arg(), u32_arg(w.rows, "rows")?])
                }
                _ => args.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::U32(0)]),
            }
        }
        let rows: Vec<u32> = ws.iter().map(|w| w.rows as u32).collect();
        let (sh, sms, n) = (self.gpu.shapes(), self.gpu.sm_count(), x.rows as u32);
        // Wide when all rows together would take the wide single-matrix mat-vec.
        let wide = self.matvec3_wide && sh.matvec_takes_wide(rows.iter().sum(), sms);
        let k = by_format(
            ty,
            match wide {
                false => Self::consumer_family(x, MATVEC3, MATVEC3_NORM),
                true => Self::consumer_family(x, MATVEC3_WIDE, MATVEC3_WIDE_NORM),
            },
        );
        let dims = match wide {
            true => sh.matvec_wide_multi(&rows, n, sms),
            false => sh.matvec_multi(&rows, n, sms),
        };
        let dims = self.gpu.one_wave(k, dims);
        self.with_q8_scaled(x, |xq, xds, scale| {
            args.extend([xq, xds, u32_arg(x.cols, "cols")?]);
            args.extend(scale);
            self.gpu.launch(k, dims, &args)
        })?;
        Ok(outs)
    }

    fn matmul_swiglu(
        &self,
        x: &CudaTensor,
        gate: &CudaWeight,
        up: &CudaWeight,
    ) -> Result<CudaTensor> {
        let fused = split_parts(&[gate, up]).filter(|_| {
            !self.f32_activations
                && gate.rows == up.rows
                && gate.cols == x.cols
                && up.cols == x.cols
        });
        let Some((ty, parts)) = fused else {
            return self.swiglu(&self.matmul(x, gate)?, &self.matmul(x, up)?);
        };
        if x.rows > FUSED_MAX_TOKENS {
            if self.gemm_for(x.rows) && self.gemm_swiglu && gate.rows.is_multiple_of(2) {
                // Prefill: gate, up and SwiGLU in one GEMM launch, whose f16 copy of the
                // output is the down projection's GEMM input.
                return self.launch_gemm_swiglu(ty, parts[0], parts[1], gate.rows, x);
            }
            // Gate and up as `matmul_many` runs them (one GEMM launch), then SwiGLU.
            let gate_up = self.matmul_many(x, &[gate, up])?;
            return self.swiglu(&gate_up[0], &gate_up[1]);
        }
        let mut out = self.tensor(x.rows, gate.rows)?;
        let ((gq, gs), (uq, us)) = (parts[0], parts[1]);
        if let Some((k, dims)) = self.swiglu_q8_launch(ty, x, gate.rows) {
            // The down projection's Q8_1 blocks come out of this launch: no quantize node.
            let (yq, yds) = self.q8_buffers(x.rows, gate.rows)?;
            self.with_q8_scaled(x, |xq, xds, scale| {
                let args = [gq.arg(), gs.arg(), uq.arg(), us.arg(), xq, xds, out.arg()];
                let rest = [
                    yq.arg(),
                    yds.arg(),
                    u32_arg(gate.rows, "rows")?,
                    u32_arg(x.cols, "cols")?,
                ];
                self.gpu
                    .launch(k, dims, &[&args[..], &rest[..], &scale[..]].concat())
            })?;
            out.q8 = Some(Box::new((yq, yds)));
            return Ok(out);
        }
        let k = by_format(
            ty,
            Self::consumer_family(x, MATVEC_SWIGLU, MATVEC_SWIGLU_NORM),
        );
        let dims = self.gpu.one_wave(
            k,
            self.gpu
                .shapes()
                .matvec_multi(&[gate.rows as u32], x.rows as u32, self.gpu.sm_count()),
        );
        self.with_q8_scaled(x, |xq, xds, scale| {
            let args = [
                gq.arg(),
                gs.arg(),
                uq.arg(),
                us.arg(),
                xq,
                xds,
                out.arg(),
                u32_arg(gate.rows, "rows")?,
                u32_arg(x.cols, "cols")?,
            ];
            self.gpu.launch(k, dims, &[&args[..], &scale[..]].concat())
        })?;
        Ok(out)
    }

    fn moe_route(&self, logits: &CudaTensor, m: &Moe) -> Result<CudaTensor> {
        let logits = self.settled(logits)?;
        moe::route(self, logits, m)
    }

    fn moe_swiglu_add(
        &self,
        x: &mut CudaTensor,
        h: &CudaTensor,
        route: &CudaTensor,
        gate: &CudaWeight,
        up: &CudaWeight,
        down: &CudaWeight,
        m: &Moe,
    ) -> Result<()> {
        moe::swiglu_add(self, x, self.settled(h)?, route, gate, up, down, m)
    }

    fn step(
        &self,
        cache: &mut CudaKvCache,
        tokens: &[u32],
        pos: usize,
        run: &mut StepFn<Self>,
    ) -> Result<CudaTensor> {
        let n = tokens.len();
        let mut step = vec![to_u32(pos, "position")?];
        step.extend_from_slice(tokens);
        self.step_arg(0, &step)?;
        let key = (cache.id, n, self.short_history(pos, n));
        let (recorded, record) = {
            let st = self.steps.borrow();
            (
                st.graphs.contains_key(&key),
                st.enabled && n == 1 && st.warm.contains(&key),
            )
        };
        if recorded {
            return self.replay(key, tokens);
        }
        self.steps.borrow_mut().in_step = true;
        let result = if record {
            self.record(key, cache, run)
        } else {
            run(self, cache).map(Some)
        };
        let mut st = self.steps.borrow_mut();
        st.in_step = false;
        st.warm.insert(key);
        drop(st);
        match result? {
            Some(out) => Ok(out),
            None => self.replay(key, tokens), // recorded, not yet run
        }
    }
}

/// The entry of `entries` for split format `ty` (Q8_0 for anything else: only the split
/// formats are stored split).
fn by_format(ty: GgmlType, entries: FormatEntries) -> &'static str {
    match ty {
        GgmlType::Q4_0 => entries[0],
        GgmlType::Q4_1 => entries[1],
        GgmlType::Q6_K => entries[3],
        GgmlType::Q5_K => entries[4],
        GgmlType::Q4_K => entries[5],
        _ => entries[2],
    }
}

/// The split-layout planes of weights that all share one 32-block format, or `None`.
#[allow(clippy::type_complexity)]
fn split_parts<'a>(ws: &[&'a CudaWeight]) -> Option<(GgmlType, Vec<(&'a DBuf<u8>, &'a DBuf<u8>)>)> {
    let mut ty0 = None;
    let mut parts = Vec::with_capacity(ws.len());
    for w in ws {
        let Storage::Split { ty, qs, scales } = &w.storage else {
            return None;
        };
        if *ty0.get_or_insert(*ty) != *ty {
            return None;
        }
        parts.push((qs, scales));
    }
    Some((ty0?, parts))
}
