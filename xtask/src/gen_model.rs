//! `cargo xtask gen-model`: synthetic GGUF models with real architecture shapes, llama.cpp's
//! tensor names and metadata keys, an embedded BPE vocabulary and deterministic random weights,
//! so benchmarks can run on machines that cannot download models.
//!
//! Speed: quantized blocks are written directly (random quants, small random f16 scales), never
//! quantized from f32. Each tensor is cut into fixed chunks of `CHUNK_BLOCKS` blocks seeded from
//! (seed, tensor index, chunk index), so the bytes do not depend on the thread count; segments of
//! chunks are filled on all cores while a writer thread streams the previous segment to disk.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use half::f16;
use kiln_host::gguf::{GgmlType, GgufWriter, Value};

use crate::presets::{self, Arch, Init, PRESETS, Preset, TensorSpec};
use crate::vocab::Qwen3Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Quant {
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q5_0")]
    Q5_0,
    #[value(name = "q5_1")]
    Q5_1,
    /// llama.cpp's Q4_K_M mixture: Q6_K for `output.weight` and for `attn_v`/`ffn_down` in the
    /// layers its `use_more_bits` picks, Q4_K for the other matrices (Q8_0 for rows that are
    /// not whole 256-element super-blocks).
    #[value(name = "q4_k_m")]
    Q4KM,
    /// llama.cpp's Q5_K_M mixture: as Q4_K_M with Q5_K for the other matrices.
    #[value(name = "q5_k_m")]
    Q5KM,
}

