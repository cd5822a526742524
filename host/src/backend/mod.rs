//! The ops interface: what a model executor may ask of a device.
//!
//! Executors are written once as `fn forward<B: Backend>(..)`. They hold `B::Weight`s (uploaded or
//! mapped once at load), pass `B::Tensor`s (activations that stay on the device) from op to op, and
//! keep their attention state in a `B::KvCache` the backend owns. Only [`Backend::read`] and
//! [`Backend::argmax`] move data back to the host. No executor names a backend.
//!
//! Every tensor is a row-major 2-D `[rows, cols]` f32 matrix: one row per token. Heads are
//! contiguous column ranges of a row (`head h` = cols `h*head_dim .. (h+1)*head_dim`), the layout
//! the GGUF q/k/v projections produce, so no op needs a reshape.
//!
//! Mixture-of-experts layers use two more ops: [`Backend::moe_route`] (top-k of the router's
//! softmax, kept on the device as an ordinary tensor) and [`Backend::moe_swiglu_add`] over 3-D
//! expert weights (`[n_expert·rows, cols]`: expert `e` owns rows `e·rows ..`). MLA will add its
//! own cache layout (compressed latent + rope key) and an `mla_attention` op the same way: new
//! trait methods used by new executors; nothing here changes shape.

pub mod cpu;
pub mod cuda;
pub mod lockstep;

use std::sync::Arc;

use anyhow::{Result, bail, ensure};

use crate::gguf::GgufFile;

/// Rows and columns of a device matrix.
pub trait Shape {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
}

/// `add_row`'s operands: one row as wide as `x`.
pub fn check_row(x: &dyn Shape, row: &dyn Shape) -> Result<()> {
    ensure!(
        row.rows() == 1 && row.cols() == x.cols(),
        "add_row: a {} × {} row for {} × {}",
        row.rows(),
        row.cols(),
        x.rows(),
        x.cols()
    );
    Ok(())
}

/// Which dimensions of a head RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: llama.cpp's llama layout (its converter permutes q/k for it).
    Normal,
    /// Halves `(i, i + rot_dim/2)`: GPT-NeoX, Qwen.
    Neox,
}

/// Rotary position embedding of every head of a `[tokens, heads*head_dim]` tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    pub head_dim: usize,
    /// Leading dimensions of each head that rotate (the rest pass through); usually `head_dim`.
    pub rot_dim: usize,
    pub freq_base: f32,
    /// Per-pair frequency divisors (`rope_freqs.weight`, Llama 3.1+ long context): pair `i`'s
    /// angle is `pos·base^(−2i/rot_dim) / factors[i]`. `None`: all 1.
    pub factors: Option<std::sync::Arc<[f32]>>,
}

/// Shape of the attention of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    pub n_head: usize,
    /// Key/value heads; each serves `n_head / n_kv_head` query heads (grouped-query attention).
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Multiplies `q·k`; `1/sqrt(head_dim)` for every model so far.
    pub scale: f32,
}

/// Size of a KV cache: f16 keys and values of `max_seq` positions for every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub n_layer: usize,
    pub max_seq: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
}

/// A mixture-of-experts feed-forward: which experts a token uses and how their outputs mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub n_expert: usize,
    /// Experts per token: the `n_used` largest router probabilities.
    pub n_used: usize,
    /// Rescale the chosen probabilities to sum to 1 (Qwen3-MoE's `norm_topk_prob`).
    pub norm_weights: bool,
}

impl Moe {
    /// `n_used` within `1..=n_expert`, and one router logit per expert in each row.
    pub fn check_logits(&self, logits: &dyn Shape) -> Result<()> {
        self.check_used()?;
        ensure!(
            logits.cols() == self.n_expert,
            "moe_route: router logits have {} columns for {} experts",
            logits.cols(),
            self.n_expert
        );
        Ok(())
    }

    /// The operands of [`Backend::moe_swiglu_add`] agree with each other and with `self`;
    /// returns the experts' width `n_ff`. Weights come with their tensor names for the message.
    pub fn check_ffn(
        &self,
        x: &dyn Shape,
        h: &dyn Shape,
        route: &dyn Shape,
        [gate, up, down]: [(&dyn Shape, &str); 3],
    ) -> Result<usize> {
        self.check_used()?;
        let (n, k) = (h.rows(), self.n_used);
        ensure!(
            route.rows() == n && route.cols() == 2 * k && x.rows() == n,
            "moe: {n} tokens, a {}x{} route for {k} experts each, a {}-row residual",
            route.rows(),
            route.cols(),
            x.rows()
        );
        let ((g, g_name), (u, u_name), (d, d_name)) = (gate, up, down);
        ensure!(
            g.rows() == u.rows()
                && g.rows().is_multiple_of(self.n_expert)
                && g.cols() == h.cols()
                && u.cols() == h.cols(),
            "moe: {g_name} and {u_name} are not {} experts over {}-wide activations",
            self.n_expert,
            h.cols()
        );
        let n_ff = g.rows() / self.n_expert;
        ensure!(
            d.cols() == n_ff && d.rows() == x.cols() * self.n_expert,
            "moe: {d_name} is {}x{}, expected {}x{n_ff}",
            d.rows(),
            d.cols(),
            x.cols() * self.n_expert
        );
        Ok(n_ff)
    }

