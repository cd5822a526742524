//! Properties of `kernels/norm.rs`: RMSNorm, softmax and the row NLL, one block per row. Column counts
//! cover fewer columns than threads (most threads idle), exactly a block (256), and several
//! strides per thread; both run out of place (poisoned output) and in place.
mod common;

use common::data::{Gen, length, seed};
use common::reference as r;
use common::{
    Arg, Buf, Device, check_err, check_written, download, names, poisoned, same_bits, upload,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct RowCase {
    rows: u32,
    cols: u32,
    in_place: bool,
    seed: u64,
}

fn row_case() -> impl Strategy<Value = RowCase> {
    (1..=6u32, length(700), any::<bool>(), seed()).prop_map(|(rows, cols, in_place, seed)| {
        RowCase {
            rows,
            cols,
            in_place,
            seed,
        }
    })
}

/// Rows wider than one chunk per thread of the register-resident norms (more than 4096
/// columns: several chunks each) and vocabulary-sized argmax rows (many pass-1 blocks).
fn wide_row_case() -> impl Strategy<Value = RowCase> {
    let cols = prop_oneof![
        prop::sample::select(vec![4097u32, 8192, 16384]),
        4097..=16384u32
    ];
    (Just(1u32), cols, any::<bool>(), seed()).prop_map(|(rows, cols, in_place, seed)| RowCase {
        rows,
        cols,
        in_place,
        seed,
    })
}

/// Launch a per-row kernel whose output is `x`'s shape; returns the output.
fn run_rows(
    dev: &mut dyn Device,
    c: &RowCase,
    x: &[f32],
    entry: &'static str,
    args: impl Fn(common::Buf, common::Buf) -> Vec<Arg>,
) -> Vec<f32> {
    let xb = upload(dev, x);
    let out = if c.in_place {
        xb
    } else {
        poisoned::<f32>(dev, x.len(), 0xff)
    };
    let dims = dev.shapes().per_row(c.rows);
    dev.launch(entry, dims, &args(xb, out));
    download::<f32>(dev, &out)
}

fn rms_norm(dev: &mut dyn Device, c: &RowCase) -> Result<(), TestCaseError> {
    let (rows, cols) = (c.rows as usize, c.cols as usize);
    let mut g = Gen::new(c.seed);
    let mut x = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let s = g.magnitude(-3.0, 3.0); // rows of very different scale: each normalizes alone
        x.extend(g.normals(cols, s));
    }
    let w: Vec<f32> = (0..cols).map(|_| g.normal() + 0.5).collect(); // either sign
    let eps = if g.chance(0.5) { 1e-6 } else { 1e-5 };
    let wb = upload(dev, &w);
    let out = run_rows(dev, c, &x, names::kiln_rms_norm, |xb, ob| {
        vec![
            xb.arg(),
            wb.arg(),
            ob.arg(),
            Arg::U32(c.cols),
            Arg::F32(eps),
        ]
    });
    check_written(dev, "rms_norm", &out)?;
    check_err(
        dev,
        "rms_norm",
        r::rel_err(&out, &r::rms_norm(&x, &w, cols, eps as f64)),
        1e-5,
    )
}

/// `rows` logit rows of `cols`: spreads from nearly uniform to one-hot, each row offset by up
/// to ±100 to check the max subtraction (exp(100) alone would overflow f32).
fn logit_rows(g: &mut Gen, rows: usize, cols: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let (spread, offset) = (g.magnitude(-2.0, 1.5), g.uniform(-100.0, 100.0));
        x.extend(g.normals(cols, spread).into_iter().map(|v| v + offset));
    }
    x
}

fn softmax(dev: &mut dyn Device, c: &RowCase) -> Result<(), TestCaseError> {
    let (rows, cols) = (c.rows as usize, c.cols as usize);
    let mut g = Gen::new(c.seed);
    let x = logit_rows(&mut g, rows, cols);
    let out = run_rows(dev, c, &x, names::kiln_softmax, |xb, ob| {
        vec![xb.arg(), ob.arg(), Arg::U32(c.cols)]
    });
    check_written(dev, "softmax", &out)?;
    check_err(
        dev,
        "softmax",
        r::rel_err(&out, &r::softmax(&x, cols)),
        1e-5,
    )?;
    for (row, o) in out.chunks_exact(cols).enumerate() {
        let s: f64 = o.iter().map(|&v| v as f64).sum();
        prop_assert!(
            (s - 1.0).abs() <= 1e-5,
            "{}: row {row} sums to {s}",
            dev.label()
        );
    }
    Ok(())
}

