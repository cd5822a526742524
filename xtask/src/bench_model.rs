//! `cargo xtask bench model`: end-to-end speed of kiln against llama.cpp's `llama-bench` on the
//! same GGUF files, on the same device, in one interleaved run.
//!
//! Protocol (docs/bench-protocol.md has the long form):
//! - Tests, named as llama-bench names them: `ppP` (prefill of P tokens into an empty cache),
//!   `tgT` (T single-token decode steps after a 1-token context), `tgT@dD` (T decode steps after
//!   a D-token prefill). Token ids are a fixed pseudo-random sequence over the vocabulary.
//! - kiln runs in-process: the model is loaded once (timed), each test is warmed up `--warmup`
//!   times, then measured. Decoding is greedy (argmax read back every step), so it is a real
//!   decode loop with one small device-to-host transfer per token.
//! - llama-bench runs once per (rep, test) with `-r 1`, so the two engines interleave. Order
//!   alternates: on even reps kiln runs a test first, on odd reps llama.cpp does, so clock and
//!   thermal drift over the run falls on both equally.
//!
//! `bench.json` schema (`"schema": "kiln-bench-model/1"`; times in ms unless the key says s):
//! ```text
//! { schema, date (UTC, RFC 3339), kiln_commit, device ("NVIDIA H200" / CPU model + threads),
//!   protocol: { reps, warmup, pp, tg, depth, order, llama_bench_args: [str] },
//!   reference: { ran: bool, path: str|null, note: str },
//!   models: [ {
//!     file, sha256, size_bytes,
//!     kiln: { load_s, vram_baseline_bytes|null, vram_peak_bytes|null, vram_peak_over_baseline_bytes|null,
//!             vram_process_bytes|null },
//!     llama_cpp: { build_commit, gpu_info, model_type, model_size, vram_process_bytes|null } | null,
//!     tests: [ {
//!       name, kind ("pp"|"tg"), n_tokens, depth,
//!       kiln: { tps_median, tps_reps: [f64], ttft_ms_median|null, ttft_ms_reps: [f64],
//!               latency_ms_p50|null, latency_ms_p95|null },
//!       llama_cpp: { tps_median, tps_reps: [f64], stddev_ts_reps: [f64] } | null,
//!       ratio (kiln tps_median / llama_cpp tps_median) | null } ],
//!     notes: [str] } ] }
//! ```
//! `tps_*` are tokens per second (for tg: T over the rep's summed step latencies); latency
//! percentiles pool every decode step of every rep; TTFT (pp tests only) is the start of the
//! prefill to the first greedy token id on the host. VRAM is device-wide used memory
//! (total − free, sampled after load, after each prefill and after each decode loop) minus the
//! value before the model was loaded; null on the CPU. `vram_process_bytes` is what each engine's
//! process holds, CUDA context included, so the two are comparable: for kiln its peak minus
//! nvidia-smi's reading before kiln created a context; for llama.cpp the peak of nvidia-smi
//! sampled every 20 ms during each llama-bench run minus the reading just before it (kiln's
//! memory is constant meanwhile), the largest over its runs.
mod kiln_runner;
mod llama_bench;
mod report;
#[cfg(test)]
mod tests;
mod vram;

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use clap::Args as ClapArgs;
use kiln_host::backend::cpu::Cpu;
use kiln_host::backend::cuda::Cuda;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::measure::{self, median};
use kiln_runner::{Device, KilnRunner, KilnSample};
use llama_bench::{LlamaBench, LlamaModelInfo};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceKind {
    Cuda,
    Cpu,
}

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// GGUF model file (repeatable).
    #[arg(short, long = "model", required = true)]
    models: Vec<PathBuf>,
    /// Where kiln runs (llama-bench is given `-ngl 99` for cuda, `-ngl 0 -t <kiln's threads>` for cpu).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cuda)]
    device: DeviceKind,
    /// Measured repetitions of every test, for each engine.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Unmeasured runs of every test before kiln's first measured one (llama-bench does its own).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Prompt tokens of the prefill test (0 skips it).
    #[arg(long, default_value_t = 512)]
    pp: usize,
    /// Decode steps of the generation tests (0 skips them).
    #[arg(long, default_value_t = 128)]
    tg: usize,
    /// Context prefilled before the second generation test (0 skips it).
    #[arg(long, default_value_t = 4096)]
    depth: usize,
    /// llama.cpp's llama-bench binary (default: $LLAMA_BENCH); without it only kiln is measured.
    #[arg(long)]
    llama_bench: Option<PathBuf>,
    /// Extra llama-bench arguments, split on whitespace (e.g. "-t 16 -ub 1024"); they replace
    /// the default `-fa 1` / `-ngl` / `-t` when they set those.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    llama_args: String,
    /// Directory for bench.json, bench.md and bench.svg.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// One benchmark, named as llama-bench names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestSpec {
    pub kind: TestKind,
    /// Prompt tokens (pp) or decode steps (tg).
    pub n: usize,
    /// Tokens in the cache before the measured part.
    pub depth: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    Pp,
    Tg,
}

