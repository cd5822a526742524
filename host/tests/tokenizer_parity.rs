//! Tokenizer parity with llama.cpp: the fixtures under `fixtures/tokenizer/` hold the ids
//! `llama-tokenize` produced for a varied corpus (see `gen_fixture.py` there).
//!
//! `*_random.json` hold 300 seeded random mixtures of words, digits, whitespace runs, scripts,
//! emoji and special tokens (`gen_fixture.py --random 300`).
//!
//! - `smollm2.json`: SmolLM2-135M-Instruct (needs `models/SmolLM2-135M-Instruct.Q4_1.gguf`,
//!   skipped visibly when absent).
//! - `qwen3.json`: the real Qwen3 tokenizer (`qwen3/tokenizer.json`), turned into a vocab-only
//!   GGUF in memory the way llama.cpp's converter does (gpt2 model, pre "qwen2", vocab padded to
//!   151936 with `[PADn]` unused tokens, added tokens as control/user-defined).
//!
//! To regenerate the Qwen3 GGUF for llama-tokenize:
//! `KILN_QWEN3_GGUF_OUT=/tmp/qwen3-vocab.gguf cargo test -p kiln-host --test tokenizer_parity
//!  write_qwen3_gguf -- --ignored`

use std::path::{Path, PathBuf};

use kiln_host::gguf::{GgufFile, GgufWriter, Value};
use kiln_host::tokenizer::Tokenizer;
use serde_json::Value as Json;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
}

/// (text, ids) pairs of a fixture (a name under fixtures/tokenizer, or an absolute path).
fn load_fixture(name: &str) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(fixture_dir().join(name)).expect("fixture");
    let rows: Vec<Json> = serde_json::from_str(&raw).expect("fixture json");
    rows.iter()
        .map(|r| {
            let text = r["text"].as_str().unwrap().to_string();
            let ids = r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            (text, ids)
        })
        .collect()
}

/// Checks every fixture case; reports all mismatches at once.
fn check_parity(tok: &Tokenizer, fixture: &str) {
    let cases = load_fixture(fixture);
    assert!(cases.len() > 30, "fixture {fixture} too small");
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false).expect("encode");
        if &got != want {
            failures.push(format!(
                "{text:?}\n   llama.cpp: {want:?}\n   kiln:      {got:?}"
            ));
        }
        // Decoding gives the text back (these vocabularies are lossless on valid UTF-8).
        assert_eq!(
            &tok.decode(&got),
            text,
            "decode(encode(x)) != x in {fixture}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn smollm2() -> Option<GgufFile> {
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("SKIP: {} not present", path.display());
        return None;
    }
    Some(GgufFile::open(&path).expect("open model"))
}

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(g) = smollm2() else { return };
    let tok = Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(!tok.add_bos_default());
    assert_eq!(tok.eot_ids()[0], 2);
    assert!(
        tok.eot_ids().contains(&0),
        "<|endoftext|> ends generation too"
    );
    assert_eq!(tok.encode("<|im_start|>", false).unwrap(), vec![1]);
    assert_eq!(tok.encode("hi", true).unwrap()[0], 1);
    check_parity(&tok, "smollm2.json");
    check_parity(&tok, "smollm2_random.json");
}

// ---------------------------------------------------------------------------------------------
// Qwen3: build a vocab-only GGUF from tokenizer.json

const QWEN3_VOCAB: usize = 151936;

fn strings(v: Vec<String>) -> Value {
    Value::Array(v.into_iter().map(Value::String).collect())
}

