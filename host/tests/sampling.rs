//! Sampler and stop-string tests, mostly property-based.

use kiln_host::sampling::{Sampler, SamplerConfig, StopOutput, StopStrings, argmax};
use proptest::prelude::*;

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-20.0f32..20.0, 1..200)
}

fn plain(temperature: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplerConfig::default()
    }
}

/// Ids allowed after top-k, top-p and min-p, computed the slow obvious way.
fn allowed(logits: &[f32], c: &SamplerConfig) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    if c.top_k > 0 {
        idx.truncate(c.top_k);
    }
    if c.top_p < 1.0 {
        let max = logits[idx[0] as usize] as f64;
        let e: Vec<f64> = idx
            .iter()
            .map(|&i| (logits[i as usize] as f64 - max).exp())
            .collect();
        let sum: f64 = e.iter().sum();
        let mut cum = 0.0;
        let mut keep = idx.len();
        for (j, x) in e.iter().enumerate() {
            cum += x / sum;
            if cum >= c.top_p as f64 {
                keep = j + 1;
                break;
            }
        }
        idx.truncate(keep);
    }
    if c.min_p > 0.0 {
        let max = logits[idx[0] as usize];
        idx.retain(|&i| logits[i as usize] >= max + c.min_p.ln());
    }
    idx
}

proptest! {
    #[test]
    fn greedy_is_argmax(mut logits in logits_strategy(), hist in prop::collection::vec(0u32..200, 0..10)) {
        let want = argmax(&logits);
        let mut s = Sampler::new(SamplerConfig::greedy());
        prop_assert_eq!(s.sample(&mut logits, &hist), want);
        // argmax really is the maximum, first among equals
        let w = want as usize;
        prop_assert!(logits.iter().all(|&l| l <= logits[w]));
        prop_assert!(logits[..w].iter().all(|&l| l < logits[w]));
    }

    #[test]
    fn top_k_1_is_greedy(logits in logits_strategy(), temp in 0.1f32..3.0, seed: u64) {
        let c = SamplerConfig { temperature: temp, top_k: 1, seed, ..SamplerConfig::default() };
        let mut s = Sampler::new(c);
        for _ in 0..5 {
            prop_assert_eq!(s.sample(&mut logits.clone(), &[]), argmax(&logits));
        }
    }

    #[test]
    fn sample_is_in_the_allowed_set(
        logits in logits_strategy(),
        top_k in 0usize..50,
        top_p in 0.05f32..1.0,
        min_p in 0.0f32..0.5,
        temp in 0.1f32..3.0,
        seed: u64,
    ) {
        let c = SamplerConfig { temperature: temp, top_k, top_p, min_p, seed, ..SamplerConfig::default() };
        let ok = allowed(&logits, &c);
        let mut s = Sampler::new(c);
        for _ in 0..20 {
            let id = s.sample(&mut logits.clone(), &[]);
            prop_assert!(ok.contains(&id), "{} not in {:?}", id, ok);
        }
    }

    #[test]
    fn same_seed_same_sequence(logits in logits_strategy(), seed: u64) {
        let c = SamplerConfig { seed, ..SamplerConfig::default() };
        let run = |c: &SamplerConfig| {
            let mut s = Sampler::new(c.clone());
            let mut hist = Vec::new();
            for _ in 0..30 {
                let id = s.sample(&mut logits.clone(), &hist);
                hist.push(id);
            }
            hist
        };
        prop_assert_eq!(run(&c), run(&c));
    }

    #[test]
    fn stop_strings_split_anywhere(text in "[a-c]{0,30}", cuts in prop::collection::vec(0usize..31, 0..6)) {
        let stops = ["abc", "cc"];
        let mut s = StopStrings::new(stops);
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len()).collect();
        cuts.sort();
        let mut out = String::new();
        let mut stopped = None;
        let mut prev = 0;
        for c in cuts.into_iter().chain([text.len()]) {
            let o = s.push(&text[prev..c]);
            prev = c;
            out.push_str(&o.emit);
            if o.stopped.is_some() { stopped = o.stopped; break; }
        }
        if stopped.is_none() { out.push_str(&s.finish()); }
        // Reference: earliest occurrence of any stop.
        let first = stops.iter().enumerate().filter_map(|(i, st)| text.find(st).map(|p| (p, i))).min();
        match first {
            Some((p, i)) => { prop_assert_eq!(&out, &text[..p]); prop_assert_eq!(stopped, Some(i)); }
            None => { prop_assert_eq!(&out, &text); prop_assert_eq!(stopped, None); }
        }
    }
}

