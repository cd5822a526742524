//! Perplexity of a model over a text, scored the way llama.cpp's `llama-perplexity` scores it,
//! so the two engines' figures for the same file and text can be compared directly.
//!
//! The text is tokenized once (with BOS when the model adds one) and cut into windows of `ctx`
//! tokens. Each window runs from an empty KV cache; when the model adds BOS, the window's first
//! token is replaced by BOS. Only the window's second half is scored: the logits at positions
//! `ctx/2 .. ctx-1` predict tokens `ctx/2 + 1 .. ctx`, so every scored token sees at least
//! half a window of context and the figure does not depend on how the text falls into windows.
//! Perplexity is `exp(mean NLL)` over every scored token, with log-softmax in float64.

use std::ops::Range;

use anyhow::{Context, Result, ensure};

/// The token ranges of the scored windows: `n_tokens / ctx` windows of `ctx` tokens (the tail
/// that does not fill a window is not scored, as in llama.cpp), at most `max_windows` of them.
pub fn windows(
    n_tokens: usize,
    ctx: usize,
    max_windows: Option<usize>,
) -> Result<Vec<Range<usize>>> {
    ensure!(
        ctx >= 4,
        "the perplexity window (-c) must be at least 4 tokens, not {ctx}"
    );
    ensure!(
        n_tokens >= ctx,
        "the text is {n_tokens} tokens, fewer than one {ctx}-token window: give a longer text \
         or a smaller -c"
    );
    let n = (n_tokens / ctx).min(max_windows.unwrap_or(usize::MAX));
    ensure!(n > 0, "--chunks 0 scores nothing");
    Ok((0..n).map(|w| w * ctx..(w + 1) * ctx).collect())
}

/// Index (within a window of `ctx`) of the first logits row that is scored.
pub fn first_scored(ctx: usize) -> usize {
    ctx / 2
}

/// `-log softmax(logits)[target]` in float64 (the max is subtracted first, so large logits
/// do not overflow).
pub fn token_nll(logits: &[f32], target: u32) -> Result<f64> {
    let t = target as usize;
    ensure!(
        t < logits.len(),
        "token id {target} is outside the {}-entry vocabulary of the logits",
        logits.len()
    );
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    ensure!(max.is_finite(), "the logits row is not finite (max {max})");
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    ensure!(
        !sum.is_nan(),
        "the logits row is not finite (it holds a NaN)"
    );
    Ok(sum.ln() + max - logits[t] as f64)
}

/// The NLLs of the logits rows `rows` (`vocab` floats each) against `targets` (one per row),
/// in row order. Rows are independent, so they run in parallel: a 512-token window of a
/// 152k-entry vocabulary is ~39 M exponentials in float64, which on one thread took longer
/// than the GPU's forward pass. Each row's arithmetic is [`token_nll`]'s, so the results do
/// not depend on the thread count.
pub fn rows_nll(rows: &[f32], vocab: usize, targets: &[u32]) -> Result<Vec<f64>> {
    use rayon::prelude::*;
    ensure!(
        vocab > 0 && rows.len() == vocab * targets.len(),
        "{} logits are not {} rows of a {vocab}-entry vocabulary",
        rows.len(),
        targets.len()
    );
    rows.par_chunks(vocab)
        .zip(targets.par_iter())
        .enumerate()
        .map(|(i, (row, &t))| token_nll(row, t).with_context(|| format!("logits row {i}")))
        .collect()
}

/// Running totals of scored tokens' NLLs.
#[derive(Clone, Debug, Default)]
pub struct Score {
    sum: f64,
    sum_sq: f64,
    count: usize,
    windows: usize,
}

impl Score {
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
    }

    /// Marks the end of one scored window.
    pub fn end_window(&mut self) {
        self.windows += 1;
    }

    /// Scored tokens so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Windows scored so far.
    pub fn windows(&self) -> usize {
        self.windows
    }

    /// Mean NLL per token (nats).
    pub fn mean_nll(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            self.sum / self.count as f64
        }
    }

    /// `exp(mean NLL)`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }

    /// Standard error of the perplexity: that of the mean NLL (sample variance / count),
    /// carried through `exp` to first order. NaN with fewer than two tokens.
    pub fn perplexity_stderr(&self) -> f64 {
        if self.count < 2 {
            return f64::NAN;
        }
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = ((self.sum_sq / n - mean * mean) * n / (n - 1.0)).max(0.0);
        self.perplexity() * (var / n).sqrt()
    }
}