impl Quant {
    fn ggml(self) -> GgmlType {
        match self {
            Quant::Q4_0 => GgmlType::Q4_0,
            Quant::Q8_0 => GgmlType::Q8_0,
            Quant::Q5_0 => GgmlType::Q5_0,
            Quant::Q5_1 => GgmlType::Q5_1,
            Quant::Q4KM => GgmlType::Q4_K,
            Quant::Q5KM => GgmlType::Q5_K,
        }
    }
    /// The tensors of preset `p` with this quantization's type for each.
    fn specs(self, p: &Preset) -> Vec<TensorSpec> {
        let mut specs = p.tensors(self.ggml());
        if matches!(self, Quant::Q4KM | Quant::Q5KM) {
            let n = p.n_layer as usize;
            // llama.cpp's `use_more_bits`: the first and last eighth, and every third between.
            let more_bits = |i: usize| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
            for t in specs.iter_mut().filter(|t| t.ty == self.ggml()) {
                let layer = t
                    .name
                    .strip_prefix("blk.")
                    .and_then(|r| r.split('.').next()?.parse().ok());
                let six = t.name == "output.weight"
                    || (["attn_v.", "ffn_down"].iter().any(|k| t.name.contains(k))
                        && layer.is_some_and(more_bits));
                if six {
                    t.ty = GgmlType::Q6_K;
                }
                // Rows that are not whole 256-element super-blocks (small experts): Q8_0, as
                // llama.cpp falls back to a 32-element type for them.
                if t.dims[0] % 256 != 0 {
                    t.ty = GgmlType::Q8_0;
                }
            }
        }
        specs
    }
    /// `general.file_type` (llama.cpp's `LLAMA_FTYPE_MOSTLY_*`).
    fn file_type(self) -> u32 {
        match self {
            Quant::Q4_0 => 2,
            Quant::Q8_0 => 7,
            Quant::Q5_0 => 8,
            Quant::Q5_1 => 9,
            Quant::Q4KM => 15,
            Quant::Q5KM => 17,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Architecture preset (see --list).
    #[arg(long, required_unless_present = "list")]
    preset: Option<String>,
    /// Type of the weight matrices (norms and the MoE router stay F32).
    #[arg(long, value_enum, default_value = "q4_0")]
    quant: Quant,
    /// Output GGUF path.
    #[arg(long, required_unless_present = "list")]
    out: Option<PathBuf>,
    /// Seed of the random weights: the same seed gives the same bytes.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print the presets with parameter counts and file sizes, then exit.
    #[arg(long)]
    list: bool,
}

pub fn run(a: Args) -> Result<()> {
    let tok = Qwen3Tokenizer::load()?;
    if a.list {
        return list(&tok);
    }
    let (Some(name), Some(out)) = (a.preset, a.out) else {
        bail!("--preset and --out are required (or --list)");
    };
    let Some(p) = presets::find(&name) else {
        bail!("unknown preset {name:?}; presets: {}", presets::names());
    };
    let start = Instant::now();
    let bytes = generate(p, a.quant, a.seed, &out, &tok, true)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "wrote {}: {} {:?}, {:.2} GB in {secs:.1} s ({:.2} GB/s)",
        out.display(),
        p.name,
        a.quant,
        bytes as f64 / 1e9,
        bytes as f64 / 1e9 / secs
    );
    Ok(())
}

fn list(tok: &Qwen3Tokenizer) -> Result<()> {
    println!(
        "{:<14} {:<9} {:>6} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10}  about",
        "preset", "arch", "layers", "embd", "params", "active", "q4_0", "q8_0", "q4_k_m"
    );
    for p in PRESETS {
        let (total, active) = p.param_counts();
        let size = |q| file_size(p, q, tok).map(|b| format!("{:.2} GB", b as f64 / 1e9));
        println!(
            "{:<14} {:<9} {:>6} {:>6} {:>8.3}B {:>8.3}B {:>10} {:>10} {:>10}  {}",
            p.name,
            p.arch.gguf_name(),
            p.n_layer,
            p.n_embd,
            total as f64 / 1e9,
            active as f64 / 1e9,
            size(Quant::Q4_0)?,
            size(Quant::Q8_0)?,
            size(Quant::Q4KM)?,
            p.about
        );
    }
    Ok(())
}

/// Exact size of the file `generate` writes.
pub fn file_size(p: &Preset, q: Quant, tok: &Qwen3Tokenizer) -> Result<u64> {
    let specs = q.specs(p);
    let w = writer(p, q, 0, &specs, tok)?;
    let align = u64::from(w.alignment());
    let header = w.begin(std::io::sink())?.data_offset();
    Ok(header
        + specs
            .iter()
            .map(|t| t.n_bytes().div_ceil(align) * align)
            .sum::<u64>())
}

/// Declares the metadata and tensors of preset `p`.
fn writer(
    p: &Preset,
    q: Quant,
    seed: u64,
    specs: &[TensorSpec],
    tok: &Qwen3Tokenizer,
) -> Result<GgufWriter> {
    let mut w = GgufWriter::new();
    let a = p.arch.gguf_name();
    let mut meta: Vec<(String, Value)> = Vec::new();
    let mut kv = |k: &str, v: Value| meta.push((k.to_string(), v));
    let u = |x: u64| Value::U32(x as u32);
    kv("general.architecture", Value::String(a.into()));
    kv(
        "general.name",
        Value::String(format!("kiln synthetic {}: {}", p.name, p.about)),
    );
    kv(
        "general.description",
        Value::String(format!(
            "random weights written by `cargo xtask gen-model --preset {} --quant {} --seed {seed}`; \
             not a trained model",
            p.name,
            format!("{q:?}").to_lowercase()
        )),
    );
    kv("general.file_type", Value::U32(q.file_type()));
    kv("general.quantization_version", Value::U32(2));
    kv("general.alignment", Value::U32(32));
    let k = |s: &str| format!("{a}.{s}");
    kv(&k("block_count"), u(p.n_layer));
    kv(&k("context_length"), Value::U32(p.n_ctx));
    kv(&k("embedding_length"), u(p.n_embd));
    kv(&k("feed_forward_length"), u(p.n_ff));
    kv(&k("attention.head_count"), u(p.n_head));
    kv(&k("attention.head_count_kv"), u(p.n_kv_head));
    kv(&k("attention.key_length"), u(p.head_dim));
    kv(&k("attention.value_length"), u(p.head_dim));
    kv(&k("rope.freq_base"), Value::F32(p.rope_base));
    kv(
        &k("attention.layer_norm_rms_epsilon"),
        Value::F32(p.rms_eps),
    );
    if p.arch == Arch::Llama {
        kv(&k("rope.dimension_count"), u(p.head_dim));
        kv(&k("vocab_size"), u(p.n_vocab));
    }
    if let Some(m) = p.moe {
        kv(&k("expert_count"), u(m.n_expert));
        kv(&k("expert_used_count"), u(m.n_expert_used));
        kv(&k("expert_feed_forward_length"), u(m.n_ff_exp));
    }
    for (key, v) in tok.metadata(p.vocab, p.n_vocab)? {
        kv(key, v);
    }
    for (key, v) in meta {
        w.add_metadata(key, v)?;
    }
    for t in specs {
        w.add_tensor(t.name.as_str(), &t.dims, t.ty)?;
    }
    Ok(w)
}

/// Blocks per independently seeded chunk. Part of the output format: changing it changes the
/// bytes a seed produces.
const CHUNK_BLOCKS: usize = 8192;
/// Chunks generated in parallel before they are handed to the writer thread.
const SEGMENT_CHUNKS: usize = 256;

/// Writes preset `p` to `out` (through `out.partial`, renamed when complete) and returns the
/// file size.
pub fn generate(
    p: &Preset,
    q: Quant,
    seed: u64,
    out: &Path,
    tok: &Qwen3Tokenizer,
    progress: bool,
) -> Result<u64> {
    let specs = q.specs(p);
    let w = writer(p, q, seed, &specs, tok)?;
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let file = File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let stream = w.begin(BufWriter::with_capacity(16 << 20, file))?;
    let total: u64 = specs.iter().map(TensorSpec::n_bytes).sum();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());

