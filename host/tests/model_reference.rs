//! Model executors on the CPU backend against a plain float64 forward pass written here, over tiny
//! synthetic llama and qwen3 models built in memory. The reference rounds keys and values to f16
//! because the KV cache is f16 by contract on every backend.

use std::collections::HashMap;
use std::sync::Arc;

use half::f16;
use kiln_host::backend::Backend;
use kiln_host::backend::cpu::Cpu;
use kiln_host::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use kiln_host::models::{self, Logits, Model};
use kiln_host::quant;

#[derive(Clone, Copy)]
struct Synth {
    arch: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_kv: usize,
    head_dim: usize,
    n_ff: usize,
    n_vocab: usize,
    ty: GgmlType,
    /// `attn_v` and `ffn_down` in this type instead (llama.cpp's *_K_M mixtures use Q6_K).
    v_down_ty: Option<GgmlType>,
    tied: bool,
    /// (experts, used per token, expert width): routed experts instead of the dense
    /// feed-forward (`qwen3moe`).
    experts: Option<(usize, usize, usize)>,
    /// `rope_freqs.weight` (Llama 3.1+): one divisor per rotary pair (`head_dim / 2`).
    rope_factors: Option<&'static [f32]>,
    /// `{arch}.rope.scaling.type` and `.factor` (the original context is `context_length`, 64).
    rope_scaling: Option<(&'static str, f32)>,
}

const EPS: f32 = 1e-5;
const BASE: f32 = 10_000.0;

const LLAMA: Synth = Synth {
    arch: "llama",
    n_layer: 2,
    n_embd: 64,
    n_head: 4,
    n_kv: 2,
    head_dim: 16,
    n_ff: 96,
    n_vocab: 50,
    ty: GgmlType::F32,
    v_down_ty: None,
    tied: true,
    experts: None,
    rope_factors: None,
    rope_scaling: None,
};

/// head_dim (32) != n_embd / n_head (16), as in real Qwen3 models; untied output.
const QWEN3: Synth = Synth {
    arch: "qwen3",
    n_layer: 2,
    n_embd: 64,
    n_head: 4,
    n_kv: 2,
    head_dim: 32,
    n_ff: 96,
    n_vocab: 50,
    ty: GgmlType::F32,
    v_down_ty: None,
    tied: false,
    experts: None,
    rope_factors: None,
    rope_scaling: None,
};

/// Qwen3-MoE: 8 experts of width 32, 2 per token, with QK-norm like QWEN3.
const QWEN3MOE: Synth = Synth {
    arch: "qwen3moe",
    experts: Some((8, 2, 32)),
    ..QWEN3
};

/// Deterministic values in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// K-quant blocks (kiln has no K-quant quantizer) from random bytes, with the f16 super-block
/// scales set so the values stay within ~±0.3 like the other formats' weights.
fn random_k_blocks(ty: GgmlType, bytes: &mut [u8], rng: &mut Rng) {
    for b in bytes.iter_mut() {
        *b = (rng.next().to_bits() >> 7) as u8;
    }
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let (_, block) = ty.block();
    for blk in bytes.chunks_exact_mut(block) {
        match ty {
            // d, dmin first: value = d·sc·q − dmin·m, sc, m < 64, q < 16.
            GgmlType::Q4_K | GgmlType::Q5_K => {
                blk[0..2].copy_from_slice(&f16(3e-4));
                blk[2..4].copy_from_slice(&f16(2e-4));
            }
            // d last: value = d·scale·(q − 32), scale an i8.
            _ => blk[block - 2..].copy_from_slice(&f16(7e-5)),
        }
    }
}

/// The GGUF bytes, plus every weight dequantized to f64 as the reference sees it.
fn build(s: &Synth) -> (Arc<GgufFile>, HashMap<String, Vec<f64>>) {
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let (q, kv) = (s.n_head * s.head_dim, s.n_kv * s.head_dim);
    // (name, rows, cols, is_norm)
    let mut specs: Vec<(String, usize, usize, bool)> = vec![
        ("token_embd.weight".into(), s.n_vocab, s.n_embd, false),
        ("output_norm.weight".into(), 1, s.n_embd, true),
    ];
    if !s.tied {
        specs.push(("output.weight".into(), s.n_vocab, s.n_embd, false));
    }
    for i in 0..s.n_layer {
        let b = |n: &str| format!("blk.{i}.{n}.weight");
        specs.extend([
            (b("attn_norm"), 1, s.n_embd, true),
            (b("attn_q"), q, s.n_embd, false),
            (b("attn_k"), kv, s.n_embd, false),
            (b("attn_v"), kv, s.n_embd, false),
            (b("attn_output"), s.n_embd, q, false),
            (b("ffn_norm"), 1, s.n_embd, true),
        ]);
        match s.experts {
            None => specs.extend([
                (b("ffn_gate"), s.n_ff, s.n_embd, false),
                (b("ffn_up"), s.n_ff, s.n_embd, false),
                (b("ffn_down"), s.n_embd, s.n_ff, false),
            ]),
            Some((n, _, ff)) => specs.extend([
                (b("ffn_gate_inp"), n, s.n_embd, false),
                (b("ffn_gate_exps"), n * ff, s.n_embd, false),
                (b("ffn_up_exps"), n * ff, s.n_embd, false),
                (b("ffn_down_exps"), n * s.n_embd, ff, false),
            ]),
        }
        if s.arch.starts_with("qwen3") {
            specs.push((b("attn_q_norm"), 1, s.head_dim, true));
            specs.push((b("attn_k_norm"), 1, s.head_dim, true));
        }
    }
    let a = s.arch;
    let mut w = GgufWriter::new();
    let meta = [
        ("general.architecture".to_string(), Value::String(a.into())),
        (format!("{a}.block_count"), Value::U32(s.n_layer as u32)),
        (format!("{a}.context_length"), Value::U32(64)),
        (format!("{a}.embedding_length"), Value::U32(s.n_embd as u32)),
        (
            format!("{a}.feed_forward_length"),
            Value::U32(s.n_ff as u32),
        ),
        (
            format!("{a}.attention.head_count"),
            Value::U32(s.n_head as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(s.n_kv as u32),
        ),
        (
            format!("{a}.attention.key_length"),
            Value::U32(s.head_dim as u32),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(BASE)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(EPS),
        ),
    ];
    for (k, v) in meta {
        w.add_metadata(k, v).unwrap();
    }
    if let Some((kind, factor)) = s.rope_scaling {
        w.add_metadata(format!("{a}.rope.scaling.type"), Value::String(kind.into()))
            .unwrap();
        w.add_metadata(format!("{a}.rope.scaling.factor"), Value::F32(factor))
            .unwrap();
    }
    if let Some((n, used, ff)) = s.experts {
        for (k, v) in [
            ("expert_count", n),
            ("expert_used_count", used),
            ("expert_feed_forward_length", ff),
        ] {
            w.add_metadata(format!("{a}.{k}"), Value::U32(v as u32))
                .unwrap();
        }
    }
    let mut data = Vec::new();
    let mut weights = HashMap::new();
    for (name, rows, cols, norm) in &specs {
        let v_down = name.contains("attn_v") || name.contains("ffn_down");
        // Norms and the MoE router stay f32, as in llama.cpp's files.
        let ty = match (*norm || name.contains("ffn_gate_inp"), s.v_down_ty) {
            (true, _) => GgmlType::F32,
            (false, Some(t)) if v_down => t,
            _ => s.ty,
        };
        let vals: Vec<f32> = (0..rows * cols)
            .map(|_| {
                if *norm {
                    1.0 + 0.3 * rng.next()
                } else {
                    0.2 * rng.next()
                }
            })
            .collect();
        let mut bytes = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                random_k_blocks(ty, &mut bytes, &mut rng)
            }
            _ => quant::quantize_row(ty, &vals, &mut bytes).unwrap(),
        }
        let mut deq = vec![0f32; rows * cols];
        quant::dequantize_row(ty, &bytes, &mut deq).unwrap();
        weights.insert(name.clone(), deq.iter().map(|&v| v as f64).collect());
        let dims: Vec<u64> = if *rows == 1 {
            vec![*cols as u64]
        } else if let (true, Some((n, _, _))) = (name.contains("_exps"), s.experts) {
            vec![*cols as u64, (*rows / n) as u64, n as u64]
        } else {
            vec![*cols as u64, *rows as u64]
        };
        w.add_tensor(name.clone(), &dims, ty).unwrap();
        data.push(bytes);
    }
    if let Some(f) = s.rope_factors {
        w.add_tensor("rope_freqs.weight", &[f.len() as u64], GgmlType::F32)
            .unwrap();
        data.push(f.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let file = GgufFile::from_bytes(w.to_vec(&refs).unwrap()).unwrap();
    (Arc::new(file), weights)
}

// ---------------------------------------------------------------------------------------------
// The reference: every step spelled out in f64.

fn matvec(w: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    let cols = x.len();
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64]) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|g| {
            let ms = g.iter().map(|v| v * v).sum::<f64>() / g.len() as f64;
            let r = 1.0 / (ms + EPS as f64).sqrt();
            g.iter()
                .zip(w)
                .map(move |(v, s)| v * r * s)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Rotates each head of `x` at `pos`, with the file's RoPE extensions as llama.cpp defines them:
/// per-pair divisors (`rope_freqs`), linear scaling (angles / factor), and YaRN (pairs below the
/// correction range keep their angle, pairs above are divided by the factor, a linear ramp
/// between; rotated values grow by 1 + 0.1·ln(factor)).
fn rope(x: &mut [f64], hd: usize, pos: usize, neox: bool, s: &Synth) {
    let (base, orig) = (BASE as f64, 64.0);
    let corr = |turns: f64| {
        hd as f64 * (orig / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (low, high) = (
        corr(32.0).floor().max(0.0),
        corr(1.0).ceil().min(hd as f64 - 1.0),
    );
    for head in x.chunks_mut(hd) {
        for i in 0..hd / 2 {
            let divisor = s.rope_factors.map_or(1.0, |f| f[i] as f64);
            let extrap = pos as f64 * base.powf(-2.0 * i as f64 / hd as f64) / divisor;
            let (theta, mscale) = match s.rope_scaling {
                None => (extrap, 1.0),
                Some(("linear", f)) => (extrap / f as f64, 1.0),
                Some(("yarn", f)) => {
                    let f = f as f64;
                    let keep = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                    (
                        extrap / f * (1.0 - keep) + extrap * keep,
                        1.0 + 0.1 * f.ln(),
                    )
                }
                Some((other, _)) => panic!("no reference for {other}"),
            };
            let (a, b) = if neox {
                (i, i + hd / 2)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = mscale * (x0 * theta.cos() - x1 * theta.sin());
            head[b] = mscale * (x0 * theta.sin() + x1 * theta.cos());
        }
    }
}

/// `down · (silu(gate · h) ⊙ (up · h))`; the widths follow from the slices.
fn swiglu(gate: &[f64], up: &[f64], down: &[f64], h: &[f64]) -> Vec<f64> {
    let ff = gate.len() / h.len();
    let gate = matvec(gate, h, ff);
    let up = matvec(up, h, ff);
    let act: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    matvec(down, &act, down.len() / ff)
}

fn f16_round(x: &mut [f64]) {
    for v in x {
        *v = f16::from_f64(*v).to_f64();
    }
}

/// Logits of every position of `tokens`.
fn reference(s: &Synth, w: &HashMap<String, Vec<f64>>, tokens: &[u32]) -> Vec<Vec<f64>> {
    reference_steered(s, w, tokens, &[])
}

/// [`reference`] with a control vector: `steer[l]` added to every position's residual stream
/// after block `l`.
fn reference_steered(
    s: &Synth,
    w: &HashMap<String, Vec<f64>>,
    tokens: &[u32],
    steer: &[Option<Vec<f32>>],
) -> Vec<Vec<f64>> {
    let qwen = s.arch.starts_with("qwen3");
    let hd = s.head_dim;
    let g = |n: &str| &w[n];
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| g("token_embd.weight")[t as usize * s.n_embd..][..s.n_embd].to_vec())
        .collect();
    for l in 0..s.n_layer {
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        for (p, x) in xs.iter().enumerate() {
            let h = rms_norm(x, g(&b("attn_norm")));
            let mut q = matvec(g(&b("attn_q")), &h, s.n_head * hd);
            let mut k = matvec(g(&b("attn_k")), &h, s.n_kv * hd);
            let mut v = matvec(g(&b("attn_v")), &h, s.n_kv * hd);
            if qwen {
                q = rms_norm(&q, g(&b("attn_q_norm")));
                k = rms_norm(&k, g(&b("attn_k_norm")));
            }
            rope(&mut q, hd, p, qwen, s);
            rope(&mut k, hd, p, qwen, s);
            f16_round(&mut k);
            f16_round(&mut v);
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for (p, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0.0; s.n_head * hd];
            for h in 0..s.n_head {
                let kvh = h / (s.n_head / s.n_kv);
                let q = &qs[p][h * hd..][..hd];
                let scores: Vec<f64> = (0..=p)
                    .map(|t| {
                        let k = &ks[t][kvh * hd..][..hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for t in 0..=p {
                    for d in 0..hd {
                        att[h * hd + d] += e[t] / sum * vs[t][kvh * hd + d];
                    }
                }
            }
            let o = matvec(g(&b("attn_output")), &att, s.n_embd);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms_norm(x, g(&b("ffn_norm")));
            let d = match s.experts {
                None => swiglu(g(&b("ffn_gate")), g(&b("ffn_up")), g(&b("ffn_down")), &h),
                Some((n, used, ff)) => {
                    // Softmax over the router's logits, the `used` largest, rescaled to sum 1.
                    let logits = matvec(g(&b("ffn_gate_inp")), &h, n);
                    let mut order: Vec<usize> = (0..n).collect();
                    order.sort_by(|&i, &j| logits[j].total_cmp(&logits[i]));
                    let chosen = &order[..used];
                    let z: f64 = chosen.iter().map(|&e| logits[e].exp()).sum();
                    let mut out = vec![0.0; s.n_embd];
                    for &e in chosen {
                        let part = |name: &str, len: usize| &g(&b(name))[e * len..(e + 1) * len];
                        let y = swiglu(
                            part("ffn_gate_exps", ff * s.n_embd),
                            part("ffn_up_exps", ff * s.n_embd),
                            part("ffn_down_exps", s.n_embd * ff),
                            &h,
                        );
                        for (o, v) in out.iter_mut().zip(y) {
                            *o += logits[e].exp() / z * v;
                        }
                    }
                    out
                }
            };
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
            if let Some(Some(dir)) = steer.get(l) {
                x.iter_mut().zip(dir).for_each(|(a, &b)| *a += b as f64);
            }
        }
    }
    let out = if s.tied {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    xs.iter()
        .map(|x| matvec(g(out), &rms_norm(x, g("output_norm.weight")), s.n_vocab))
        .collect()
}

// ---------------------------------------------------------------------------------------------

const TOKENS: [u32; 9] = [3, 17, 42, 0, 9, 9, 31, 48, 5];

fn kiln_all(model: &dyn Model<Cpu>, tokens: &[u32]) -> Vec<Vec<f32>> {
    let cpu = Cpu::new();
    let mut cache = cpu.kv_cache(&model.config().kv_spec(32)).unwrap();
    let logits = model
        .forward(&cpu, &mut cache, tokens, 0, Logits::All)
        .unwrap();
    let n = model.config().n_vocab;
    cpu.read(&logits)
        .unwrap()
        .chunks(n)
        .map(|r| r.to_vec())
        .collect()
}

/// max |a - b| / max |b| over all positions.
fn rel_err(a: &[Vec<f32>], b: &[Vec<f64>]) -> f64 {
    let scale = b.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()));
    diff / scale
}

/// Normalized mean squared error: sum (a - b)^2 / sum b^2.
fn nmse(a: &[Vec<f32>], b: &[Vec<f64>]) -> f64 {
    let num: f64 = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (*x as f64 - y).powi(2))
        .sum();
    num / b.iter().flatten().map(|y| y * y).sum::<f64>()
}

/// `bound` applies to the max relative error; `nmse_bound` to the NMSE.
fn check_against_reference(s: Synth, bound: f64, nmse_bound: f64) {
    let (file, weights) = build(&s);
    let model = models::load(&Cpu::new(), &file, &mut |_, _| {}).unwrap();
    let got = kiln_all(model.as_ref(), &TOKENS);
    let want = reference(&s, &weights, &TOKENS);
    assert_eq!(got.len(), want.len());
    let (err, nmse) = (rel_err(&got, &want), nmse(&got, &want));
    eprintln!(
        "{} {:?}: max rel err {err:.2e}, nmse {nmse:.2e}",
        s.arch, s.ty
    );
    assert!(
        err < bound,
        "{} {:?}: rel err {err:e} >= {bound:e}",
        s.arch,
        s.ty
    );
    assert!(
        nmse < nmse_bound,
        "{} {:?}: nmse {nmse:e} >= {nmse_bound:e}",
        s.arch,
        s.ty
    );
}

#[test]
fn llama_f32_matches_f64_reference() {
    check_against_reference(LLAMA, 1e-3, 1e-8);
}

#[test]
fn qwen3_f32_matches_f64_reference() {
    check_against_reference(QWEN3, 1e-3, 1e-8);
}

#[test]
fn qwen3moe_f32_matches_f64_reference() {
    check_against_reference(QWEN3MOE, 1e-3, 1e-8);
}

#[test]
fn llama_f16_matches_f64_reference() {
    check_against_reference(
        Synth {
            ty: GgmlType::F16,
            ..LLAMA
        },
        1e-3,
        1e-8,
    );
}

/// Quantized weights: the reference uses the same dequantized weights, so the remaining error
/// is the 8-bit quantization of activations inside each mat-vec (about 3e-3 relative per
/// mat-vec), compounded over two random (so poorly conditioned) layers.
#[test]
fn quantized_weights_match_f64_reference_within_activation_quantization() {
    check_against_reference(
        Synth {
            ty: GgmlType::Q8_0,
            ..LLAMA
        },
        6e-2,
        1e-3,
    );
    check_against_reference(
        Synth {
            ty: GgmlType::Q4_1,
            ..LLAMA
        },
        6e-2,
        1e-3,
    );
    check_against_reference(
        Synth {
            ty: GgmlType::Q4_0,
            ..QWEN3
        },
        6e-2,
        1e-3,
    );
    check_against_reference(
        Synth {
            ty: GgmlType::Q8_0,
            ..QWEN3MOE
        },
        6e-2,
        1e-3,
    );
}

/// Prefilling a prefix and decoding the rest one token at a time must give the logits that one
/// full prefill gives at the same positions.
#[test]
fn prefill_then_decode_equals_full_prefill() {
    for s in [
        LLAMA,
        QWEN3,
        Synth {
            ty: GgmlType::Q4_1,
            ..LLAMA
        },
        Synth {
            ty: GgmlType::Q8_0,
            ..QWEN3
        },
        QWEN3MOE,
        Synth {
            ty: GgmlType::Q4_0,
            ..QWEN3MOE
        },
    ] {
        let (file, _) = build(&s);
        let cpu = Cpu::new();
        let model = models::load(&cpu, &file, &mut |_, _| {}).unwrap();
        let full = kiln_all(model.as_ref(), &TOKENS);
        let mut cache = cpu.kv_cache(&model.config().kv_spec(32)).unwrap();
        let split = 4;
        let first = model
            .forward(&cpu, &mut cache, &TOKENS[..split], 0, Logits::Last)
            .unwrap();
        let mut steps = vec![cpu.read(&first).unwrap()];
        for (i, &t) in TOKENS.iter().enumerate().skip(split) {
            let l = model
                .forward(&cpu, &mut cache, &[t], i, Logits::Last)
                .unwrap();
            steps.push(cpu.read(&l).unwrap());
        }
        for (k, step) in steps.iter().enumerate() {
            let want = &full[split - 1 + k];
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = step
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 1e-5 * scale,
                "{} {:?} position {}: diff {diff}",
                s.arch,
                s.ty,
                split - 1 + k
            );
        }
    }
}

#[test]
fn load_errors_name_what_is_missing() {
    let (file, _) = build(&LLAMA);
    // Rebuild without one block tensor.
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    let keep: Vec<_> = file
        .tensors()
        .iter()
        .filter(|t| t.name != "blk.1.ffn_up.weight")
        .collect();
    for t in &keep {
        w.add_tensor(t.name.clone(), &t.dims, t.ggml_type).unwrap();
    }
    let data: Vec<&[u8]> = keep.iter().map(|t| file.tensor_data(t)).collect();
    let broken = Arc::new(GgufFile::from_bytes(w.to_vec(&data).unwrap()).unwrap());
    let err = models::load(&Cpu::new(), &broken, &mut |_, _| {})
        .err()
        .expect("load must fail");
    assert!(
        format!("{err:#}").contains("blk.1.ffn_up.weight"),
        "{err:#}"
    );

    // RoPE scaling kiln does not implement (Phi-3's longrope): refused, the key named.
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    w.add_metadata("llama.rope.scaling.type", Value::String("longrope".into()))
        .unwrap();
    w.add_metadata("llama.rope.scaling.factor", Value::F32(4.0))
        .unwrap();
    for t in file.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.ggml_type).unwrap();
    }
    let data: Vec<&[u8]> = file.tensors().iter().map(|t| file.tensor_data(t)).collect();
    let scaled = Arc::new(GgufFile::from_bytes(w.to_vec(&data).unwrap()).unwrap());
    let err = models::load(&Cpu::new(), &scaled, &mut |_, _| {})
        .err()
        .expect("load must fail");
    assert!(
        format!("{err:#}").contains("llama.rope.scaling.type = \"longrope\""),
        "{err:#}"
    );

    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("mamba".into()))
        .unwrap();
    let other = Arc::new(GgufFile::from_bytes(w.to_vec(&[]).unwrap()).unwrap());
    let err = models::load(&Cpu::new(), &other, &mut |_, _| {})
        .err()
        .expect("load must fail");
    assert!(
        format!("{err:#}").contains("unsupported architecture \"mamba\""),
        "{err:#}"
    );
}

/// Logits of every position, decoding one token at a time on backend `b`.
fn decode_steps<B: Backend + 'static>(
    b: &B,
    file: &Arc<GgufFile>,
    tokens: &[u32],
) -> Vec<Vec<f32>> {
    let model = models::load(b, file, &mut |_, _| {}).unwrap();
    let mut cache = b.kv_cache(&model.config().kv_spec(32)).unwrap();
    tokens
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            b.read(
                &model
                    .forward(b, &mut cache, &[t], pos, Logits::Last)
                    .unwrap(),
            )
            .unwrap()
        })
        .collect()
}

