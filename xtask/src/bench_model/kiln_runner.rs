//! kiln's side of `bench model`: the engine in-process, each measurement read on the host clock
//! once the device has finished (a synchronisation, or the argmax read back).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use kiln_host::backend::Backend;
use kiln_host::backend::cpu::Cpu;
use kiln_host::backend::cuda::Cuda;
use kiln_host::engine::{Engine, PREFILL_CHUNK};
use kiln_host::models::Logits;
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{KilnModel, TestKind, TestSpec};

/// Seed of the benchmark's token ids: fixed, so every run feeds the same sequence.
const TOKEN_SEED: u64 = 0x6b69_6c6e;

/// What the protocol needs from a backend beyond [`Backend`]: a name for the report, device
/// memory in use, and a way to wait for queued work.
pub trait Device: Backend + 'static {
    fn describe(&self) -> String;
    /// Device-wide bytes in use (total − free); `None` where there is no device memory.
    fn used_bytes(&self) -> Option<u64>;
    fn sync(&self) -> Result<()>;
}

impl Device for Cpu {
    fn describe(&self) -> String {
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        format!("{model} ({} threads)", rayon::current_num_threads())
    }
    fn used_bytes(&self) -> Option<u64> {
        None
    }
    fn sync(&self) -> Result<()> {
        Ok(()) // CPU ops have finished when they return
    }
}

impl Device for Cuda {
    fn describe(&self) -> String {
        self.gpu().name().to_string()
    }
    fn used_bytes(&self) -> Option<u64> {
        // The host grid executor (no device) has no memory figure; that is not an error here.
        self.gpu()
            .memory_info()
            .ok()
            .map(|(free, total)| (total - free) as u64)
    }
    fn sync(&self) -> Result<()> {
        self.gpu().synchronize()
    }
}

/// One measured run of one test.
#[derive(Clone, Debug)]
pub struct KilnSample {
    pub tps: f64,
    /// Prefill tests: start of the prefill to the first greedy token id on the host.
    pub ttft_ms: Option<f64>,
    /// Generation tests: each decode step, forward pass through argmax on the host.
    pub step_ms: Vec<f64>,
}

/// A loaded model with a KV cache sized for the largest test, reused by every run (each run
/// starts at position 0, and attention never reads past the positions it wrote).
pub struct KilnRunner<D: Device> {
    engine: Engine<D>,
    cache: D::KvCache,
    tokens: Vec<u32>,
    pub load_s: f64,
    baseline: Option<u64>,
    peak: Option<u64>,
}

/// Cache positions a test writes.
fn positions(s: &TestSpec) -> usize {
    match s.kind {
        TestKind::Pp => s.n,
        TestKind::Tg => context(s) + s.n,
    }
}

/// Tokens prefilled before a generation test's decode steps: the depth, or one token (a decode
/// step needs something to attend to and a token to start from).
fn context(s: &TestSpec) -> usize {
    s.depth.max(1)
}

/// `n` token ids spread uniformly over the vocabulary, as llama-bench's are (it draws them
/// with `rand() % n_vocab`): no BOS runs, which would make every position look alike.
pub fn token_ids(n_vocab: usize, n: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(TOKEN_SEED);
    (0..n)
        .map(|_| rng.random_range(0..n_vocab as u32))
        .collect()
}

impl<D: Device> KilnRunner<D> {
    /// Loads `file` (timed: file open to weights resident and tokenizer ready) and allocates a
    /// cache for the largest of `specs`.
    pub fn load(dev: D, file: &Path, specs: &[TestSpec]) -> Result<Self> {
        let baseline = dev.used_bytes();
        let t = Instant::now();
        let engine = Engine::load(dev, file, None)?;
        engine.backend.sync()?;
        let load_s = t.elapsed().as_secs_f64();
        let cfg = engine.model.config();
        let need = specs.iter().map(positions).max().unwrap_or(1);
        ensure!(
            need <= cfg.n_ctx_train,
            "the tests need {need} cache positions, more than the model's {}-token context (lower --depth, --pp or --tg)",
            cfg.n_ctx_train
        );
        let cache = engine
            .backend
            .kv_cache(&cfg.kv_spec(need))
            .context("allocating the KV cache")?;
        let longest = specs
            .iter()
            .map(|s| {
                if s.kind == TestKind::Pp {
                    s.n
                } else {
                    context(s)
                }
            })
            .max();
        let tokens = token_ids(cfg.n_vocab, longest.unwrap_or(1));
        let mut r = KilnRunner {
            engine,
            cache,
            tokens,
            load_s,
            baseline,
            peak: None,
        };
        r.sample_memory();
        Ok(r)
    }

