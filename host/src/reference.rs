//! float64 references of every GPU kernel, written as plainly as possible: the kernel property
//! tests (`tests/kernels_*.rs`) compare the host grid executor and the real GPU against these.
//!
//! Nothing here shares code with the kernels or the CPU backend on purpose: the GGUF block
//! layouts are decoded again from their definition, so a layout mistake cannot cancel out.
//! Layouts are `row-major` with the same shapes the kernel docs state.

/// The 32-element block formats the GPU keeps in split layout. `Q4K`, `Q5K` and `Q6K` are
/// the unpacked 32-element blocks kiln makes of a K-quant super-block
/// (`kernels_gpu::quant::reblock`), not GGUF types: eight consecutive blocks of a row share
/// `d` (and `dmin`) as the super-block's eight sub-blocks do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFormat {
    Q4_0,
    Q4_1,
    Q8_0,
    Q6K,
    Q5K,
    Q4K,
}

/// Elements per block of every [`BlockFormat`].
pub const QK: usize = 32;

impl BlockFormat {
    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q6K => 36,
            BlockFormat::Q5K | BlockFormat::Q4K => 38,
        }
    }

    /// Blocks of a row that must come in whole groups sharing their `d` (a K super-block).
    pub fn group(self) -> usize {
        match self {
            BlockFormat::Q6K | BlockFormat::Q5K | BlockFormat::Q4K => 8,
            _ => 1,
        }
    }
}

fn half(bytes: &[u8], at: usize) -> f64 {
    half::f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f64()
}

/// Dequantize one block:
/// Q4_0 `{d: f16, qs: [u8; 16]}` → d·(q − 8); Q4_1 `{d, m: f16, qs: [u8; 16]}` → d·q + m;
/// Q8_0 `{d: f16, qs: [i8; 32]}` → d·q; Q6K `{d: f16, sc: [i8; 2], q: [u8; 32]}` →
/// d·sc[i / 16]·(q − 32); Q4K and Q5K `{d, dmin: f16, sc, m: u8, q: [u8; 32]}` →
/// d·sc·q − dmin·m. 4-bit element i < 16 is the low nibble of byte i, element 16 + i the high
/// nibble.
pub fn dequantize_block(fmt: BlockFormat, b: &[u8]) -> [f64; QK] {
    let nib = |qs: &[u8], i: usize| if i < 16 { qs[i] & 0xf } else { qs[i - 16] >> 4 } as f64;
    std::array::from_fn(|i| match fmt {
        BlockFormat::Q4_0 => half(b, 0) * (nib(&b[2..], i) - 8.0),
        BlockFormat::Q4_1 => half(b, 0) * nib(&b[4..], i) + half(b, 2),
        BlockFormat::Q8_0 => half(b, 0) * b[2 + i] as i8 as f64,
        BlockFormat::Q6K => half(b, 0) * b[2 + i / 16] as i8 as f64 * (b[4 + i] as f64 - 32.0),
        BlockFormat::Q5K | BlockFormat::Q4K => {
            half(b, 0) * b[4] as f64 * b[6 + i] as f64 - half(b, 2) * b[5] as f64
        }
    })
}

/// Dequantize a `rows × cols` matrix of GGUF blocks (`cols % 32 == 0`).
pub fn dequantize(fmt: BlockFormat, gguf: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    assert!(cols.is_multiple_of(QK) && gguf.len() == rows * cols / QK * fmt.block_bytes());
    gguf.chunks_exact(fmt.block_bytes())
        .flat_map(|b| dequantize_block(fmt, b))
        .collect()
}

/// The f16 weights the GEMM's tensor cores multiply (`kernels/mma.rs`): each weight rounded
/// once to f16 from its exact value, except Q4K's and Q5K's, whose block scale `d·sc` and
/// minimum `−dmin·m` are each rounded to f16 first and then combined by one f16 FMA (as Q4_1's
/// stored f16 scale and minimum are).
pub fn gemm_weights_f16(fmt: BlockFormat, blocks: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    let f16 = |v: f64| half::f16::from_f64(v).to_f64();
    match fmt {
        BlockFormat::Q4K | BlockFormat::Q5K => blocks
            .chunks_exact(fmt.block_bytes())
            .flat_map(|b| {
                let scale = f16(half(b, 0) * b[4] as f64);
                let min = f16(-half(b, 2) * b[5] as f64);
                (0..QK).map(move |i| f16(scale * b[6 + i] as f64 + min))
            })
            .collect(),
        _ => dequantize(fmt, blocks, rows, cols)
            .into_iter()
            .map(f16)
            .collect(),
    }
}

