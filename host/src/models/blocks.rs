//! Pieces every decoder-only architecture shares: weight loading by GGUF name, the q/k/v/o
//! attention projections, the SwiGLU feed-forward, the embedding/output head, and the pre-norm
//! [`Decoder`] that llama and qwen3 both are (qwen3 adds QK-norm; qwen3moe routed experts).

use std::sync::Arc;

use anyhow::{Result, ensure};

use super::{Config, Experts, Logits, Model};
use crate::backend::{Backend, Shape};
use crate::gguf::GgufFile;

/// Loads weights by GGUF name and checks their shapes, so a malformed file fails at load with
/// the tensor's name rather than deep inside a forward pass.
pub struct Loader<'a, B: Backend> {
    pub b: &'a B,
    pub file: &'a Arc<GgufFile>,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub fn new(b: &'a B, file: &'a Arc<GgufFile>) -> Self {
        Loader { b, file }
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_ok()
    }

    /// The tensor `name`, which must be `[rows, cols]` in our convention (GGUF dims `[cols, rows]`).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        Self::shaped(self.b.load_weight(self.file, name)?, name, rows, cols)
    }

    /// [`matrix`](Self::matrix) for a table only read by row lookups ([`Backend::load_lookup_table`]).
    pub fn lookup_table(&self, name: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        Self::shaped(self.b.load_lookup_table(self.file, name)?, name, rows, cols)
    }

    fn shaped(w: B::Weight, name: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        ensure!(
            w.rows() == rows && w.cols() == cols,
            "tensor {name} is {} rows x {} columns, the model's metadata implies {rows} x {cols}",
            w.rows(),
            w.cols()
        );
        Ok(w)
    }

    /// A one-dimensional tensor of `len` elements (norm scales).
    pub fn vector(&self, name: &str, len: usize) -> Result<B::Weight> {
        self.matrix(name, 1, len)
    }

    /// `blk.{layer}.{name}.weight`, the llama.cpp naming of per-block tensors.
    pub fn blk(&self, layer: usize, name: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        self.matrix(&format!("blk.{layer}.{name}.weight"), rows, cols)
    }
}

/// The four attention projections of one block.
pub struct SelfAttn<B: Backend> {
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub wo: B::Weight,
}

impl<B: Backend> SelfAttn<B> {
    pub fn load(l: &Loader<B>, layer: usize, c: &Config) -> Result<Self> {
        let (q_dim, kv_dim) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        Ok(SelfAttn {
            wq: l.blk(layer, "attn_q", q_dim, c.n_embd)?,
            wk: l.blk(layer, "attn_k", kv_dim, c.n_embd)?,
            wv: l.blk(layer, "attn_v", kv_dim, c.n_embd)?,
            wo: l.blk(layer, "attn_output", c.n_embd, q_dim)?,
        })
    }

    /// Projects the normed hidden state to queries, keys and values.
    pub fn qkv(&self, b: &B, h: &B::Tensor) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let [q, k, v]: [B::Tensor; 3] = b
            .matmul_many(h, &[&self.wq, &self.wk, &self.wv])?
            .try_into()
            .map_err(|_| anyhow::anyhow!("matmul_many returned the wrong number of tensors"))?;
        Ok((q, k, v))
    }
}

/// `down(silu(gate(x)) * up(x))`.
pub struct SwiGlu<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

impl<B: Backend> SwiGlu<B> {
    pub fn load(l: &Loader<B>, layer: usize, c: &Config) -> Result<Self> {
        Ok(SwiGlu {
            gate: l.blk(layer, "ffn_gate", c.n_ff, c.n_embd)?,
            up: l.blk(layer, "ffn_up", c.n_ff, c.n_embd)?,
            down: l.blk(layer, "ffn_down", c.n_embd, c.n_ff)?,
        })
    }

    /// `x += down(silu(gate(h)) * up(h))`: the feed-forward added into the residual stream;
    /// then `next(x)` when the norm after it is given.
    pub fn forward_add(
        &self,
        b: &B,
        x: &mut B::Tensor,
        h: &B::Tensor,
        next: Option<(&B::Weight, f32)>,
    ) -> Result<Option<B::Tensor>> {
        let act = b.matmul_swiglu(h, &self.gate, &self.up)?;
        match next {
            Some((norm, eps)) => b.matmul_add_norm(x, &act, &self.down, norm, eps).map(Some),
            None => b.matmul_add(x, &act, &self.down).map(|()| None),
        }
    }
}

/// A mixture-of-experts SwiGLU feed-forward: the router picks `n_used` of `n_expert` expert
/// feed-forwards per token and mixes their outputs by its weights.
pub struct MoeSwiGlu<B: Backend> {
    /// `ffn_gate_inp`: `[n_expert, n_embd]`, one logit per expert.
    pub router: B::Weight,
    /// `ffn_{gate,up,down}_exps`: every expert's matrix stacked along the rows.
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
    pub experts: Experts,
}

