//! `kiln`: command-line front end over the host crate (generate, chat, serve, info, tokenize).
//!
//! stdout carries only model output (streamed, flushed per piece); everything else (load
//! messages, speed summaries, errors) goes to stderr. Errors are one line and a non-zero exit.

use std::collections::BTreeMap;
use std::io::{self, BufRead, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kiln_host::backend::Backend;
use kiln_host::backend::cpu::Cpu;
use kiln_host::backend::cuda::Cuda;
use kiln_host::chat::{ChatTemplate, Message};
use kiln_host::engine::{Engine, GenParams, Generation};
use kiln_host::gguf::GgufFile;
use kiln_host::sampling::SamplerConfig;
use kiln_host::steering::{self, ControlVectorFile};
use kiln_host::tokenizer::Tokenizer;

mod serve;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "GGUF LLM inference on the CPU or an NVIDIA GPU (kernels written in Rust)"
)]
struct Cli {
    /// CPU threads (default: all cores).
    #[arg(short = 't', long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Complete a prompt (from -p or stdin); the completion streams to stdout.
    Generate(GenerateArgs),
    /// Interactive multi-turn chat with the model's template; one user turn per stdin line.
    Chat(ChatArgs),
    /// An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, streaming).
    Serve(ServeArgs),
    /// Perplexity over a text file, scored as llama.cpp's llama-perplexity scores it (windows
    /// of -c tokens, default 512, each from an empty cache; the second half of each is scored).
    Perplexity(PerplexityArgs),
    /// Print a model's architecture, shapes, quantization and tokenizer.
    Info {
        /// GGUF file.
        file: PathBuf,
    },
    /// Tokenize stdin with the model's tokenizer.
    Tokenize {
        #[arg(short, long)]
        model: PathBuf,
        /// Print only the ids, as `[1, 2, 3]`.
        #[arg(long)]
        ids: bool,
        /// Prepend the BOS token.
        #[arg(long)]
        bos: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Device {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Args)]
struct ModelArgs {
    /// GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// Where to run: auto picks CUDA when available, else the CPU.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Context size (KV cache positions); default: the model's training context.
    #[arg(short = 'c', long = "ctx-size")]
    ctx: Option<usize>,
    /// Keep matmul activations in f32 instead of quantizing them to 8 bits (llama.cpp's way):
    /// slower, but CPU and GPU then agree to float rounding and give the same greedy text.
    #[arg(long)]
    f32_activations: bool,
    /// Round every CPU op as llama.cpp's CPU backend does (AVX-512 build): the same logits, so
    /// the same greedy tokens as llama.cpp; attention then accumulates in f16 and runs slower.
    /// CPU only (`auto` then picks the CPU).
    #[arg(long)]
    llama_numerics: bool,
    /// Steer with a control vector (llama.cpp's control-vector GGUF: `direction.N` tensors
    /// added to the residual stream after layer N); repeatable, the files add up.
    #[arg(long, value_name = "FILE")]
    control_vector: Vec<PathBuf>,
    /// A control vector times SCALE (negative steers away); repeatable.
    #[arg(long, num_args = 2, value_names = ["FILE", "SCALE"])]
    control_vector_scaled: Vec<String>,
    /// Apply control vectors to layers START..=END only (default: all).
    #[arg(long, num_args = 2, value_names = ["START", "END"])]
    control_vector_layer_range: Vec<usize>,
}

impl ModelArgs {
    /// The control-vector files and scales of `--control-vector` and `--control-vector-scaled`.
    fn control_vectors(&self) -> Result<Vec<ControlVectorFile>> {
        let mut files: Vec<ControlVectorFile> = self
            .control_vector
            .iter()
            .map(|p| ControlVectorFile {
                path: p.clone(),
                scale: 1.0,
            })
            .collect();
        for pair in self.control_vector_scaled.chunks_exact(2) {
            let scale = pair[1].parse().with_context(|| {
                format!(
                    "--control-vector-scaled {} {}: SCALE is not a number",
                    pair[0], pair[1]
                )
            })?;
            files.push(ControlVectorFile {
                path: PathBuf::from(&pair[0]),
                scale,
            });
        }
        Ok(files)
    }
}

#[derive(Args, Clone)]
struct SampleArgs {
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    n: usize,
    /// Temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens below this fraction of the top probability (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalty on recently seen tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// RNG seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Stop when the output contains this text (repeatable).
    #[arg(long)]
    stop: Vec<String>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// Prompt text; read from stdin when absent.
    #[arg(short, long)]
    prompt: Option<String>,
    /// Wrap the prompt as a user turn in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    system: Option<String>,
    /// Print one JSON object (prompt, completion, token ids, timings) instead of streaming.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// System message.
    #[arg(long)]
    system: Option<String>,
}

#[derive(Args)]
struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score (UTF-8); read from stdin when absent.
    #[arg(short, long)]
    file: Option<PathBuf>,
    /// Score at most this many windows (default: every whole window of the text).
    #[arg(long)]
    chunks: Option<usize>,
    /// Print one JSON object instead of the summary line.
    #[arg(long)]
    json: bool,
}