/// `row_nll`'s parts against float64: `max − x[target]` exactly (the block max is exact) and
/// `Σ exp(x − max)` to the f32 `exp`'s accuracy, so `ln` of the one plus the other is the NLL.
/// Rows from [`logit_rows`], random targets.
fn row_nll(dev: &mut dyn Device, c: &RowCase) -> Result<(), TestCaseError> {
    let (rows, cols) = (c.rows as usize, c.cols as usize);
    let mut g = Gen::new(c.seed);
    let x = logit_rows(&mut g, rows, cols);
    let targets: Vec<u32> = (0..rows)
        .map(|_| (g.uniform(0.0, 1.0) * cols as f32) as u32 % c.cols)
        .collect();
    let (xb, tb) = (upload(dev, &x), upload(dev, &targets));
    let out = poisoned::<f64>(dev, 2 * rows, 0xff);
    let dims = dev.shapes().per_row(c.rows);
    dev.launch(
        names::kiln_row_nll,
        dims,
        &[xb.arg(), tb.arg(), out.arg(), Arg::U32(c.cols)],
    );
    let got = download::<f64>(dev, &out);
    for (r, (row, &t)) in x.chunks_exact(cols).zip(&targets).enumerate() {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        let (s, d) = (got[2 * r], got[2 * r + 1]);
        prop_assert_eq!(
            d,
            max - row[t as usize] as f64,
            "{}: row {} max − target",
            dev.label(),
            r
        );
        prop_assert!(
            (s - sum).abs() <= 1e-5 * sum,
            "{}: row {r} Σexp {s} vs {sum}",
            dev.label()
        );
        let (nll, want) = (s.ln() + d, sum.ln() + max - row[t as usize] as f64);
        prop_assert!(
            (nll - want).abs() <= 1e-5,
            "{}: row {r} nll {nll} vs {want}",
            dev.label()
        );
    }
    Ok(())
}

/// `rms_norm_q8` normalizes like the float64 reference, and its Q8_1 blocks are what
/// `quantize_q8_1` writes for its own f32 output, bit for bit: the fused path may never change
/// a single activation code.
fn rms_norm_q8(dev: &mut dyn Device, c: &RowCase) -> Result<(), TestCaseError> {
    let (rows, cols) = (c.rows as usize, (c.cols as usize).div_ceil(32) * 32);
    let mut g = Gen::new(c.seed);
    let x = g.activations(rows, cols);
    let w: Vec<f32> = (0..cols).map(|_| g.normal() + 0.5).collect();
    let (xb, wb) = (upload(dev, &x), upload(dev, &w));
    let (cu, eps) = (Arg::U32(cols as u32), Arg::F32(1e-6));
    let fused = poisoned::<f32>(dev, rows * cols, 0xff);
    let (q, ds) = (
        poisoned::<i8>(dev, rows * cols, 0x80),
        poisoned::<f32>(dev, rows * cols / 16, 0xff),
    );
    let dims = dev.shapes().norm_q8(rows as u32, cols as u32);
    dev.launch(
        names::kiln_rms_norm_q8,
        dims,
        &[xb.arg(), wb.arg(), fused.arg(), q.arg(), ds.arg(), cu, eps],
    );
    let normed = download::<f32>(dev, &fused);
    check_written(dev, "rms_norm_q8", &normed)?;
    check_err(
        dev,
        "rms_norm_q8",
        r::rel_err(&normed, &r::rms_norm(&x, &w, cols, 1e-6)),
        1e-5,
    )?;
    let (q_ref, ds_ref) = (
        poisoned::<i8>(dev, rows * cols, 0x80),
        poisoned::<f32>(dev, rows * cols / 16, 0xff),
    );
    dev.launch(
        names::kiln_quantize_q8_1,
        dev.shapes().quantize_q8_1(cols as u32, rows as u32),
        &[fused.arg(), q_ref.arg(), ds_ref.arg(), cu],
    );
    same_bits::<i8>(dev, "codes", &q, &q_ref)?;
    same_bits::<f32>(dev, "block scales", &ds, &ds_ref)?;
    Ok(())
}