impl<B: Backend> MoeSwiGlu<B> {
    pub fn load(l: &Loader<B>, layer: usize, c: &Config, experts: Experts) -> Result<Self> {
        let (n, ff) = (experts.moe.n_expert, experts.n_ff);
        Ok(MoeSwiGlu {
            router: l.blk(layer, "ffn_gate_inp", n, c.n_embd)?,
            gate: l.blk(layer, "ffn_gate_exps", n * ff, c.n_embd)?,
            up: l.blk(layer, "ffn_up_exps", n * ff, c.n_embd)?,
            down: l.blk(layer, "ffn_down_exps", n * c.n_embd, ff)?,
            experts,
        })
    }

    /// `x += Σ_j w_j · expert_j(h)` over the experts the router picks for each row of `h`.
    pub fn forward_add(&self, b: &B, x: &mut B::Tensor, h: &B::Tensor) -> Result<()> {
        let moe = &self.experts.moe;
        let route = b.moe_route(&b.matmul(h, &self.router)?, moe)?;
        b.moe_swiglu_add(x, h, &route, &self.gate, &self.up, &self.down, moe)
    }
}

/// A block's feed-forward: one SwiGLU, or routed experts.
pub enum FeedForward<B: Backend> {
    Dense(SwiGlu<B>),
    Experts(MoeSwiGlu<B>),
}

impl<B: Backend> FeedForward<B> {
    pub fn load(l: &Loader<B>, layer: usize, c: &Config) -> Result<Self> {
        Ok(match c.experts {
            Some(e) => FeedForward::Experts(MoeSwiGlu::load(l, layer, c, e)?),
            None => FeedForward::Dense(SwiGlu::load(l, layer, c)?),
        })
    }

    /// `x += ffn(h)`, then `next(x)` when the norm after it is given.
    pub fn forward_add(
        &self,
        b: &B,
        x: &mut B::Tensor,
        h: &B::Tensor,
        next: Option<(&B::Weight, f32)>,
    ) -> Result<Option<B::Tensor>> {
        match self {
            FeedForward::Dense(f) => f.forward_add(b, x, h, next),
            FeedForward::Experts(f) => {
                f.forward_add(b, x, h)?;
                next.map(|(norm, eps)| b.rms_norm(x, norm, eps)).transpose()
            }
        }
    }
}

/// Token embedding in, final norm and vocabulary projection out.
pub struct Head<B: Backend> {
    pub embd: B::Weight,
    pub norm: B::Weight,
    /// `output.weight`, or a second handle on `token_embd.weight` when the model ties them.
    pub output: B::Weight,
}

impl<B: Backend> Head<B> {
    pub fn load(l: &Loader<B>, c: &Config) -> Result<Self> {
        let tied = !l.has("output.weight");
        let out = if tied {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        Ok(Head {
            embd: if tied {
                l.matrix("token_embd.weight", c.n_vocab, c.n_embd)?
            } else {
                l.lookup_table("token_embd.weight", c.n_vocab, c.n_embd)?
            },
            norm: l.vector("output_norm.weight", c.n_embd)?,
            output: l.matrix(out, c.n_vocab, c.n_embd)?,
        })
    }

    pub fn embed(&self, b: &B, tokens: &[u32]) -> Result<B::Tensor> {
        ensure!(!tokens.is_empty(), "forward pass over zero tokens");
        b.embed(&self.embd, tokens)
    }

    /// The vocabulary projection of `h`, the final norm's output (`output_norm`, which the
    /// last block folds into its last projection).
    pub fn logits(&self, b: &B, h: &B::Tensor, which: Logits) -> Result<B::Tensor> {
        let n = h.rows();
        let last;
        let h = match which {
            Logits::Last if n > 1 => {
                last = b.rows(h, n - 1, 1)?;
                &last
            }
            _ => h,
        };
        b.matmul(h, &self.output)
    }
}

/// One pre-norm block: `x += attn(norm(x))`, `x += ffn(norm(x))`, with an optional per-head
/// RMSNorm of queries and keys before RoPE (Qwen3's QK-norm).
pub struct DecoderBlock<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn: SelfAttn<B>,
    /// `attn_q_norm`, `attn_k_norm` (each `head_dim` long).
    pub qk_norm: Option<(B::Weight, B::Weight)>,
    pub ffn_norm: B::Weight,
    pub ffn: FeedForward<B>,
}

