//! Properties of `kernels/elementwise.rs`: RoPE (normal and NeoX, full and partial rotary),
//! SwiGLU, residual add, embedding lookup from every table format, and the f16 KV-cache store.
//! Thread counts are rarely a multiple of the block size, so the tail guard is always tested.
mod common;

use common::data::{Gen, head_dim, length, seed};
use common::reference::{self as r, BlockFormat, QK};
use common::{Arg, Device, check_err, check_written, download, names, poisoned, upload};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct RopeCase {
    n: u32,
    heads: u32,
    head_dim: u32,
    partial: bool,
    pos0: u32,
    neox: bool,
    theta: f32,
    /// With `rope_freqs`-style divisors.
    factors: bool,
    seed: u64,
}

fn rope_case() -> impl Strategy<Value = RopeCase> {
    let pos0 = prop_oneof![0..8u32, 0..5000u32];
    let theta = prop::sample::select(vec![10_000f32, 500_000.0, 1_000_000.0]);
    (
        1..=3u32,
        1..=4u32,
        head_dim(),
        any::<bool>(),
        pos0,
        any::<bool>(),
        theta,
        (any::<bool>(), seed()),
    )
        .prop_map(
            |(n, heads, head_dim, partial, pos0, neox, theta, (factors, seed))| RopeCase {
                n,
                heads,
                head_dim,
                partial,
                pos0,
                neox,
                theta,
                factors,
                seed,
            },
        )
}