/// Max relative L2 error between two backends' logits, per position.
fn per_position_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(c, g)| {
            let num: f64 = c.iter().zip(g).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = c.iter().map(|x| (*x as f64).powi(2)).sum();
            (num / den).sqrt()
        })
        .collect()
}

/// Asserts every position's logits of `got` are within `tol` (relative L2) of `want`'s, after
/// printing the worst; `what` names the case in both messages.
fn assert_positions_close(want: &[Vec<f32>], got: &[Vec<f32>], tol: f64, what: &str) {
    assert_eq!(want.len(), got.len(), "{what}: position counts differ");
    let rels = per_position_rel(want, got);
    let worst = rels.iter().fold(0f64, |m, &r| m.max(r));
    eprintln!("{what}: worst position rel err {worst:.2e} (tolerance {tol:e})");
    for (pos, rel) in rels.into_iter().enumerate() {
        assert!(rel < tol, "{what}, position {pos}: logits rel err {rel:e}");
    }
}

/// The CUDA backend, run on the host grid executor (same backend code, same kernel bodies as
/// on the GPU), must agree with the CPU backend: both quantize activations the same way, so
/// only summation order and f32 rounding separate them.
#[test]
fn cuda_backend_on_host_grid_matches_cpu_backend() {
    use kiln_host::backend::cuda::Cuda;
    // The GPU attention kernel wants head_dim % 32 == 0.
    let wide = Synth {
        n_embd: 128,
        head_dim: 32,
        ..LLAMA
    };
    let cases = [
        Synth {
            ty: GgmlType::Q4_1,
            ..wide
        },
        Synth {
            ty: GgmlType::Q8_0,
            ..QWEN3
        },
        Synth {
            ty: GgmlType::F16,
            ..wide
        },
        Synth {
            n_embd: 256,
            n_head: 4,
            n_kv: 2,
            head_dim: 64,
            ty: GgmlType::F16,
            ..LLAMA
        },
    ];
    for s in cases {
        let (file, _) = build(&s);
        let cpu = decode_steps(&Cpu::new(), &file, &TOKENS);
        // With the f32 attention kernel: the same arithmetic up to float rounding. With the
        // tensor-core pass 1 (head_dim 64 here): its f16 operands, ~1e-3, in split-KV's two
        // launches and in the one-launch form for short histories.
        for (mma, short, tol) in [(false, 0, 1e-4), (true, 0, 5e-3), (true, 1 << 20, 5e-3)] {
            let cuda = Cuda::host::<policies::Hopper>()
                .with_attention_mma(mma)
                .with_attention_short_max(short)
                .with_norm_defer(false);
            let gpu = decode_steps(&cuda, &file, &TOKENS);
            let what = format!(
                "{} {:?} head_dim {}, attention mma {mma}, short up to {short}: CUDA-on-host vs CPU",
                s.arch, s.ty, s.head_dim
            );
            assert_positions_close(&cpu, &gpu, tol, &what);
        }
    }
}