/// GGUF bytes holding the Qwen3 tokenizer (plus the few hyperparameters llama.cpp's loader
/// insists on even for vocab-only loads).
fn qwen3_gguf_bytes() -> Vec<u8> {
    let dir = fixture_dir().join("qwen3");
    let tj: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let cfg: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let mut tokens: Vec<Option<String>> = vec![None; QWEN3_VOCAB];
    let mut types = vec![1i32; QWEN3_VOCAB];
    for (text, id) in tj["model"]["vocab"].as_object().unwrap() {
        tokens[id.as_u64().unwrap() as usize] = Some(text.clone());
    }
    for at in tj["added_tokens"].as_array().unwrap() {
        let id = at["id"].as_u64().unwrap() as usize;
        let text = at["content"].as_str().unwrap();
        tokens[id] = Some(text.to_string());
        let looks_special = text.starts_with("<|") && text.ends_with("|>");
        types[id] = if at["special"].as_bool().unwrap() || looks_special {
            3
        } else {
            4
        };
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.unwrap_or_else(|| {
                types[i] = 5;
                format!("[PAD{i}]")
            })
        })
        .collect();
    let merges: Vec<String> = tj["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => s.clone(),
            Json::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            other => panic!("merge {other:?}"),
        })
        .collect();
    let id_of = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    let (eos, pad) = (id_of("<|im_end|>"), id_of("<|endoftext|>"));

    let mut w = GgufWriter::new();
    let mut kv = |k: &str, v: Value| w.add_metadata(k, v).unwrap();
    kv("general.architecture", Value::String("qwen3".into()));
    kv(
        "general.name",
        Value::String("Qwen3 tokenizer (vocab only)".into()),
    );
    kv("qwen3.block_count", Value::U32(28));
    kv("qwen3.context_length", Value::U32(40960));
    kv("qwen3.embedding_length", Value::U32(1024));
    kv("qwen3.feed_forward_length", Value::U32(3072));
    kv("qwen3.attention.head_count", Value::U32(16));
    kv("qwen3.attention.head_count_kv", Value::U32(8));
    kv("qwen3.attention.key_length", Value::U32(128));
    kv("qwen3.attention.value_length", Value::U32(128));
    kv("qwen3.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    kv("qwen3.rope.freq_base", Value::F32(1e6));
    kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    kv("tokenizer.ggml.pre", Value::String("qwen2".into()));
    kv("tokenizer.ggml.tokens", strings(tokens.clone()));
    kv(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    kv("tokenizer.ggml.merges", strings(merges));
    kv("tokenizer.ggml.eos_token_id", Value::U32(eos));
    kv("tokenizer.ggml.padding_token_id", Value::U32(pad));
    kv("tokenizer.ggml.bos_token_id", Value::U32(pad));
    kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    kv(
        "tokenizer.chat_template",
        Value::String(cfg["chat_template"].as_str().unwrap().into()),
    );
    w.to_vec(&[]).unwrap()
}

fn qwen3() -> Tokenizer {
    let g = GgufFile::from_bytes(qwen3_gguf_bytes()).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

#[test]
#[ignore = "writes the Qwen3 vocab-only GGUF for llama-tokenize; set KILN_QWEN3_GGUF_OUT"]
fn write_qwen3_gguf() {
    let out = std::env::var("KILN_QWEN3_GGUF_OUT").expect("set KILN_QWEN3_GGUF_OUT");
    std::fs::write(&out, qwen3_gguf_bytes()).unwrap();
    eprintln!("wrote {out}");
}

#[test]
fn qwen3_matches_llama_cpp() {
    let tok = qwen3();
    assert_eq!(tok.vocab_size(), QWEN3_VOCAB);
    assert_eq!(tok.eos(), Some(151645));
    assert!(!tok.add_bos_default());
    assert!(tok.eot_ids().contains(&151643) && tok.eot_ids().contains(&151645));
    assert_eq!(tok.encode("<|im_start|>", false).unwrap(), vec![151644]);
    assert_eq!(tok.encode("<think>", false).unwrap(), vec![151667]);
    check_parity(&tok, "qwen3.json");
    check_parity(&tok, "qwen3_random.json");
}

#[test]
fn qwen3_stream_decoder_holds_partial_characters() {
    let tok = qwen3();
    for text in [
        "\u{1f980} crab",
        "\u{4f60}\u{597d}\u{4e16}\u{754c}",
        "e\u{301}\u{1f468}\u{200d}\u{1f469}",
    ] {
        let ids = tok.encode(text, false).unwrap();
        let mut d = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            let piece = d.push(id);
            assert!(
                !piece.contains('\u{fffd}'),
                "partial character leaked for {text:?}"
            );
            out.push_str(&piece);
        }
        out.push_str(&d.finish());
        assert_eq!(out, text);
    }
}

/// Parity on vocabularies kiln does not ship (licences), built with `hf_to_gguf_vocab.py` and
/// recorded with `gen_fixture.py`: `KILN_EXTRA_PARITY=a.gguf=a.json,b.gguf=b.json`.
#[test]
fn extra_parity_from_env() {
    let Ok(spec) = std::env::var("KILN_EXTRA_PARITY") else {
        eprintln!("SKIP: KILN_EXTRA_PARITY not set (extra vocabularies, see hf_to_gguf_vocab.py)");
        return;
    };
    for pair in spec.split(',').filter(|p| !p.is_empty()) {
        let (model, fixture) = pair
            .split_once('=')
            .expect("KILN_EXTRA_PARITY entries are model=fixture");
        let tok = Tokenizer::from_gguf(&GgufFile::open(model).unwrap()).unwrap();
        check_parity(&tok, fixture);
        eprintln!("parity ok: {model} vs {fixture}");
    }
}