impl<B: Backend> DecoderBlock<B> {
    pub fn load(l: &Loader<B>, i: usize, c: &Config, qk_norm: bool) -> Result<Self> {
        let qk_norm = if qk_norm {
            Some((
                l.blk(i, "attn_q_norm", 1, c.head_dim)?,
                l.blk(i, "attn_k_norm", 1, c.head_dim)?,
            ))
        } else {
            None
        };
        Ok(DecoderBlock {
            attn_norm: l.blk(i, "attn_norm", 1, c.n_embd)?,
            attn: SelfAttn::load(l, i, c)?,
            qk_norm,
            ffn_norm: l.blk(i, "ffn_norm", 1, c.n_embd)?,
            ffn: FeedForward::load(l, i, c)?,
        })
    }

    /// `x += attn(h)` with `h = attn_norm(x)` given, then `x += ffn(ffn_norm(x))`; returns
    /// `next(x)` of the new `x` when the norm after the block is given (the next block's
    /// `attn_norm` or the head's), which a backend may fold into the block's last projection.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        b: &B,
        cache: &mut B::KvCache,
        layer: usize,
        x: &mut B::Tensor,
        h: &B::Tensor,
        pos: usize,
        c: &Config,
        next: Option<&B::Weight>,
    ) -> Result<Option<B::Tensor>> {
        let (q, k, v) = self.attn.qkv(b, h)?;
        // The norm weights are head_dim long, so each head is normalized separately.
        let qk_norm = self.qk_norm.as_ref().map(|(qn, kn)| (qn, kn, c.rms_eps));
        let a = b.rope_attention(
            cache,
            layer,
            q,
            k,
            &v,
            qk_norm,
            pos,
            &c.rope,
            &c.attention(),
        )?;
        let h = b.matmul_add_norm(x, &a, &self.attn.wo, &self.ffn_norm, c.rms_eps)?;
        let next = next.map(|norm| (norm, c.rms_eps));
        self.ffn.forward_add(b, x, &h, next)
    }
}

/// A decoder-only transformer: embedding, `n_layer` [`DecoderBlock`]s, final norm and head.
pub struct Decoder<B: Backend> {
    pub cfg: Config,
    pub head: Head<B>,
    pub blocks: Vec<DecoderBlock<B>>,
    /// A control vector's direction per block, added to the residual stream after it.
    pub steering: Vec<Option<B::Tensor>>,
}

impl<B: Backend> Decoder<B> {
    /// Loads every block (`qk_norm`: the blocks have `attn_q_norm`/`attn_k_norm`), reporting
    /// progress per block.
    pub fn load(
        l: &Loader<B>,
        cfg: Config,
        qk_norm: bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let head = Head::load(l, &cfg)?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            blocks.push(DecoderBlock::load(l, i, &cfg, qk_norm)?);
            progress(i + 1, cfg.n_layer);
        }
        Ok(Decoder {
            cfg,
            head,
            blocks,
            steering: Vec::new(),
        })
    }
}

impl<B: Backend> Model<B> for Decoder<B> {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn forward(
        &self,
        b: &B,
        cache: &mut B::KvCache,
        tokens: &[u32],
        pos: usize,
        logits: Logits,
    ) -> Result<B::Tensor> {
        let eps = self.cfg.rms_eps;
        // The norm before block i+1 (or the head) is block i's to fold into its last
        // projection, unless a control vector changes x between them.
        let norm_after = |layer: usize| {
            self.blocks
                .get(layer + 1)
                .map_or(&self.head.norm, |next| &next.attn_norm)
        };
        let mut x = self.head.embed(b, tokens)?;
        let first = self
            .blocks
            .first()
            .map_or(&self.head.norm, |bl| &bl.attn_norm);
        let mut h = b.rms_norm(&x, first, eps)?;
        for (layer, block) in self.blocks.iter().enumerate() {
            let steer = self.steering.get(layer).and_then(Option::as_ref);
            let next = steer.is_none().then(|| norm_after(layer));
            h = match block.forward(b, cache, layer, &mut x, &h, pos, &self.cfg, next)? {
                Some(h) => h,
                None => {
                    if let Some(dir) = steer {
                        b.add_row(&mut x, dir)?;
                    }
                    b.rms_norm(&x, norm_after(layer), eps)?
                }
            };
        }
        self.head.logits(b, &h, logits)
    }

    fn steer(&mut self, b: &B, directions: &[Option<Vec<f32>>]) -> Result<()> {
        let n_embd = self.cfg.n_embd;
        ensure!(
            directions.len() <= self.blocks.len(),
            "{} control-vector layers for a {}-layer model",
            directions.len(),
            self.blocks.len()
        );
        self.steering = directions
            .iter()
            .map(|d| match d {
                Some(d) => {
                    ensure!(
                        d.len() == n_embd,
                        "a control vector of {} for width {n_embd}",
                        d.len()
                    );
                    b.upload(d, 1, n_embd).map(Some)
                }
                None => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(())
    }
}