/// One-token steps over short histories with `rope_store` folded into the one-launch attention
/// (`kiln_attention_short_rope_mma`, Hopper's default where the head dimension takes the tensor
/// cores): the logits of the two launches it replaces, bit for bit, with QK-norm (qwen3) and
/// without (llama); and the fused kernel really ran.
#[test]
fn fused_short_attention_on_cuda_host_grid_matches_two_launches() {
    use kiln_host::backend::cuda::Cuda;
    let heads64 = Synth {
        n_embd: 256,
        n_head: 4,
        n_kv: 2,
        head_dim: 64,
        ..QWEN3
    };
    for s in [
        Synth {
            ty: GgmlType::Q4_0,
            ..heads64
        },
        Synth {
            arch: LLAMA.arch,
            ty: GgmlType::F16,
            ..heads64
        },
    ] {
        let (file, _) = build(&s);
        let short = |fused: bool| {
            let cuda = Cuda::host::<policies::Hopper>()
                .with_attention_short_max(128)
                .with_attention_short_rope(fused)
                .with_norm_defer(false);
            let logits = decode_steps(&cuda, &file, &TOKENS);
            let name = kernels_gpu::entries::names::kiln_attention_short_rope_mma;
            (logits, cuda.gpu().host_launches(name))
        };
        let ((fused, launches), (apart, none)) = (short(true), short(false));
        assert!(
            launches >= TOKENS.len() && none == 0,
            "{}: the fused kernel ran {launches} times (on) and {none} (off)",
            s.arch
        );
        assert!(
            fused == apart,
            "{} {:?}: fused short attention differs from rope_store + attention",
            s.arch,
            s.ty
        );
    }
}