impl TestSpec {
    pub fn name(&self) -> String {
        let base = match self.kind {
            TestKind::Pp => format!("pp{}", self.n),
            TestKind::Tg => format!("tg{}", self.n),
        };
        if self.depth > 0 {
            format!("{base}@d{}", self.depth)
        } else {
            base
        }
    }
}

/// The tests the flags ask for, in run order.
pub fn tests(pp: usize, tg: usize, depth: usize) -> Vec<TestSpec> {
    let mut t = Vec::new();
    if pp > 0 {
        t.push(TestSpec {
            kind: TestKind::Pp,
            n: pp,
            depth: 0,
        });
    }
    if tg > 0 {
        t.push(TestSpec {
            kind: TestKind::Tg,
            n: tg,
            depth: 0,
        });
        if depth > 0 {
            t.push(TestSpec {
                kind: TestKind::Tg,
                n: tg,
                depth,
            });
        }
    }
    t
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Kiln,
    LlamaCpp,
}

/// One measured run: rep `rep` of test `test` (an index into the test list) on `engine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub rep: usize,
    pub test: usize,
    pub engine: Engine,
}

/// Run order: rep-major, then test; within a (rep, test) pair kiln goes first on even reps and
/// llama.cpp on odd ones. Without the reference, kiln's steps alone in the same order.
pub fn schedule(reps: usize, n_tests: usize, with_reference: bool) -> Vec<Step> {
    let mut s = Vec::new();
    for rep in 0..reps {
        for test in 0..n_tests {
            let order = if rep % 2 == 0 {
                [Engine::Kiln, Engine::LlamaCpp]
            } else {
                [Engine::LlamaCpp, Engine::Kiln]
            };
            for engine in order {
                if engine == Engine::Kiln || with_reference {
                    s.push(Step { rep, test, engine });
                }
            }
        }
    }
    s
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub schema: &'static str,
    pub date: String,
    pub kiln_commit: String,
    pub device: String,
    pub protocol: Protocol,
    pub reference: Reference,
    pub models: Vec<ModelReport>,
}

#[derive(Serialize, Debug)]
pub struct Protocol {
    pub reps: usize,
    pub warmup: usize,
    pub pp: usize,
    pub tg: usize,
    pub depth: usize,
    pub order: &'static str,
    pub llama_bench_args: Vec<String>,
}

#[derive(Serialize, Debug)]
pub struct Reference {
    pub ran: bool,
    pub path: Option<String>,
    pub note: String,
}

#[derive(Serialize, Debug)]
pub struct ModelReport {
    pub file: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub kiln: KilnModel,
    pub llama_cpp: Option<LlamaModelInfo>,
    pub tests: Vec<TestReport>,
    pub notes: Vec<String>,
}

#[derive(Serialize, Debug, Default)]
pub struct KilnModel {
    pub load_s: f64,
    pub vram_baseline_bytes: Option<u64>,
    pub vram_peak_bytes: Option<u64>,
    pub vram_peak_over_baseline_bytes: Option<u64>,
    pub vram_process_bytes: Option<u64>,
}

#[derive(Serialize, Debug)]
pub struct TestReport {
    pub name: String,
    pub kind: TestKind,
    pub n_tokens: usize,
    pub depth: usize,
    pub kiln: KilnTest,
    pub llama_cpp: Option<LlamaTest>,
    pub ratio: Option<f64>,
}

#[derive(Serialize, Debug)]
pub struct KilnTest {
    pub tps_median: f64,
    pub tps_reps: Vec<f64>,
    pub ttft_ms_median: Option<f64>,
    pub ttft_ms_reps: Vec<f64>,
    pub latency_ms_p50: Option<f64>,
    pub latency_ms_p95: Option<f64>,
}

impl KilnTest {
    /// Medians over reps; latency percentiles over every decode step of every rep.
    pub fn from_samples(samples: &[KilnSample]) -> KilnTest {
        let tps_reps: Vec<f64> = samples.iter().map(|s| s.tps).collect();
        let ttft_ms_reps: Vec<f64> = samples.iter().filter_map(|s| s.ttft_ms).collect();
        let mut lat: Vec<f64> = samples
            .iter()
            .flat_map(|s| s.step_ms.iter().copied())
            .collect();
        let (latency_ms_p50, latency_ms_p95) = if lat.is_empty() {
            (None, None)
        } else {
            (
                Some(measure::percentile(&mut lat, 0.5)),
                Some(measure::percentile(&mut lat, 0.95)),
            )
        };
        KilnTest {
            tps_median: median(&tps_reps),
            ttft_ms_median: (!ttft_ms_reps.is_empty()).then(|| median(&ttft_ms_reps)),
            tps_reps,
            ttft_ms_reps,
            latency_ms_p50,
            latency_ms_p95,
        }
    }
}