/// What each weight's roundings are relative to: `|w|`, but for Q4K and Q5K, whose scaled code
/// and minimum may cancel, `|d·sc·q| + |dmin·m|`.
pub fn weight_magnitudes(fmt: BlockFormat, blocks: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    match fmt {
        BlockFormat::Q4K | BlockFormat::Q5K => blocks
            .chunks_exact(fmt.block_bytes())
            .flat_map(|b| {
                let (scale, min) = (half(b, 0) * b[4] as f64, half(b, 2) * b[5] as f64);
                (0..QK).map(move |i| (scale * b[6 + i] as f64).abs() + min.abs())
            })
            .collect(),
        _ => dequantize(fmt, blocks, rows, cols)
            .into_iter()
            .map(f64::abs)
            .collect(),
    }
}

/// f16 bits to f64 (exact).
pub fn f16_values(bits: &[u16]) -> Vec<f64> {
    bits.iter()
        .map(|&b| half::f16::from_bits(b).to_f64())
        .collect()
}

pub fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// The activations a Q8_1 block stands for: element i of block b is `d_b · q_i` (`xds` holds
/// the `(d, s)` pairs per block as the quantize kernel writes them, `s ≈ d·Σq`).
pub fn q8_activations(xq: &[i8], xds: &[f32]) -> Vec<f64> {
    assert_eq!(xq.len(), xds.len() / 2 * QK);
    xq.iter()
        .enumerate()
        .map(|(i, &q)| xds[2 * (i / QK)] as f64 * q as f64)
        .collect()
}

/// The coefficient of a weight block's constant part: every element is `a_i + c` with `a_i`
/// the part that scales the quant (Q4_0: d·n, Q4_1: d·n, Q8_0: d·q) and `c` = −8d, m, 0
/// (Q4K, Q5K: −dmin·m; Q6K: 0, its −32 is an integer inside the dot).
/// Q4_1's dot uses the activation block's stored `s` (f16 `d·Σq`) for `c · d_x·Σq`, as the CPU
/// backend and llama.cpp do; Q4_0's uses the exact integer `Σq` (the kernel sums it with dp4a),
/// matching the CPU backend's integer `Σ(q−8)·x`.
pub fn q8_1_offset(fmt: BlockFormat, block: &[u8]) -> f64 {
    match fmt {
        BlockFormat::Q4_0 => -8.0 * half(block, 0),
        BlockFormat::Q4_1 => half(block, 2),
        BlockFormat::Q5K | BlockFormat::Q4K => -half(block, 2) * block[5] as f64,
        BlockFormat::Q8_0 | BlockFormat::Q6K => 0.0,
    }
}

/// The integer mat-vec's definition on Q8_1 activations (codes `xq`, per-block `(d, s)` in
/// `xds`): `y[t][r] = Σ_b d_x·Σ_i (w_i − c)·q_i + c·s`, with `c` from [`q8_1_offset`].
/// Equal to `matvec(w, q8_activations(..))` when `s = d·Σq` exactly.
pub fn matvec_q8_1(
    fmt: BlockFormat,
    gguf: &[u8],
    rows: usize,
    cols: usize,
    xq: &[i8],
    xds: &[f32],
) -> Vec<f64> {
    q8_1_block_sums(fmt, gguf, rows, cols, xq, xds, |dot, offset| dot + offset)
}

/// The scale of the f32 rounding in [`matvec_q8_1`]'s value as the kernels compute it, in any
/// order of summing blocks: `Σ_b` of the magnitudes each block rounds. Q4_0's and Q8_0's block
/// is one product of an exact integer dot (Q4_0 folds its −8·Σx in exactly), so `|term_b|`;
/// Q4_1's is the f32 sum of `d_w·d_x·dot` and `m·s`, which may cancel, so both by magnitude.
pub fn matvec_q8_1_abs(
    fmt: BlockFormat,
    gguf: &[u8],
    rows: usize,
    cols: usize,
    xq: &[i8],
    xds: &[f32],
) -> Vec<f64> {
    match fmt {
        BlockFormat::Q4_1 | BlockFormat::Q5K | BlockFormat::Q4K => {
            q8_1_block_sums(fmt, gguf, rows, cols, xq, xds, |dot, offset| {
                dot.abs() + offset.abs()
            })
        }
        _ => q8_1_block_sums(fmt, gguf, rows, cols, xq, xds, |dot, offset| {
            (dot + offset).abs()
        }),
    }
}

