//! Chat templates: the Jinja template in `tokenizer.chat_template`, rendered with minijinja the
//! way Hugging Face transformers renders it (trim_blocks + lstrip_blocks, `raise_exception`,
//! Python string methods such as `.strip()`/`.startswith()`/`.split()` through
//! minijinja-contrib's pycompat, `bos_token`/`eos_token`, `add_generation_prompt`).

use anyhow::{Context, Result, anyhow};
use minijinja::value::Value as JValue;
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::gguf::GgufFile;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

const NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// The text of the token whose id is stored under `key`, or "" when absent.
fn token_text(g: &GgufFile, key: &str) -> Result<String> {
    if g.get(key).is_none() {
        return Ok(String::new());
    }
    let id = g.get_u32(key).with_context(|| format!("reading {key}"))? as usize;
    let tokens = g
        .get_str_array("tokenizer.ggml.tokens")
        .context("reading tokenizer.ggml.tokens")?;
    tokens.get(id).map(|s| s.to_string()).ok_or_else(|| {
        anyhow!(
            "{key} = {id} is outside tokenizer.ggml.tokens ({} entries)",
            tokens.len()
        )
    })
}

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, or `None` when the file has none.
    pub fn from_gguf(g: &GgufFile) -> Result<Option<Self>> {
        const KEY: &str = "tokenizer.chat_template";
        if g.get(KEY).is_none() {
            return Ok(None);
        }
        let source = g.get_str(KEY).with_context(|| format!("reading {KEY}"))?;
        let bos = token_text(g, "tokenizer.ggml.bos_token_id")?;
        let eos = token_text(g, "tokenizer.ggml.eos_token_id")?;
        Self::new(source, &bos, &eos)
            .with_context(|| format!("compiling {KEY}"))
            .map(Some)
    }

    /// Compiles `source`; `bos_token`/`eos_token` are the texts the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<JValue, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("chat template raised: {msg}"),
            ))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| anyhow!("chat template does not compile: {e:#}"))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders `messages`; with `add_generation_prompt` the result ends with the opening of an
    /// assistant turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Like [`Self::render`] with extra template variables (e.g. `enable_thinking: false` for
    /// Qwen3, `tools`). Extra variables override the built-in ones of the same name.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), serde_json::to_value(messages)?);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        for (k, v) in extra {
            ctx.insert(k.clone(), v.clone());
        }
        let tmpl = self.env.get_template(NAME).map_err(|e| anyhow!("{e:#}"))?;
        tmpl.render(JValue::from_serialize(&ctx))
            .map_err(|e| anyhow!("rendering the chat template failed: {e:#}"))
    }
}

/// `strftime_now(format)` (Llama 3 templates): the current UTC date/time; supports %d %m %Y %y
/// %b %B %H %M %S %%; other directives are kept literally.
pub fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mname = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&mname[..3]),
            Some('B') => out.push_str(mname),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}
