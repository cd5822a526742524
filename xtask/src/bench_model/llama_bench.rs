//! llama.cpp's side of `bench model`: runs `llama-bench` for one test and one repetition at a
//! time (`-r 1`) and reads its JSON output.
//!
//! The JSON is read as untyped values so that fields added or reordered by newer llama.cpp
//! versions do not break the adapter; a missing field is an error naming it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde::Serialize;
use serde_json::Value;

use super::{TestKind, TestSpec};

/// Flags the protocol sets for every run; `--llama-args` may not set them.
const OWNED_FLAGS: &[&str] = &[
    "-m",
    "--model",
    "-p",
    "--n-prompt",
    "-n",
    "--n-gen",
    "-pg",
    "-d",
    "--n-depth",
    "-r",
    "--repetitions",
    "-o",
    "--output",
];

/// Defaults that `--llama-args` replaces when it sets the same flag: llama-bench appends
/// repeated flags as extra test values instead of overriding them. On the GPU every layer is
/// offloaded; on the CPU (`cpu_threads`: kiln's thread count) none is, and llama-bench gets
/// kiln's thread count, since its own default (physical cores) may differ.
fn defaults(cpu_threads: Option<usize>) -> Vec<(&'static [&'static str], String)> {
    let mut d: Vec<(&[&str], String)> = vec![(&["-fa", "--flash-attn"], "1".into())];
    match cpu_threads {
        None => d.push((&["-ngl", "--n-gpu-layers"], "99".into())),
        Some(t) => d.extend([
            (&["-ngl", "--n-gpu-layers"][..], "0".into()),
            (&["-t", "--threads"][..], t.to_string()),
        ]),
    }
    d
}

pub struct LlamaBench {
    path: PathBuf,
    extra: Vec<String>,
    defaults: Vec<(&'static [&'static str], String)>,
    /// Whether this build has `-d/--n-depth` (added to llama-bench in 2025).
    has_depth: bool,
}

/// One repetition of one test, as llama-bench reported it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ts: Vec<f64>,
}

/// What llama-bench says about itself and the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LlamaModelInfo {
    pub build_commit: String,
    pub gpu_info: String,
    pub model_type: String,
    pub model_size: u64,
    /// Device memory llama-bench's process held at its peak (filled in by `bench model`).
    pub vram_process_bytes: Option<u64>,
}