    pub fn device(&self) -> &D {
        &self.engine.backend
    }

    pub fn summary(&self) -> KilnModel {
        KilnModel {
            load_s: self.load_s,
            vram_baseline_bytes: self.baseline,
            vram_peak_bytes: self.peak,
            vram_peak_over_baseline_bytes: self
                .peak
                .zip(self.baseline)
                .map(|(p, b)| p.saturating_sub(b)),
            vram_process_bytes: None, // needs a reading from before the CUDA context: `measure_all`
        }
    }

    pub fn run(&mut self, spec: &TestSpec) -> Result<KilnSample> {
        match spec.kind {
            TestKind::Pp => self.pp(spec.n),
            TestKind::Tg => self.tg(spec.n, context(spec)),
        }
    }

    fn sample_memory(&mut self) {
        if let Some(u) = self.engine.backend.used_bytes() {
            self.peak = Some(self.peak.map_or(u, |p| p.max(u)));
        }
    }

    /// The first `n` benchmark tokens from position 0, in the engine's prefill chunks; returns
    /// the last position's logits (still on the device, maybe still being computed).
    /// One forward step as the engine runs it (through `Backend::step`, so CUDA decode steps
    /// are recorded once and replayed as graphs).
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<D::Tensor> {
        let model = &self.engine.model;
        self.engine
            .backend
            .step(&mut self.cache, tokens, pos, &mut |b, c| {
                model.forward(b, c, tokens, pos, Logits::Last)
            })
    }

    fn prefill(&mut self, n: usize) -> Result<D::Tensor> {
        let mut logits = None;
        let tokens = self.tokens[..n].to_vec();
        for (i, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let pos = i * PREFILL_CHUNK;
            logits = Some(self.forward(chunk, pos)?);
        }
        logits.context("empty prefill")
    }

    fn argmax(&self, logits: &D::Tensor) -> Result<u32> {
        self.engine
            .backend
            .argmax(logits)?
            .first()
            .copied()
            .context("argmax of empty logits")
    }

    fn pp(&mut self, n: usize) -> Result<KilnSample> {
        let t = Instant::now();
        let logits = self.prefill(n)?;
        self.engine.backend.sync()?;
        let pp_s = t.elapsed().as_secs_f64();
        self.argmax(&logits)?;
        let ttft_ms = t.elapsed().as_secs_f64() * 1e3;
        self.sample_memory();
        Ok(KilnSample {
            tps: n as f64 / pp_s,
            ttft_ms: Some(ttft_ms),
            step_ms: Vec::new(),
        })
    }

    /// `ctx` tokens prefilled (not timed), then `n` greedy decode steps, each timed from the
    /// forward pass to its token id on the host.
    fn tg(&mut self, n: usize, ctx: usize) -> Result<KilnSample> {
        let logits = self.prefill(ctx)?;
        let mut tok = self.argmax(&logits)?;
        self.sample_memory();
        let mut step_ms = Vec::with_capacity(n);
        for pos in ctx..ctx + n {
            let t = Instant::now();
            let logits = self.forward(&[tok], pos)?;
            tok = self.argmax(&logits)?;
            step_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        self.sample_memory();
        let total_s: f64 = step_ms.iter().sum::<f64>() / 1e3;
        Ok(KilnSample {
            tps: n as f64 / total_s,
            ttft_ms: None,
            step_ms,
        })
    }
}
