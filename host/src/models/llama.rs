//! Llama (SmolLM2, Llama 2/3, and anything llama.cpp converts to `general.architecture = llama`):
//! pre-norm blocks of grouped-query attention with "normal" (adjacent-pair) RoPE, since
//! llama.cpp's converter permutes the q/k rows for that layout, and a SwiGLU feed-forward.

use std::sync::Arc;

use anyhow::{Result, bail};

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
    let l = Loader::new(b, file);
    if l.has("rope_freqs.weight") {
        // Llama 3.1+ long-context frequency scaling; without it outputs drift, so refuse.
        bail!("rope_freqs.weight (Llama 3.1+ RoPE scaling) is not supported yet");
    }
    Decoder::load(&l, cfg, false, progress)
}
