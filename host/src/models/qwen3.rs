//! Qwen3, dense and mixture-of-experts (`qwen3moe`, whose feed-forwards are routed experts,
//! [`super::blocks::MoeSwiGlu`]): the llama block plus QK-norm (a per-head RMSNorm of queries and keys before
//! RoPE, `attn_q_norm`/`attn_k_norm`), with NeoX (half-split) RoPE. `head_dim` comes from
//! `qwen3.attention.key_length` and need not equal `n_embd / n_head`.

use std::sync::Arc;

use anyhow::Result;

use super::Config;
use super::blocks::{Decoder, Loader};
use crate::backend::{Backend, RopeStyle};
use crate::gguf::GgufFile;

pub fn load<B: Backend>(
    b: &B,
    file: &Arc<GgufFile>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Decoder<B>> {
    let cfg = Config::from_gguf(file, RopeStyle::Neox)?;
    Decoder::load(&Loader::new(b, file), cfg, true, progress)
}