/// With the norms folded into the residual projections (`kiln_matvec_add_norm_q8_*`, Hopper's
/// default): the activation codes quantize `x ⊙ g` instead of `x ⊙ g / rms`, the same values
/// but for float rounding, which flips an occasional code. So the CUDA backend is held to the
/// float64 forward pass, no less accurate than the CPU backend, and must really differ from
/// the CPU backend's (the path ran: undeferred they agree to 1e-4). Dense Q4_0 and Q4_1
/// models (Q8_0 projections keep the norm launch; the K-quant test checks K formats against
/// float64 with it). Mixture-of-experts layers defer only the norm before their experts, which
/// read it settled: `moe_on_cuda_host_grid_matches_cpu_backend` runs that.
#[test]
fn deferred_norms_on_cuda_host_grid_match_f64_reference() {
    use kernels_gpu::entries::families::{MATVEC_ADD_NORM_Q8, MATVEC3_NORM, MATVEC3_WIDE_NORM};
    use kiln_host::backend::cuda::Cuda;
    let cases = [
        Synth {
            n_embd: 128,
            head_dim: 32,
            ty: GgmlType::Q4_1,
            ..LLAMA
        },
        Synth {
            n_embd: 128,
            head_dim: 32,
            ty: GgmlType::Q4_0,
            ..LLAMA
        },
        Synth {
            ty: GgmlType::Q4_0,
            ..QWEN3
        },
    ];
    for s in cases {
        let (file, weights) = build(&s);
        let want = reference(&s, &weights, &TOKENS);
        let cpu = decode_steps(&Cpu::new(), &file, &TOKENS);
        let deferred = Cuda::host::<policies::Hopper>().with_norm_defer(true);
        let gpu = decode_steps(&deferred, &file, &TOKENS);
        let launches = |family: [&str; 6]| -> usize {
            family.iter().map(|k| deferred.gpu().host_launches(k)).sum()
        };
        // The producer, and consumers that apply 1/rms (the `Deferred` instantiations).
        let consumers = launches(MATVEC3_NORM) + launches(MATVEC3_WIDE_NORM);
        assert!(
            launches(MATVEC_ADD_NORM_Q8) > 0 && consumers > 0,
            "{} {:?}: the deferred norm never ran (or its consumers took the finished kernels)",
            s.arch,
            s.ty
        );
        let (cpu_err, gpu_err) = (rel_err(&cpu, &want), rel_err(&gpu, &want));
        // Undeferred, the two backends agree to 1e-4 (the test above) until an activation code
        // at a rounding tie flips.
        let moved = per_position_rel(&cpu, &gpu)
            .iter()
            .fold(0f64, |m, &r| m.max(r));
        eprintln!(
            "{} {:?}: deferred norms vs f64 {gpu_err:.2e}, CPU {cpu_err:.2e}; apart by {moved:.2e}",
            s.arch, s.ty
        );
        assert!(
            gpu_err <= 1.5 * cpu_err + 1e-3,
            "{} {:?}: deferred norms rel err {gpu_err:e} vs the CPU backend's {cpu_err:e}",
            s.arch,
            s.ty
        );
        assert!(
            moved > 1e-3,
            "{} {:?}: deferring the norms changed nothing: did the path run?",
            s.arch,
            s.ty
        );
    }
}

/// Llama at head_dim 32 (the GPU attention kernels' smallest) in Q4_1 and Q4_0, and qwen3 in
/// Q8_0: the legacy formats, with and without QK-norm.
fn quantized_wide_llama_and_qwen3() -> [Synth; 3] {
    let wide = Synth {
        n_embd: 128,
        head_dim: 32,
        ..LLAMA
    };
    [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0].map(|ty| match ty {
        GgmlType::Q8_0 => Synth { ty, ..QWEN3 },
        _ => Synth { ty, ..wide },
    })
}