/// `Σ_b f(d_x·dot_b, offset_b)` per output, the block terms of [`matvec_q8_1`] split in two.
fn q8_1_block_sums(
    fmt: BlockFormat,
    gguf: &[u8],
    rows: usize,
    cols: usize,
    xq: &[i8],
    xds: &[f32],
    f: fn(f64, f64) -> f64,
) -> Vec<f64> {
    let nb = cols / QK;
    let n = xq.len() / cols;
    assert!(cols.is_multiple_of(QK) && xq.len() == n * cols && xds.len() == 2 * n * nb);
    let blocks: Vec<&[u8]> = gguf.chunks_exact(fmt.block_bytes()).collect();
    assert_eq!(blocks.len(), rows * nb);
    let mut y = Vec::with_capacity(n * rows);
    for t in 0..n {
        for r in 0..rows {
            let mut acc = 0.0;
            for b in 0..nb {
                let wb = blocks[r * nb + b];
                let (w, c) = (dequantize_block(fmt, wb), q8_1_offset(fmt, wb));
                let (d, s) = (
                    xds[2 * (t * nb + b)] as f64,
                    xds[2 * (t * nb + b) + 1] as f64,
                );
                let q = &xq[(t * nb + b) * QK..][..QK];
                let dot: f64 = w.iter().zip(q).map(|(wi, &qi)| (wi - c) * qi as f64).sum();
                let offset = match fmt {
                    BlockFormat::Q4_0 => c * d * q.iter().map(|&v| v as f64).sum::<f64>(),
                    _ => c * s,
                };
                acc += f(d * dot, offset);
            }
            y.push(acc);
        }
    }
    y
}

/// `y[t][r] = Σ_c w[r][c] · x[t][c]` for `n` activation rows.
pub fn matvec(w: &[f64], x: &[f64], rows: usize, cols: usize, n: usize) -> Vec<f64> {
    assert!(w.len() == rows * cols && x.len() == n * cols);
    let mut y = Vec::with_capacity(n * rows);
    for xt in x.chunks_exact(cols) {
        for wr in w.chunks_exact(cols) {
            y.push(wr.iter().zip(xt).map(|(a, b)| a * b).sum());
        }
    }
    y
}

/// RMSNorm of each row: `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &[f32], w: &[f32], cols: usize, eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols) {
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(&v, &g)| v as f64 * inv * g as f64));
    }
    out
}

/// Softmax of each row (max-subtracted; the reference of the safe formulation).
pub fn softmax(x: &[f32], cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols) {
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / s));
    }
    out
}

/// RoPE of `x` (`n × heads × head_dim`), token t at position `pos0 + t`: the first `rot_dim`
/// dims of each head rotate in pairs (2i, 2i+1) (normal) or (i, i + rot_dim/2) (NeoX) by angle
/// `pos · theta^(−2i/rot_dim) / factors[i]` (`factors` all 1 when `None`); the remaining dims
/// pass through.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &[f32],
    heads: usize,
    head_dim: usize,
    rot_dim: usize,
    pos0: usize,
    theta: f64,
    neox: bool,
    factors: Option<&[f32]>,
) -> Vec<f64> {
    assert!(
        rot_dim.is_multiple_of(2)
            && rot_dim <= head_dim
            && x.len().is_multiple_of(heads * head_dim)
    );
    let mut out = widen(x);
    let half = rot_dim / 2;
    for (row, head) in out.chunks_exact_mut(head_dim).enumerate() {
        let pos = (pos0 + row / heads) as f64;
        for i in 0..half {
            let factor = factors.map_or(1.0, |f| f[i] as f64);
            let angle = pos * theta.powf(-((2 * i) as f64) / rot_dim as f64) / factor;
            let (s, c) = angle.sin_cos();
            let (a, b) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (va, vb) = (head[a], head[b]);
            head[a] = va * c - vb * s;
            head[b] = va * s + vb * c;
        }
    }
    out
}

/// `silu(gate) · up`.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| g as f64 / (1.0 + (-(g as f64)).exp()) * u as f64)
        .collect()
}

