use std::path::PathBuf;

use kiln_host::backend::Backend;
use kiln_host::backend::cpu::Cpu;
use kiln_host::engine::{Engine, GenParams};
use kiln_host::gguf::{GgmlType, GgufFile, Value};
use kiln_host::models::Logits;
use kiln_host::sampling::SamplerConfig;
use sha2::{Digest, Sha256};

use super::*;

/// A path in the temp dir, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> Self {
        TempPath(std::env::temp_dir().join(format!("kiln-gen-model-{}-{name}", std::process::id())))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn sha256(path: &Path) -> Vec<u8> {
    Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

/// Loads the file on the CPU backend, checks one forward pass gives finite, non-degenerate
/// logits, and generates a few tokens.
fn run_on_cpu(path: &Path, n_vocab: usize) {
    let mut e = Engine::load(Cpu::new(), path, Some(64)).unwrap();
    let prompt = e
        .tokenizer
        .encode("Hello, world! The quick brown fox", false)
        .unwrap();
    assert!(prompt.len() > 3, "{prompt:?}");

    let mut cache = e.backend.kv_cache(&e.model.config().kv_spec(64)).unwrap();
    let logits = e
        .model
        .forward(&e.backend, &mut cache, &prompt, 0, Logits::Last)
        .unwrap();
    let logits = e.backend.read(&logits).unwrap();
    assert_eq!(logits.len(), n_vocab);
    assert!(logits.iter().all(|x| x.is_finite()), "non-finite logits");
    let mean = logits.iter().sum::<f32>() / n_vocab as f32;
    let std = (logits.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n_vocab as f32).sqrt();
    assert!(std > 0.01 && std < 20.0, "logit std {std}");

    let params = GenParams {
        max_tokens: 4,
        sampler: SamplerConfig::greedy(),
        stop: vec![],
        ignore_eos: true,
    };
    let g = e.generate(&prompt, &params, &mut |_| Ok(())).unwrap();
    assert_eq!(g.tokens.len(), 4);
    assert!(g.tokens.iter().all(|&t| (t as usize) < n_vocab));
}

/// Mean and root mean square of tensor `name`'s dequantized weights.
fn weight_stats(f: &GgufFile, name: &str) -> (f32, f32) {
    let t = f.tensor(name).unwrap();
    let mut w = vec![0f32; t.n_elements() as usize];
    kiln_host::quant::dequantize_row(t.ggml_type, f.tensor_data(t), &mut w).unwrap();
    let mean = w.iter().sum::<f32>() / w.len() as f32;
    let rms = (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt();
    (mean, rms)
}

#[test]
fn tiny_qwen3_has_the_declared_shapes_and_runs() {
    let tok = Qwen3Tokenizer::load().unwrap();
    let p = presets::find("tiny-qwen3").unwrap();
    let path = TempPath::new("tiny-qwen3.gguf");
    let size = generate(p, Quant::Q4_0, 7, &path.0, &tok, false).unwrap();
    assert_eq!(size, file_size(p, Quant::Q4_0, &tok).unwrap());

    let f = GgufFile::open(&path.0).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "qwen3");
    assert_eq!(f.get_u32("general.file_type").unwrap(), 2);
    for (key, want) in [
        ("qwen3.block_count", 2),
        ("qwen3.embedding_length", 256),
        ("qwen3.feed_forward_length", 512),
        ("qwen3.attention.head_count", 4),
        ("qwen3.attention.head_count_kv", 2),
        ("qwen3.attention.key_length", 64),
        ("qwen3.attention.value_length", 64),
        ("qwen3.context_length", 4096),
    ] {
        assert_eq!(f.get_u32(key).unwrap(), want, "{key}");
    }
    assert_eq!(f.get_f32("qwen3.rope.freq_base").unwrap(), 1e6);
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "qwen2");
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, p.n_vocab);
    assert_eq!(
        tokens[f.get_u32("tokenizer.ggml.eos_token_id").unwrap() as usize],
        "<|im_end|>"
    );
    assert!(f.get("tokenizer.chat_template").is_some());

    let specs = p.tensors(GgmlType::Q4_0);
    assert_eq!(f.tensors().len(), specs.len());
    for s in &specs {
        let t = f.tensor(&s.name).unwrap();
        assert_eq!((&t.dims, t.ggml_type), (&s.dims, s.ty), "{}", s.name);
    }
    assert!(
        f.tensor("output.weight").is_err(),
        "tiny-qwen3 ties its embeddings"
    );
    assert_eq!(f.tensor("blk.1.attn_q_norm.weight").unwrap().dims, vec![64]);
    assert_eq!(
        f.tensor("token_embd.weight").unwrap().dims,
        vec![256, p.n_vocab]
    );

    // Weights have the intended magnitude; norms are about 1.
    let (mean, std) = weight_stats(&f, "blk.0.attn_q.weight");
    assert!(
        mean.abs() < 1e-3 && (0.018..0.022).contains(&std),
        "mean {mean} std {std}"
    );
    let n = f.tensor("blk.0.attn_norm.weight").unwrap();
    let norm: Vec<f32> = f
        .tensor_data(n)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert!(norm.iter().all(|x| (0.89..1.11).contains(x)));
    drop(f);

    run_on_cpu(&path.0, p.n_vocab as usize);
}

