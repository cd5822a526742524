//! `kiln perplexity`'s scoring: the float64 NLL, the windows, the running score, and on the real
//! SmolLM2 (skipped, with a message, when `models/` lacks it) the figure against llama.cpp's
//! `llama-perplexity` on the same file and text.

mod common;

use common::smollm2_path as model_path;

use kiln_host::backend::Backend;
use kiln_host::backend::cpu::Cpu;
use kiln_host::engine::Engine;
use kiln_host::models::Logits;
use kiln_host::perplexity::{Score, first_scored, rows_nll, token_nll, windows};
use proptest::prelude::*;

/// `-ln p(target)` computed the plain way: the probabilities themselves, in float64.
fn nll_by_probabilities(logits: &[f32], target: usize) -> f64 {
    let e: Vec<f64> = logits.iter().map(|&v| (v as f64).exp()).collect();
    -(e[target] / e.iter().sum::<f64>()).ln()
}

proptest! {
    #[test]
    fn nll_matches_the_probabilities(
        logits in prop::collection::vec(-30f32..30.0, 1..300),
        pick in any::<prop::sample::Index>(),
    ) {
        let t = pick.index(logits.len());
        let got = token_nll(&logits, t as u32).unwrap();
        let want = nll_by_probabilities(&logits, t);
        prop_assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{got} vs {want}");
    }

    #[test]
    fn probabilities_of_every_target_sum_to_one(logits in prop::collection::vec(-80f32..80.0, 1..200)) {
        let total: f64 = (0..logits.len())
            .map(|t| (-token_nll(&logits, t as u32).unwrap()).exp())
            .sum();
        prop_assert!((total - 1.0).abs() < 1e-12, "{total}");
    }

    #[test]
    fn rows_nll_is_token_nll_row_by_row_in_order(
        vocab in 1usize..64,
        rows in 0usize..40,
        seed in any::<u64>(),
    ) {
        // Deterministic pseudo-random logits and targets from the seed (xorshift).
        let mut x = seed | 1;
        let mut next = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        let logits: Vec<f32> = (0..vocab * rows).map(|_| (next() % 6000) as f32 / 100.0 - 30.0).collect();
        let targets: Vec<u32> = (0..rows).map(|_| (next() % vocab as u64) as u32).collect();
        let got = rows_nll(&logits, vocab, &targets).unwrap();
        prop_assert_eq!(got.len(), rows);
        for (i, &t) in targets.iter().enumerate() {
            let want = token_nll(&logits[i * vocab..(i + 1) * vocab], t).unwrap();
            prop_assert_eq!(got[i].to_bits(), want.to_bits(), "row {}", i);
        }
    }

    #[test]
    fn windows_are_whole_consecutive_and_capped(n in 0usize..5000, ctx in 4usize..700, cap in prop::option::of(1usize..20)) {
        match windows(n, ctx, cap) {
            Err(e) => prop_assert!(n < ctx, "unexpected error {e:#}"),
            Ok(w) => {
                prop_assert_eq!(w.len(), (n / ctx).min(cap.unwrap_or(usize::MAX)));
                for (i, r) in w.iter().enumerate() {
                    prop_assert_eq!(r.clone(), i * ctx..(i + 1) * ctx);
                }
            }
        }
    }
}

#[test]
fn nll_stays_finite_for_huge_logits_and_rejects_bad_rows() {
    let nll = token_nll(&[1e30, 0.0, -1e30], 0).unwrap();
    assert_eq!(nll, 0.0);
    assert_eq!(token_nll(&[1e30, 0.0, -1e30], 1).unwrap(), 1e30f32 as f64);
    let e = token_nll(&[0.0, 1.0], 2).unwrap_err().to_string();
    assert!(e.contains("token id 2") && e.contains("2-entry"), "{e}");
    let e = token_nll(&[f32::NAN, f32::NAN], 0).unwrap_err().to_string();
    assert!(e.contains("not finite"), "{e}");
    let e = token_nll(&[0.0, f32::NAN, 1.0], 0).unwrap_err().to_string();
    assert!(e.contains("not finite"), "{e}");
}