/// Row argmax against the CPU rule: first index of the maximum, NaN never chosen, 0 when no
/// element beats −∞. Rows mix ties, NaNs and infinities.
fn argmax(dev: &mut dyn Device, c: &RowCase) -> Result<(), TestCaseError> {
    let (rows, cols) = (c.rows as usize, c.cols as usize);
    let mut g = Gen::new(c.seed);
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|_| (g.normal() * 4.0).round())
        .collect(); // many ties
    for v in x.iter_mut() {
        if g.chance(0.05) {
            *v = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY]
                [(g.normal().abs() * 10.0) as usize % 3];
        }
    }
    if g.chance(0.2) {
        x[..cols].fill(f32::NEG_INFINITY); // a row where nothing beats −∞
    }
    let xb = upload(dev, &x);
    let (cu, parts) = (cols as u32, dev.shapes().argmax_parts(cols as u32));
    let (part, out) = (
        poisoned::<u32>(dev, 2 * rows * parts as usize, 0xff),
        poisoned::<u32>(dev, rows, 0xff),
    );
    dev.launch(
        names::kiln_argmax_blocks,
        dev.shapes().argmax_blocks(rows as u32, cu),
        &[xb.arg(), part.arg(), Arg::U32(cu)],
    );
    dev.launch(
        names::kiln_argmax_merge,
        dev.shapes().argmax_merge(rows as u32),
        &[part.arg(), out.arg(), Arg::U32(parts)],
    );
    let got = download::<u32>(dev, &out);
    for (r, row) in x.chunks(cols).enumerate() {
        let want = row
            .iter()
            .enumerate()
            .fold((0u32, f32::NEG_INFINITY), |b, (i, &v)| {
                if v > b.1 { (i as u32, v) } else { b }
            })
            .0;
        prop_assert_eq!(got[r], want, "{}: row {}", dev.label(), r);
    }
    Ok(())
}

#[derive(Clone, Debug)]
struct NormRopeCase {
    n: u32,
    heads: u32,
    head_dim: u32,
    partial: bool,
    neox: bool,
    pos0: u32,
    seed: u64,
}

fn norm_rope_case() -> impl Strategy<Value = NormRopeCase> {
    let head_dim = prop::sample::select(vec![2u32, 8, 64, 128, 256, 6]);
    (
        1..=3u32,
        1..=4u32,
        head_dim,
        any::<bool>(),
        any::<bool>(),
        0..5000u32,
        seed(),
    )
        .prop_map(
            |(n, heads, head_dim, partial, neox, pos0, seed)| NormRopeCase {
                n,
                heads,
                head_dim,
                partial: partial && head_dim % 4 == 0,
                neox,
                pos0,
                seed,
            },
        )
}

/// `rms_norm_rope` equals `rms_norm` (per head) then `rope`, bit for bit.
/// Llama 3.1-like angle divisors (`rope_freqs`) when `on`, else a null pointer (no divisors);
/// the buffer must outlive the launches that read the pointer.
fn rope_factors(dev: &mut dyn Device, g: &mut Gen, rot: u32, on: bool) -> (Buf, Arg) {
    let factors: Vec<f32> = (0..rot / 2).map(|_| g.uniform(1.0, 8.0)).collect();
    let fb = upload(dev, &factors);
    let arg = if on { fb.arg() } else { Arg::Ptr(0) };
    (fb, arg)
}

fn rms_norm_rope(dev: &mut dyn Device, c: &NormRopeCase) -> Result<(), TestCaseError> {
    let (rows, hd) = ((c.n * c.heads) as usize, c.head_dim as usize);
    let rot = if c.partial {
        c.head_dim / 2
    } else {
        c.head_dim
    };
    let mut g = Gen::new(c.seed);
    let x = g.activations(rows, hd);
    let w: Vec<f32> = (0..hd).map(|_| g.normal() + 0.5).collect();
    let (xb, wb, pos) = (upload(dev, &x), upload(dev, &w), upload(dev, &[c.pos0]));
    let (eps, log2_base, neox) = (
        Arg::F32(1e-6),
        Arg::F32(1e6f32.log2()),
        Arg::U32(c.neox as u32),
    );
    let (_fb, factors) = rope_factors(dev, &mut g, rot, c.seed.is_multiple_of(2));
    let two = poisoned::<f32>(dev, rows * hd, 0xff);
    dev.launch(
        names::kiln_rms_norm,
        dev.shapes().per_row(rows as u32),
        &[xb.arg(), wb.arg(), two.arg(), Arg::U32(c.head_dim), eps],
    );
    let threads = (rows as u32) * rot / 2;
    let rope_args = [
        two.arg(),
        Arg::U32(c.heads),
        Arg::U32(c.head_dim),
        Arg::U32(rot),
        pos.arg(),
        log2_base,
        factors,
        neox,
        Arg::U32(threads),
    ];
    dev.launch(names::kiln_rope, dev.shapes().flat(threads), &rope_args);
    let one = poisoned::<f32>(dev, rows * hd, 0xff);
    let args = [
        xb.arg(),
        wb.arg(),
        one.arg(),
        Arg::U32(c.heads),
        Arg::U32(c.head_dim),
        Arg::U32(rot),
        pos.arg(),
        log2_base,
        factors,
        neox,
        eps,
    ];
    dev.launch(
        names::kiln_rms_norm_rope,
        dev.shapes().per_row(rows as u32),
        &args,
    );
    let fused = download::<f32>(dev, &one);
    check_written(dev, "rms_norm_rope", &fused)?;
    same_bits::<f32>(dev, "fused vs rms_norm+rope outputs", &one, &two)?;
    Ok(())
}

