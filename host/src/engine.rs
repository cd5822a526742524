//! Generation: load a GGUF model onto a backend, prefill a prompt in one batched forward pass,
//! then decode token by token, streaming text through a callback.
//!
//! The engine remembers which tokens its KV cache holds, so a follow-up prompt that extends the
//! previous one (a chat's next turn) only prefills the new suffix.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::backend::Backend;
use crate::chat::ChatTemplate;
use crate::gguf::GgufFile;
use crate::models::{self, Logits, Model};
use crate::perplexity::{self, Score};
use crate::sampling::{Sampler, SamplerConfig, StopStrings};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Longest prompt chunk per forward pass: bounds activation memory on long prompts.
pub const PREFILL_CHUNK: usize = 512;
/// Files above this size get a load progress bar (small ones load too fast to watch).
const PROGRESS_MIN_BYTES: u64 = 256 << 20;
/// KV cache positions allocated the first time; it doubles (up to the model's context) as needed.
const INITIAL_CTX: usize = 1024;

pub struct Engine<B: Backend> {
    pub backend: B,
    pub file: Arc<GgufFile>,
    pub model: Box<dyn Model<B>>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// Most positions the cache may grow to: the model's training context, or the user's limit.
    pub max_ctx: usize,
    cache: Option<(B::KvCache, usize)>,
    /// Tokens whose keys/values are in the cache, position `i` at index `i`.
    cached: Vec<u32>,
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    StopString,
    MaxTokens,
    ContextFull,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Prompt tokens actually run (the rest were already in the KV cache).
    pub prefill_tokens: usize,
    pub prefill_s: f64,
    /// Forward passes after the prefill (each produces one token).
    pub decode_tokens: usize,
    pub decode_s: f64,
}

impl Timings {
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_s)
    }
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_tokens, self.decode_s)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
}