    fn check_used(&self) -> Result<()> {
        ensure!(
            self.n_used >= 1 && self.n_used <= self.n_expert,
            "mixture of experts: {} experts used of {}",
            self.n_used,
            self.n_expert
        );
        Ok(())
    }
}

/// One decode step's ops, run by [`Backend::step`] (recorded once on backends that can).
pub type StepFn<'a, B> =
    dyn FnMut(&B, &mut <B as Backend>::KvCache) -> Result<<B as Backend>::Tensor> + 'a;

/// A compute device, as the model executors see it.
pub trait Backend {
    /// An f32 activation matrix resident on the device.
    type Tensor: Shape;
    /// A GGUF tensor made usable by the device: `rows` = product of `dims[1..]`, `cols` = `dims[0]`.
    type Weight: Shape;
    /// Per-layer f16 keys and values; f16 on every backend so they agree bit for bit on the cache.
    type KvCache;

    /// Short name for messages ("cpu", "cuda").
    fn name(&self) -> &'static str;

    /// Maps (CPU, zero-copy) or uploads (device) the named tensor; errors name a missing tensor.
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight>;
    /// A table only ever read through [`embed`](Self::embed) (a token embedding not tied to the
    /// output projection): a device backend may keep it out of device memory, since a step reads
    /// a few of its rows.
    fn load_lookup_table(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight> {
        self.load_weight(file, name)
    }
    fn kv_cache(&self, spec: &KvSpec) -> Result<Self::KvCache>;

    /// Host to device.
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// Device to host, row-major.
    fn read(&self, x: &Self::Tensor) -> Result<Vec<f32>>;
    /// Index of the largest element of each row (greedy decoding without reading logits back).
    fn argmax(&self, x: &Self::Tensor) -> Result<Vec<u32>>;
    /// `−log softmax(row)[target]` of each row of `x` (logits), one target per row: perplexity's
    /// score. A device backend may compute it without reading the rows back.
    fn token_nll(&self, x: &Self::Tensor, targets: &[u32]) -> Result<Vec<f64>> {
        crate::perplexity::rows_nll(&self.read(x)?, x.cols(), targets)
    }
    /// Rows `start .. start+n` as a new tensor (e.g. the last position before the output head).
    fn rows(&self, x: &Self::Tensor, start: usize, n: usize) -> Result<Self::Tensor>;

    /// `out[i] = table[ids[i]]`, dequantized: `[ids.len(), table.cols]`.
    fn embed(&self, table: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor>;
    /// `x · wᵀ`: `[n, w.cols]` → `[n, w.rows]`; the weight may be quantized.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor>;
    /// `[x·w₀ᵀ, x·w₁ᵀ, ..]` for weights of equal width (the q/k/v projections of one input):
    /// a backend may compute them in one pass.
    fn matmul_many(&self, x: &Self::Tensor, ws: &[&Self::Weight]) -> Result<Vec<Self::Tensor>> {
        ws.iter().map(|w| self.matmul(x, w)).collect()
    }
    /// `silu(x·gateᵀ) ⊙ (x·upᵀ)`, the first half of a SwiGLU feed-forward; a backend may fuse it.
    fn matmul_swiglu(
        &self,
        x: &Self::Tensor,
        gate: &Self::Weight,
        up: &Self::Weight,
    ) -> Result<Self::Tensor> {
        self.swiglu(&self.matmul(x, gate)?, &self.matmul(x, up)?)
    }
    /// RMSNorm over each group of `w.cols` columns (a whole row, or one head for QK-norm),
    /// scaled by `w`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Result<Self::Tensor>;
    /// RMSNorm of each head (`w` is `head_dim` long) then RoPE at positions `pos..` (QK-norm);
    /// a backend may fuse the two.
    fn rms_norm_rope(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        pos: usize,
        rope: &Rope,
    ) -> Result<Self::Tensor> {
        let mut y = self.rms_norm(x, w, eps)?;
        self.rope(&mut y, pos, rope)?;
        Ok(y)
    }
    /// Rotates every head of row `i` by position `pos + i`, in place.
    fn rope(&self, x: &mut Self::Tensor, pos: usize, rope: &Rope) -> Result<()>;
    /// `silu(gate) * up`, elementwise.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `x += y` (residual connections).
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// `x[i] += row` for every row `i` (`row` is `1 × x.cols`): a control vector steering the
    /// residual stream.
    fn add_row(&self, x: &mut Self::Tensor, row: &Self::Tensor) -> Result<()>;
    /// Stores `k`, `v` (`[n, n_kv_head*head_dim]`) of positions `pos .. pos+n` in `layer` of the
    /// cache, then attends each query row `i` of `q` (`[n, n_head*head_dim]`) causally over
    /// cache positions `0 ..= pos+i`. Returns `[n, n_head*head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        pos: usize,
        attn: &Attention,
    ) -> Result<Self::Tensor>;

    /// RoPE of `q` and `k` at positions `pos..` (after a per-head RMSNorm of each by
    /// `qk_norm` = (query weight, key weight, eps) when given: Qwen3's QK-norm), then
    /// [`Backend::attention`]. A backend may do the norms, rotations and the cache store in one pass.
    #[allow(clippy::too_many_arguments)]
    fn rope_attention(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        q: Self::Tensor,
        k: Self::Tensor,
        v: &Self::Tensor,
        qk_norm: Option<(&Self::Weight, &Self::Weight, f32)>,
        pos: usize,
        rope: &Rope,
        attn: &Attention,
    ) -> Result<Self::Tensor> {
        let (q, k) = match qk_norm {
            Some((qn, kn, eps)) => (
                self.rms_norm_rope(&q, qn, eps, pos, rope)?,
                self.rms_norm_rope(&k, kn, eps, pos, rope)?,
            ),
            None => {
                let (mut q, mut k) = (q, k);
                self.rope(&mut q, pos, rope)?;
                self.rope(&mut k, pos, rope)?;
                (q, k)
            }
        };
        self.attention(cache, layer, &q, &k, v, pos, attn)
    }

    /// Mixture-of-experts routing of each row of the router logits `[n, n_expert]`: softmax,
    /// then the `n_used` largest probabilities (ranked by logit, the lower index first on
    /// ties), rescaled to sum to 1 with `norm_weights`. Returns `[n, 2·n_used]`: per row the chosen experts' indices
    /// (integers, exact in f32) in descending probability, then their weights in the same
    /// order. It stays on the device, so a recorded decode step can replay it.
    fn moe_route(&self, logits: &Self::Tensor, moe: &Moe) -> Result<Self::Tensor> {
        let _ = (logits, moe);
        bail!("the {} backend has no mixture-of-experts ops", self.name())
    }
    /// `x += Σ_j w_j · down_{e_j}(silu(gate_{e_j}(h)) ⊙ up_{e_j}(h))` over each row's experts
    /// `e_j` and weights `w_j` from [`moe_route`](Self::moe_route), added in route order. `gate`
    /// and `up` are `[n_expert·n_ff, n_embd]` and `down` `[n_expert·n_embd, n_ff]`, expert `e`
    /// owning rows `e·n_ff ..` (`e·n_embd ..`): GGUF's `ffn_*_exps` tensors.
    #[allow(clippy::too_many_arguments)]
    fn moe_swiglu_add(
        &self,
        x: &mut Self::Tensor,
        h: &Self::Tensor,
        route: &Self::Tensor,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        moe: &Moe,
    ) -> Result<()> {
        let _ = (x, h, route, gate, up, down, moe);
        bail!("the {} backend has no mixture-of-experts ops", self.name())
    }

    /// `x += a · wᵀ` (a projection into the residual stream); a backend may fuse the add.
    fn matmul_add(&self, x: &mut Self::Tensor, a: &Self::Tensor, w: &Self::Weight) -> Result<()> {
        let y = self.matmul(a, w)?;
        self.add_assign(x, &y)
    }

    /// `x += a · wᵀ`, then returns `rms_norm(x, norm, eps)` of the new `x`: the projection
    /// that ends a sub-block and the norm that starts the next. A backend may leave the norm's
    /// `1/rms` to the projections that read its output, saving the norm a pass of its own.
    fn matmul_add_norm(
        &self,
        x: &mut Self::Tensor,
        a: &Self::Tensor,
        w: &Self::Weight,
        norm: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor> {
        self.matmul_add(x, a, w)?;
        self.rms_norm(x, norm, eps)
    }

    /// One forward step over `tokens` at positions `pos..`: `run` issues the ops. A backend that
    /// can record work (CUDA graphs) may record a decode step once and replay the recording
    /// for later steps with the same cache and token count, feeding it the new tokens and
    /// position from device memory; `run` must therefore issue the same ops at every such step,
    /// which a model's forward pass does.
    fn step(
        &self,
        cache: &mut Self::KvCache,
        tokens: &[u32],
        pos: usize,
        run: &mut StepFn<Self>,
    ) -> Result<Self::Tensor> {
        let _ = (tokens, pos);
        run(self, cache)
    }
}