impl LlamaBench {
    /// Checks that `path` is an executable llama-bench and which flags it has; `cpu_threads`
    /// is kiln's thread count when kiln runs on the CPU (see [`defaults`]).
    pub fn new(path: &Path, extra: &str, cpu_threads: Option<usize>) -> Result<Self> {
        let meta =
            std::fs::metadata(path).map_err(|e| anyhow!("llama-bench {}: {e}", path.display()))?;
        ensure!(
            meta.is_file() && is_executable(&meta),
            "llama-bench {} is not an executable file",
            path.display()
        );
        let extra: Vec<String> = extra.split_whitespace().map(String::from).collect();
        if let Some(f) = extra.iter().find(|a| OWNED_FLAGS.contains(&a.as_str())) {
            bail!("--llama-args must not set {f}: bench model sets it for every run");
        }
        let out = Command::new(path)
            .arg("--help")
            .output()
            .with_context(|| format!("running {} --help", path.display()))?;
        let help = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        ensure!(
            help.contains("--n-prompt"),
            "{} does not look like llama-bench (its --help does not mention --n-prompt)",
            path.display()
        );
        Ok(LlamaBench {
            path: path.to_path_buf(),
            extra,
            defaults: defaults(cpu_threads),
            has_depth: help.contains("--n-depth"),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn supports(&self, spec: &TestSpec) -> bool {
        spec.depth == 0 || self.has_depth
    }

    /// Why some tests have no reference figure, if they do not.
    pub fn depth_note(&self) -> Option<String> {
        (!self.has_depth).then(|| {
            "this llama-bench has no -d/--n-depth flag (an old build): tests at depth ran for kiln only".to_string()
        })
    }

    /// The arguments every run shares (not the model or the test).
    pub fn base_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        for (flags, value) in &self.defaults {
            if !self.extra.iter().any(|x| flags.contains(&x.as_str())) {
                a.extend([flags[0].to_string(), value.clone()]);
            }
        }
        a.extend(["-r", "1", "-o", "json"].map(String::from));
        a.extend(self.extra.iter().cloned());
        a
    }

    /// The full argument list of one run of `spec` on `file`.
    pub fn args(&self, file: &Path, spec: &TestSpec) -> Vec<String> {
        let mut a = vec!["-m".to_string(), file.display().to_string()];
        let (p, n) = prompt_and_gen(spec);
        a.extend(["-p".into(), p.to_string(), "-n".into(), n.to_string()]);
        if spec.depth > 0 {
            a.extend(["-d".into(), spec.depth.to_string()]);
        }
        a.extend(self.base_args());
        a
    }

    pub fn run(&self, file: &Path, spec: &TestSpec) -> Result<(Sample, LlamaModelInfo)> {
        let args = self.args(file, spec);
        let out = Command::new(&self.path)
            .args(&args)
            .output()
            .with_context(|| format!("running {}", self.path.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no error output");
            bail!(
                "llama-bench {} failed ({}): {last}",
                args.join(" "),
                out.status
            );
        }
        parse(&String::from_utf8_lossy(&out.stdout), spec)
    }
}

/// llama-bench's `n_prompt` and `n_gen` of a test.
fn prompt_and_gen(spec: &TestSpec) -> (usize, usize) {
    match spec.kind {
        TestKind::Pp => (spec.n, 0),
        TestKind::Tg => (0, spec.n),
    }
}

#[cfg(unix)]
fn is_executable(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_: &std::fs::Metadata) -> bool {
    true
}

/// The result for `spec` in llama-bench's `-o json` output (an array of result objects).
pub fn parse(json: &str, spec: &TestSpec) -> Result<(Sample, LlamaModelInfo)> {
    let v: Value = serde_json::from_str(json).map_err(|e| {
        let head: String = json
            .chars()
            .take(80)
            .collect::<String>()
            .replace(['\n', '\r'], " ");
        anyhow!("llama-bench output is not JSON ({e}); it starts: {head:?}")
    })?;
    let results = v
        .as_array()
        .context("llama-bench JSON is not an array of results")?;
    let (p, n) = prompt_and_gen(spec);
    let mut found = None;
    for r in results {
        // Builds before -d existed have no n_depth: their results are all at depth 0.
        let depth = if r.get("n_depth").is_some() {
            uint(r, "n_depth")?
        } else {
            0
        };
        if uint(r, "n_prompt")? == p as u64
            && uint(r, "n_gen")? == n as u64
            && depth == spec.depth as u64
        {
            found = Some(r);
            break;
        }
    }
    let r = found.with_context(|| {
        format!(
            "llama-bench output has no {} result ({} results)",
            spec.name(),
            results.len()
        )
    })?;
    let samples_ts = field(r, "samples_ts")?
        .as_array()
        .context("llama-bench field samples_ts is not an array")?
        .iter()
        .map(|x| {
            x.as_f64()
                .context("llama-bench field samples_ts holds a non-number")
        })
        .collect::<Result<Vec<f64>>>()?;
    let sample = Sample {
        avg_ts: num(r, "avg_ts")?,
        stddev_ts: num(r, "stddev_ts")?,
        samples_ts,
    };
    let info = LlamaModelInfo {
        build_commit: text(r, "build_commit")?,
        gpu_info: text(r, "gpu_info")?,
        model_type: text(r, "model_type")?,
        model_size: uint(r, "model_size")?,
        vram_process_bytes: None,
    };
    Ok((sample, info))
}

fn field<'a>(r: &'a Value, key: &str) -> Result<&'a Value> {
    r.get(key)
        .with_context(|| format!("llama-bench result has no field {key}"))
}

fn num(r: &Value, key: &str) -> Result<f64> {
    field(r, key)?
        .as_f64()
        .with_context(|| format!("llama-bench field {key} is not a number"))
}

fn uint(r: &Value, key: &str) -> Result<u64> {
    field(r, key)?
        .as_u64()
        .with_context(|| format!("llama-bench field {key} is not a non-negative integer"))
}

fn text(r: &Value, key: &str) -> Result<String> {
    Ok(field(r, key)?
        .as_str()
        .with_context(|| format!("llama-bench field {key} is not a string"))?
        .to_string())
}