#[test]
fn tiny_llama_q8_0_runs() {
    let tok = Qwen3Tokenizer::load().unwrap();
    let p = presets::find("tiny-llama").unwrap();
    let path = TempPath::new("tiny-llama.gguf");
    generate(p, Quant::Q8_0, 1, &path.0, &tok, false).unwrap();
    let f = GgufFile::open(&path.0).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.vocab_size").unwrap(), 128_256);
    assert_eq!(f.tensor("output.weight").unwrap().ggml_type, GgmlType::Q8_0);
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens[128_009], "<|eot_id|>");
    assert_eq!(tokens[128_255], "<|reserved_special_token_250|>");
    assert_eq!(
        f.get("tokenizer.ggml.bos_token_id"),
        Some(&Value::U32(128_000))
    );
    drop(f);
    run_on_cpu(&path.0, 128_256);
}

/// The MoE layout: 3-D expert tensors, an F32 router, the qwen3moe keys.
#[test]
fn tiny_qwen3moe_has_expert_tensors() {
    let tok = Qwen3Tokenizer::load().unwrap();
    let p = presets::find("tiny-qwen3moe").unwrap();
    let path = TempPath::new("tiny-qwen3moe.gguf");
    generate(p, Quant::Q4_0, 5, &path.0, &tok, false).unwrap();
    let f = GgufFile::open(&path.0).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "qwen3moe");
    assert_eq!(f.get_u32("qwen3moe.expert_count").unwrap(), 8);
    assert_eq!(f.get_u32("qwen3moe.expert_used_count").unwrap(), 2);
    assert_eq!(
        f.get_u32("qwen3moe.expert_feed_forward_length").unwrap(),
        128
    );
    let t = |n: &str| f.tensor(n).unwrap();
    assert_eq!(t("blk.1.ffn_gate_inp.weight").dims, vec![256, 8]);
    assert_eq!(t("blk.1.ffn_gate_inp.weight").ggml_type, GgmlType::F32);
    assert_eq!(t("blk.1.ffn_gate_exps.weight").dims, vec![256, 128, 8]);
    assert_eq!(t("blk.1.ffn_up_exps.weight").dims, vec![256, 128, 8]);
    assert_eq!(t("blk.1.ffn_down_exps.weight").dims, vec![128, 256, 8]);
    assert!(f.tensor("blk.0.ffn_gate.weight").is_err());
}

#[test]
fn same_seed_gives_the_same_bytes() {
    let tok = Qwen3Tokenizer::load().unwrap();
    let p = presets::find("tiny-qwen3").unwrap();
    let (a, b, c) = (
        TempPath::new("seed-a.gguf"),
        TempPath::new("seed-b.gguf"),
        TempPath::new("seed-c.gguf"),
    );
    generate(p, Quant::Q4_0, 3, &a.0, &tok, false).unwrap();
    generate(p, Quant::Q4_0, 3, &b.0, &tok, false).unwrap();
    generate(p, Quant::Q4_0, 4, &c.0, &tok, false).unwrap();
    assert_eq!(sha256(&a.0), sha256(&b.0));
    assert_ne!(sha256(&a.0), sha256(&c.0));
}

/// The bytes do not depend on how many threads fill a segment.
#[test]
fn segments_do_not_depend_on_thread_count() {
    let t = &presets::find("tiny-qwen3").unwrap().tensors(GgmlType::Q4_0)[0];
    let chunk = CHUNK_BLOCKS * 18;
    let len = 5 * chunk + 18 * 7;
    let fill = |first, threads, buf: &mut Vec<u8>| {
        fill_segment(t, 9, 0, first, buf, len, chunk, threads);
        buf.clone()
    };
    let one = fill(3, 1, &mut Vec::new());
    // A recycled, larger buffer gives the same bytes.
    assert_eq!(one, fill(3, 4, &mut vec![7u8; len + 100]));
    assert_ne!(one, fill(4, 4, &mut Vec::new()));
}

#[test]
fn zero_nibbles_become_eight() {
    assert_eq!(no_zero_nibbles(0), 0x8888_8888_8888_8888);
    assert_eq!(
        no_zero_nibbles(0xF0F0_0000_1234_5678),
        0xF8F8_8888_1234_5678
    );
    assert_eq!(no_zero_nibbles(u64::MAX), u64::MAX);
}