/// llama-perplexity's usual window, so figures compare with the ones people publish.
const PERPLEXITY_WINDOW: usize = 512;

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Defaults for requests that leave a setting out (`-n` is their `max_tokens`).
    #[command(flatten)]
    sample: SampleArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match in_pool(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// `kiln generate ... | head` closing the pipe early is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Runs the command on a rayon worker thread: the CPU backend's parallel ops then start from
/// inside the pool, so the caller computes its share instead of sleeping on a latch while the
/// pool is woken for every op (measurable at ~200 parallel ops per token).
fn in_pool(cli: Cli) -> Result<()> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(t) = cli.threads {
        b = b.num_threads(t.max(1));
    }
    b.build()
        .context("starting the thread pool")?
        .install(move || run(cli))
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Generate(a) => match pick_backend(&a.model)? {
            Picked::Cpu(b) => generate(b, &a),
            Picked::Cuda(b) => generate(b, &a),
        },
        Cmd::Chat(a) => match pick_backend(&a.model)? {
            Picked::Cpu(b) => chat(b, &a),
            Picked::Cuda(b) => chat(b, &a),
        },
        Cmd::Serve(a) => match pick_backend(&a.model)? {
            Picked::Cpu(b) => serve_model(b, a),
            Picked::Cuda(b) => serve_model(b, a),
        },
        Cmd::Perplexity(mut a) => {
            a.model.ctx = Some(a.model.ctx.unwrap_or(PERPLEXITY_WINDOW));
            match pick_backend(&a.model)? {
                Picked::Cpu(b) => perplexity(b, &a),
                Picked::Cuda(b) => perplexity(b, &a),
            }
        }
        Cmd::Info { file } => info(&file),
        Cmd::Tokenize { model, ids, bos } => tokenize(&model, ids, bos),
    }
}

#[allow(clippy::large_enum_variant)] // made once per process
enum Picked {
    Cpu(Cpu),
    Cuda(Cuda),
}

/// The one place a backend is chosen; everything after is generic over it. `auto` takes the
/// GPU when a driver and a device are there, and says why on stderr when it falls back;
/// `--llama-numerics` exists on the CPU only, so it takes the CPU.
fn pick_backend(m: &ModelArgs) -> Result<Picked> {
    let cpu = || {
        let c = if m.f32_activations {
            Cpu::new().with_f32_activations()
        } else {
            Cpu::new()
        };
        if m.llama_numerics {
            c.with_llama_numerics()
        } else {
            c
        }
    };
    let cuda = || {
        Cuda::new(kiln::PTX_MODULES, 0).map(|c| {
            if m.f32_activations {
                c.with_f32_activations()
            } else {
                c
            }
        })
    };
    if m.llama_numerics {
        ensure!(
            m.device != Device::Cuda,
            "--llama-numerics runs on the CPU backend only"
        );
        return Ok(Picked::Cpu(cpu()));
    }
    match m.device {
        Device::Cpu => Ok(Picked::Cpu(cpu())),
        Device::Cuda => Ok(Picked::Cuda(cuda().context("--device cuda")?)),
        Device::Auto if !kiln_host::cuda::driver_present() => Ok(Picked::Cpu(cpu())),
        Device::Auto => match cuda() {
            Ok(c) => Ok(Picked::Cuda(c)),
            Err(e) => {
                eprintln!("kiln: no usable GPU ({e:#}); running on the CPU");
                Ok(Picked::Cpu(cpu()))
            }
        },
    }
}

