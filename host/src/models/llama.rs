//! Llama (SmolLM2, Llama 2/3, and anything llama.cpp converts to `general.architecture = llama`):
//! pre-norm blocks of grouped-query attention with "normal" (adjacent-pair) RoPE, since
//! llama.cpp's converter permutes the q/k rows for that layout, and a SwiGLU feed-forward.

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
    let cfg = Config::from_gguf(file, RopeStyle::Normal)?;
    // Llama 3.1+'s `rope_freqs.weight` is read into `cfg.rope.factors`.
    Decoder::load(&Loader::new(b, file), cfg, false, progress)
}