    let result = std::thread::scope(|s| -> Result<()> {
        // Two segments in flight: one being written while the next is generated.
        let (tx, rx) = sync_channel::<(usize, Vec<u8>)>(1);
        // Written buffers go back for reuse: saves page-faulting fresh memory for every segment.
        let (spare_tx, spare_rx) = sync_channel::<Vec<u8>>(4);
        let specs = &specs;
        let writer = s.spawn(move || -> Result<()> {
            let mut stream = stream;
            let (mut done, mut shown) = (0u64, 0u64);
            for (ti, buf) in rx {
                stream.write_tensor_chunk(&specs[ti].name, &buf)?;
                done += buf.len() as u64;
                let _ = spare_tx.try_send(buf);
                if progress && done * 10 / total.max(1) > shown {
                    shown = done * 10 / total.max(1);
                    eprint!("\r{}%", shown * 10);
                }
            }
            if progress {
                eprintln!();
            }
            stream.finish()?;
            Ok(())
        });
        'tensors: for (ti, t) in specs.iter().enumerate() {
            let block = t.ty.block().1;
            let chunk_bytes = CHUNK_BLOCKS * block;
            let n_bytes = t.n_bytes() as usize;
            let mut first = 0usize;
            while first * chunk_bytes < n_bytes {
                let len = (SEGMENT_CHUNKS * chunk_bytes).min(n_bytes - first * chunk_bytes);
                let mut buf = spare_rx.try_recv().unwrap_or_default();
                fill_segment(
                    t,
                    seed,
                    ti as u64,
                    first as u64,
                    &mut buf,
                    len,
                    chunk_bytes,
                    threads,
                );
                if tx.send((ti, buf)).is_err() {
                    break 'tensors; // the writer failed; its error is reported below
                }
                first += SEGMENT_CHUNKS;
            }
        }
        drop(tx);
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer thread panicked"))?
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e.context(format!("writing {}", partial.display())));
    }
    std::fs::rename(&partial, out)
        .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?;
    Ok(std::fs::metadata(out)?.len())
}