#[derive(Clone, Debug)]
struct RopeStoreCase {
    n: u32,
    kv_heads: u32,
    group: u32,
    head_dim: u32,
    partial: bool,
    neox: bool,
    norm: bool,
    pos0: u32,
    seed: u64,
}

fn rope_store_case() -> impl Strategy<Value = RopeStoreCase> {
    let head_dim = prop::sample::select(vec![2u32, 8, 64, 128, 256, 6]);
    (
        1..=3u32,
        1..=3u32,
        1..=4u32,
        head_dim,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0..300u32,
        seed(),
    )
        .prop_map(
            |(n, kv_heads, group, head_dim, partial, neox, norm, pos0, seed)| RopeStoreCase {
                n,
                kv_heads,
                group,
                head_dim,
                partial: partial && head_dim % 4 == 0,
                neox,
                norm,
                pos0,
                seed,
            },
        )
}

/// `rope_store` writes, bit for bit, what `rms_norm_rope` (or `rope` without QK-norm) of q and
/// k, then `kv_store` of k and v write; cache slots of other positions keep their poison.
fn rope_store(dev: &mut dyn Device, c: &RopeStoreCase) -> Result<(), TestCaseError> {
    let (n, kvh, hd) = (c.n as usize, c.kv_heads as usize, c.head_dim as usize);
    let heads = kvh * c.group as usize;
    let (max_ctx, rot) = (
        c.pos0 as usize + n + 3,
        if c.partial {
            c.head_dim / 2
        } else {
            c.head_dim
        },
    );
    let mut g = Gen::new(c.seed);
    let (q, k, v) = (
        g.activations(n * heads, hd),
        g.activations(n * kvh, hd),
        g.activations(n * kvh, hd),
    );
    let (qn, kn): (Vec<f32>, Vec<f32>) = (
        (0..hd).map(|_| g.normal() + 0.5).collect(),
        (0..hd).map(|_| g.normal() + 0.5).collect(),
    );
    let (qb, kb, vb, qnb, knb, pos) = (
        upload(dev, &q),
        upload(dev, &k),
        upload(dev, &v),
        upload(dev, &qn),
        upload(dev, &kn),
        upload(dev, &[c.pos0]),
    );
    let (eps, log2_base, neox) = (
        Arg::F32(1e-6),
        Arg::F32(1e6f32.log2()),
        Arg::U32(c.neox as u32),
    );
    let (_fb, factors) = rope_factors(dev, &mut g, rot, c.seed.is_multiple_of(2));
    let (hd32, rot32, ctx32) = (
        Arg::U32(c.head_dim),
        Arg::U32(rot),
        Arg::U32(max_ctx as u32),
    );
    // Reference: the separate kernels.
    let positioned = |dev: &mut dyn Device, x: &[f32], w: common::Buf, hs: usize| {
        let rows = x.len() / hd;
        if c.norm {
            let (xb, out) = (upload(dev, x), poisoned::<f32>(dev, x.len(), 0xff));
            let args = [
                xb.arg(),
                w.arg(),
                out.arg(),
                Arg::U32(hs as u32),
                hd32,
                rot32,
                pos.arg(),
                log2_base,
                factors,
                neox,
                eps,
            ];
            dev.launch(
                names::kiln_rms_norm_rope,
                dev.shapes().per_row(rows as u32),
                &args,
            );
            out
        } else {
            let out = upload(dev, x);
            let threads = rows as u32 * rot / 2;
            let args = [
                out.arg(),
                Arg::U32(hs as u32),
                hd32,
                rot32,
                pos.arg(),
                log2_base,
                factors,
                neox,
                Arg::U32(threads),
            ];
            dev.launch(names::kiln_rope, dev.shapes().flat(threads), &args);
            out
        }
    };
    let q_ref = positioned(dev, &q, qnb, heads);
    let k_ref = positioned(dev, &k, knb, kvh);
    let cache_len = kvh * max_ctx * hd;
    let (kc_ref, vc_ref) = (
        poisoned::<u16>(dev, cache_len, 0xff),
        poisoned::<u16>(dev, cache_len, 0xff),
    );
    let threads = (n * kvh * hd) as u32;
    let args = [
        k_ref.arg(),
        vb.arg(),
        kc_ref.arg(),
        vc_ref.arg(),
        Arg::U32(c.kv_heads),
        hd32,
        ctx32,
        pos.arg(),
        Arg::U32(threads),
    ];
    dev.launch(names::kiln_kv_store, dev.shapes().flat(threads), &args);
    // The fused launch.
    let (q_out, kc, vc) = (
        poisoned::<f32>(dev, n * heads * hd, 0xff),
        poisoned::<u16>(dev, cache_len, 0xff),
        poisoned::<u16>(dev, cache_len, 0xff),
    );
    let args = [
        qb.arg(),
        kb.arg(),
        vb.arg(),
        qnb.arg(),
        knb.arg(),
        q_out.arg(),
        kc.arg(),
        vc.arg(),
        Arg::U32(heads as u32),
        Arg::U32(c.kv_heads),
        hd32,
        rot32,
        ctx32,
        pos.arg(),
        log2_base,
        factors,
        neox,
        Arg::U32(c.norm as u32),
        eps,
    ];
    dev.launch(
        names::kiln_rope_store,
        dev.shapes().rope_store(heads as u32, c.kv_heads, c.n),
        &args,
    );
    same_bits::<f32>(dev, "queries", &q_out, &q_ref)?;
    same_bits::<u16>(dev, "key caches", &kc, &kc_ref)?;
    same_bits::<u16>(dev, "value caches", &vc, &vc_ref)?;
    Ok(())
}