#[test]
fn rows_nll_names_the_bad_row_and_rejects_ragged_input() {
    let e = rows_nll(&[0.0, 1.0, 2.0, 3.0], 2, &[1, 2]).unwrap_err();
    assert!(format!("{e:#}").contains("logits row 1"), "{e:#}");
    let e = rows_nll(&[0.0, 1.0, 2.0], 2, &[1, 0])
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 logits") && e.contains("2 rows"), "{e}");
    let e = rows_nll(&[], 0, &[]).unwrap_err().to_string();
    assert!(e.contains("0-entry"), "{e}");
}

/// The CUDA backend's `token_nll` (the `row_nll` kernel, run here on the host grid executor)
/// is the float64 `rows_nll` of the same rows to 1e-6, and names a bad target or row.
#[test]
fn cuda_token_nll_on_host_grid_is_rows_nll() {
    use kiln_host::backend::cuda::Cuda;
    let cuda = Cuda::host::<policies::Hopper>();
    let (rows, vocab) = (5usize, 3001usize);
    let logits: Vec<f32> = (0..rows * vocab)
        .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 24.0 + (i / vocab) as f32 * 40.0)
        .collect();
    let targets = [0u32, 3000, 17, 1500, 2999];
    let x = cuda.upload(&logits, rows, vocab).unwrap();
    let got = cuda.token_nll(&x, &targets).unwrap();
    let want = rows_nll(&logits, vocab, &targets).unwrap();
    for (r, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "row {r}: {g} vs {w}"
        );
    }
    assert_eq!(got.len(), rows);

    let e = cuda
        .token_nll(&x, &[0, 1, 3001, 2, 3])
        .unwrap_err()
        .to_string();
    assert!(e.contains("logits row 2") && e.contains("3001"), "{e}");
    let e = cuda.token_nll(&x, &[0, 1]).unwrap_err().to_string();
    assert!(
        e.contains("2 targets") && e.contains("5 logits rows"),
        "{e}"
    );
    let mut bad = logits.clone();
    bad[3 * vocab + 5] = f32::NAN;
    bad[3 * vocab + 6] = f32::INFINITY;
    let x = cuda.upload(&bad, rows, vocab).unwrap();
    let e = cuda.token_nll(&x, &targets).unwrap_err().to_string();
    assert!(
        e.contains("logits row 3") && e.contains("not finite"),
        "{e}"
    );
}

#[test]
fn window_errors_say_what_is_short() {
    let e = windows(100, 128, None).unwrap_err().to_string();
    assert!(
        e.contains("100 tokens") && e.contains("128-token window"),
        "{e}"
    );
    assert!(
        windows(100, 2, None)
            .unwrap_err()
            .to_string()
            .contains("at least 4")
    );
    assert!(
        windows(1000, 128, Some(0))
            .unwrap_err()
            .to_string()
            .contains("--chunks 0")
    );
    // Half of each window is context only: logits rows ctx/2 .. ctx-1 are scored.
    assert_eq!(first_scored(512), 256);
    assert_eq!(first_scored(7), 3);
}

#[test]
fn score_is_the_exp_of_the_mean_with_its_standard_error() {
    let mut s = Score::default();
    assert!(s.perplexity().is_nan());
    for v in [1.0, 2.0, 3.0] {
        s.add(v);
    }
    assert_eq!(s.count(), 3);
    assert!((s.mean_nll() - 2.0).abs() < 1e-15);
    assert!((s.perplexity() - 2f64.exp()).abs() < 1e-12);
    // Sample variance 1, so the mean's standard error is sqrt(1/3).
    let want = 2f64.exp() * (1.0f64 / 3.0).sqrt();
    assert!(
        (s.perplexity_stderr() - want).abs() < 1e-12,
        "{}",
        s.perplexity_stderr()
    );
}

fn text_tokens(e: &Engine<Cpu>) -> Vec<u32> {
    let text = include_str!("fixtures/perplexity.txt");
    e.tokenizer
        .encode(text, e.tokenizer.add_bos_default())
        .unwrap()
}

fn kiln_perplexity(cpu: Cpu, ctx: usize) -> Score {
    let path = model_path().unwrap();
    let mut e = Engine::load(cpu, &path, Some(ctx)).unwrap();
    let tokens = text_tokens(&e);
    e.perplexity(&tokens, ctx, None, &mut |_, _, _| {}).unwrap()
}