#[derive(Serialize, Debug)]
pub struct LlamaTest {
    pub tps_median: f64,
    pub tps_reps: Vec<f64>,
    pub stddev_ts_reps: Vec<f64>,
}

pub fn run(a: Args) -> Result<()> {
    for m in &a.models {
        ensure!(
            m.is_file(),
            "model file {} does not exist (or is not a file)",
            m.display()
        );
    }
    ensure!(a.reps > 0, "--reps must be at least 1");
    let specs = tests(a.pp, a.tg, a.depth);
    ensure!(
        !specs.is_empty(),
        "--pp and --tg are both 0: nothing to measure"
    );
    let path = a
        .llama_bench
        .clone()
        .or_else(|| std::env::var_os("LLAMA_BENCH").map(PathBuf::from));
    // The CPU backend's parallel ops start from inside the pool (as in the kiln CLI), so the
    // calling thread computes its share instead of waiting on the pool.
    let pool = match a.device {
        DeviceKind::Cpu => Some(
            rayon::ThreadPoolBuilder::new()
                .build()
                .context("starting the thread pool")?,
        ),
        DeviceKind::Cuda => None,
    };
    let llama = match &path {
        Some(p) => Some(LlamaBench::new(
            p,
            &a.llama_args,
            pool.as_ref().map(|p| p.current_num_threads()),
        )?),
        None => {
            ensure!(
                a.llama_args.trim().is_empty(),
                "--llama-args given but no llama-bench (--llama-bench or $LLAMA_BENCH)"
            );
            eprintln!(
                "bench model: no llama-bench given (--llama-bench or $LLAMA_BENCH): measuring kiln only"
            );
            None
        }
    };
    let report = match &pool {
        Some(pool) => {
            pool.install(|| measure_all(&a, &specs, llama.as_ref(), None, || Ok(Cpu::new())))?
        }
        None => {
            // Before any CUDA context of this process exists.
            let before_context = vram::used_now();
            measure_all(&a, &specs, llama.as_ref(), before_context, || {
                Cuda::new(kiln::PTX_MODULES, 0).context("--device cuda")
            })?
        }
    };
    let table = report::write_all(&report, &a.out)?;
    println!("{table}");
    eprintln!(
        "bench model: wrote {}/bench.{{json,md,svg}}",
        a.out.display()
    );
    Ok(())
}

fn measure_all<D: Device>(
    a: &Args,
    specs: &[TestSpec],
    llama: Option<&LlamaBench>,
    before_context: Option<u64>,
    new_device: impl Fn() -> Result<D>,
) -> Result<Report> {
    let reference = match llama {
        Some(l) => Reference {
            ran: true,
            path: Some(l.path().display().to_string()),
            note: l.depth_note().unwrap_or_default(),
        },
        None => Reference {
            ran: false,
            path: None,
            note: "llama-bench was not run (no --llama-bench or $LLAMA_BENCH): kiln figures only"
                .into(),
        },
    };
    let mut device = String::new();
    let mut models = Vec::new();
    for file in &a.models {
        let dev = new_device()?;
        device = dev.describe();
        let mut m = measure_model(a, specs, llama, dev, file)
            .with_context(|| file.display().to_string())?;
        m.kiln.vram_process_bytes = m
            .kiln
            .vram_peak_bytes
            .zip(before_context)
            .map(|(p, b)| p.saturating_sub(b));
        models.push(m);
    }
    Ok(Report {
        schema: "kiln-bench-model/1",
        date: utc_now(),
        kiln_commit: measure::commit(),
        device,
        protocol: Protocol {
            reps: a.reps,
            warmup: a.warmup,
            pp: a.pp,
            tg: a.tg,
            depth: a.depth,
            order: "per (rep, test): kiln first on even reps, llama.cpp first on odd reps",
            llama_bench_args: llama.map(|l| l.base_args()).unwrap_or_default(),
        },
        reference,
        models,
    })
}

