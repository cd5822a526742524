//! Tokenizer built from GGUF metadata (`tokenizer.ggml.*`), matching llama.cpp's tokenization.
//!
//! Two vocabulary kinds are supported:
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE (SmolLM2, Qwen2/3, Llama 3, DeepSeek, GLM).
//!   Text is split by the regexes that `tokenizer.ggml.pre` names (see [`pretok`]), each piece is
//!   mapped byte-wise to the GPT-2 byte alphabet and merged by `tokenizer.ggml.merges` rank. The
//!   split and merge run on the `tokenizers` crate.
//! - `tokenizer.ggml.model = "llama"`: SentencePiece-style, driven by `tokenizer.ggml.scores`,
//!   spaces written as `▁`, unknown characters falling back to `<0xXX>` byte tokens (see [`spm`]).
//!
//! Control (token type 3), user-defined (4) and unknown (2) tokens are recognised in the input
//! text before anything else, longest token first, so `<|im_start|>` in a prompt is one token
//! (what llama.cpp does with `parse_special`, the default of `llama-tokenize` and of chat).

mod pretok;
mod spm;
mod stream;

use std::collections::HashMap;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer as HfTokenizer};

use crate::gguf::GgufFile;

pub use pretok::KNOWN as KNOWN_PRE_TOKENIZERS;
pub use stream::StreamDecoder;

/// GGUF token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_id(id: i32) -> Option<Self> {
        Some(match id {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }
}

/// Token texts that end a turn, besides `tokenizer.ggml.eos_token_id` and the explicit
/// `eot`/`eom` ids.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
];

enum Kind {
    /// Byte-level BPE; `hf` holds the pre-tokenizer + BPE model.
    Bpe { hf: Box<HfTokenizer> },
    /// SentencePiece-style.
    Spm {
        scores: Vec<f32>,
        byte_ids: Box<[Option<u32>; 256]>,
        add_space_prefix: bool,
    },
}

/// A GGUF model's tokenizer. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Tokenizer {
    kind: Kind,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Text → id, the last id winning for duplicated texts.
    lookup: HashMap<String, u32>,
    /// Control/user-defined/unknown tokens matched in raw text, longest text first.
    specials: Vec<(String, u32)>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    eot: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field(
                "model",
                &match self.kind {
                    Kind::Bpe { .. } => "gpt2",
                    Kind::Spm { .. } => "llama",
                },
            )
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

/// Optional token id under `key`; an id outside the vocabulary is an error.
fn opt_id(g: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    let id = g.get_u32(key).with_context(|| format!("reading {key}"))?;
    ensure!(
        (id as usize) < n_vocab,
        "{key} = {id} is outside the vocabulary of {n_vocab} tokens (tokenizer.ggml.tokens)"
    );
    Ok(Some(id))
}