/// llama.cpp 0c1e570 (the GUIDE's reference; CPU build on the dev machine, `scripts/build-llama-cpp.sh
/// cpu` with the `llama-perplexity` target), `llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf
/// -f fixtures/perplexity.txt -c 128 -b 128 -t 2 --no-repack` (its AMX repacked mat-mul crashed on
/// that machine): "Final estimate: PPL = 36.6225 +/- 5.59230", over 6 windows of 128 tokens, 63
/// scored in each; per window [1]36.2551 [2]35.6930 [3]36.8111 [4]36.8842 [5]37.6438 [6]36.6225.
const LLAMA_PPL_128: f64 = 36.6225;
const LLAMA_PPL_STDERR_128: f64 = 5.59230;
const LLAMA_SCORED_128: usize = 6 * 63;

#[test]
fn llama_numerics_perplexity_equals_llama_perplexity() {
    if model_path().is_none() {
        return;
    }
    let s = kiln_perplexity(Cpu::new().with_llama_numerics(), 128);
    eprintln!(
        "kiln {:.4} ± {:.4}, llama.cpp {LLAMA_PPL_128:.4}",
        s.perplexity(),
        s.perplexity_stderr()
    );
    assert_eq!(s.count(), LLAMA_SCORED_128);
    // The logits are llama.cpp's, so only the rounding of its printed figures is left.
    assert!(
        (s.perplexity() - LLAMA_PPL_128).abs() <= 0.5e-4 * 1.01,
        "{} vs {LLAMA_PPL_128}",
        s.perplexity()
    );
    let err = s.perplexity_stderr();
    assert!(
        (err - LLAMA_PPL_STDERR_128).abs() <= 0.5e-5 * 1.01,
        "{err} vs {LLAMA_PPL_STDERR_128}"
    );
}

#[test]
fn own_numerics_perplexity_is_near_llama_perplexity() {
    if model_path().is_none() {
        return;
    }
    // kiln's own rounding moves single 8-bit activation codes, which moves logits by ~0.1 on
    // this model (model_smollm2.rs), but not the average NLL by more than a fraction of its
    // standard error; f32 activations remove the 8-bit codes altogether.
    for (cpu, what) in [
        (Cpu::new(), "own"),
        (Cpu::new().with_f32_activations(), "f32"),
    ] {
        let s = kiln_perplexity(cpu, 128);
        let rel = (s.perplexity() - LLAMA_PPL_128).abs() / LLAMA_PPL_128;
        eprintln!(
            "{what}: kiln {:.4}, llama.cpp {LLAMA_PPL_128:.4}, rel {rel:.2e}",
            s.perplexity()
        );
        assert!(rel < 0.01, "{what}: {} vs {LLAMA_PPL_128}", s.perplexity());
    }
}

/// A window longer than the engine's prefill chunk (512) runs as two forward passes; its score
/// must equal one forward pass over the whole window.
#[test]
fn windows_longer_than_a_prefill_chunk_score_as_one_pass() {
    let Some(path) = model_path() else { return };
    let ctx = 600;
    let mut e = Engine::load(Cpu::new().with_f32_activations(), &path, Some(ctx)).unwrap();
    let mut tokens = text_tokens(&e);
    let got = e.perplexity(&tokens, ctx, None, &mut |_, _, _| {}).unwrap();

    if let (true, Some(bos)) = (e.tokenizer.add_bos_default(), e.tokenizer.bos()) {
        tokens[0] = bos;
    }
    let mut cache = e.backend.kv_cache(&e.model.config().kv_spec(ctx)).unwrap();
    let logits = e
        .model
        .forward(&e.backend, &mut cache, &tokens[..ctx], 0, Logits::All)
        .unwrap();
    let rows = e.backend.read(&logits).unwrap();
    let vocab = rows.len() / ctx;
    let mut want = Score::default();
    for j in ctx / 2..ctx - 1 {
        want.add(token_nll(&rows[j * vocab..(j + 1) * vocab], tokens[j + 1]).unwrap());
    }
    assert_eq!(got.count(), want.count());
    assert_eq!(got.windows(), 1);
    let rel = (got.mean_nll() - want.mean_nll()).abs() / want.mean_nll();
    assert!(
        rel < 1e-5,
        "chunked {} vs one pass {}",
        got.mean_nll(),
        want.mean_nll()
    );
}