/// Q4_K_M: llama.cpp's mixture of Q4_K and Q6_K tensors, with weights of the intended magnitude,
/// and the model runs on the CPU backend.
#[test]
fn tiny_llama_q4_k_m_mixes_k_quants_and_runs() {
    let tok = Qwen3Tokenizer::load().unwrap();
    let p = presets::find("tiny-llama").unwrap();
    let path = TempPath::new("tiny-llama-q4km.gguf");
    generate(p, Quant::Q4KM, 2, &path.0, &tok, false).unwrap();
    let f = GgufFile::open(&path.0).unwrap();
    assert_eq!(f.get_u32("general.file_type").unwrap(), 15);
    let ty = |n: &str| f.tensor(n).unwrap().ggml_type;
    assert_eq!(ty("output.weight"), GgmlType::Q6_K);
    assert_eq!(ty("token_embd.weight"), GgmlType::Q4_K);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q4_K);
    assert_eq!(ty("blk.0.ffn_gate.weight"), GgmlType::Q4_K);
    // use_more_bits over 2 layers: the last seventh-eighth onwards (layer 1), not layer 0.
    for (l, want) in [(0, GgmlType::Q4_K), (1, GgmlType::Q6_K)] {
        for t in ["attn_v", "ffn_down"] {
            assert_eq!(ty(&format!("blk.{l}.{t}.weight")), want, "layer {l} {t}");
        }
    }
    for name in ["blk.0.attn_q.weight", "blk.1.attn_v.weight"] {
        let (mean, std) = weight_stats(&f, name);
        assert!(
            mean.abs() < 1e-3 && (0.016..0.024).contains(&std),
            "{name}: mean {mean} std {std}"
        );
    }
    drop(f);
    run_on_cpu(&path.0, 128_256);
}

/// Q5_K_M: Q5_K where Q4_K_M has Q4_K, weights of the intended magnitude, runs on the CPU.
#[test]
fn tiny_qwen3_q5_k_m_runs() {
    let tok = Qwen3Tokenizer::load().unwrap();
    let p = presets::find("tiny-qwen3").unwrap();
    let path = TempPath::new("tiny-qwen3-q5km.gguf");
    generate(p, Quant::Q5KM, 3, &path.0, &tok, false).unwrap();
    let f = GgufFile::open(&path.0).unwrap();
    assert_eq!(f.get_u32("general.file_type").unwrap(), 17);
    let ty = |n: &str| f.tensor(n).unwrap().ggml_type;
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q5_K);
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q6_K);
    assert_sigma_and_run(f, &path.0, p.n_vocab as usize);
}

/// `blk.0.attn_q.weight` of `f` (the file at `path`) is zero-mean with the presets' standard
/// deviation 0.02, and the model runs on the CPU.
fn assert_sigma_and_run(f: GgufFile, path: &Path, n_vocab: usize) {
    let (mean, std) = weight_stats(&f, "blk.0.attn_q.weight");
    assert!(
        mean.abs() < 1e-3 && (0.016..0.024).contains(&std),
        "mean {mean} std {std}"
    );
    drop(f);
    run_on_cpu(path, n_vocab);
}

/// Q5_0 / Q5_1: every matrix in the format, llama.cpp's file type, weights of the intended
/// magnitude, runs on the CPU.
#[test]
fn tiny_qwen3_q5_0_and_q5_1_run() {
    let tok = Qwen3Tokenizer::load().unwrap();
    let p = presets::find("tiny-qwen3").unwrap();
    for (q, ty, file_type) in [
        (Quant::Q5_0, GgmlType::Q5_0, 8),
        (Quant::Q5_1, GgmlType::Q5_1, 9),
    ] {
        let path = TempPath::new(&format!("tiny-qwen3-{file_type}.gguf"));
        generate(p, q, 3, &path.0, &tok, false).unwrap();
        let f = GgufFile::open(&path.0).unwrap();
        assert_eq!(f.get_u32("general.file_type").unwrap(), file_type);
        assert_eq!(f.tensor("blk.0.attn_q.weight").unwrap().ggml_type, ty);
        assert_sigma_and_run(f, &path.0, p.n_vocab as usize);
    }
}

#[test]
fn k4_scale_packing_inverts_get_scale_min_k4() {
    let sc = [0, 63, 17, 32, 48, 1, 62, 15];
    let m = [63, 0, 5, 60, 33, 31, 2, 47];
    let packed = pack_k4_scales(&sc, &m);
    for j in 0..8 {
        assert_eq!(
            kernels_gpu::quant::get_scale_min_k4(j, &packed),
            (sc[j], m[j]),
            "sub-block {j}"
        );
    }
}
