//! Token sampling with llama.cpp's default chain: penalties → top-k → top-p → min-p →
//! temperature → draw from the softmax. Temperature ≤ 0 means greedy (argmax after penalties,
//! ties to the lowest id). Also [`StopStrings`], stop-string detection over streamed text.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// Sampling settings. Defaults follow llama.cpp's (`temp 0.8, top_k 40, top_p 0.95,
/// min_p 0.05, repeat_penalty 1.0, repeat_last_n 64`).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// ≤ 0: greedy.
    pub temperature: f32,
    /// 0: disabled.
    pub top_k: usize,
    /// ≥ 1: disabled.
    pub top_p: f32,
    /// ≤ 0: disabled.
    pub min_p: f32,
    /// 1.0: disabled. Positive logits of recent tokens are divided by it, negative multiplied.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalties look at (0: none).
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token present in the window.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window.
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0x5EED,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding (no penalties).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }
}

/// A seeded sampler. The same config (seed included) and inputs give the same ids.
pub struct Sampler {
    config: SamplerConfig,
    rng: StdRng,
    /// Scratch candidate list (id, logit), reused between calls.
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        Self {
            config,
            rng,
            cand: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Restarts the random stream from the configured seed.
    pub fn reset(&mut self) {
        self.rng = StdRng::seed_from_u64(self.config.seed);
    }

    /// Whether [`Sampler::sample`] reduces to the argmax of the raw logits (greedy, no
    /// penalties): the caller may then take the argmax on the device and skip reading logits.
    pub fn is_plain_argmax(&self) -> bool {
        let c = &self.config;
        let neutral =
            c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0;
        (c.temperature <= 0.0 || c.top_k == 1) && (neutral || c.repeat_last_n == 0)
    }

    /// Picks the next token. `logits` (one per vocabulary entry) are modified in place by the
    /// penalties; `history` is the sequence so far (prompt and generated), most recent last.
    /// NaN logits count as -inf. An empty `logits` gives 0.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        if logits.is_empty() {
            return 0;
        }
        for l in logits.iter_mut() {
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
        apply_penalties(&self.config, logits, history);
        let c = &self.config;
        if c.temperature <= 0.0 || c.top_k == 1 {
            return argmax(logits);
        }

        let cand = &mut self.cand;
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        // Descending logit, ties by ascending id: a total, deterministic order.
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));

        if c.top_k > 0 && c.top_k < cand.len() {
            cand.select_nth_unstable_by(c.top_k - 1, order);
            cand.truncate(c.top_k);
        }
        if c.top_p < 1.0 {
            cand.sort_unstable_by(order);
            let probs = softmax(cand.iter().map(|x| x.1));
            let mut cum = 0.0f64;
            let mut keep = cand.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if c.min_p > 0.0 {
            let max = cand.iter().map(|x| x.1).fold(f32::NEG_INFINITY, f32::max);
            if max.is_finite() {
                let floor = max + c.min_p.ln();
                cand.retain(|x| x.1 >= floor);
            }
        }
        if cand.is_empty() {
            return argmax(logits);
        }
        let t = c.temperature;
        let probs = softmax(cand.iter().map(|x| x.1 / t));
        let r: f64 = self.rng.random::<f64>();
        let mut cum = 0.0;
        for (i, p) in probs.iter().enumerate() {
            cum += p;
            if r < cum {
                return cand[i].0;
            }
        }
        // Rounding left r ≥ the total: take the last token with nonzero probability.
        let last = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
        cand[last].0
    }
}

/// Index of the largest value, the lowest index among equals (NaN never wins).
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] || xs[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// Probabilities of `logits` (computed in f64, max-subtracted). All -inf gives uniform.
fn softmax(logits: impl Iterator<Item = f32> + Clone) -> Vec<f64> {
    let max = logits.clone().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        let n = logits.count();
        return vec![1.0 / n as f64; n];
    }
    let exps: Vec<f64> = logits.map(|l| (l as f64 - max as f64).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Repeat, presence and frequency penalties over the last `repeat_last_n` history tokens.
fn apply_penalties(c: &SamplerConfig, logits: &mut [f32], history: &[u32]) {
    let neutral =
        c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0;
    if neutral || c.repeat_last_n == 0 || history.is_empty() {
        return;
    }
    let window = &history[history.len().saturating_sub(c.repeat_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &n) in &counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if *l <= 0.0 {
            *l *= c.repeat_penalty;
        } else {
            *l /= c.repeat_penalty;
        }
        *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
    }
}

/// Result of feeding text to [`StopStrings`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that is safe to show now (cannot be part of a stop string).
    pub emit: String,
    /// Index (in the configured list) of the stop string that matched; generation should end.
    pub stopped: Option<usize>,
}

/// Finds stop strings in streamed text. Text that could be the beginning of a stop string is
/// held back until it either completes the stop string (then it is dropped, along with
/// everything after it) or is ruled out.
#[derive(Clone, Debug)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
    done: bool,
}

impl StopStrings {
    /// Empty stop strings are ignored.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        let stops = stops
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        Self {
            stops,
            held: String::new(),
            done: false,
        }
    }

    /// Feeds a chunk. After a stop, further chunks yield nothing.
    pub fn push(&mut self, chunk: &str) -> StopOutput {
        if self.done {
            return StopOutput {
                emit: String::new(),
                stopped: None,
            };
        }
        self.held.push_str(chunk);
        // Earliest match wins; at equal positions the earlier-listed stop string.
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|p| (p, i)))
            .min();
        if let Some((pos, i)) = hit {
            let emit = self.held[..pos].to_string();
            self.held.clear();
            self.done = true;
            return StopOutput {
                emit,
                stopped: Some(i),
            };
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutput {
            emit,
            stopped: None,
        }
    }

    /// The text still held back (end of generation without a stop: show it).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    pub fn stopped(&self) -> bool {
        self.done
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn partial_suffix_len(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for k in (best + 1..=max).rev() {
                let start = h.len() - k;
                if h.is_char_boundary(start) && s.starts_with(&h[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}
