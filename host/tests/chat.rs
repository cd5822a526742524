//! Chat template rendering: SmolLM2's template from the model file, Qwen3's from the fixture
//! tokenizer_config.json, and template features (raise_exception, pycompat methods).

use std::path::Path;

use kiln_host::chat::{ChatTemplate, Message};
use kiln_host::gguf::{GgufFile, GgufWriter, Value};

fn qwen3_template() -> ChatTemplate {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer/qwen3/tokenizer_config.json");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    ChatTemplate::new(cfg["chat_template"].as_str().unwrap(), "", "<|im_end|>").unwrap()
}

#[test]
fn smollm2_template_from_gguf() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("SKIP: {} not present", path.display());
        return;
    }
    let g = GgufFile::open(&path).unwrap();
    let t = ChatTemplate::from_gguf(&g)
        .unwrap()
        .expect("SmolLM2 has a chat template");
    let out = t
        .render(
            &[Message::system("You are terse."), Message::user("Hi")],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without a system message the template inserts its default one.
    let out = t.render(&[Message::user("Hi")], false).unwrap();
    assert!(
        out.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{out}"
    );
    assert!(out.ends_with("<|im_start|>user\nHi<|im_end|>\n"), "{out:?}");
}

#[test]
fn no_template_is_none() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()))
        .unwrap();
    let g = GgufFile::from_bytes(w.to_vec(&[]).unwrap()).unwrap();
    assert!(ChatTemplate::from_gguf(&g).unwrap().is_none());
}

#[test]
fn bos_eos_come_from_the_vocabulary() {
    let mut w = GgufWriter::new();
    let toks = ["<unk>", "<s>", "</s>"]
        .iter()
        .map(|s| Value::String(s.to_string()))
        .collect();
    w.add_metadata("tokenizer.ggml.tokens", Value::Array(toks))
        .unwrap();
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(1))
        .unwrap();
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(2))
        .unwrap();
    w.add_metadata(
        "tokenizer.chat_template",
        Value::String("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}{{ eos_token }}{% endfor %}".into()),
    )
    .unwrap();
    let g = GgufFile::from_bytes(w.to_vec(&[]).unwrap()).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap().unwrap();
    assert_eq!(
        t.render(&[Message::user("  x ")], false).unwrap(),
        "<s>[user]x</s>"
    );
}

#[test]
fn qwen3_template_renders() {
    let t = qwen3_template();
    let msgs = [Message::system("Be brief."), Message::user("Hi")];
    assert_eq!(
        t.render(&msgs, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // enable_thinking = false adds an empty think block.
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), false.into());
    assert_eq!(
        t.render_with(&[Message::user("Hi")], true, &extra).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    // An assistant turn after the last user query keeps its reasoning (split/strip/lstrip via
    // pycompat); earlier turns lose it.
    let msgs = [
        Message::user("Q1"),
        Message::assistant("<think>\nold thoughts\n</think>\n\nA1"),
        Message::user("Q2"),
        Message::assistant("<think>\nnew thoughts\n</think>\n\nA2"),
    ];
    assert_eq!(
        t.render(&msgs, false).unwrap(),
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n\
         <|im_start|>user\nQ2<|im_end|>\n\
         <|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\nA2<|im_end|>\n"
    );
}

#[test]
fn raise_exception_is_an_error() {
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[Message::user("x")], false).unwrap(), "ok");
    let err = t.render(&[Message::assistant("x")], false).unwrap_err();
    assert!(
        format!("{err:#}").contains("first message must be from the user"),
        "{err:#}"
    );
}

#[test]
fn python_string_methods_and_whitespace_control() {
    let src = "{% for m in messages %}\n  {% if m.content.startswith('!') %}{{ m.content.lstrip('!').upper() }}{% else %}{{ m.content.strip() }}{% endif %}\n{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(
        t.render(&[Message::user("!hey"), Message::user("  yo  ")], false)
            .unwrap(),
        "HEYyo"
    );
}

#[test]
fn bad_template_is_a_clear_error() {
    let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
    assert!(format!("{err:#}").contains("does not compile"), "{err:#}");
}
