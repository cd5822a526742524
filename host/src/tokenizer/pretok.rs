//! Pre-tokenizer split patterns for byte-level BPE vocabularies, keyed by GGUF's
//! `tokenizer.ggml.pre`.
//!
//! Each pre-tokenizer is a list of regexes applied in order: every regex splits every piece the
//! previous ones produced, keeping both the matches and the text between them as separate pieces
//! ("isolated" splitting). The patterns are the published split rules of each model family
//! (as llama.cpp's GGUF conversion names them); case-insensitive contraction groups are spelled
//! out as explicit character classes.

/// The split rules of one `tokenizer.ggml.pre` family plus the vocabulary flags that go with it.
#[derive(Debug, Clone, Copy)]
pub struct PreTokenizer {
    /// Regexes, applied in order.
    pub patterns: &'static [&'static str],
    /// A pre-token that is itself a vocabulary entry is emitted whole, without running merges.
    pub ignore_merges: bool,
    /// Whether a BOS token is added when the file has no `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
}

/// GPT-2's split: contractions, letter runs, digit runs, other-symbol runs, whitespace.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3 / GLM-4 family: digits in groups of up to three.
const LLAMA3: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen2/Qwen3 family: like Llama 3 but every digit is its own piece.
const QWEN2: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen3.5: letters include combining marks.
const QWEN35: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
    "\\s+$",
    CJK_HANGUL,
    "\\p{N}+",
];

/// CJK ideographs, the blocks below them from U+0800, and Hangul.
const CJK_HANGUL: &str = "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
/// CJK ideographs and kana.
const CJK_KANA: &str = "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";

const DEEPSEEK_CODER: &[&str] = &["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_HANGUL, "\\p{N}"];

const DEEPSEEK_V3: &[&str] = &[
    "\\p{N}{1,3}",
    CJK_KANA,
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];

const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"];

const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];

/// Everything up to whitespace or sentence punctuation (Latin, CJK, Devanagari, Arabic).
const NOT_PUNCT: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";
const BLOOM: &[&str] = &[NOT_PUNCT];
const VIKING: &[&str] = &[NOT_PUNCT, r"\p{N}"];

/// Every `tokenizer.ggml.pre` value kiln understands, for error messages.
pub const KNOWN: &[&str] = &[
    "default",
    "gpt2",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "jina-es",
    "jina-de",
    "jina-v2-es",
    "jina-v2-de",
    "gigachat",
    "mellum",
    "trillion",
    "granite-docling",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "dbrx",
    "smaug-bpe",
    "chatglm-bpe",
    "glm4",
    "glm5",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "hunyuan",
    "qwen35",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "falcon",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "minerva-7b",
    "poro-chat",
    "bloom",
    "gpt3-finnish",
    "viking",
];

/// The pre-tokenizer for `pre` (the value of `tokenizer.ggml.pre`), or `None` if unknown.
pub fn lookup(pre: &str) -> Option<PreTokenizer> {
    const fn p(patterns: &'static [&'static str]) -> PreTokenizer {
        PreTokenizer {
            patterns,
            ignore_merges: false,
            add_bos: false,
        }
    }
    Some(match pre {
        "default" => p(DEFAULT),
        "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de"
        | "jina-v2-es" | "jina-v2-de" | "gigachat" | "mellum" | "trillion" | "granite-docling" => {
            p(&[GPT2])
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => PreTokenizer {
            patterns: &[LLAMA3],
            ignore_merges: true,
            add_bos: true,
        },
        "dbrx" | "smaug-bpe" | "chatglm-bpe" => p(&[LLAMA3]),
        "glm4" | "glm5" => PreTokenizer {
            patterns: &[LLAMA3],
            ignore_merges: true,
            add_bos: false,
        },
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" => p(&[QWEN2]),
        "qwen35" => p(&[QWEN35]),
        "deepseek-llm" => p(DEEPSEEK_LLM),
        "deepseek-coder" => p(DEEPSEEK_CODER),
        "deepseek-v3" => p(DEEPSEEK_V3),
        "falcon" => p(FALCON),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            p(&[r"\p{N}", GPT2])
        }
        "poro-chat" | "bloom" | "gpt3-finnish" => p(BLOOM),
        "viking" => p(VIKING),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_name_resolves_and_compiles() {
        for name in KNOWN {
            let pt = lookup(name).unwrap_or_else(|| panic!("{name} not in lookup"));
            for pat in pt.patterns {
                tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(pat.to_string()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{name}: {pat}: {e}"));
            }
        }
        assert!(lookup("no-such-pre").is_none());
    }
}
