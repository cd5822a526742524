//! Llama (SmolLM2, Llama 2/3, and anything llama.cpp converts to `general.architecture = llama`):
//! pre-norm blocks of grouped-query attention with "normal" (adjacent-pair) RoPE, since
//! llama.cpp's converter permutes the q/k rows for that layout, and a SwiGLU feed-forward.

use std::sync::Arc;

use anyhow::{Result, bail};

use super::blocks::{Head, Loader, SelfAttn, SwiGlu};
use super::{Config, Logits, Model};
use crate::backend::{Backend, RopeStyle};
use crate::gguf::GgufFile;

pub struct LlamaBlock<B: Backend> {
    pub attn_norm: B::Weight,
    pub attn: SelfAttn<B>,
    pub ffn_norm: B::Weight,
    pub ffn: SwiGlu<B>,
}

impl<B: Backend> LlamaBlock<B> {
    fn load(l: &Loader<B>, i: usize, c: &Config) -> Result<Self> {
        Ok(LlamaBlock {
            attn_norm: l.blk(i, "attn_norm", 1, c.n_embd)?,
            attn: SelfAttn::load(l, i, c)?,
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
        let (mut q, mut k, v) = self.attn.qkv(b, &h)?;
        b.rope(&mut q, pos, &c.rope)?;
        b.rope(&mut k, pos, &c.rope)?;
        b.add_assign(x, &self.attn.attend(b, cache, layer, &q, &k, &v, pos, c)?)?;
        let h = b.rms_norm(x, &self.ffn_norm, c.rms_eps)?;
        b.add_assign(x, &self.ffn.forward(b, &h)?)
    }
}

pub struct Llama<B: Backend> {
    pub cfg: Config,
    pub head: Head<B>,
    pub blocks: Vec<LlamaBlock<B>>,
}

impl<B: Backend> Llama<B> {
    pub fn load(b: &B, file: &Arc<GgufFile>, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let cfg = Config::from_gguf(file, RopeStyle::Normal)?;
        let l = Loader::new(b, file);
        if l.has("rope_freqs.weight") {
            // Llama 3.1+ long-context frequency scaling; without it outputs drift, so refuse.
            bail!("rope_freqs.weight (Llama 3.1+ RoPE scaling) is not supported yet");
        }
        let head = Head::load(&l, &cfg)?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            blocks.push(LlamaBlock::load(&l, i, &cfg)?);
            progress(i + 1, cfg.n_layer);
        }
        Ok(Llama { cfg, head, blocks })
    }
}

impl<B: Backend> Model<B> for Llama<B> {
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
