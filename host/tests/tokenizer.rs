//! Tokenizer unit tests on small in-memory GGUF vocabularies: SentencePiece merges by score and
//! byte fallback, byte-level BPE merges, special tokens, streaming decode, metadata errors.

use kiln_host::gguf::{GgufFile, GgufWriter, Value};
use kiln_host::tokenizer::{TokenType, Tokenizer};

fn s(x: &str) -> Value {
    Value::String(x.to_string())
}

fn gguf(kvs: Vec<(&str, Value)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.add_metadata(k, v).unwrap();
    }
    GgufFile::from_bytes(w.to_vec(&[]).unwrap()).unwrap()
}

/// A tiny SentencePiece vocabulary: specials, the 256 byte tokens, then scored pieces.
fn spm_vocab() -> GgufFile {
    let mut tokens = vec![s("<unk>"), s("<s>"), s("</s>")];
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    let mut scores = vec![Value::F32(0.0); 3];
    for b in 0..256 {
        tokens.push(s(&format!("<0x{b:02X}>")));
        types.push(Value::I32(6));
        scores.push(Value::F32(0.0));
    }
    // Higher score = joined earlier.
    for (piece, score) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("ll", -3.0),
        ("he", -4.0),
        ("hell", -5.0),
        ("▁hello", -6.0),
        ("▁w", -7.0),
        ("or", -8.0),
        ("▁wor", -9.0),
        ("▁world", -1.5),
        ("ld", -9.5),
        ("▁h", -10.0),
        ("hello", -11.0),
        ("wor", -12.0),
        ("<|user|>", 0.0),
    ] {
        tokens.push(s(piece));
        types.push(Value::I32(if piece == "<|user|>" { 4 } else { 1 }));
        scores.push(Value::F32(score));
    }
    gguf(vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", Value::Array(tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.scores", Value::Array(scores)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
    ])
}

fn pieces(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&i| t.token_str(i).unwrap().to_string())
        .collect()
}

#[test]
fn spm_merges_by_score_and_falls_back_to_bytes() {
    let t = Tokenizer::from_gguf(&spm_vocab()).unwrap();
    assert!(t.add_bos_default(), "llama vocabularies add BOS by default");
    let ids = t.encode("hello world", true).unwrap();
    assert_eq!(pieces(&t, &ids), ["<s>", "▁hello", "▁world"]);
    assert_eq!(t.decode(&ids[1..]), "hello world");
    // 'é' is not in the vocabulary: its two UTF-8 bytes.
    let ids = t.encode("hé", false).unwrap();
    assert_eq!(pieces(&t, &ids), ["▁h", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&ids), "hé");
    assert_eq!(t.token_type(ids[1]), Some(TokenType::Byte));
    // A user-defined token inside text is one token; text right after a special token gets the
    // space prefix again.
    let ids = t.encode("hello<|user|>world", false).unwrap();
    assert_eq!(pieces(&t, &ids), ["▁hello", "<|user|>", "▁world"]);
}

#[test]
fn spm_stream_decoder_joins_byte_tokens() {
    let t = Tokenizer::from_gguf(&spm_vocab()).unwrap();
    let ids = t.encode("h\u{1f980}", false).unwrap();
    assert_eq!(ids.len(), 5, "▁h + 4 byte tokens");
    let mut d = t.stream_decoder();
    let outs: Vec<String> = ids.iter().map(|&i| d.push(i)).collect();
    assert_eq!(outs, ["h", "", "", "", "\u{1f980}"]);
    // A stray continuation byte becomes U+FFFD rather than being held forever.
    let mut d = t.stream_decoder();
    let cont = t.token_id("<0x80>").unwrap();
    assert_eq!(d.push(cont), "\u{fffd}");
    let lead = t.token_id("<0xF0>").unwrap();
    assert_eq!(d.push(lead), "");
    assert_eq!(d.finish(), "\u{fffd}");
}

/// A byte-level BPE vocabulary over "ab" with a couple of merges and a control token.
fn bpe_vocab(pre: Option<&str>) -> GgufFile {
    let toks = ["<|end|>", "a", "b", "Ġ", "ab", "Ġab", "1", "2", "12", "Ċ"];
    let mut kvs = vec![
        ("tokenizer.ggml.model", s("gpt2")),
        (
            "tokenizer.ggml.tokens",
            Value::Array(toks.iter().map(|x| s(x)).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(
                toks.iter()
                    .map(|x| Value::I32(if x.starts_with("<|") { 3 } else { 1 }))
                    .collect(),
            ),
        ),
        (
            "tokenizer.ggml.merges",
            Value::Array(vec![s("a b"), s("Ġ ab"), s("1 2")]),
        ),
        ("tokenizer.ggml.eos_token_id", Value::U32(0)),
    ];
    if let Some(p) = pre {
        kvs.push(("tokenizer.ggml.pre", s(p)));
    }
    gguf(kvs)
}

#[test]
fn bpe_merges_and_pre_tokenizers() {
    let t = Tokenizer::from_gguf(&bpe_vocab(Some("gpt2"))).unwrap();
    let ids = t.encode("ab ab\nab<|end|>12", false).unwrap();
    assert_eq!(pieces(&t, &ids), ["ab", "Ġab", "Ċ", "ab", "<|end|>", "12"]);
    assert_eq!(t.decode(&ids), "ab ab\nab<|end|>12");
    assert_eq!(t.eot_ids(), &[0]);
    assert!(!t.add_bos_default(), "no BOS token");
    // Qwen2 splits every digit; "12" is two pieces that cannot merge.
    let t = Tokenizer::from_gguf(&bpe_vocab(Some("qwen2"))).unwrap();
    assert_eq!(pieces(&t, &t.encode("12", false).unwrap()), ["1", "2"]);
    // No tokenizer.ggml.pre: the "default" rules.
    Tokenizer::from_gguf(&bpe_vocab(None)).unwrap();
}

fn err(g: &GgufFile) -> String {
    format!("{:#}", Tokenizer::from_gguf(g).unwrap_err())
}

#[test]
fn metadata_errors_name_the_key() {
    let e = err(&bpe_vocab(Some("no-such-pre")));
    assert!(
        e.contains("tokenizer.ggml.pre") && e.contains("no-such-pre"),
        "{e}"
    );

    let e = err(&gguf(vec![
        ("tokenizer.ggml.model", s("rwkv")),
        ("tokenizer.ggml.tokens", Value::Array(vec![s("a")])),
    ]));
    assert!(
        e.contains("tokenizer.ggml.model") && e.contains("rwkv"),
        "{e}"
    );

    let e = err(&gguf(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.tokens", Value::Array(vec![s("a")])),
    ]));
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");

    let e = err(&gguf(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.tokens", Value::Array(vec![s("a")])),
        (
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::I32(1), Value::I32(1)]),
        ),
    ]));
    assert!(e.contains("tokenizer.ggml.token_type"), "{e}");

    let e = err(&gguf(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.tokens", Value::Array(vec![s("a")])),
        ("tokenizer.ggml.merges", Value::Array(vec![])),
        ("tokenizer.ggml.eos_token_id", Value::U32(7)),
    ]));
    assert!(e.contains("tokenizer.ggml.eos_token_id"), "{e}");

    let e = err(&gguf(vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", Value::Array(vec![s("a")])),
    ]));
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");

    let e = err(&gguf(vec![("tokenizer.ggml.model", s("gpt2"))]));
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");

    let e = err(&gguf(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.tokens", Value::Array(vec![s("a"), s("b")])),
        ("tokenizer.ggml.merges", Value::Array(vec![s("a c")])),
    ]));
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
}