impl<B: Backend + 'static> Engine<B> {
    /// Opens and maps the file, loads the executor for its architecture and its tokenizer.
    /// `max_ctx` sizes the KV cache (default: the model's training context; a longer one is
    /// allowed, with a warning).
    pub fn load(backend: B, path: &Path, max_ctx: Option<usize>) -> Result<Self> {
        let file = Arc::new(GgufFile::open(path)?);
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let bar = if size >= PROGRESS_MIN_BYTES {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "loading {bar:40} {pos}/{len} blocks {elapsed}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            Some(bar)
        } else {
            None
        };
        let mut progress = |done: usize, total: usize| {
            if let Some(bar) = &bar {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            }
        };
        let model = models::load(&backend, &file, &mut progress)?;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let tokenizer = Tokenizer::from_gguf(&file).context("loading the tokenizer")?;
        let template = ChatTemplate::from_gguf(&file).context("loading the chat template")?;
        let train = model.config().n_ctx_train.max(1);
        // A longer context than the model was trained for is the user's call (as in
        // llama.cpp), e.g. with RoPE scaling the file does not declare; say so once.
        let max_ctx = max_ctx.unwrap_or(train).max(1);
        if max_ctx > train {
            eprintln!(
                "warning: context {max_ctx} is longer than the {train} positions the model was \
                 trained for ({}.context_length); output past {train} may degrade",
                model.config().arch
            );
        }
        Ok(Engine {
            backend,
            file,
            model,
            tokenizer,
            template,
            max_ctx,
            cache: None,
            cached: Vec::new(),
        })
    }

    /// Steers every later generation with per-layer control-vector directions
    /// ([`crate::steering::load`]). The cache is dropped: its keys and values were computed
    /// without them (and recorded decode steps address the old cache).
    pub fn set_control_vectors(&mut self, directions: &[Option<Vec<f32>>]) -> Result<()> {
        self.model.steer(&self.backend, directions)?;
        self.cache = None;
        self.cached.clear();
        Ok(())
    }

    /// Forgets the KV cache contents (the next prompt is prefilled in full).
    pub fn reset(&mut self) {
        self.cached.clear();
    }

    /// Makes the cache hold at least `need` positions, growing it (and forgetting its contents)
    /// if it is smaller.
    fn ensure_cache(&mut self, need: usize) -> Result<()> {
        ensure!(
            need <= self.max_ctx,
            "prompt and generation need {need} positions, more than the {}-token context",
            self.max_ctx
        );
        if self.cache.as_ref().is_some_and(|(_, size)| *size >= need) {
            return Ok(());
        }
        let mut size = INITIAL_CTX.min(self.max_ctx);
        while size < need {
            size = (size * 2).min(self.max_ctx);
        }
        self.cache = None; // free the old one first
        let spec = self.model.config().kv_spec(size);
        self.cache = Some((self.backend.kv_cache(&spec)?, size));
        self.cached.clear();
        Ok(())
    }

    /// Generates a continuation of `prompt`, calling `on_text` with each new piece of text as soon
    /// as it is final (stop strings are held back until they can no longer match).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<Generation> {
        ensure!(!prompt.is_empty(), "the prompt is empty (no tokens)");
        let want = (prompt.len() + params.max_tokens).min(self.max_ctx);
        self.ensure_cache(want.max(prompt.len()))?;

        // Reuse the cached prefix; always run at least one token to get fresh logits.
        let mut reuse = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        reuse = reuse.min(prompt.len() - 1);
        self.cached.truncate(reuse);

        let mut timings = Timings {
            prompt_tokens: prompt.len(),
            ..Timings::default()
        };
        let start = Instant::now();
        let mut logits = None;
        for chunk in prompt[reuse..].chunks(PREFILL_CHUNK) {
            logits = Some(forward(
                &*self.model,
                &self.backend,
                &mut self.cache,
                chunk,
                self.cached.len(),
            )?);
            self.cached.extend_from_slice(chunk);
        }
        let mut logits = logits.context("nothing to prefill")?;
        timings.prefill_tokens = prompt.len() - reuse;

        let mut sampler = Sampler::new(params.sampler.clone());
        let mut stops = StopStrings::new(params.stop.iter().cloned());
        let tokenizer = &self.tokenizer;
        let mut decoder = StreamDecoder::new(tokenizer);
        let mut history: Vec<u32> = prompt.to_vec();
        let mut out = Generation {
            tokens: Vec::new(),
            text: String::new(),
            stop: StopReason::MaxTokens,
            timings,
        };
        let mut decode_time = Duration::ZERO;
        // A decode step lasts from its forward pass to its token on the host: a device may run
        // the step asynchronously, so the forward call alone can return long before the work ends.
        let mut step_start: Option<Instant> = None;
        let mut first = true;
        loop {
            if out.tokens.len() >= params.max_tokens {
                if first {
                    out.timings.prefill_s = start.elapsed().as_secs_f64();
                }
                break;
            }
            // Greedy decoding moves one id per token to the host, not the logits row.
            let tok = if sampler.is_plain_argmax() {
                self.backend.argmax(&logits)?[0]
            } else {
                sampler.sample(&mut self.backend.read(&logits)?, &history)
            };
            if let Some(t) = step_start.take() {
                decode_time += t.elapsed();
            }
            if first {
                // Prefill ends with its first token on the host (time to first token).
                out.timings.prefill_s = start.elapsed().as_secs_f64();
                first = false;
            }
            if !params.ignore_eos && tokenizer.is_eot(tok) {
                out.stop = StopReason::Eos;
                break;
            }
            out.tokens.push(tok);
            history.push(tok);
            let piece = stops.push(&decoder.push(tok));
            if !piece.emit.is_empty() {
                out.text.push_str(&piece.emit);
                on_text(&piece.emit)?;
            }
            if piece.stopped.is_some() {
                out.stop = StopReason::StopString;
                break;
            }
            if out.tokens.len() >= params.max_tokens {
                break;
            }
            // The cache was sized for prompt + max_tokens (capped by the context) up front.
            let pos = self.cached.len();
            if pos + 1 > self.cache.as_ref().map_or(0, |c| c.1) {
                out.stop = StopReason::ContextFull;
                break;
            }
            step_start = Some(Instant::now());
            logits = forward(&*self.model, &self.backend, &mut self.cache, &[tok], pos)?;
            self.cached.push(tok);
            out.timings.decode_tokens += 1;
        }
        // Text held back for a stop string that never completed is part of the output.
        let tail = stops.push(&decoder.finish()).emit;
        let rest = tail + &stops.finish();
        if !rest.is_empty() && out.stop != StopReason::StopString {
            out.text.push_str(&rest);
            on_text(&rest)?;
        }
        out.timings.decode_s = decode_time.as_secs_f64();
        Ok(out)
    }
}