/// `acc + x`.
pub fn add(acc: &[f32], x: &[f32]) -> Vec<f64> {
    acc.iter()
        .zip(x)
        .map(|(&a, &b)| a as f64 + b as f64)
        .collect()
}

/// Rows `ids` of a `vocab × cols` table.
pub fn embed(table: &[f64], ids: &[u32], cols: usize) -> Vec<f64> {
    ids.iter()
        .flat_map(|&id| {
            table[id as usize * cols..(id as usize + 1) * cols]
                .iter()
                .copied()
        })
        .collect()
}

/// f32 to f16 bits, round to nearest even (what `cvt.rn.f16.f32` does).
pub fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// Store `n` tokens of `src` (`n × kv_heads × head_dim`) into an f16 cache
/// (`kv_heads × max_ctx × head_dim`) at positions `pos0..pos0 + n`; other slots untouched.
pub fn kv_store(
    cache: &mut [u16],
    src: &[f32],
    kv_heads: usize,
    head_dim: usize,
    max_ctx: usize,
    pos0: usize,
) {
    for (i, &v) in src.iter().enumerate() {
        let (d, h, t) = (
            i % head_dim,
            i / head_dim % kv_heads,
            i / (head_dim * kv_heads),
        );
        cache[(h * max_ctx + pos0 + t) * head_dim + d] = f16_bits(v);
    }
}

/// Causal grouped-query attention: for token t (position `pos0 + t`) and query head h (KV head
/// `h / (heads / kv_heads)`), `softmax(scale · q·k_p for p in 0..=pos0+t) · V`.
/// `q`: `n × heads × head_dim`; `k`, `v`: `kv_heads × max_ctx × head_dim`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f64],
    v: &[f64],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    max_ctx: usize,
    pos0: usize,
    scale: f64,
) -> Vec<f64> {
    assert!(heads.is_multiple_of(kv_heads) && q.len().is_multiple_of(heads * head_dim));
    let n = q.len() / (heads * head_dim);
    let mut out = vec![0.0; q.len()];
    for t in 0..n {
        for h in 0..heads {
            let base = (h / (heads / kv_heads)) * max_ctx;
            let qh = &q[(t * heads + h) * head_dim..][..head_dim];
            let len = pos0 + t + 1;
            let s: Vec<f64> = (0..len)
                .map(|p| {
                    scale
                        * qh.iter()
                            .zip(&k[(base + p) * head_dim..][..head_dim])
                            .map(|(&a, b)| a as f64 * b)
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let o = &mut out[(t * heads + h) * head_dim..][..head_dim];
            for (p, ep) in e.iter().enumerate() {
                for (d, od) in o.iter_mut().enumerate() {
                    *od += ep / z * v[(base + p) * head_dim + d];
                }
            }
        }
    }
    out
}

/// Norm-wise error of `out` against `reference`, relative to `mag` (each output's Σ|terms|)
/// rather than to `reference`: a sum of random terms can cancel far below them, while float
/// rounding (of the terms, or of f16 operands) is relative to the terms.
pub fn err_vs_magnitude(out: &[f32], reference: &[f64], mag: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "length mismatch");
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(&o, r)| (o as f64 - r).powi(2))
        .sum();
    let den: f64 = mag.iter().map(|a| a * a).sum();
    (num / den.max(1e-300)).sqrt()
}

/// ‖out − ref‖₂ / ‖ref‖₂ (the error measure every property bounds; ‖ref‖ is never zero there).
/// A NaN anywhere in `out` makes it NaN, which fails any `<=` bound.
pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "length mismatch");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        num += (o as f64 - r).powi(2);
        den += r * r;
    }
    (num / den).sqrt()
}

/// Mixture-of-experts routing of one row of router logits: the `k` largest logits in
/// descending order (the lower index first on ties) and their softmax probabilities over all
/// the logits, rescaled to sum to 1 with `norm`.
pub fn moe_route(logits: &[f32], k: usize, norm: bool) -> (Vec<usize>, Vec<f64>) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(k);
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let z: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let mut w: Vec<f64> = order
        .iter()
        .map(|&e| (logits[e] as f64 - max).exp() / z)
        .collect();
    if norm {
        let chosen: f64 = w.iter().sum();
        w.iter_mut().for_each(|p| *p /= chosen);
    }
    (order, w)
}
