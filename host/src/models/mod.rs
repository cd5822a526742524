//! Model executors, written once against [`Backend`]: one file per architecture, one struct per
//! block loaded by GGUF tensor name, shared block helpers in [`blocks`].

pub mod blocks;
pub mod llama;
pub mod qwen3;
mod rope_scaling;

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};

use crate::backend::{Attention, Backend, KvSpec, Moe, Rope, RopeStyle};
use crate::gguf::GgufFile;

/// Architectures [`load`] accepts (GGUF `general.architecture`).
pub const SUPPORTED: &[&str] = &["llama", "qwen3", "qwen3moe"];

/// Hyper-parameters of a decoder-only transformer, read from `{arch}.*` metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    /// Context the model was trained for; the KV cache default.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope: Rope,
    /// Multiplies `q·k`: `1/sqrt(head_dim)`, times YaRN's magnitude correction when the file
    /// asks for it ([`rope_scaling`]).
    pub attn_scale: f32,
    /// The feed-forward's experts, for mixture-of-experts models (`{arch}.expert_count` > 0).
    pub experts: Option<Experts>,
}

/// The routed experts of a mixture-of-experts feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub moe: Moe,
    /// Hidden width of one expert (`{arch}.expert_feed_forward_length`).
    pub n_ff: usize,
}

impl Config {
    /// Reads the metadata every supported architecture shares; `rope_style` is the one fact the
    /// file does not say (llama.cpp fixes it per architecture).
    pub fn from_gguf(file: &GgufFile, rope_style: RopeStyle) -> Result<Config> {
        let arch = file.get_str("general.architecture")?.to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| -> Result<usize> { Ok(file.get_u32(&key(k))? as usize) };
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        ensure!(
            n_head > 0 && n_embd > 0,
            "{}: zero heads or embedding width",
            key("attention.head_count")
        );
        let n_kv_head = u("attention.head_count_kv").unwrap_or(n_head);
        ensure!(
            n_kv_head > 0 && n_head % n_kv_head == 0,
            "{n_head} attention heads cannot share {n_kv_head} kv heads"
        );
        let head_dim = u("attention.key_length").unwrap_or(n_embd / n_head);
        if let Ok(vd) = u("attention.value_length") {
            ensure!(
                vd == head_dim,
                "key length {head_dim} != value length {vd} is not supported"
            );
        }
        let rot_dim = u("rope.dimension_count").unwrap_or(head_dim);
        let n_ctx_train = u("context_length")?;
        // 10000 is the value of the original RoPE paper, which files omitting it assume.
        let freq_base = file.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0);
        let scaling = rope_scaling::read(file, &arch, rot_dim, freq_base, n_ctx_train)?;
        let embd = file
            .tensor("token_embd.weight")
            .context("model has no tensor token_embd.weight")?;
        let n_vocab = embd.dims.get(1).copied().unwrap_or(0) as usize;
        let experts = match u("expert_count") {
            Ok(n_expert) if n_expert > 0 => {
                let n_used = u("expert_used_count")?;
                ensure!(
                    (1..=n_expert).contains(&n_used),
                    "{}: {n_used} experts used of {n_expert}",
                    key("expert_used_count")
                );
                Some(Experts {
                    moe: Moe {
                        n_expert,
                        n_used,
                        norm_weights: file
                            .get_bool(&key("expert_weights_norm"))
                            .unwrap_or_else(|_| norms_expert_weights(&arch)),
                    },
                    n_ff: u("expert_feed_forward_length")?,
                })
            }
            _ => None,
        };
        Ok(Config {
            n_layer: u("block_count")?,
            // A mixture-of-experts model need not have a dense feed-forward width.
            n_ff: match experts {
                Some(_) => u("feed_forward_length").unwrap_or(0),
                None => u("feed_forward_length")?,
            },
            experts,
            n_ctx_train,
            rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope: Rope {
                style: rope_style,
                head_dim,
                rot_dim,
                freq_base,
                factors: scaling.factors,
            },
            attn_scale: scaling.attn_scale / (head_dim as f32).sqrt(),
            arch,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            n_vocab,
        })
    }

    pub fn attention(&self) -> Attention {
        Attention {
            n_head: self.n_head,
            n_kv_head: self.n_kv_head,
            head_dim: self.head_dim,
            scale: self.attn_scale,
        }
    }

    /// A cache for `max_seq` positions (callers clamp to what they need; capped by training).
    pub fn kv_spec(&self, max_seq: usize) -> KvSpec {
        KvSpec {
            n_layer: self.n_layer,
            max_seq,
            n_kv_head: self.n_kv_head,
            head_dim: self.head_dim,
        }
    }
}

/// Whether `arch` rescales its chosen experts' weights to sum to 1 when the file does not say
/// (`expert_weights_norm`): llama.cpp fixes it per architecture, as Qwen3-MoE's
/// `norm_topk_prob` does.
fn norms_expert_weights(arch: &str) -> bool {
    arch == "qwen3moe"
}

/// Which positions' logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (generation): skips the vocabulary mat-mul for the rest.
    Last,
    /// Every token's (tests, perplexity).
    All,
}

/// A loaded model, ready to run on backend `B`.
pub trait Model<B: Backend> {
    fn config(&self) -> &Config;
    /// Runs `tokens` at positions `pos ..`, appending their keys/values to `cache`, and returns
    /// logits `[1 or tokens.len(), n_vocab]`.
    fn forward(
        &self,
        b: &B,
        cache: &mut B::KvCache,
        tokens: &[u32],
        pos: usize,
        logits: Logits,
    ) -> Result<B::Tensor>;
    /// Adds `directions[l]` (`n_embd` wide) to the residual stream after block `l` from now on
    /// ([`crate::steering`]); all `None` removes any. Keys and values already cached were
    /// computed without it, so the caller must drop its cache.
    fn steer(&mut self, b: &B, directions: &[Option<Vec<f32>>]) -> Result<()>;
}

/// Loads the executor for the file's architecture. `progress(done, total)` is called per block.
pub fn load<B: Backend + 'static>(
    b: &B,
    file: &Arc<GgufFile>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn Model<B>>> {
    let arch = file.get_str("general.architecture")?;
    Ok(match arch {
        "llama" => Box::new(llama::load(b, file, progress)?),
        "qwen3" | "qwen3moe" => Box::new(qwen3::load(b, file, progress)?),
        other => bail!(
            "unsupported architecture {other:?} (kiln runs: {})",
            SUPPORTED.join(", ")
        ),
    })
}