/// Dense prefill of `GEMM_MIN_TOKENS` or more on the CUDA backend (host grid): the projections
/// take the f16 tensor-core GEMM and gate/up/SwiGLU the paired one (`kiln_mma_swiglu_*`), whose
/// f16 copy feeds the down projection; against the CPU backend with f32 activations (f16
/// operands: ~1e-3), with the paired GEMM checked to have run instead of the `swiglu` kernel.
/// With the short-prompt tile allowed up to 128 tokens (the host grid has 2 SMs), the one-block
/// o and down launches of this 9-token prompt take it (`kiln_mma_short_*`) and the two-block
/// gate/up the main one; with it switched off, none does. With split-K allowed, the one-block
/// launches that have two stages split over k instead.
#[test]
fn dense_prefill_on_cuda_host_grid_takes_the_paired_swiglu_gemm() {
    use kernels_gpu::entries::names;
    use kiln_host::backend::cuda::Cuda;
    let launches = |cuda: &Cuda, entries: &[&'static str]| -> usize {
        entries.iter().map(|k| cuda.gpu().host_launches(k)).sum()
    };
    let short = [
        names::kiln_mma_short_q4_0,
        names::kiln_mma_short_q4_1,
        names::kiln_mma_short_q8_0,
    ];
    for s in quantized_wide_llama_and_qwen3() {
        let (file, _) = build(&s);
        let want = prefill_all(&Cpu::new().with_f32_activations(), &file, &TOKENS);
        let what = format!("{} {:?}", s.arch, s.ty);
        let main_only = Cuda::host::<policies::Hopper>()
            .with_gemm_short_max(0)
            .with_gemm_split_k(0);
        let got = prefill_all(&main_only, &file, &TOKENS);
        assert_eq!(
            launches(&main_only, &short),
            0,
            "{what}: short tile while off"
        );
        assert_positions_close(
            &want,
            &got,
            5e-3,
            &format!("{what} dense prefill, short tile off, CUDA-on-host vs CPU"),
        );
        let cuda = Cuda::host::<policies::Hopper>()
            .with_gemm_short_max(128)
            .with_gemm_split_k(0);
        let got = prefill_all(&cuda, &file, &TOKENS);
        assert!(
            launches(&cuda, &short) > 0,
            "{what}: the short tile never ran"
        );
        let paired = launches(
            &cuda,
            &[
                names::kiln_mma_swiglu_q4_0,
                names::kiln_mma_swiglu_q4_1,
                names::kiln_mma_swiglu_q8_0,
            ],
        );
        assert!(paired > 0, "{what}: the paired SwiGLU GEMM never ran");
        assert_eq!(
            cuda.gpu().host_launches(names::kiln_swiglu),
            0,
            "{what}: a prefill still ran the separate swiglu kernel"
        );
        assert_positions_close(
            &want,
            &got,
            5e-3,
            &format!("{what} dense prefill, CUDA-on-host vs CPU"),
        );
        // Split-K (up to 4 shares): one-block launches of two or more stages (128+ columns)
        // split instead of taking the short or deep tile (2 shares: the host grid's 2 SMs × 2
        // blocks, capped by the stages); one-stage launches cannot split and keep them.
        let split = Cuda::host::<policies::Hopper>().with_gemm_split_k(4);
        let got = prefill_all(&split, &file, &TOKENS);
        let deep = [
            names::kiln_mma_deep_q4_0,
            names::kiln_mma_deep_q4_1,
            names::kiln_mma_deep_q8_0,
        ];
        let small = |c: &Cuda| launches(c, &short) + launches(c, &deep);
        assert!(
            small(&split) < small(&cuda),
            "{what}: split-K on, yet every one-block launch took the short or deep tile"
        );
        assert_positions_close(
            &want,
            &got,
            5e-3,
            &format!("{what} dense prefill, split-K, CUDA-on-host vs CPU"),
        );
        // Switched off: the gate/up GEMM, then `swiglu` (and `to_f16` for the down GEMM).
        let unpaired = Cuda::host::<policies::Hopper>().with_gemm_swiglu(false);
        let got = prefill_all(&unpaired, &file, &TOKENS);
        assert!(
            unpaired.gpu().host_launches(names::kiln_swiglu) > 0,
            "{what}: with the paired GEMM off, swiglu never ran"
        );
        assert_positions_close(
            &want,
            &got,
            5e-3,
            &format!("{what} dense prefill, paired GEMM off, CUDA-on-host vs CPU"),
        );
    }
}

/// Q5_0 and Q5_1 files on the CUDA backend, which has no 5-bit format with a scale per 32
/// weights: Q5_0 loads as Q8_0 blocks (every weight exact, so the Q8_0 kernels compute what the
/// CPU backend's Q5_0 dots do, up to float rounding), Q5_1 widened to f16 (each weight rounded
/// once). Both held to the float64 forward pass next to the CPU backend; Q5_0 also to the CPU
/// backend itself, and checked to run through the Q8_0 kernels. Q5_1 mixed into a Q4_0 model on
/// attn_v and ffn_down, where llama.cpp's mixes put the 5-bit legacy formats.
#[test]
fn q5_0_and_q5_1_on_cuda_host_grid() {
    use kernels_gpu::entries::families::{MATVEC3, MATVEC3_NORM, MATVEC3_WIDE, MATVEC3_WIDE_NORM};
    use kiln_host::backend::cuda::Cuda;
    let heads32 = Synth {
        n_embd: 128,
        head_dim: 32,
        ..LLAMA
    };
    let cases = [
        Synth {
            ty: GgmlType::Q5_0,
            ..heads32
        },
        Synth {
            ty: GgmlType::Q5_0,
            ..QWEN3
        },
        Synth {
            ty: GgmlType::Q4_0,
            v_down_ty: Some(GgmlType::Q5_1),
            ..heads32
        },
    ];
    for s in cases {
        let (file, weights) = build(&s);
        let want = reference(&s, &weights, &TOKENS);
        let cpu = decode_steps(&Cpu::new(), &file, &TOKENS);
        let cuda = Cuda::host::<policies::Hopper>();
        let gpu = decode_steps(&cuda, &file, &TOKENS);
        let (cpu_err, gpu_err) = (rel_err(&cpu, &want), rel_err(&gpu, &want));
        let what = format!("{} {:?} (attn_v, ffn_down {:?})", s.arch, s.ty, s.v_down_ty);
        eprintln!("{what}: CUDA-on-host vs f64 {gpu_err:.2e}, CPU {cpu_err:.2e}");
        assert!(
            gpu_err <= 1.5 * cpu_err + 1e-4,
            "{what}: CUDA rel err {gpu_err:e} vs the CPU backend's {cpu_err:e}"
        );
        if s.ty == GgmlType::Q5_0 {
            let q8_0 = |family: [&str; 6]| cuda.gpu().host_launches(family[2]);
            let ran = [MATVEC3, MATVEC3_NORM, MATVEC3_WIDE, MATVEC3_WIDE_NORM]
                .map(q8_0)
                .iter()
                .sum::<usize>();
            assert!(ran > 0, "{what}: the q/k/v projections did not run as Q8_0");
            let apart = per_position_rel(&cpu, &gpu);
            let close = apart.iter().filter(|&&r| r <= 1e-5).count();
            assert!(
                3 * close >= 2 * apart.len(),
                "{what}: within 1e-5 of the CPU backend at {close} of {} positions: {apart:.1?}",
                apart.len()
            );
        }
    }
}

/// K-quants on the CUDA backend: Q6_K runs natively (re-blocked by 32, exactly), Q4_K as Q4_1
/// and Q5_K as Q5K blocks (each sub-block's d·sc and dmin·m rounded to f16). With f32 activations, checked against the
/// float64 forward pass over the weights as the GPU holds them: only f32 arithmetic separates
/// them. With Q8_1 activations (the default), against the same reference next to the CPU
/// backend, whose K-quant dots quantize activations to Q8_K (256-element blocks) instead: both
/// round activations to 8 bits, differently, and the GPU path must be no less accurate.
#[test]
fn k_quants_on_cuda_host_grid_match_f64_reference_and_cpu_backend() {
    use kiln_host::backend::cuda::Cuda;
    // Rows of whole 256-element super-blocks.
    for s in [
        // As Q4_K_M: Q6_K v and down projections (q/k/v of two formats in one layer).
        Synth {
            n_embd: 256,
            head_dim: 64,
            n_ff: 256,
            ty: GgmlType::Q4_K,
            v_down_ty: Some(GgmlType::Q6_K),
            ..QWEN3
        },
        Synth {
            n_embd: 256,
            n_head: 4,
            n_kv: 2,
            head_dim: 64,
            n_ff: 512,
            ty: GgmlType::Q6_K,
            ..LLAMA
        },
        Synth {
            n_embd: 256,
            head_dim: 64,
            n_ff: 256,
            ty: GgmlType::Q5_K,
            ..QWEN3
        },
    ] {
        // All three K formats are held exactly as in the file.
        let (file, weights) = build(&s);
        let want = reference(&s, &weights, &TOKENS);
        let f32x = Cuda::host::<policies::Hopper>().with_f32_activations();
        let err = rel_err(&decode_steps(&f32x, &file, &TOKENS), &want);
        eprintln!(
            "{:?} on CUDA-on-host, f32 activations: max rel err {err:.2e} vs f64",
            s.ty
        );
        assert!(err < 1e-4, "{} {:?}: rel err {err:e}", s.arch, s.ty);

        let cpu = decode_steps(&Cpu::new(), &file, &TOKENS);
        let gpu = decode_steps(&Cuda::host::<policies::Hopper>(), &file, &TOKENS);
        let (cpu_err, gpu_err) = (rel_err(&cpu, &want), rel_err(&gpu, &want));
        let rel = per_position_rel(&cpu, &gpu);
        let worst = rel.iter().fold(0f64, |m, &r| m.max(r));
        eprintln!(
            "{:?} 8-bit activations vs f64: CUDA-on-host (Q8_1) {gpu_err:.2e}, CPU (Q8_K) {cpu_err:.2e}; rel L2 between them {worst:.2e}",
            s.ty
        );
        // The GPU path's 8-bit activations must be no worse than the CPU backend's (the random
        // Q6_K model amplifies activation rounding to a few % in both).
        assert!(
            gpu_err <= 1.5 * cpu_err + 1e-3,
            "{} {:?}: CUDA-on-host rel err {gpu_err:e} vs the CPU backend's {cpu_err:e}",
            s.arch,
            s.ty
        );
    }
}