fn rope(dev: &mut dyn Device, c: &RopeCase) -> Result<(), TestCaseError> {
    let (n, heads, hd) = (c.n as usize, c.heads as usize, c.head_dim as usize);
    let rot = if c.partial { hd / 2 } else { hd };
    let mut g = Gen::new(c.seed);
    let xs = g.magnitude(-1.0, 1.0);
    let x = g.normals(n * heads * hd, xs);
    let xb = upload(dev, &x);
    let log2_base = c.theta.log2();
    let threads = (n * heads * rot / 2) as u32;
    let dims = dev.shapes().flat(threads);
    let pos = upload(dev, &[c.pos0]); // kernels read the step's position from device memory
    // Llama 3.1-like divisors of the angles (1 to 8), or none (a null pointer).
    let factors: Option<Vec<f32>> = c
        .factors
        .then(|| (0..rot / 2).map(|_| g.uniform(1.0, 8.0)).collect());
    let fb = factors.as_ref().map(|f| upload(dev, f));
    let args = [
        xb.arg(),
        Arg::U32(c.heads),
        Arg::U32(c.head_dim),
        Arg::U32(rot as u32),
        pos.arg(),
        Arg::F32(log2_base),
        fb.as_ref().map_or(Arg::Ptr(0), |b| b.arg()),
        Arg::U32(c.neox as u32),
        Arg::U32(threads),
    ];
    dev.launch(names::kiln_rope, dims, &args);
    let out = download::<f32>(dev, &xb);
    check_written(dev, "rope", &out)?;
    // The kernel's inputs define the reference: the f32 log2(theta) it was given, exactly.
    let want = r::rope(
        &x,
        heads,
        hd,
        rot,
        c.pos0 as usize,
        2f64.powf(log2_base as f64),
        c.neox,
        factors.as_deref(),
    );
    // Angles are pos · freq in f32 (and freq is an approximate exp2 on the GPU), so the angle
    // error grows with the position: ~2^-22 relative of pos, a few 1e-4 rad at pos 5000.
    let max_pos = (c.pos0 + c.n) as f64;
    check_err(dev, "rope", r::rel_err(&out, &want), 1e-5 + 4e-7 * max_pos)?;
    // Dims past the rotary part pass through untouched, bit for bit.
    for (i, (&o, &v)) in out.iter().zip(&x).enumerate() {
        if i % hd >= rot {
            prop_assert!(
                o.to_bits() == v.to_bits(),
                "{}: dim {} of a head changed",
                dev.label(),
                i % hd
            );
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
struct FlatCase {
    len: u32,
    seed: u64,
}

fn flat_case() -> impl Strategy<Value = FlatCase> {
    (length(2000), seed()).prop_map(|(len, seed)| FlatCase { len, seed })
}

fn swiglu(dev: &mut dyn Device, c: &FlatCase) -> Result<(), TestCaseError> {
    let mut g = Gen::new(c.seed);
    let len = c.len as usize;
    // Gates out to ±100: silu saturates (exp overflow must give -0, not NaN).
    let gate: Vec<f32> = (0..len)
        .map(|_| {
            if g.chance(0.05) {
                g.uniform(-100.0, 100.0)
            } else {
                4.0 * g.normal()
            }
        })
        .collect();
    let us = g.magnitude(-1.0, 1.0);
    let up = g.normals(len, us);
    let (gb, ub) = (upload(dev, &gate), upload(dev, &up));
    let ob = poisoned::<f32>(dev, len, 0xff);
    dev.launch(
        names::kiln_swiglu,
        dev.shapes().flat(c.len),
        &[gb.arg(), ub.arg(), ob.arg(), Arg::U32(c.len)],
    );
    let out = download::<f32>(dev, &ob);
    check_written(dev, "swiglu", &out)?;
    // Relative to |g·u|, not to the result: where every gate is ≲ −88, silu underflows f32 to
    // 0 while the f64 value is ~1e-40 — a relative error of 1 that is no error at all.
    let want = r::swiglu(&gate, &up);
    let num: f64 = out
        .iter()
        .zip(&want)
        .map(|(&o, w)| (o as f64 - w).powi(2))
        .sum();
    let den: f64 = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| (g as f64 * u as f64).powi(2))
        .sum();
    check_err(dev, "swiglu", (num / den.max(1e-300)).sqrt(), 1e-5)
}

fn add_assign(dev: &mut dyn Device, c: &FlatCase) -> Result<(), TestCaseError> {
    let mut g = Gen::new(c.seed);
    let len = c.len as usize;
    let (sa, sx) = (g.magnitude(-2.0, 2.0), g.magnitude(-2.0, 2.0));
    let acc = g.normals(len, sa);
    let x = g.normals(len, sx);
    // One past the end: a guard value the tail threads must not touch.
    let mut acc_ext = acc.clone();
    acc_ext.push(1234.5);
    let (ab, xb) = (upload(dev, &acc_ext), upload(dev, &x));
    dev.launch(
        names::kiln_add_assign,
        dev.shapes().flat(c.len),
        &[ab.arg(), xb.arg(), Arg::U32(c.len)],
    );
    let out = download::<f32>(dev, &ab);
    prop_assert!(
        out[len] == 1234.5,
        "{}: add_assign wrote past len",
        dev.label()
    );
    // One f32 rounding per element.
    check_err(
        dev,
        "add_assign",
        r::rel_err(&out[..len], &r::add(&acc, &x)),
        1e-6,
    )
}

#[derive(Clone, Debug)]
struct RowCase {
    rows: u32,
    cols: u32,
    seed: u64,
}

fn row_case() -> impl Strategy<Value = RowCase> {
    (1..=9u32, length(700), seed()).prop_map(|(rows, cols, seed)| RowCase { rows, cols, seed })
}

/// `add_row`: one control-vector row added to every row, the tail guarded.
fn add_row(dev: &mut dyn Device, c: &RowCase) -> Result<(), TestCaseError> {
    let mut g = Gen::new(c.seed);
    let (cols, len) = (c.cols as usize, (c.rows * c.cols) as usize);
    let (sa, sr) = (g.magnitude(-2.0, 2.0), g.magnitude(-2.0, 2.0));
    let acc = g.normals(len, sa);
    let row = g.normals(cols, sr);
    let mut acc_ext = acc.clone();
    acc_ext.push(1234.5);
    let (ab, rb) = (upload(dev, &acc_ext), upload(dev, &row));
    dev.launch(
        names::kiln_add_row,
        dev.shapes().flat(len as u32),
        &[ab.arg(), rb.arg(), Arg::U32(c.cols), Arg::U32(len as u32)],
    );
    let out = download::<f32>(dev, &ab);
    prop_assert!(
        out[len] == 1234.5,
        "{}: add_row wrote past len",
        dev.label()
    );
    let want: Vec<f64> = (0..len)
        .map(|i| acc[i] as f64 + row[i % cols] as f64)
        .collect();
    check_err(dev, "add_row", r::rel_err(&out[..len], &want), 1e-6)
}

/// Embedding table formats: the three split block formats and plain f16.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Table {
    Block(BlockFormat),
    F16,
}

#[derive(Clone, Debug)]
struct EmbedCase {
    table: Table,
    vocab: u32,
    blocks: u32,
    ids: Vec<u32>,
    seed: u64,
}

fn embed_case() -> impl Strategy<Value = EmbedCase> {
    let table = prop::sample::select(vec![
        Table::Block(BlockFormat::Q4_0),
        Table::Block(BlockFormat::Q4_1),
        Table::Block(BlockFormat::Q8_0),
        Table::Block(BlockFormat::Q6K),
        Table::Block(BlockFormat::Q5K),
        Table::Block(BlockFormat::Q4K),
        Table::F16,
    ]);
    (table, 1..=20u32, 1..=12u32, seed()).prop_flat_map(|(table, vocab, blocks, seed)| {
        // Ids anywhere in the table, repeats allowed, the last row reachable.
        let group = match table {
            Table::Block(fmt) => fmt.group() as u32,
            Table::F16 => 1,
        };
        prop::collection::vec(0..vocab, 1..=6).prop_map(move |ids| EmbedCase {
            table,
            vocab,
            blocks: blocks.next_multiple_of(group),
            ids,
            seed,
        })
    })
}

fn embed(dev: &mut dyn Device, c: &EmbedCase) -> Result<(), TestCaseError> {
    let (vocab, cols, n) = (c.vocab as usize, c.blocks as usize * QK, c.ids.len());
    let mut g = Gen::new(c.seed);
    let threads = (n * cols) as u32;
    let ids_b = upload(dev, &c.ids);
    let out_b = poisoned::<f32>(dev, n * cols, 0xff);
    let dims = dev.shapes().flat(threads);
    let table = match c.table {
        Table::F16 => {
            let t: Vec<u16> = g
                .normals(vocab * cols, 0.1)
                .into_iter()
                .map(|v| half::f16::from_f32(v).to_bits())
                .collect();
            let tb = upload(dev, &t);
            let args = [
                tb.arg(),
                ids_b.arg(),
                out_b.arg(),
                Arg::U32(cols as u32),
                Arg::U32(threads),
            ];
            dev.launch(names::kiln_embed_f16, dims, &args);
            r::f16_values(&t)
        }
        Table::Block(fmt) => {
            let gguf = g.gguf_blocks(fmt, vocab * cols / QK);
            let (qs, sc) = common::split_planes(fmt, &gguf, vocab, cols);
            // The families list the formats in `BlockFormat`'s order.
            let entry = kernels_gpu::entries::families::EMBED[fmt as usize];
            let (qb, sb) = (upload(dev, &qs), upload(dev, &sc));
            let args = [
                qb.arg(),
                sb.arg(),
                ids_b.arg(),
                out_b.arg(),
                Arg::U32(cols as u32),
                Arg::U32(threads),
            ];
            dev.launch(entry, dims, &args);
            r::dequantize(fmt, &gguf, vocab, cols)
        }
    };
    let out = download::<f32>(dev, &out_b);
    check_written(dev, "embed", &out)?;
    // Dequantization is exact but for Q4_1's one rounding of d·q + m.
    check_err(
        dev,
        "embed",
        r::rel_err(&out, &r::embed(&table, &c.ids, cols)),
        1e-6,
    )
}

#[derive(Clone, Debug)]
struct KvCase {
    n: u32,
    kv_heads: u32,
    head_dim: u32,
    pos0: u32,
    spare: u32,
    seed: u64,
}

fn kv_case() -> impl Strategy<Value = KvCase> {
    (1..=4u32, 1..=4u32, head_dim(), 0..40u32, 0..3u32, seed()).prop_map(
        |(n, kv_heads, head_dim, pos0, spare, seed)| KvCase {
            n,
            kv_heads,
            head_dim,
            pos0,
            spare,
            seed,
        },
    )
}

fn kv_store(dev: &mut dyn Device, c: &KvCase) -> Result<(), TestCaseError> {
    let (n, kvh, hd) = (c.n as usize, c.kv_heads as usize, c.head_dim as usize);
    let max_ctx = (c.pos0 + c.n + c.spare) as usize;
    let mut g = Gen::new(c.seed);
    // Magnitudes from f16 subnormals to past f16's range (rounds to ±inf).
    let mut src = || -> Vec<f32> {
        (0..n * kvh * hd)
            .map(|_| g.sign() * g.magnitude(-7.0, 4.9))
            .collect()
    };
    let (k, v) = (src(), src());
    // The caches start as NaN halves with distinct payloads (K and V differ): slots outside
    // the stored positions must keep theirs, bit for bit.
    let fresh = |tag: u16| -> Vec<u16> {
        (0..kvh * max_ctx * hd)
            .map(|i| 0x7e00 | tag | (i as u16 & 0xff))
            .collect()
    };
    let (mut k_cache, mut v_cache) = (fresh(0), fresh(0x100));
    let (kb, vb, kcb, vcb) = (
        upload(dev, &k),
        upload(dev, &v),
        upload(dev, &k_cache),
        upload(dev, &v_cache),
    );
    let threads = (n * kvh * hd) as u32;
    let pos = upload(dev, &[c.pos0]); // read on the device, like every position-dependent kernel
    let args = [
        kb.arg(),
        vb.arg(),
        kcb.arg(),
        vcb.arg(),
        Arg::U32(c.kv_heads),
        Arg::U32(c.head_dim),
        Arg::U32(max_ctx as u32),
        pos.arg(),
        Arg::U32(threads),
    ];
    dev.launch(names::kiln_kv_store, dev.shapes().flat(threads), &args);
    r::kv_store(&mut k_cache, &k, kvh, hd, max_ctx, c.pos0 as usize);
    r::kv_store(&mut v_cache, &v, kvh, hd, max_ctx, c.pos0 as usize);
    for (which, got, want) in [
        ("k", download::<u16>(dev, &kcb), k_cache),
        ("v", download::<u16>(dev, &vcb), v_cache),
    ] {
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            let (h, p, d) = (i / (max_ctx * hd), i / hd % max_ctx, i % hd);
            prop_assert!(
                false,
                "{}: {which} cache[head {h}, pos {p}, dim {d}] = {:#06x}, want {:#06x}",
                dev.label(),
                got[i],
                want[i]
            );
        }
    }
    Ok(())
}

kernel_properties! {
    host_rope, gpu_rope: rope_case() => rope;
    host_swiglu, gpu_swiglu: flat_case() => swiglu;
    host_add_assign, gpu_add_assign: flat_case() => add_assign;
    host_add_row, gpu_add_row: row_case() => add_row;
    host_embed, gpu_embed: embed_case() => embed;
    host_kv_store, gpu_kv_store: kv_case() => kv_store;
}

/// Long contexts and many heads: GPU only.
#[test]
fn gpu_rope_long_context() {
    let case = (
        1..=16u32,
        1..=64u32,
        head_dim(),
        any::<bool>(),
        0..32768u32,
        any::<bool>(),
        seed(),
    )
        .prop_map(|(n, heads, head_dim, partial, pos0, neox, seed)| RopeCase {
            n,
            heads,
            head_dim,
            partial,
            pos0,
            neox,
            theta: 1_000_000.0,
            factors: seed % 2 == 0,
            seed,
        });
    common::run_gpu("gpu_rope_long_context", 32, case, rope);
}