fn load<B: Backend + 'static>(backend: B, m: &ModelArgs) -> Result<Engine<B>> {
    ensure_file(&m.model)?;
    let files = m.control_vectors()?;
    let mut engine = Engine::load(backend, &m.model, m.ctx)
        .with_context(|| format!("loading {}", m.model.display()))?;
    if !files.is_empty() {
        let c = engine.model.config();
        let range = match m.control_vector_layer_range[..] {
            [a, b] => Some((a, b)),
            _ => None,
        };
        let dirs = steering::load(&files, c.n_layer, c.n_embd, range)?;
        let n = dirs.iter().filter(|d| d.is_some()).count();
        engine.set_control_vectors(&dirs)?;
        eprintln!(
            "kiln: steering {n} layers with {} control vector file(s)",
            files.len()
        );
    }
    let c = engine.model.config();
    eprintln!(
        "kiln: {} ({}, {} layers, {} embd) on {}",
        m.model.display(),
        c.arch,
        c.n_layer,
        c.n_embd,
        engine.backend.name()
    );
    Ok(engine)
}

fn ensure_file(p: &Path) -> Result<()> {
    if !p.is_file() {
        bail!(
            "model file {} not found (run scripts/fetch-model.sh?)",
            p.display()
        );
    }
    Ok(())
}

fn params(s: &SampleArgs) -> GenParams {
    let seed = s.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    GenParams {
        max_tokens: s.n,
        sampler: SamplerConfig {
            temperature: s.temp,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            seed,
            ..SamplerConfig::default()
        },
        stop: s.stop.clone(),
        ignore_eos: s.ignore_eos,
    }
}

/// Tokens of `text` as a prompt: BOS per the model's default unless the text already starts
/// with it (chat templates often spell it out).
fn encode_prompt(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = tok.encode(text, false)?;
    if tok.add_bos_default()
        && let Some(bos) = tok.bos()
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
    Ok(ids)
}

fn template(engine: &Engine<impl Backend>) -> Result<&ChatTemplate> {
    engine
        .template
        .as_ref()
        .context("this model has no chat template (tokenizer.chat_template)")
}

fn summary(g: &Generation) {
    let t = &g.timings;
    eprintln!(
        "\nkiln: prompt {} tokens ({} run) in {:.3}s = {:.1} t/s | generated {} tokens, {} decode steps in {:.3}s = {:.1} t/s | stop: {:?}",
        t.prompt_tokens,
        t.prefill_tokens,
        t.prefill_s,
        t.prefill_tps(),
        g.tokens.len(),
        t.decode_tokens,
        t.decode_s,
        t.decode_tps(),
        g.stop
    );
}

fn generate<B: Backend + 'static>(backend: B, a: &GenerateArgs) -> Result<()> {
    let prompt = match &a.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from stdin")?;
            s
        }
    };
    let mut engine = load(backend, &a.model)?;
    let text = if a.chat {
        let mut msgs = Vec::new();
        if let Some(sys) = &a.system {
            msgs.push(Message::new("system", sys));
        }
        msgs.push(Message::new("user", &prompt));
        template(&engine)?.render(&msgs, true)?
    } else {
        prompt.clone()
    };
    let ids = encode_prompt(&engine.tokenizer, &text)?;
    let p = params(&a.sample);
    let mut out = io::stdout().lock();
    let g = if a.json {
        engine.generate(&ids, &p, &mut |_| Ok(()))?
    } else {
        engine.generate(&ids, &p, &mut |piece| {
            out.write_all(piece.as_bytes())?;
            out.flush()?;
            Ok(())
        })?
    };
    if a.json {
        let j = serde_json::json!({
            "prompt": text,
            "completion": g.text,
            "prompt_tokens": ids,
            "tokens": g.tokens,
            "stop": g.stop,
            "timings": {
                "prompt_tokens": g.timings.prompt_tokens,
                "prefill_s": g.timings.prefill_s,
                "prefill_tps": g.timings.prefill_tps(),
                "decode_tokens": g.timings.decode_tokens,
                "decode_s": g.timings.decode_s,
                "decode_tps": g.timings.decode_tps(),
            },
        });
        writeln!(out, "{j}")?;
    } else {
        writeln!(out)?;
    }
    out.flush()?;
    summary(&g);
    Ok(())
}

