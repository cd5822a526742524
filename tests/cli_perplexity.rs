//! `kiln perplexity` as a user runs it: the built binary on the real SmolLM2 file and the
//! fixture text, its JSON, and its one-line errors. Skipped, with a message, when `models/` lacks
//! the file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");
const TEXT: &str = "host/tests/fixtures/perplexity.txt";

fn model() -> Option<PathBuf> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        return Some(p);
    }
    eprintln!(
        "SKIPPED: {} not found (run scripts/fetch-model.sh)",
        p.display()
    );
    None
}

/// `kiln perplexity -m MODEL --device cpu` with `args` (split at spaces).
fn perplexity(model: &Path, args: &str) -> Output {
    Command::new(KILN)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["perplexity", "--device", "cpu", "-m"])
        .arg(model)
        .args(args.split_whitespace())
        .output()
        .unwrap()
}

#[test]
fn perplexity_json_has_llama_perplexitys_figure() {
    let Some(m) = model() else { return };
    let out = perplexity(&m, &format!("-f {TEXT} -c 128 --llama-numerics --json"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["window"], 128);
    assert_eq!(j["windows"], 6);
    assert_eq!(j["scored_tokens"], 378);
    // llama-perplexity's "Final estimate: PPL = 36.6225" (host/tests/perplexity.rs says how).
    let ppl = j["perplexity"].as_f64().unwrap();
    assert!((ppl - 36.6225).abs() < 1e-4, "{ppl}");
    // --chunks caps the windows.
    let out = perplexity(&m, &format!("-f {TEXT} -c 128 --chunks 2 --json"));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&j["windows"], &j["scored_tokens"]),
        (&2.into(), &126.into())
    );
}

#[test]
fn perplexity_errors_name_the_problem() {
    let Some(m) = model() else { return };
    let out = perplexity(&m, "-f no/such/text.txt");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no/such/text.txt"),
        "{err}"
    );
    // The fixture is ~850 tokens: not one 1024-token window.
    let out = perplexity(&m, &format!("-f {TEXT} -c 1024"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("fewer than one 1024-token window"),
        "{err}"
    );
}