#[test]
fn frequencies_match_softmax() {
    let logits = [1.0f32, 2.0, 0.5, -1.0, 1.5, 0.0, 3.0, -2.0];
    for &t in &[0.5f32, 1.0, 2.0] {
        let e: Vec<f64> = logits.iter().map(|&l| ((l / t) as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|x| x / z).collect();
        let n = 200_000;
        let mut counts = vec![0usize; logits.len()];
        let mut s = Sampler::new(plain(t, 7));
        for _ in 0..n {
            counts[s.sample(&mut logits.clone(), &[]) as usize] += 1;
        }
        // Chi-square with 7 degrees of freedom: P(X > 30) ≈ 1e-4.
        let chi2: f64 = counts
            .iter()
            .zip(&p)
            .filter(|(_, p)| **p * n as f64 > 5.0)
            .map(|(&c, &p)| {
                let exp = p * n as f64;
                (c as f64 - exp).powi(2) / exp
            })
            .sum();
        assert!(
            chi2 < 30.0,
            "T={t}: chi2 = {chi2}, counts {counts:?}, p {p:?}"
        );
    }
}

#[test]
fn penalties_follow_llama_cpp() {
    let c = SamplerConfig {
        repeat_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        repeat_last_n: 3,
        ..SamplerConfig::greedy()
    };
    let mut logits = [4.0f32, -4.0, 4.0, 1.0];
    // Window = last 3 = [1, 1, 3]; token 0 is outside it.
    let id = Sampler::new(c).sample(&mut logits, &[0, 1, 1, 3]);
    assert_eq!(logits, [4.0, -8.0 - 0.5 - 0.5, 4.0, 0.5 - 0.25 - 0.5]);
    assert_eq!(id, 0, "ties go to the lowest id");
}

#[test]
fn greedy_penalty_changes_choice() {
    let c = SamplerConfig {
        repeat_penalty: 3.0,
        ..SamplerConfig::greedy()
    };
    let mut logits = [3.0f32, 2.0];
    assert_eq!(Sampler::new(c).sample(&mut logits, &[0]), 1);
}

#[test]
fn degenerate_inputs_do_not_panic() {
    let mut s = Sampler::new(SamplerConfig::default());
    assert_eq!(s.sample(&mut [], &[]), 0);
    let mut l = [f32::NAN, f32::NEG_INFINITY, 1.0];
    assert_eq!(s.sample(&mut l, &[99, 1_000_000]), 2);
    let mut all_inf = [f32::NEG_INFINITY; 4];
    assert!(s.sample(&mut all_inf, &[]) < 4);
}

#[test]
fn stop_strings_hold_back_partial_matches() {
    let mut s = StopStrings::new(["<|im_end|>", "\n\nUser:"]);
    assert_eq!(
        s.push("Hello <|im"),
        StopOutput {
            emit: "Hello ".into(),
            stopped: None
        }
    );
    assert_eq!(
        s.push("_e"),
        StopOutput {
            emit: String::new(),
            stopped: None
        }
    );
    assert_eq!(
        s.push("nd|> tail"),
        StopOutput {
            emit: String::new(),
            stopped: Some(0)
        }
    );
    assert!(s.stopped());
    assert_eq!(s.push("more"), StopOutput::default());

    let mut s = StopStrings::new(["\n\nUser:"]);
    assert_eq!(s.push("a\n").emit, "a");
    assert_eq!(s.push("b").emit, "\nb", "ruled-out prefix is released");
    assert_eq!(s.push("\u{1f980}\n\nUs").emit, "\u{1f980}");
    assert_eq!(s.finish(), "\n\nUs");
}
