//! Qwen3 (dense): the llama block plus QK-norm (a per-head RMSNorm of queries and keys before
//! RoPE, `attn_q_norm`/`attn_k_norm`), with NeoX (half-split) RoPE. `head_dim` comes from
//! `qwen3.attention.key_length` and need not equal `n_embd / n_head`.

use std::sync::Arc;

use anyhow::Result;

use super::blocks::{Head, Loader, SelfAttn, SwiGlu};
use super::{Config, Logits, Model};
use crate::backend::{Backend, RopeStyle};
use crate::gguf::GgufFile;

pub struct Qwen3Block<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn: SelfAttn<B>,
    pub q_norm: B::Weight,
    pub k_norm: B::Weight,
    pub ffn_norm: B::Weight,
    pub ffn: SwiGlu<B>,
}

impl<B: Backend> Qwen3Block<B> {
    fn load(l: &Loader<B>, i: usize, c: &Config) -> Result<Self> {
        Ok(Qwen3Block {
            attn_norm: l.blk(i, "attn_norm", 1, c.n_embd)?,
            attn: SelfAttn::load(l, i, c)?,
            q_norm: l.blk(i, "attn_q_norm", 1, c.head_dim)?,
            k_norm: l.blk(i, "attn_k_norm", 1, c.head_dim)?,
            ffn_norm: l.blk(i, "ffn_norm", 1, c.n_embd)?,
            ffn: SwiGlu::load(l, i, c)?,
        })
    }

    fn forward(
        &self,
        b: &B,
        cache: &mut B::KvCache,
        layer: usize,
        x: &mut B::Tensor,
        pos: usize,
        c: &Config,
    ) -> Result<()> {
        let h = b.rms_norm(x, &self.attn_norm, c.rms_eps)?;
        let (q, k, v) = self.attn.qkv(b, &h)?;
        // The norm weights are head_dim long, so rms_norm normalizes each head separately.
        let mut q = b.rms_norm(&q, &self.q_norm, c.rms_eps)?;
        let mut k = b.rms_norm(&k, &self.k_norm, c.rms_eps)?;
        b.rope(&mut q, pos, &c.rope)?;
        b.rope(&mut k, pos, &c.rope)?;
        b.add_assign(x, &self.attn.attend(b, cache, layer, &q, &k, &v, pos, c)?)?;
        let h = b.rms_norm(x, &self.ffn_norm, c.rms_eps)?;
        b.add_assign(x, &self.ffn.forward(b, &h)?)
    }
}

pub struct Qwen3<B: Backend> {
    pub cfg: Config,
    pub head: Head<B>,
    pub blocks: Vec<Qwen3Block<B>>,
}

impl<B: Backend> Qwen3<B> {
    pub fn load(b: &B, file: &Arc<GgufFile>, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let cfg = Config::from_gguf(file, RopeStyle::Neox)?;
        let l = Loader::new(b, file);
        let head = Head::load(&l, &cfg)?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            blocks.push(Qwen3Block::load(&l, i, &cfg)?);
            progress(i + 1, cfg.n_layer);
        }
        Ok(Qwen3 { cfg, head, blocks })
    }
}

impl<B: Backend> Model<B> for Qwen3<B> {
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
        let mut x = self.head.embed(b, tokens)?;
        for (layer, block) in self.blocks.iter().enumerate() {
            block.forward(b, cache, layer, &mut x, pos, &self.cfg)?;
        }
        self.head.logits(b, &x, &self.cfg, logits)
    }
}