/// With f32 activations (no 8-bit activation codes to flip) the CUDA backend on the host
/// executor and the CPU backend agree to float rounding at every position of quantized models,
/// and the nudge that moves Q8_1-activation logits by ~1e-2 moves these by float rounding only.
#[test]
fn f32_activations_cuda_on_host_grid_matches_cpu_backend() {
    use kiln_host::backend::cuda::Cuda;
    for s in quantized_wide_llama_and_qwen3() {
        let (file, _) = build(&s);
        let cpu = decode_steps(&Cpu::new().with_f32_activations(), &file, &TOKENS);
        let gpu = decode_steps(
            &Cuda::host::<policies::Hopper>().with_f32_activations(),
            &file,
            &TOKENS,
        );
        let what = format!("{} {:?}: f32-activation CUDA-on-host vs CPU", s.arch, s.ty);
        assert_positions_close(&cpu, &gpu, 5e-5, &what);
        // And the mode really changes the arithmetic: Q8_1 activations give other logits.
        let q8 = decode_steps(&Cpu::new(), &file, &TOKENS);
        assert!(
            per_position_rel(&cpu, &q8).iter().any(|&r| r > 1e-4),
            "{} {:?}: f32 and Q8_1 activations agree suspiciously well",
            s.arch,
            s.ty
        );
    }
}

/// The CUDA backend (host executor) and the CPU backend in lockstep: every op gets identical
/// inputs (the CUDA side is re-synced to the CPU's result after each op) and must agree to 1e-5
/// of the output's scale. Free-running, the two part at some positions by ~1e-2 — sub-1e-6 op
/// differences flip an occasional 8-bit activation code (docs/benchmarks.md) — so this is the
/// check that holds each op of the CUDA backend to the CPU's semantics.
#[test]
fn cuda_backend_ops_match_cpu_backend_in_lockstep() {
    use kiln_host::backend::cuda::Cuda;
    use kiln_host::backend::lockstep::Lockstep;
    let s = Synth {
        n_embd: 256,
        n_head: 4,
        n_kv: 2,
        head_dim: 64,
        ty: GgmlType::Q4_1,
        ..LLAMA
    };
    let (file, _) = build(&s);
    // Op by op at float rounding: the f32 attention kernel (the tensor-core one is checked
    // against float64 by the kernel tests and end to end above).
    let cuda = Cuda::host::<policies::Hopper>().with_attention_mma(false);
    let lock = Lockstep::new(Cpu::new(), cuda, 1e-5);
    let _ = decode_steps(&lock, &file, &TOKENS);
    let report = lock.report();
    assert!(
        report.mismatches.is_empty(),
        "ops that differ: {:#?}",
        report.mismatches
    );
    assert!(report.ops > 100, "only {} ops compared", report.ops);
}

/// Mixture of experts on the CUDA backend (host grid) against the CPU backend: op by op in
/// lockstep for decode steps (route indices exactly, weights and the mixed expert outputs to
/// float rounding), then free-running, decode steps and one prefill, end to end.
#[test]
fn moe_on_cuda_host_grid_matches_cpu_backend() {
    use kiln_host::backend::cuda::Cuda;
    use kiln_host::backend::lockstep::Lockstep;
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
        let s = Synth { ty, ..QWEN3MOE };
        let (file, _) = build(&s);
        let cuda = Cuda::host::<policies::Hopper>().with_attention_mma(false);
        let lock = Lockstep::new(Cpu::new(), cuda, 1e-5);
        assert_decode_in_lockstep(&lock, &file, &format!("{ty:?}"));

        let cpu = decode_steps(&Cpu::new(), &file, &TOKENS);
        let cuda = Cuda::host::<policies::Hopper>();
        let gpu = decode_steps(&cuda, &file, &TOKENS);
        // head_dim 32: the f32 attention kernel, so float rounding only (measured ~1e-7).
        let what = format!("{ty:?} MoE decode, CUDA-on-host vs CPU");
        assert_positions_close(&cpu, &gpu, 1e-4, &what);
        // Prefill of GEMM_MIN_TOKENS or more: the dense projections take the f16 tensor-core
        // GEMM, the experts the grouped one; against the CPU backend with f32 activations
        // (measured ~9e-4: f16 operands).
        let want = prefill_all(&Cpu::new().with_f32_activations(), &file, &TOKENS);
        let got = prefill_all(&cuda, &file, &TOKENS);
        let what = format!("{ty:?} MoE prefill (GEMMs), CUDA-on-host vs CPU");
        assert_positions_close(&want, &got, 5e-3, &what);
        // A shorter prompt: the Q8_1 mat-vecs, the experts' over slots sorted by expert;
        // against the CPU backend's 8-bit activations: float rounding only (measured ~8e-8).
        let short = &TOKENS[..4];
        let want = prefill_all(&Cpu::new(), &file, short);
        let got = prefill_all(&cuda, &file, short);
        let what = format!("{ty:?} MoE prefill (sorted mat-vecs), CUDA-on-host vs CPU");
        assert_positions_close(&want, &got, 1e-4, &what);
        // The full prompt with the grouped GEMM switched off (`KILN_MOE_GEMM=0`): the experts
        // take the sorted mat-vecs, the dense projections still their GEMM; against the CPU
        // in f32 activations, as the first prefill check.
        let want = prefill_all(&Cpu::new().with_f32_activations(), &file, &TOKENS);
        let matvecs = Cuda::host::<policies::Hopper>().with_moe_gemm(false);
        let got = prefill_all(&matvecs, &file, &TOKENS);
        let what = format!("{ty:?} MoE prefill (GEMM off), CUDA-on-host vs CPU");
        assert_positions_close(&want, &got, 1e-2, &what);
    }
}