kernel_properties! {
    host_rms_norm_rope, gpu_rms_norm_rope: norm_rope_case() => rms_norm_rope;
    host_rope_store, gpu_rope_store: rope_store_case() => rope_store;
    host_rms_norm_q8, gpu_rms_norm_q8: row_case() => rms_norm_q8;
    host_argmax, gpu_argmax: row_case() => argmax;
    host_rms_norm, gpu_rms_norm: row_case() => rms_norm;
    host_softmax, gpu_softmax: row_case() => softmax;
    host_row_nll, gpu_row_nll: row_case() => row_nll;
}

#[test]
fn host_norm_q8_wide_rows() {
    common::run_host(2, wide_row_case(), rms_norm_q8);
    common::run_host(4, wide_row_case(), argmax);
}

/// More rows than `launch::NORM_SLICED_ROWS`: one block per row emits every chunk of it (the
/// prefill shape; `row_case`'s few rows take the sliced decode shape).
#[test]
fn host_norm_q8_many_rows() {
    let case = (9..=12u32, length(300), seed()).prop_map(|(rows, cols, seed)| RowCase {
        rows,
        cols,
        in_place: false,
        seed,
    });
    common::run_host(4, case, rms_norm_q8);
}

/// Model-sized rows (hidden sizes up to 16k, vocab-sized softmax): GPU only.
#[test]
fn gpu_norm_large() {
    let case = || {
        (1..=64u32, length(16384), any::<bool>(), seed()).prop_map(
            |(rows, cols, in_place, seed)| RowCase {
                rows,
                cols,
                in_place,
                seed,
            },
        )
    };
    common::run_gpu("gpu_norm_large", 32, case(), rms_norm);
    common::run_gpu("gpu_norm_large", 32, case(), softmax);
    common::run_gpu("gpu_norm_large", 32, case(), row_nll);
    common::run_gpu("gpu_norm_large", 32, case(), rms_norm_q8);
    let vocab = (
        1..=4u32,
        prop_oneof![Just(151_936u32), 1..=262_144u32],
        any::<bool>(),
        seed(),
    );
    common::run_gpu(
        "gpu_norm_large",
        16,
        vocab.prop_map(|(rows, cols, in_place, seed)| RowCase {
            rows,
            cols,
            in_place,
            seed,
        }),
        argmax,
    );
}
