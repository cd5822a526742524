//! Architecture presets for `gen-model`: the shapes of real models (values from their published
//! configs) and the tensor list each one has under llama.cpp's GGUF names.
//!
//! Tensor dims are in ggml order: `dims[0]` is the row length (the input width of a mat-mul).

use kiln_host::gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen3,
    Qwen3Moe,
}

impl Arch {
    /// `general.architecture`, and the prefix of the hyper-parameter keys.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }
}

/// Which vocabulary the file embeds (see `vocab.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// The Qwen3 byte-level BPE, padded with `[PAD{i}]` tokens to `n_vocab`.
    Qwen3,
    /// The first 128000 Qwen3 BPE tokens plus Llama 3's 256 special tokens (128256 in all).
    Llama3,
}

#[derive(Clone, Copy, Debug)]
pub struct Moe {
    pub n_expert: u64,
    pub n_expert_used: u64,
    pub n_ff_exp: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub about: &'static str,
    pub arch: Arch,
    pub vocab: VocabKind,
    /// Rows of `token_embd.weight` (real models pad the tokenizer's vocabulary up to this).
    pub n_vocab: u64,
    pub n_layer: u64,
    pub n_embd: u64,
    /// Dense feed-forward width (for MoE models the `feed_forward_length` key only).
    pub n_ff: u64,
    pub n_head: u64,
    pub n_kv_head: u64,
    pub head_dim: u64,
    pub n_ctx: u32,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// No `output.weight`: the output head reuses `token_embd.weight`.
    pub tied: bool,
    pub moe: Option<Moe>,
}

/// Qwen3's tokenizer has 151643 BPE tokens plus 26 added ones.
pub const QWEN3_TOKENIZER_VOCAB: u64 = 151_669;
/// Llama 3's vocabulary size (128000 BPE tokens + 256 special tokens).
pub const LLAMA3_VOCAB: u64 = 128_256;

const QWEN3: Preset = Preset {
    name: "",
    about: "",
    arch: Arch::Qwen3,
    vocab: VocabKind::Qwen3,
    n_vocab: 151_936,
    n_layer: 0,
    n_embd: 0,
    n_ff: 0,
    n_head: 0,
    n_kv_head: 8,
    head_dim: 128,
    n_ctx: 40_960,
    rope_base: 1_000_000.0,
    rms_eps: 1e-6,
    tied: false,
    moe: None,
};

const LLAMA3: Preset = Preset {
    name: "",
    about: "",
    arch: Arch::Llama,
    vocab: VocabKind::Llama3,
    n_vocab: LLAMA3_VOCAB,
    n_layer: 0,
    n_embd: 0,
    n_ff: 0,
    n_head: 0,
    n_kv_head: 8,
    head_dim: 128,
    n_ctx: 8192,
    rope_base: 500_000.0,
    rms_eps: 1e-5,
    tied: false,
    moe: None,
};

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "tiny-qwen3",
        about: "2-layer qwen3 for tests (Qwen3 vocabulary, tied embeddings)",
        n_vocab: QWEN3_TOKENIZER_VOCAB,
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        n_ctx: 4096,
        tied: true,
        ..QWEN3
    },
    Preset {
        name: "tiny-llama",
        about: "2-layer llama for tests (Llama-3-sized vocabulary)",
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        n_ctx: 4096,
        ..LLAMA3
    },
    Preset {
        name: "tiny-qwen3moe",
        about: "2-layer qwen3moe for tests (8 experts, 2 used)",
        arch: Arch::Qwen3Moe,
        n_vocab: QWEN3_TOKENIZER_VOCAB,
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        n_ctx: 4096,
        moe: Some(Moe {
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 128,
        }),
        ..QWEN3
    },
    Preset {
        name: "qwen3-0.6b",
        about: "Qwen3-0.6B shapes (tied embeddings)",
        n_layer: 28,
        n_embd: 1024,
        n_ff: 3072,
        n_head: 16,
        tied: true,
        ..QWEN3
    },
    Preset {
        name: "qwen3-1.7b",
        about: "Qwen3-1.7B shapes (tied embeddings)",
        n_layer: 28,
        n_embd: 2048,
        n_ff: 6144,
        n_head: 16,
        tied: true,
        ..QWEN3
    },
    Preset {
        name: "qwen3-4b",
        about: "Qwen3-4B shapes (tied embeddings)",
        n_layer: 36,
        n_embd: 2560,
        n_ff: 9728,
        n_head: 32,
        tied: true,
        ..QWEN3
    },
    Preset {
        name: "qwen3-8b",
        about: "Qwen3-8B shapes",
        n_layer: 36,
        n_embd: 4096,
        n_ff: 12288,
        n_head: 32,
        ..QWEN3
    },
    Preset {
        name: "qwen3-14b",
        about: "Qwen3-14B shapes",
        n_layer: 40,
        n_embd: 5120,
        n_ff: 17408,
        n_head: 40,
        ..QWEN3
    },
    Preset {
        name: "qwen3-30b-a3b",
        about: "Qwen3-30B-A3B shapes (128 experts, 8 used)",
        arch: Arch::Qwen3Moe,
        n_layer: 48,
        n_embd: 2048,
        n_ff: 6144,
        n_head: 32,
        n_kv_head: 4,
        moe: Some(Moe {
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 768,
        }),
        ..QWEN3
    },
    Preset {
        name: "llama-3-8b",
        about: "Llama-3-8B shapes (vocabulary: truncated Qwen3 BPE + Llama 3 special tokens)",
        n_layer: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        ..LLAMA3
    },
];

pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

pub fn names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// A weight matrix in the file's quantized type: zero-mean, standard deviation `sigma`.
    Weight { sigma: f32 },
    /// An F32 matrix (the MoE router): uniform, zero-mean, standard deviation `sigma`.
    DenseF32 { sigma: f32 },
    /// An F32 RMSNorm weight: 1.0 with a little noise.
    Norm,
}

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub init: Init,
}

impl TensorSpec {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    pub fn n_bytes(&self) -> u64 {
        let (qk, bytes) = self.ty.block();
        self.n_elements() / qk as u64 * bytes as u64
    }
}

/// Standard deviation of every weight matrix (GPT-2-style initialisation): keeps activations
/// and logits at ordinary magnitudes through the network.
const SIGMA: f32 = 0.02;

impl Preset {
    /// Every tensor of the model, in file order, with the quantized type `q` for the matrices.
    pub fn tensors(&self, q: GgmlType) -> Vec<TensorSpec> {
        let mut out = Vec::new();
        let mut push = |name: String, dims: &[u64], init: Init| {
            let ty = if matches!(init, Init::Weight { .. }) {
                q
            } else {
                GgmlType::F32
            };
            out.push(TensorSpec {
                name,
                dims: dims.to_vec(),
                ty,
                init,
            });
        };
        let w = Init::Weight { sigma: SIGMA };
        let (e, v) = (self.n_embd, self.n_vocab);
        let (q_dim, kv_dim) = (self.n_head * self.head_dim, self.n_kv_head * self.head_dim);
        push("token_embd.weight".into(), &[e, v], w);
        push("output_norm.weight".into(), &[e], Init::Norm);
        if !self.tied {
            push("output.weight".into(), &[e, v], w);
        }
        for i in 0..self.n_layer {
            let b = |t: &str| format!("blk.{i}.{t}.weight");
            push(b("attn_norm"), &[e], Init::Norm);
            push(b("attn_q"), &[e, q_dim], w);
            push(b("attn_k"), &[e, kv_dim], w);
            push(b("attn_v"), &[e, kv_dim], w);
            push(b("attn_output"), &[q_dim, e], w);
            if self.arch != Arch::Llama {
                push(b("attn_q_norm"), &[self.head_dim], Init::Norm);
                push(b("attn_k_norm"), &[self.head_dim], Init::Norm);
            }
            push(b("ffn_norm"), &[e], Init::Norm);
            match self.moe {
                None => {
                    push(b("ffn_gate"), &[e, self.n_ff], w);
                    push(b("ffn_up"), &[e, self.n_ff], w);
                    push(b("ffn_down"), &[self.n_ff, e], w);
                }
                Some(m) => {
                    // The router stays F32, as llama.cpp's quantizer leaves it.
                    push(
                        b("ffn_gate_inp"),
                        &[e, m.n_expert],
                        Init::DenseF32 { sigma: SIGMA },
                    );
                    push(b("ffn_gate_exps"), &[e, m.n_ff_exp, m.n_expert], w);
                    push(b("ffn_up_exps"), &[e, m.n_ff_exp, m.n_expert], w);
                    push(b("ffn_down_exps"), &[m.n_ff_exp, e, m.n_expert], w);
                }
            }
        }
        out
    }

    /// Total parameters, and those active per token (differs for MoE).
    pub fn param_counts(&self) -> (u64, u64) {
        let total: u64 = self
            .tensors(GgmlType::F32)
            .iter()
            .map(TensorSpec::n_elements)
            .sum();
        let active = match self.moe {
            None => total,
            Some(m) => {
                total - self.n_layer * 3 * self.n_embd * m.n_ff_exp * (m.n_expert - m.n_expert_used)
            }
        };
        (total, active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parameter counts match the published sizes (within rounding of the marketing names).
    #[test]
    fn param_counts_match_published_sizes() {
        let p = |n: &str| find(n).unwrap().param_counts();
        assert_eq!(p("qwen3-0.6b").0 / 1_000_000, 596); // 0.6B (tied)
        assert_eq!(p("qwen3-8b").0 / 100_000_000, 81); // 8.2B
        assert_eq!(p("llama-3-8b").0 / 100_000_000, 80); // 8.03B
        let (total, active) = p("qwen3-30b-a3b");
        assert_eq!((total / 100_000_000, active / 100_000_000), (305, 33)); // 30.5B / 3.3B
    }

    #[test]
    fn tensor_rows_are_whole_blocks() {
        for p in PRESETS {
            for t in p.tensors(GgmlType::Q4_0) {
                let (qk, _) = t.ty.block();
                assert_eq!(t.dims[0] % qk as u64, 0, "{} {}", p.name, t.name);
            }
        }
    }
}