fn measure_model<D: Device>(
    a: &Args,
    specs: &[TestSpec],
    llama: Option<&LlamaBench>,
    dev: D,
    file: &Path,
) -> Result<ModelReport> {
    let (sha256, size_bytes) = sha256_and_size(file)?;
    eprintln!(
        "bench model: {} ({size_bytes} bytes, sha256 {sha256})",
        file.display()
    );
    let mut kiln = KilnRunner::load(dev, file, specs)?;
    eprintln!(
        "  kiln loaded in {:.2} s on {}",
        kiln.load_s,
        kiln.device().describe()
    );
    for spec in specs {
        for _ in 0..a.warmup {
            kiln.run(spec)?;
        }
    }
    let mut notes = Vec::new();
    // A test llama-bench cannot run (an old build without -d) is measured for kiln alone.
    let mut llama_runs: Vec<bool> = specs
        .iter()
        .map(|s| llama.is_some_and(|l| l.supports(s)))
        .collect();
    let mut llama_worked = false;
    if let Some(note) = llama.and_then(|l| l.depth_note()) {
        notes.push(note);
    }
    let mut kiln_samples: Vec<Vec<KilnSample>> = vec![Vec::new(); specs.len()];
    let mut llama_samples: Vec<Vec<llama_bench::Sample>> =
        (0..specs.len()).map(|_| Vec::new()).collect();
    let mut llama_info = None;
    let mut llama_vram: Option<u64> = None;
    let on_gpu = kiln.device().used_bytes().is_some();
    for step in schedule(a.reps, specs.len(), llama.is_some()) {
        let spec = &specs[step.test];
        match (step.engine, llama) {
            (Engine::Kiln, _) => {
                let s = kiln.run(spec)?;
                eprintln!(
                    "  rep {} {:>12} kiln      {:>10.1} t/s",
                    step.rep,
                    spec.name(),
                    s.tps
                );
                kiln_samples[step.test].push(s);
            }
            (Engine::LlamaCpp, Some(l)) if llama_runs[step.test] => {
                match measured_vram(on_gpu, || l.run(file, spec)) {
                    Ok(((s, info), vram)) => {
                        llama_vram = llama_vram.max(vram);
                        eprintln!(
                            "  rep {} {:>12} llama.cpp {:>10.1} t/s",
                            step.rep,
                            spec.name(),
                            s.avg_ts
                        );
                        llama_samples[step.test].push(s);
                        llama_info.get_or_insert(info);
                        llama_worked = true;
                    }
                    // A first run that fails is a setup problem: stop before spending the device time.
                    Err(e) if !llama_worked => return Err(e),
                    // Later failures (say, out of memory at depth) cost that test its reference
                    // figure, not the rest of the run.
                    Err(e) => {
                        let msg = format!(
                            "llama-bench failed on {}, which has no reference figure: {e:#}",
                            spec.name()
                        );
                        eprintln!("  {msg}");
                        notes.push(msg);
                        llama_runs[step.test] = false;
                        llama_samples[step.test].clear();
                    }
                }
            }
            (Engine::LlamaCpp, _) => {}
        }
    }
    let tests = specs
        .iter()
        .zip(kiln_samples.iter().zip(&llama_samples))
        .map(|(spec, (k, l))| {
            let kiln = KilnTest::from_samples(k);
            let llama_cpp = (!l.is_empty()).then(|| {
                let tps_reps: Vec<f64> = l.iter().map(|s| s.avg_ts).collect();
                LlamaTest {
                    tps_median: median(&tps_reps),
                    tps_reps,
                    stddev_ts_reps: l.iter().map(|s| s.stddev_ts).collect(),
                }
            });
            let ratio = llama_cpp
                .as_ref()
                .filter(|l| l.tps_median > 0.0)
                .map(|l| kiln.tps_median / l.tps_median);
            TestReport {
                name: spec.name(),
                kind: spec.kind,
                n_tokens: spec.n,
                depth: spec.depth,
                kiln,
                llama_cpp,
                ratio,
            }
        })
        .collect();
    if let Some(info) = &mut llama_info {
        info.vram_process_bytes = llama_vram;
    }
    Ok(ModelReport {
        file: file.display().to_string(),
        sha256,
        size_bytes,
        kiln: kiln.summary(),
        llama_cpp: llama_info,
        tests,
        notes,
    })
}

/// Runs `f` (one llama-bench run) under the nvidia-smi sampler when kiln runs on a GPU: the
/// peak over the reading just before it, `None` where nvidia-smi cannot tell.
fn measured_vram<T>(on_gpu: bool, f: impl FnOnce() -> Result<T>) -> Result<(T, Option<u64>)> {
    let before = on_gpu.then(vram::used_now).flatten();
    let sampler = before.and_then(|_| vram::Sampler::start());
    let r = f();
    let peak = sampler.and_then(|s| s.stop());
    Ok((r?, peak.zip(before).map(|(p, b)| p.saturating_sub(b))))
}

/// SHA-256 (hex) and size of a file, streamed (model files run to tens of GB).
fn sha256_and_size(path: &Path) -> Result<(String, u64)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    let hex = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, size))
}

/// The current UTC time as RFC 3339 (`2026-12-02T12:43:21Z`).
fn utc_now() -> String {
    kiln_host::chat::strftime_now("%Y-%m-%dT%H:%M:%SZ".into())
}