/// Fills `buf` with `len` bytes of tensor `t` starting at chunk `first`, the chunks spread over
/// up to `threads` threads.
#[allow(clippy::too_many_arguments)]
fn fill_segment(
    t: &TensorSpec,
    seed: u64,
    ti: u64,
    first: u64,
    buf: &mut Vec<u8>,
    len: usize,
    chunk_bytes: usize,
    threads: usize,
) {
    // Every byte is overwritten below; resize only zeroes growth.
    buf.resize(len, 0);
    let mut chunks: Vec<(u64, &mut [u8])> = buf
        .chunks_mut(chunk_bytes)
        .enumerate()
        .map(|(i, c)| (first + i as u64, c))
        .collect();
    if chunks.len() == 1 || threads == 1 {
        for (ci, c) in chunks {
            fill_chunk(t, Rng::new(seed, ti, ci), c);
        }
    } else {
        let per = chunks.len().div_ceil(threads);
        std::thread::scope(|s| {
            for group in chunks.chunks_mut(per) {
                s.spawn(move || {
                    for (ci, c) in group.iter_mut() {
                        fill_chunk(t, Rng::new(seed, ti, *ci), c);
                    }
                });
            }
        });
    }
}

/// Standard deviation of a Q4_0 quant once nibble 0 (-8) is folded onto 8 (0): values -7..=7,
/// 0 twice as likely, E[v²] = 2·140/16.
const Q4_STD: f32 = 4.1833;
/// Standard deviation of a Q8_0 quant: uniform on -127..=127 (-128 folded onto -127).
const Q8_STD: f32 = 73.6;

fn fill_chunk(t: &TensorSpec, mut rng: Rng, out: &mut [u8]) {
    match (t.init, t.ty) {
        (Init::Weight { sigma }, GgmlType::Q4_0) => {
            for b in out.chunks_exact_mut(18) {
                b[..2].copy_from_slice(&rng.scale(sigma / Q4_STD).to_le_bytes());
                b[2..10].copy_from_slice(&no_zero_nibbles(rng.next()).to_le_bytes());
                b[10..18].copy_from_slice(&no_zero_nibbles(rng.next()).to_le_bytes());
            }
        }
        (Init::Weight { sigma }, GgmlType::Q8_0) => {
            for b in out.chunks_exact_mut(34) {
                b[..2].copy_from_slice(&rng.scale(sigma / Q8_STD).to_le_bytes());
                for q in b[2..].chunks_exact_mut(8) {
                    q.copy_from_slice(&rng.next().to_le_bytes());
                }
                for q in &mut b[2..] {
                    if *q == 0x80 {
                        *q = 0x81; // keep the distribution symmetric
                    }
                }
            }
        }
        (Init::Weight { sigma }, ty @ (GgmlType::Q5_0 | GgmlType::Q5_1)) => {
            // Uniform values of standard deviation sigma through the reference quantizer:
            // slower than random codes, but these formats are only generated to test them.
            for b in out.chunks_exact_mut(ty.block().1) {
                let x: [f32; 32] =
                    std::array::from_fn(|_| (rng.unit() * 2.0 - 1.0) * sigma * 3f32.sqrt());
                kiln_host::quant::quantize_row(ty, &x, b).expect("one whole block");
            }
        }
        (Init::Weight { sigma }, ty @ (GgmlType::Q4_K | GgmlType::Q5_K)) => {
            // value = d·sc·q − dmin·m with m = sc and dmin = d·(mean code): d·sc·(q − mean),
            // symmetric. Q5_K's fifth bits (bytes 16..48) are random like its nibbles.
            let (bytes, mean, std) = match ty {
                GgmlType::Q4_K => (144, 7.5, Q4K_STD),
                _ => (176, 15.5, Q5K_STD),
            };
            for b in out.chunks_exact_mut(bytes) {
                let sc: [u8; 8] = std::array::from_fn(|_| 32 + (rng.next() % 32) as u8);
                let d = rng.scale(sigma / (std * 47.5));
                b[..2].copy_from_slice(&d.to_le_bytes());
                b[2..4].copy_from_slice(&f16::from_f32(mean * d.to_f32()).to_le_bytes());
                b[4..16].copy_from_slice(&pack_k4_scales(&sc, &sc));
                for q in b[16..].chunks_exact_mut(8) {
                    q.copy_from_slice(&rng.next().to_le_bytes());
                }
            }
        }
        (Init::Weight { sigma }, GgmlType::Q6_K) => {
            for b in out.chunks_exact_mut(210) {
                // value = d·sc·(q − 32), q uniform on 0..64, sc on 32..112.
                for q in b[..192].chunks_exact_mut(8) {
                    q.copy_from_slice(&rng.next().to_le_bytes());
                }
                for sc in &mut b[192..208] {
                    *sc = 32 + (rng.next() % 80) as u8;
                }
                b[208..].copy_from_slice(&rng.scale(sigma / (Q6K_STD * 72.0)).to_le_bytes());
            }
        }
        (Init::DenseF32 { sigma }, GgmlType::F32) => {
            for x in out.chunks_exact_mut(4) {
                // Uniform on ±sigma·√3 has standard deviation sigma.
                let v = (rng.unit() * 2.0 - 1.0) * sigma * 3f32.sqrt();
                x.copy_from_slice(&v.to_le_bytes());
            }
        }
        (Init::Norm, GgmlType::F32) => {
            for x in out.chunks_exact_mut(4) {
                let v = 1.0 + (rng.unit() - 0.5) * 0.2;
                x.copy_from_slice(&v.to_le_bytes());
            }
        }
        (init, ty) => unreachable!("{}: no generator for {init:?} as {}", t.name, ty.name()),
    }
}