impl<B: Backend + 'static> Engine<B> {
    /// Perplexity of the model over `tokens` (the whole text, tokenized with BOS where the model
    /// adds one), in windows of `ctx` tokens scored as [`crate::perplexity`] describes; at most
    /// `max_windows` windows. `on_window(done, total, score)` runs after each window. The KV
    /// cache's contents are forgotten (the next prompt is prefilled in full).
    pub fn perplexity(
        &mut self,
        tokens: &[u32],
        ctx: usize,
        max_windows: Option<usize>,
        on_window: &mut dyn FnMut(usize, usize, &Score),
    ) -> Result<Score> {
        let ranges = perplexity::windows(tokens.len(), ctx, max_windows)?;
        self.ensure_cache(ctx)?;
        self.cached.clear();
        let bos = match self.tokenizer.add_bos_default() {
            true => self.tokenizer.bos(),
            false => None,
        };
        let first = perplexity::first_scored(ctx);
        let mut score = Score::default();
        let mut window = Vec::with_capacity(ctx);
        for (done, range) in ranges.iter().enumerate() {
            window.clear();
            window.extend_from_slice(&tokens[range.clone()]);
            if let Some(bos) = bos {
                window[0] = bos;
            }
            let (cache, _) = self.cache.as_mut().context("KV cache not allocated")?;
            for (c, chunk) in window.chunks(PREFILL_CHUNK).enumerate() {
                let pos = c * PREFILL_CHUNK;
                // Rows `lo..hi` of this chunk are scored; the others only fill the cache, and a
                // chunk with none skips the vocabulary mat-mul for all but its last row.
                let (lo, hi) = (first.max(pos), (ctx - 1).min(pos + chunk.len()));
                let which = if lo < hi { Logits::All } else { Logits::Last };
                let logits = self
                    .model
                    .forward(&self.backend, cache, chunk, pos, which)?;
                if lo >= hi {
                    continue;
                }
                let scored = match (lo - pos, hi - lo) {
                    (0, n) if n == chunk.len() => logits,
                    (start, n) => self.backend.rows(&logits, start, n)?,
                };
                let nll = (self.backend)
                    .token_nll(&scored, &window[lo + 1..hi + 1])
                    .with_context(|| {
                        format!(
                            "window {} (tokens {range:?}), scored from position {lo}",
                            done + 1
                        )
                    })?;
                nll.into_iter().for_each(|v| score.add(v));
            }
            score.end_window();
            on_window(done + 1, ranges.len(), &score);
        }
        Ok(score)
    }
}

/// Runs `tokens` at positions `pos..` and returns the last position's logits on the device.
/// A free function so the caller can keep borrowing the tokenizer meanwhile.
fn forward<B: Backend>(
    model: &dyn Model<B>,
    backend: &B,
    cache: &mut Option<(B::KvCache, usize)>,
    tokens: &[u32],
    pos: usize,
) -> Result<B::Tensor> {
    let (cache, _) = cache.as_mut().context("KV cache not allocated")?;
    backend.step(cache, tokens, pos, &mut |b, c| {
        model.forward(b, c, tokens, pos, Logits::Last)
    })
}