fn chat<B: Backend + 'static>(backend: B, a: &ChatArgs) -> Result<()> {
    let mut engine = load(backend, &a.model)?;
    template(&engine)?;
    let interactive = io::stdin().is_terminal();
    if interactive {
        eprintln!("kiln: chat; one message per line, Ctrl-D to quit");
    }
    let mut msgs = Vec::new();
    if let Some(sys) = &a.system {
        msgs.push(Message::new("system", sys));
    }
    let mut p = params(&a.sample);
    let mut out = io::stdout().lock();
    let mut lines = io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        msgs.push(Message::new("user", line.trim()));
        let text = template(&engine)?.render(&msgs, true)?;
        let ids = encode_prompt(&engine.tokenizer, &text)?;
        let g = engine.generate(&ids, &p, &mut |piece| {
            out.write_all(piece.as_bytes())?;
            out.flush()?;
            Ok(())
        })?;
        writeln!(out)?;
        out.flush()?;
        if interactive {
            summary(&g);
        }
        msgs.push(Message::new("assistant", g.text.trim()));
        p.sampler.seed = p.sampler.seed.wrapping_add(1);
    }
    Ok(())
}

fn perplexity<B: Backend + 'static>(backend: B, a: &PerplexityArgs) -> Result<()> {
    let text = match &a.file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading the text file {} (UTF-8)", p.display()))?,
        None => io::read_to_string(io::stdin()).context("reading the text from stdin")?,
    };
    let window = a.model.ctx.unwrap_or(PERPLEXITY_WINDOW);
    let mut engine = load(backend, &a.model)?;
    let tok = &engine.tokenizer;
    let tokens = tok.encode(&text, tok.add_bos_default())?;
    let start = Instant::now();
    let score = engine.perplexity(&tokens, window, a.chunks, &mut |done, total, s| {
        eprintln!(
            "[{done}/{total}] perplexity {:.4} over {} tokens",
            s.perplexity(),
            s.count()
        );
    })?;
    let secs = start.elapsed().as_secs_f64();
    let windows = score.windows();
    if a.json {
        let j = serde_json::json!({
            "model": a.model.model.display().to_string(),
            "backend": engine.backend.name(),
            "text_tokens": tokens.len(),
            "window": window,
            "windows": windows,
            "scored_tokens": score.count(),
            "mean_nll": score.mean_nll(),
            "perplexity": score.perplexity(),
            "perplexity_stderr": score.perplexity_stderr(),
            "seconds": secs,
        });
        println!("{j}");
    } else {
        println!(
            "perplexity {:.4} ± {:.4} ({} windows of {window} tokens, {} scored, {})",
            score.perplexity(),
            score.perplexity_stderr(),
            windows,
            score.count(),
            engine.backend.name()
        );
        eprintln!(
            "kiln: {:.1} s, {:.1} tokens/s",
            secs,
            (windows * window) as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}

fn serve_model<B: Backend + 'static>(backend: B, a: ServeArgs) -> Result<()> {
    let engine = load(backend, &a.model)?;
    let id = a
        .model
        .model
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let addr = match a.host.contains(':') {
        true => format!("[{}]:{}", a.host, a.port), // an IPv6 address
        false => format!("{}:{}", a.host, a.port),
    };
    serve::serve(engine, &addr, id, a.sample)
}