fn opt_bool(g: &GgufFile, key: &str) -> Result<Option<bool>> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(
        g.get_bool(key).with_context(|| format!("reading {key}"))?,
    ))
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = g
            .get_str("tokenizer.ggml.model")
            .context("reading tokenizer.ggml.model")?;
        let tokens: Vec<String> = g
            .get_str_array("tokenizer.ggml.tokens")
            .context("reading tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let n = tokens.len();
        ensure!(n > 0, "tokenizer.ggml.tokens is empty");
        ensure!(
            n <= u32::MAX as usize,
            "tokenizer.ggml.tokens has {n} entries, too many"
        );
        let types: Vec<TokenType> = if g.get("tokenizer.ggml.token_type").is_some() {
            let raw = g
                .get_i32_array("tokenizer.ggml.token_type")
                .context("reading tokenizer.ggml.token_type")?;
            ensure!(
                raw.len() == n,
                "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {n}",
                raw.len()
            );
            raw.iter()
                .enumerate()
                .map(|(i, &t)| {
                    TokenType::from_id(t).ok_or_else(|| {
                        anyhow!(
                            "tokenizer.ggml.token_type[{i}] = {t} is not a known token type (1..=6)"
                        )
                    })
                })
                .collect::<Result<_>>()?
        } else {
            vec![TokenType::Normal; n]
        };
        let mut lookup = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            lookup.insert(t.clone(), i as u32);
        }

        let bos = opt_id(g, "tokenizer.ggml.bos_token_id", n)?;
        let eos = opt_id(g, "tokenizer.ggml.eos_token_id", n)?;
        let unk = opt_id(g, "tokenizer.ggml.unknown_token_id", n)?;

        let (kind, default_add_bos) = match model {
            "gpt2" => {
                let pre_name = match g.get("tokenizer.ggml.pre") {
                    None => "default",
                    Some(_) => g
                        .get_str("tokenizer.ggml.pre")
                        .context("reading tokenizer.ggml.pre")?,
                };
                let pre = pretok::lookup(pre_name).ok_or_else(|| {
                    anyhow!(
                        "tokenizer.ggml.pre = {pre_name:?} is not a pre-tokenizer kiln knows; known: {}",
                        pretok::KNOWN.join(", ")
                    )
                })?;
                let hf = build_bpe(g, &tokens, pre).with_context(|| {
                    format!(
                        "building the byte-level BPE tokenizer (tokenizer.ggml.pre = {pre_name:?})"
                    )
                })?;
                (Kind::Bpe { hf: Box::new(hf) }, pre.add_bos)
            }
            "llama" => {
                let scores = g.get_f32_array("tokenizer.ggml.scores").context(
                    "reading tokenizer.ggml.scores (required for tokenizer.ggml.model = \"llama\")",
                )?;
                ensure!(
                    scores.len() == n,
                    "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {n}",
                    scores.len()
                );
                let mut byte_ids = Box::new([None; 256]);
                for b in 0..256usize {
                    byte_ids[b] = lookup.get(&format!("<0x{b:02X}>")).copied();
                }
                let add_space_prefix =
                    opt_bool(g, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                (
                    Kind::Spm {
                        scores,
                        byte_ids,
                        add_space_prefix,
                    },
                    true,
                )
            }
            other => bail!(
                "tokenizer.ggml.model = {other:?} is not supported (kiln supports \"gpt2\" and \"llama\")"
            ),
        };

        let add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos);
        let add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

        let mut specials: Vec<(String, u32)> = types
            .iter()
            .enumerate()
            .filter(|(i, t)| {
                matches!(
                    t,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                ) && !tokens[*i].is_empty()
            })
            .map(|(i, _)| (tokens[i].clone(), i as u32))
            .collect();
        // Longest first; equal lengths by id so the order is deterministic.
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        let mut eot = Vec::new();
        let mut push = |id: u32| {
            if !eot.contains(&id) {
                eot.push(id);
            }
        };
        if let Some(e) = eos {
            push(e);
        }
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = opt_id(g, key, n)? {
                push(id);
            }
        }
        for text in END_OF_TURN_TEXTS {
            if let Some(&id) = lookup.get(*text) {
                push(id);
            }
        }

        Ok(Self {
            kind,
            tokens,
            types,
            lookup,
            specials,
            bos,
            eos,
            unk,
            eot,
            add_bos,
            add_eos,
        })
    }

    /// Tokenizes `text`, recognising special tokens written in it. With `add_bos`, the BOS token
    /// is prepended (when the model has one). Pass [`Self::add_bos_default`] for the model's own
    /// choice.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_bos, false)
    }

    /// Like [`Self::encode`], also appending EOS when `add_eos` (see [`Self::add_eos_default`]).
    pub fn encode_with(&self, text: &str, add_bos: bool, add_eos: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos && let Some(b) = self.bos {
            out.push(b);
        }
        let mut prev_special = true;
        for frag in self.split_specials(text) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    self.encode_plain(t, prev_special, &mut out)?;
                    prev_special = false;
                }
            }
        }
        if add_eos && let Some(e) = self.eos {
            out.push(e);
        }
        Ok(out)
    }

    /// Tokenizes text that contains no special tokens.
    fn encode_plain(&self, text: &str, after_special: bool, out: &mut Vec<u32>) -> Result<()> {
        match &self.kind {
            Kind::Bpe { hf } => {
                let enc = hf
                    .encode_fast(text, false)
                    .map_err(|e| anyhow!("BPE tokenization failed: {e}"))?;
                out.extend_from_slice(enc.get_ids());
            }
            Kind::Spm {
                scores,
                byte_ids,
                add_space_prefix,
            } => {
                let mut s = String::with_capacity(text.len() + 3);
                if *add_space_prefix && after_special {
                    s.push('▁');
                }
                for ch in text.chars() {
                    s.push(if ch == ' ' { '▁' } else { ch });
                }
                spm::Spm {
                    lookup: &self.lookup,
                    scores,
                    byte_ids,
                    unk: self.unk,
                }
                .encode(&s, out);
            }
        }
        Ok(())
    }

    /// Splits `text` at occurrences of special tokens: each special token, longest first, cuts
    /// every remaining text fragment at its non-overlapping occurrences.
    fn split_specials<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        if text.is_empty() {
            return Vec::new();
        }
        for (tok, id) in &self.specials {
            if !text.contains(tok.as_str()) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(mut t) => {
                        while let Some(pos) = t.find(tok.as_str()) {
                            if pos > 0 {
                                next.push(Fragment::Text(&t[..pos]));
                            }
                            next.push(Fragment::Token(*id));
                            t = &t[pos + tok.len()..];
                        }
                        if !t.is_empty() {
                            next.push(Fragment::Text(t));
                        }
                    }
                    tok_frag => next.push(tok_frag),
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes token `id` stands for in output text: control and other special tokens render
    /// as their text, byte tokens as their byte, normal tokens decoded from the vocabulary's
    /// spelling. Unknown ids give nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(text) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let ty = self.types[id as usize];
        match (&self.kind, ty) {
            (
                _,
                TokenType::Control
                | TokenType::UserDefined
                | TokenType::Unknown
                | TokenType::Unused,
            ) => text.as_bytes().to_vec(),
            (Kind::Bpe { .. }, _) => byte_level_decode(text),
            (Kind::Spm { .. }, TokenType::Byte) => parse_byte_token(text)
                .map(|b| vec![b])
                .unwrap_or_else(|| text.as_bytes().to_vec()),
            (Kind::Spm { .. }, _) => text.replace('▁', " ").into_bytes(),
        }
    }

    /// Decodes ids to text (invalid UTF-8 becomes U+FFFD). Special tokens are rendered as their
    /// text; for SentencePiece vocabularies the space added in front of the text is removed.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut d = self.stream_decoder();
        let mut s = String::new();
        for &id in ids {
            s.push_str(&d.push(id));
        }
        s.push_str(&d.finish());
        s
    }

    /// A streaming decoder over this tokenizer.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// Whether decoding should drop one leading space (SentencePiece's added space prefix).
    pub(crate) fn strips_leading_space(&self) -> bool {
        matches!(
            self.kind,
            Kind::Spm {
                add_space_prefix: true,
                ..
            }
        )
    }

    /// The vocabulary's spelling of token `id` (byte-level or `▁` form), `None` if out of range.
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The GGUF token type of `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id whose vocabulary spelling is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.lookup.get(text).copied()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Ids that end generation: EOS first, then `eot`/`eom` ids and end-of-turn tokens such as
    /// `<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>` present in the vocabulary.
    pub fn eot_ids(&self) -> &[u32] {
        &self.eot
    }

    /// Whether `id` ends generation (see [`Self::eot_ids`]).
    pub fn is_eot(&self, id: u32) -> bool {
        self.eot.contains(&id)
    }

    /// `tokenizer.ggml.add_bos_token`, or the vocabulary kind's default when absent.
    pub fn add_bos_default(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// `tokenizer.ggml.add_eos_token` (false when absent).
    pub fn add_eos_default(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// Builds the tokenizers-crate pipeline: regex splits, byte-level mapping, BPE merges.
fn build_bpe(g: &GgufFile, tokens: &[String], pre: pretok::PreTokenizer) -> Result<HfTokenizer> {
    let merges_raw = g
        .get_str_array("tokenizer.ggml.merges")
        .context("reading tokenizer.ggml.merges (required for tokenizer.ggml.model = \"gpt2\")")?;
    let mut merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        // The separator is the first space after the first character (a token may be " ").
        let first = m.chars().next().map_or(0, char::len_utf8);
        let sp = m[first..].find(' ').map(|p| p + first).ok_or_else(|| {
            anyhow!("tokenizer.ggml.merges[{i}] = {m:?} has no space separating the pair")
        })?;
        merges.push((m[..sp].to_string(), m[sp + 1..].to_string()));
    }
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| anyhow!("tokenizer.ggml.merges/tokens are inconsistent: {e}"))?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for pat in pre.patterns {
        let split = Split::new(
            SplitPattern::Regex(pat.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow!("compiling split regex {pat:?}: {e}"))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut hf = HfTokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(hf)
}

/// Parses `<0xAB>` into the byte 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The GPT-2 byte alphabet: printable bytes stand for themselves, the other 68 bytes are
/// shifted to U+0100 upwards in byte order. Returns the byte a character stands for.
fn byte_level_char_to_byte(c: char) -> Option<u8> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let cp = c as u32;
    if cp < 256 && printable(cp) {
        return Some(cp as u8);
    }
    // The shifted bytes, in order: 0..=32, 127..=160, 173.
    match cp.checked_sub(256)? {
        k @ 0..=32 => Some(k as u8),
        k @ 33..=66 => Some((127 + k - 33) as u8),
        67 => Some(173),
        _ => None,
    }
}

/// Decodes a byte-level BPE token spelling; characters outside the alphabet pass through as UTF-8.
fn byte_level_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match byte_level_char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_a_bijection() {
        let mut seen = [false; 256];
        for cp in 0..0x200u32 {
            if let Some(b) = char::from_u32(cp).and_then(byte_level_char_to_byte) {
                assert!(!seen[b as usize], "byte {b} mapped twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_level_char_to_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xZZ>"), None);
    }
}