/// `--f32-activations` with experts: the CUDA backend's f32 expert mat-vecs against the CPU
/// backend in the same mode, where only float rounding separates them: op by op in lockstep
/// (measured ≤ 5e-7), then free-running decode and prefill, where the tiny random model
/// amplifies that rounding (measured 4e-7 with Q8_0 weights, 1.3e-4 with Q4_0).
#[test]
fn moe_on_cuda_with_f32_activations_matches_cpu_backend() {
    use kiln_host::backend::cuda::Cuda;
    use kiln_host::backend::lockstep::Lockstep;
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
        let (file, _) = build(&Synth { ty, ..QWEN3MOE });
        let cpu = Cpu::new().with_f32_activations();
        let cuda = Cuda::host::<policies::Hopper>().with_f32_activations();
        let lock = Lockstep::new(
            Cpu::new().with_f32_activations(),
            Cuda::host::<policies::Hopper>().with_f32_activations(),
            1e-5,
        );
        assert_decode_in_lockstep(&lock, &file, &format!("{ty:?} f32 activations"));
        let (decoded, got) = (
            decode_steps(&cpu, &file, &TOKENS),
            decode_steps(&cuda, &file, &TOKENS),
        );
        let what = format!("{ty:?} MoE decode, f32 activations, CUDA-on-host vs CPU");
        assert_positions_close(&decoded, &got, 1e-3, &what);
        let (want, got) = (
            prefill_all(&cpu, &file, &TOKENS),
            prefill_all(&cuda, &file, &TOKENS),
        );
        let what = format!("{ty:?} MoE prefill, f32 activations, CUDA-on-host vs CPU");
        assert_positions_close(&want, &got, 1e-3, &what);
        // And the mode changes the arithmetic: 8-bit activations give other logits.
        let q8 = decode_steps(&Cpu::new(), &file, &TOKENS);
        assert!(
            per_position_rel(&decoded, &q8).iter().any(|&r| r > 1e-4),
            "{ty:?}: f32 and Q8 activations agree suspiciously well"
        );
    }
}

/// Decode steps of `TOKENS` on an MoE model through `lock`: no op may differ beyond its
/// tolerance, and both MoE ops must have been compared.
fn assert_decode_in_lockstep<R: Backend + 'static, C: Backend + 'static>(
    lock: &kiln_host::backend::lockstep::Lockstep<R, C>,
    file: &Arc<GgufFile>,
    what: &str,
) {
    let _ = decode_steps(lock, file, &TOKENS);
    let report = lock.report();
    assert!(
        report.mismatches.is_empty(),
        "{what}: ops that differ: {:#?}",
        report.mismatches
    );
    for op in ["moe_route", "moe_swiglu_add"] {
        assert!(
            report.worst.iter().any(|(k, _)| k == op),
            "{what}: no {op} compared: {:?}",
            report.worst
        );
    }
}

/// Logits of every position of `tokens`, from one forward pass on `b`.
fn prefill_all<B: Backend + 'static>(b: &B, file: &Arc<GgufFile>, tokens: &[u32]) -> Vec<Vec<f32>> {
    prefill_steered(b, file, tokens, &[])
}

/// [`prefill_all`] with the model steered by `steer` ([`Model::steer`]).
fn prefill_steered<B: Backend + 'static>(
    b: &B,
    file: &Arc<GgufFile>,
    tokens: &[u32],
    steer: &[Option<Vec<f32>>],
) -> Vec<Vec<f32>> {
    let mut model = models::load(b, file, &mut |_, _| {}).unwrap();
    model.steer(b, steer).unwrap();
    let mut cache = b.kv_cache(&model.config().kv_spec(32)).unwrap();
    let logits = model
        .forward(b, &mut cache, tokens, 0, Logits::All)
        .unwrap();
    let n = model.config().n_vocab;
    b.read(&logits)
        .unwrap()
        .chunks(n)
        .map(|r| r.to_vec())
        .collect()
}

/// Prefill in lockstep: all of `TOKENS` in one forward pass, so the CUDA backend's quantized
/// matmuls take the tensor-core GEMM (`kernels/mma.rs`) instead of the mat-vec. The GEMM
/// multiplies f16-rounded weights and activations (no 8-bit activations), so the reference is
/// the CPU backend in f32-activation mode, and each op must agree to 2e-3 of its largest
/// value (two f16 roundings, ~2⁻¹¹ each), for every quantized weight format.
#[test]
fn cuda_backend_prefill_matches_cpu_backend_in_lockstep() {
    use kiln_host::backend::cuda::Cuda;
    use kiln_host::backend::lockstep::Lockstep;
    use policies::TargetPolicy;
    const {
        assert!(
            TOKENS.len() as u32 >= policies::Hopper::GEMM_MIN_TOKENS,
            "the prefill must be long enough for the GEMM"
        )
    };
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let s = Synth {
            n_embd: 256,
            n_head: 4,
            n_kv: 2,
            head_dim: 64,
            ty,
            ..LLAMA
        };
        let (file, _) = build(&s);
        let lock = Lockstep::new(
            Cpu::new().with_f32_activations(),
            Cuda::host::<policies::Hopper>(),
            2e-3,
        );
        let model = models::load(&lock, &file, &mut |_, _| {}).unwrap();
        let mut cache = lock.kv_cache(&model.config().kv_spec(32)).unwrap();
        model
            .forward(&lock, &mut cache, &TOKENS, 0, Logits::All)
            .unwrap();
        let report = lock.report();
        assert!(
            report.mismatches.is_empty(),
            "{ty:?}: ops that differ: {:#?}",
            report.mismatches
        );
        assert!(report.ops > 20, "{ty:?}: only {} ops compared", report.ops);
    }
}

/// The CPU backend with every RMSNorm output nudged by one part in 10⁷ (about one ulp): a stand-in
/// for "the same math summed in another order". Used to measure how far 8-bit activation
/// quantization alone can move logits between two correct implementations.
struct Nudged(Cpu);

impl Backend for Nudged {
    type Tensor = <Cpu as Backend>::Tensor;
    type Weight = <Cpu as Backend>::Weight;
    type KvCache = <Cpu as Backend>::KvCache;
    fn name(&self) -> &'static str {
        "cpu-nudged"
    }
    fn load_weight(&self, f: &Arc<GgufFile>, n: &str) -> anyhow::Result<Self::Weight> {
        self.0.load_weight(f, n)
    }
    fn kv_cache(&self, s: &kiln_host::backend::KvSpec) -> anyhow::Result<Self::KvCache> {
        self.0.kv_cache(s)
    }
    fn upload(&self, d: &[f32], r: usize, c: usize) -> anyhow::Result<Self::Tensor> {
        self.0.upload(d, r, c)
    }
    fn read(&self, x: &Self::Tensor) -> anyhow::Result<Vec<f32>> {
        self.0.read(x)
    }
    fn argmax(&self, x: &Self::Tensor) -> anyhow::Result<Vec<u32>> {
        self.0.argmax(x)
    }
    fn rows(&self, x: &Self::Tensor, s: usize, n: usize) -> anyhow::Result<Self::Tensor> {
        self.0.rows(x, s, n)
    }
    fn embed(&self, t: &Self::Weight, ids: &[u32]) -> anyhow::Result<Self::Tensor> {
        self.0.embed(t, ids)
    }
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight) -> anyhow::Result<Self::Tensor> {
        self.0.matmul(x, w)
    }
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> anyhow::Result<Self::Tensor> {
        use kiln_host::backend::Shape;
        let y = self.0.rms_norm(x, w, eps)?;
        // Non-uniform (a uniform scale cancels in the quantizer's d): ±1–3 ulp-sized changes.
        let v: Vec<f32> = self
            .0
            .read(&y)?
            .iter()
            .enumerate()
            .map(|(i, a)| a * (1.0 + 1e-7 * ((i % 7) as f32 - 3.0)))
            .collect();
        self.0.upload(&v, Shape::rows(&y), Shape::cols(&y))
    }
    fn rope(
        &self,
        x: &mut Self::Tensor,
        p: usize,
        r: &kiln_host::backend::Rope,
    ) -> anyhow::Result<()> {
        self.0.rope(x, p, r)
    }
    fn swiglu(&self, g: &Self::Tensor, u: &Self::Tensor) -> anyhow::Result<Self::Tensor> {
        self.0.swiglu(g, u)
    }
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> anyhow::Result<()> {
        self.0.add_assign(x, y)
    }
    fn add_row(&self, x: &mut Self::Tensor, row: &Self::Tensor) -> anyhow::Result<()> {
        self.0.add_row(x, row)
    }
    fn attention(
        &self,
        c: &mut Self::KvCache,
        l: usize,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        p: usize,
        a: &kiln_host::backend::Attention,
    ) -> anyhow::Result<Self::Tensor> {
        self.0.attention(c, l, q, k, v, p, a)
    }
}