fn info(path: &Path) -> Result<()> {
    ensure_file(path)?;
    let f = GgufFile::open(path)?;
    let size = std::fs::metadata(path)?.len();
    let arch = f.get_str("general.architecture").unwrap_or("(none)");
    let u = |k: &str| {
        f.get_u32(&format!("{arch}.{k}"))
            .map_or("-".to_string(), |v| v.to_string())
    };
    let fl = |k: &str| {
        f.get_f32(&format!("{arch}.{k}"))
            .map_or("-".to_string(), |v| v.to_string())
    };
    let mut o = io::stdout().lock();
    writeln!(
        o,
        "file:           {} ({:.1} MiB, GGUF v{})",
        path.display(),
        size as f64 / (1 << 20) as f64,
        f.version()
    )?;
    writeln!(o, "architecture:   {arch}")?;
    if let Ok(name) = f.get_str("general.name") {
        writeln!(o, "name:           {name}")?;
    }
    writeln!(o, "layers:         {}", u("block_count"))?;
    writeln!(o, "embedding:      {}", u("embedding_length"))?;
    writeln!(o, "feed-forward:   {}", u("feed_forward_length"))?;
    if f.get_u32(&format!("{arch}.expert_count")).is_ok() {
        writeln!(
            o,
            "experts:        {} ({} per token, width {})",
            u("expert_count"),
            u("expert_used_count"),
            u("expert_feed_forward_length")
        )?;
    }
    writeln!(
        o,
        "heads:          {} (kv {})",
        u("attention.head_count"),
        u("attention.head_count_kv")
    )?;
    let head_dim = match (
        f.get_u32(&format!("{arch}.attention.key_length")),
        f.get_u32(&format!("{arch}.embedding_length")),
        f.get_u32(&format!("{arch}.attention.head_count")),
    ) {
        (Ok(k), _, _) => k.to_string(),
        (_, Ok(e), Ok(h)) if h > 0 => format!("{} (embedding / heads)", e / h),
        _ => "-".to_string(),
    };
    writeln!(o, "head dim:       {head_dim}")?;
    writeln!(o, "context:        {}", u("context_length"))?;
    writeln!(o, "rope base:      {}", fl("rope.freq_base"))?;
    if let Ok(kind) = f.get_str(&format!("{arch}.rope.scaling.type")) {
        writeln!(
            o,
            "rope scaling:   {kind} (factor {}, original context {})",
            fl("rope.scaling.factor"),
            u("rope.scaling.original_context_length")
        )?;
    }
    if let Ok(t) = f.tensor("rope_freqs.weight") {
        writeln!(o, "rope freqs:     per-pair factors {:?}", t.dims)?;
    }
    writeln!(
        o,
        "rms eps:        {}",
        fl("attention.layer_norm_rms_epsilon")
    )?;
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    let mut params = 0u64;
    for t in f.tensors() {
        *types.entry(t.ggml_type.name()).or_default() += 1;
        params += t.dims.iter().product::<u64>();
    }
    let types: Vec<String> = types.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    writeln!(
        o,
        "tensors:        {} ({}), {:.1}M parameters",
        f.tensors().len(),
        types.join(", "),
        params as f64 / 1e6
    )?;
    let tok_model = f.get_str("tokenizer.ggml.model").unwrap_or("-");
    let pre = f.get_str("tokenizer.ggml.pre").unwrap_or("-");
    let vocab = f
        .get_str_array("tokenizer.ggml.tokens")
        .map_or(0, |t| t.len());
    writeln!(o, "tokenizer:      {tok_model} (pre {pre}), {vocab} tokens")?;
    writeln!(
        o,
        "chat template:  {}",
        if f.get_str("tokenizer.chat_template").is_ok() {
            "yes"
        } else {
            "no"
        }
    )?;
    let supported = kiln_host::models::SUPPORTED.contains(&arch);
    let runs = kiln_host::models::SUPPORTED.join(", ");
    match supported {
        true => writeln!(o, "supported:      yes")?,
        false => writeln!(o, "supported:      no (kiln runs {runs})")?,
    }
    Ok(())
}

fn tokenize(model: &Path, ids_only: bool, bos: bool) -> Result<()> {
    ensure_file(model)?;
    let f = GgufFile::open(model)?;
    let tok = Tokenizer::from_gguf(&f)?;
    let mut text = String::new();
    io::stdin()
        .read_to_string(&mut text)
        .context("reading stdin")?;
    let ids = tok.encode(&text, bos)?;
    let mut o = io::stdout().lock();
    if ids_only {
        let s: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        writeln!(o, "[{}]", s.join(", "))?;
    } else {
        for &id in &ids {
            writeln!(o, "{id:6} -> {:?}", tok.decode(&[id]))?;
        }
    }
    Ok(())
}