/// Standard deviation of a Q4_K code less its mean (uniform on 0..16) and of a Q6_K code less
/// 32 (uniform on 0..64).
const Q4K_STD: f32 = 4.61;
const Q6K_STD: f32 = 18.5;
/// Of a Q5_K code less its mean (uniform on 0..32).
const Q5K_STD: f32 = 9.23;

/// Q4_K/Q5_K's 12 scale bytes from 6-bit scales and minimums (the inverse of
/// `kernels_gpu::quant::get_scale_min_k4`): sub-blocks 0..4 in the low 6 bits of bytes j / j+4,
/// 4..8 as a nibble each of byte j+4 plus two bits on top of bytes j−4 / j.
fn pack_k4_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for j in 0..4 {
        b[j] = (sc[j] & 63) | (sc[j + 4] >> 4) << 6;
        b[j + 4] = (m[j] & 63) | (m[j + 4] >> 4) << 6;
        b[j + 8] = (sc[j + 4] & 0xf) | (m[j + 4] & 0xf) << 4;
    }
    b
}

/// Replaces each zero nibble with 8, so Q4_0 quants (nibble - 8) are symmetric around zero.
fn no_zero_nibbles(x: u64) -> u64 {
    const LOW: u64 = 0x1111_1111_1111_1111;
    let mut any = x | (x >> 1);
    any |= any >> 2;
    let zero = !any & LOW;
    x | (zero << 3)
}

/// SplitMix64: tiny, fast, and good enough for random weights.
struct Rng(u64);

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    fn new(seed: u64, tensor: u64, chunk: u64) -> Self {
        Rng(mix(
            mix(mix(seed) ^ tensor) ^ chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform on [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
    /// A block scale: `base` times a factor uniform on [0.75, 1.25), as f16.
    fn scale(&mut self, base: f32) -> f16 {
        f16::from_f32(base * (0.75 + 0.5 * self.unit()))
    }
}

#[cfg(test)]
mod tests;