/// How much an ulp-sized nudge moves the CPU backend's own logits: with F16 weights (no
/// activation quantization) it stays at rounding level; with quantized weights it is what
/// separates any two correct implementations (printed, and bounded loosely).
#[test]
fn ulp_nudge_sensitivity_of_quantized_activations() {
    let hd64 = Synth {
        n_embd: 256,
        n_head: 4,
        n_kv: 2,
        head_dim: 64,
        ..LLAMA
    };
    for ty in [GgmlType::F16, GgmlType::Q4_1, GgmlType::Q8_0] {
        let s = Synth { ty, ..hd64 };
        let (file, _) = build(&s);
        let base = decode_steps(&Cpu::new(), &file, &TOKENS);
        let nudged = decode_steps(&Nudged(Cpu::new()), &file, &TOKENS);
        let rel = per_position_rel(&base, &nudged);
        eprintln!(
            "nudge {ty:?}: {:?}",
            rel.iter().map(|r| format!("{r:.0e}")).collect::<Vec<_>>()
        );
        let worst = rel.iter().cloned().fold(0f64, f64::max);
        if ty == GgmlType::F16 {
            assert!(
                worst < 1e-5,
                "F16: a one-ulp nudge moved logits by {worst:e}"
            );
        }
    }
}

/// A prefill of 24 tokens on the CUDA backend (host grid executor): long enough for the GEMM and
/// the tensor-core attention (`kernels/flash.rs`, f16 operands), which must stay within the bounds
/// the quantized CPU path meets against the float64 forward pass.
#[test]
fn cuda_prefill_with_tensor_core_attention_matches_f64_reference() {
    use kiln_host::backend::cuda::Cuda;
    let tokens: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % 50).collect();
    let s = Synth {
        n_embd: 256,
        n_head: 4,
        n_kv: 2,
        head_dim: 64,
        ty: GgmlType::Q4_0,
        ..QWEN3
    };
    let (file, weights) = build(&s);
    let gpu = Cuda::host::<policies::Hopper>();
    let model = models::load(&gpu, &file, &mut |_, _| {}).unwrap();
    let mut cache = gpu.kv_cache(&model.config().kv_spec(32)).unwrap();
    let logits = model
        .forward(&gpu, &mut cache, &tokens, 0, Logits::All)
        .unwrap();
    let got: Vec<Vec<f32>> = gpu
        .read(&logits)
        .unwrap()
        .chunks(s.n_vocab)
        .map(|r| r.to_vec())
        .collect();
    let want = reference(&s, &weights, &tokens);
    let (err, nmse) = (rel_err(&got, &want), nmse(&got, &want));
    eprintln!("cuda-on-host prefill, 24 tokens: max rel err {err:.2e}, nmse {nmse:.2e}");
    assert!(err < 6e-2 && nmse < 1e-3, "rel err {err:e}, nmse {nmse:e}");
}

/// Control vectors (`Model::steer`): a direction added after blocks 1 and 2 of a 3-layer
/// model, on the CPU and on the CUDA backend (host grid, f32 activations), against the float64
/// forward pass with the same directions. The directions move the logits far more than the
/// tolerance, so a backend that ignored them (or added them after the wrong block) fails.
#[test]
fn control_vectors_match_f64_reference() {
    use kiln_host::backend::cuda::Cuda;
    let s = Synth {
        n_layer: 3,
        ty: GgmlType::F16,
        ..QWEN3
    };
    let (file, weights) = build(&s);
    let mut rng = Rng(0x5eed);
    let mut dir = || Some((0..s.n_embd).map(|_| rng.next()).collect::<Vec<f32>>());
    let steer = vec![None, dir(), dir()];
    let want = reference_steered(&s, &weights, &TOKENS, &steer);
    let plain = reference(&s, &weights, &TOKENS);
    let moved = rel_err(
        &want
            .iter()
            .map(|r| r.iter().map(|&v| v as f32).collect())
            .collect::<Vec<_>>(),
        &plain,
    );
    assert!(
        moved > 0.05,
        "the directions barely move the logits ({moved:.2e})"
    );
    let cpu = prefill_steered(&Cpu::new().with_f32_activations(), &file, &TOKENS, &steer);
    let err = rel_err(&cpu, &want);
    assert!(
        err < 1e-3,
        "CPU, steered: rel err {err:.2e} against float64"
    );
    let cuda = Cuda::host::<policies::Hopper>().with_f32_activations();
    let gpu = prefill_steered(&cuda, &file, &TOKENS, &steer);
    let err = rel_err(&gpu, &want);
    assert!(
        err < 5e-3,
        "CUDA-on-host, steered: rel err {err:.2e} against float64"
    );
    // One direction per layer at most, of the model's width.
    let mut model = models::load(&Cpu::new(), &file, &mut |_, _| {}).unwrap();
    let too_many = vec![None; 4];
    assert!(model.steer(&Cpu::new(), &too_many).is_err());
    assert!(model.steer(&Cpu::new(), &[Some(vec![0.0; 3])]).is_err());
}

/// Context-extension RoPE against the float64 forward pass written from llama.cpp's
/// definitions, on both backends: Llama 3.1+'s `rope_freqs.weight` (per-pair divisors), linear
/// scaling, and YaRN (alone and over `rope_freqs`), for interleaved (llama) and NeoX (qwen3)
/// pairs; a factor table of the wrong length is an error naming the tensor.
#[test]
fn rope_extensions_match_f64_reference() {
    use kiln_host::backend::cuda::Cuda;
    // Mixed divisors, some < 1, as the table spans high and low frequencies.
    const FACTORS: [f32; 16] = [
        1.0, 1.0, 2.0, 4.0, 8.0, 16.0, 0.5, 3.0, 1.0, 32.0, 1.5, 6.0, 2.0, 0.25, 8.0, 1.0,
    ];
    // head_dim 32: the GPU kernels' smallest head. YaRN's ramp over 64 original positions
    // spans pairs 0..5 of 16, so all three regimes (kept, blended, divided) are exercised.
    let llama = Synth {
        head_dim: 32,
        ..LLAMA
    };
    let cases = [
        (llama, true, None),
        (QWEN3, true, None),
        (QWEN3, false, Some(("linear", 4.0))),
        (QWEN3, false, Some(("yarn", 4.0))),
        (llama, true, Some(("yarn", 8.0))),
    ];
    for (base, factors, scaling) in cases {
        let s = Synth {
            ty: GgmlType::F16,
            rope_factors: factors.then_some(&FACTORS[..base.head_dim / 2]),
            rope_scaling: scaling,
            ..base
        };
        let what = format!("{} factors {factors} scaling {scaling:?}", s.arch);
        let (file, weights) = build(&s);
        let want = reference(&s, &weights, &TOKENS);
        let plain = Synth {
            rope_factors: None,
            rope_scaling: None,
            ..s
        };
        let as_f32 = |r: &[Vec<f64>]| -> Vec<Vec<f32>> {
            r.iter()
                .map(|r| r.iter().map(|&v| v as f32).collect())
                .collect()
        };
        let moved = rel_err(&as_f32(&want), &reference(&plain, &weights, &TOKENS));
        assert!(
            moved > 1e-2,
            "{what}: barely moves the logits ({moved:.2e})"
        );
        let cpu = prefill_steered(&Cpu::new().with_f32_activations(), &file, &TOKENS, &[]);
        let err = rel_err(&cpu, &want);
        assert!(err < 1e-3, "{what}, CPU: rel err {err:.2e} against float64");
        let cuda = Cuda::host::<policies::Hopper>().with_f32_activations();
        let gpu = prefill_steered(&cuda, &file, &TOKENS, &[]);
        let err = rel_err(&gpu, &want);
        assert!(
            err < 5e-3,
            "{what}, CUDA-on-host: rel err {err:.2e} against float64"
        );
    }
    let (file, _) = build(&Synth {
        rope_factors: Some(&FACTORS[..3]),
        ..QWEN3
    });
    let Err(e) = models::load(&Cpu::new(), &file, &mut |_, _| {}) else {
        panic!("a 3-entry rope_freqs.weight for 32 rotary dims loaded");
    };
    let msg = format!("{e:#}");
    assert!(
        msg.contains("rope_freqs.weight") && msg.contains("[16]"),
        "{msg}"
    );
}
