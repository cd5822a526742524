//! Properties of `kernels/residual_norm.rs`: the residual projection that defers the next
//! RMSNorm (`matvec_add_norm_q8`), the consumers that finish it (the q/k/v and gate/up
//! mat-vecs given the producer's partial sums), and the settle kernel for every other reader.
//!
//! The producer's residual is checked bit for bit against the plain mat-vec with `acc`, its
//! `x ⊙ g`, codes and scales against their definition, its partial sums against float64. The
//! consumers are checked against float64 on the exact codes they read, scaled by the float64
//! `1/rms` of the residual: only f32 rounding separates them.
mod common;

use common::data::{Gen, seed};
use common::reference::{self as r, BlockFormat, QK};
use common::{
    Arg, Device, check_err, check_written, download, entry, names, poisoned, split_weights, upload,
};
use kernels_gpu::entries::families;
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Case {
    fmt: BlockFormat,
    /// Residual width (the producer's rows, the consumers' columns) in 32-row blocks.
    row_blocks: u32,
    /// The producer's input width in 32-blocks.
    blocks: u32,
    n: u32,
    /// Of the Q8_1-emitting SwiGLU consumer: 2 or 4 (1 is a 1024-thread block, which its
    /// entries cannot launch on a GPU; the host checks occupancy before taking it).
    rows_per_warp: u32,
    /// Rows of the consumers' matrices (q/k/v: three; gate/up: the first, twice).
    out_rows: [u32; 3],
    /// q/k/v through the wide instantiation.
    wide: bool,
    eps: f32,
    seed: u64,
}

fn case(fmt: BlockFormat) -> impl Strategy<Value = Case> {
    (
        // Small shapes: every GPU thread is an OS thread on the host executor. A lane's second
        // 32-block (blocks > 32) is the mat-vec tests' business; here the first K-format
        // super-block already makes 256 rows.
        1..=3u32,
        prop_oneof![Just(1u32), 1..=12u32],
        1..=2u32,
        prop::sample::select(vec![2u32, 4]),
        (1..=20u32, 1..=12u32, prop_oneof![Just(0u32), 1..=12u32]),
        any::<bool>(),
        prop::sample::select(vec![1e-6f32, 1e-5, 1e-2]),
        seed(),
    )
        .prop_map(
            move |(row_blocks, blocks, n, rows_per_warp, (a, b, c), wide, eps, seed)| Case {
                fmt,
                // A K-format consumer reads whole 256-element super-blocks.
                row_blocks: row_blocks.next_multiple_of(fmt.group() as u32),
                blocks: blocks.next_multiple_of(fmt.group() as u32),
                n,
                rows_per_warp,
                out_rows: [a, b, c],
                wide,
                eps,
                seed,
            },
        )
}

fn deferred_norm(dev: &mut dyn Device, c: &Case) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (
        32 * c.row_blocks as usize,
        c.blocks as usize * QK,
        c.n as usize,
    );
    let label = dev.label();
    let mut g = Gen::new(c.seed);
    let a = g.activations(n, cols);
    let (aq_b, ads_b, _, _) = common::quantize_q8_1(dev, &a, cols, n)?;
    let (_, qs_b, sc_b) = split_weights(dev, &mut g, c.fmt, rows, cols);
    let x0 = g.activations(n, rows);
    let gamma: Vec<f32> = (0..rows).map(|_| g.uniform(-2.0, 2.0)).collect();

    // The residual as the plain mat-vec with `acc` leaves it.
    let want_x_b = upload(dev, &x0);
    let dims = dev
        .shapes()
        .matvec_resident(rows as u32, n as u32, u32::MAX / 64);
    let shape = [Arg::U32(rows as u32), Arg::U32(cols as u32)];
    let w_args = [qs_b.arg(), sc_b.arg(), aq_b.arg(), ads_b.arg()];
    let args = [&w_args[..], &[want_x_b.arg()], &shape[..], &[Arg::U32(1)]].concat();
    dev.launch(entry(c.fmt, families::MATVEC), dims, &args);
    let want_x = download::<f32>(dev, &want_x_b);

    let (x_b, g_b) = (upload(dev, &x0), upload(dev, &gamma));
    let h_b = poisoned::<f32>(dev, n * rows, 0xff);
    // -128 never comes out of the quantizer: it marks codes never written.
    let hq_b = poisoned::<i8>(dev, n * rows, 0x80);
    let hds_b = poisoned::<f32>(dev, n * rows / QK * 2, 0xff);
    let parts = rows / QK;
    let ss_b = poisoned::<f64>(dev, n * parts, 0xff);
    let out = [
        x_b.arg(),
        g_b.arg(),
        h_b.arg(),
        hq_b.arg(),
        hds_b.arg(),
        ss_b.arg(),
    ];
    let dims = dev.shapes().matvec_add_norm_q8(rows as u32, n as u32);
    let args = [&w_args[..], &out[..], &shape[..]].concat();
    dev.launch(entry(c.fmt, families::MATVEC_ADD_NORM_Q8), dims, &args);
    let (x, h) = (download::<f32>(dev, &x_b), download::<f32>(dev, &h_b));
    let (hq, hds) = (download::<i8>(dev, &hq_b), download::<f32>(dev, &hds_b));
    let ss = download::<f64>(dev, &ss_b);
    let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
    prop_assert!(
        bits(&x) == bits(&want_x),
        "{label}: residual differs from the mat-vec with acc"
    );
    for (i, (&hv, &xv)) in h.iter().zip(&x).enumerate() {
        prop_assert!(
            hv.to_bits() == (xv * gamma[i % rows]).to_bits(),
            "{label}: h[{i}] = {hv}, want x·g = {}",
            xv * gamma[i % rows]
        );
    }
    for blk in 0..n * parts {
        let vs = &h[blk * QK..][..QK];
        let qs = &hq[blk * QK..][..QK];
        let d = vs.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        prop_assert!(
            hds[2 * blk] == d && hds[2 * blk + 1] == d * sum as f32,
            "{label}: block {blk}: (d, s) = ({}, {}), want ({d}, {})",
            hds[2 * blk],
            hds[2 * blk + 1],
            d * sum as f32
        );
        for (i, (&q, &v)) in qs.iter().zip(vs).enumerate() {
            let ideal = if d == 0.0 { 0.0 } else { v as f64 / d as f64 };
            prop_assert!(
                q != -128 && (q as f64 - ideal).abs() <= 0.5 + 1e-4,
                "{label}: block {blk} elem {i}: q = {q}, h/d = {ideal}"
            );
        }
        let want: f64 = x[blk * QK..][..QK]
            .iter()
            .map(|&v| (v as f64).powi(2))
            .sum();
        prop_assert!(
            (ss[blk] - want).abs() <= 1e-12 * want,
            "{label}: Σx² of block {blk} = {}, want {want}",
            ss[blk]
        );
    }
    // 1/rms of each token's new residual, in float64.
    let inv: Vec<f64> = (0..n)
        .map(|t| {
            let row = &x[t * rows..][..rows];
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / rows as f64;
            1.0 / (ms + c.eps as f64).sqrt()
        })
        .collect();
    let scale = [ss_b.arg(), Arg::U32(parts as u32), Arg::F32(c.eps)];
    consumers(dev, c, &mut g, (&hq_b, &hds_b, &hq, &hds), &scale, &inv)?;
    settle(dev, c, (&h_b, &h), &scale, &inv)
}

/// The q/k/v mat-vec (one-row and wide) and the gate/up + SwiGLU (plain and Q8_1-emitting)
/// over the deferred norm: each output is `1/rms` times the dot product with the codes.
fn consumers(
    dev: &mut dyn Device,
    c: &Case,
    g: &mut Gen,
    (hq_b, hds_b, hq, hds): (&common::Buf, &common::Buf, &[i8], &[f32]),
    scale: &[Arg; 3],
    inv: &[f64],
) -> Result<(), TestCaseError> {
    let (cols, n) = (32 * c.row_blocks as usize, c.n as usize);
    let scaled = |v: Vec<f64>, rows: usize| -> Vec<f64> {
        v.iter()
            .enumerate()
            .map(|(i, a)| a * inv[i / rows])
            .collect()
    };
    let mut mats = Vec::new();
    let mut args = Vec::new();
    for &rows in &c.out_rows {
        let rows = rows as usize;
        if rows == 0 {
            args.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::U32(0)]);
            continue;
        }
        let (gguf, qs_b, sc_b) = split_weights(dev, g, c.fmt, rows, cols);
        let y_b = poisoned::<f32>(dev, n * rows, 0xff);
        args.extend([qs_b.arg(), sc_b.arg(), y_b.arg(), Arg::U32(rows as u32)]);
        mats.push((gguf, qs_b, sc_b, y_b, rows));
    }
    args.extend([hq_b.arg(), hds_b.arg(), Arg::U32(cols as u32)]);
    args.extend(scale);
    {
        let (sh, wide) = (dev.shapes(), c.wide);
        let (dims, k) = match wide {
            false => (
                sh.matvec_multi(&c.out_rows, n as u32, u32::MAX / 64),
                entry(c.fmt, families::MATVEC3_NORM),
            ),
            true => (
                sh.matvec_wide_multi(&c.out_rows, n as u32, u32::MAX / 64),
                entry(c.fmt, families::MATVEC3_WIDE_NORM),
            ),
        };
        dev.launch(k, dims, &args);
        for (m, (gguf, _, _, y_b, rows)) in mats.iter().enumerate() {
            let y = download::<f32>(dev, y_b);
            check_written(dev, &format!("matvec3 output {m}"), &y)?;
            let want = scaled(r::matvec_q8_1(c.fmt, gguf, *rows, cols, hq, hds), *rows);
            let abs = scaled(r::matvec_q8_1_abs(c.fmt, gguf, *rows, cols, hq, hds), *rows);
            let err = r::err_vs_magnitude(&y, &want, &abs);
            check_err(dev, &format!("matvec3 (wide {wide}) matrix {m}"), err, 1e-5)?;
        }
    }

    // Gate = the first matrix, up a second of its shape; rows rounded to whole Q8_1 blocks
    // for the emitting form.
    let rows = mats[0].4.next_multiple_of(32);
    let (gate, gq_b, gs_b) = split_weights(dev, g, c.fmt, rows, cols);
    let (up, uq_b, us_b) = split_weights(dev, g, c.fmt, rows, cols);
    let gates = scaled(r::matvec_q8_1(c.fmt, &gate, rows, cols, hq, hds), rows);
    let ups = scaled(r::matvec_q8_1(c.fmt, &up, rows, cols, hq, hds), rows);
    let want: Vec<f64> = gates
        .iter()
        .zip(&ups)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    let magnitude: f64 = gates
        .iter()
        .zip(&ups)
        .map(|(g, u)| (g * u).abs())
        .sum::<f64>()
        .max(1e-30);
    let w = [
        gq_b.arg(),
        gs_b.arg(),
        uq_b.arg(),
        us_b.arg(),
        hq_b.arg(),
        hds_b.arg(),
    ];
    let shape = [Arg::U32(rows as u32), Arg::U32(cols as u32)];
    let y_b = poisoned::<f32>(dev, n * rows, 0xff);
    let dims = dev
        .shapes()
        .matvec_multi(&[rows as u32], n as u32, u32::MAX / 64);
    let args = [&w[..], &[y_b.arg()], &shape[..], &scale[..]].concat();
    dev.launch(entry(c.fmt, families::MATVEC_SWIGLU_NORM), dims, &args);
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "matvec_swiglu output", &y)?;
    let err: f64 = y
        .iter()
        .zip(&want)
        .map(|(&o, &w)| (o as f64 - w).abs())
        .sum();
    check_err(dev, "matvec_swiglu", err / magnitude, 2e-5)?;

    let (y_b, yq_b, yds_b) = (
        poisoned::<f32>(dev, n * rows, 0xff),
        poisoned::<i8>(dev, n * rows, 0x80),
        poisoned::<f32>(dev, n * rows / QK * 2, 0xff),
    );
    let dims = dev
        .shapes()
        .matvec_swiglu_q8(rows as u32, n as u32, c.rows_per_warp);
    let out = [y_b.arg(), yq_b.arg(), yds_b.arg()];
    let args = [&w[..], &out[..], &shape[..], &scale[..]].concat();
    dev.launch(entry(c.fmt, families::MATVEC_SWIGLU_Q8_NORM), dims, &args);
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "matvec_swiglu_q8 output", &y)?;
    let err: f64 = y
        .iter()
        .zip(&want)
        .map(|(&o, &w)| (o as f64 - w).abs())
        .sum();
    check_err(dev, "matvec_swiglu_q8", err / magnitude, 2e-5)?;
    let (_, _, want_q, want_ds) = common::quantize_q8_1(dev, &y, rows, n)?;
    let (yq, yds) = (download::<i8>(dev, &yq_b), download::<f32>(dev, &yds_b));
    let label = dev.label();
    prop_assert!(
        yq == want_q
            && yds
                .iter()
                .zip(&want_ds)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{label}: matvec_swiglu_q8's Q8_1 blocks differ from quantize_q8_1 of its output"
    );
    Ok(())
}

/// `norm_settle_q8`: the finished norm `h · 1/rms` and its Q8_1 blocks as `quantize_q8_1`
/// writes them (the helper checks them against the definition).
fn settle(
    dev: &mut dyn Device,
    c: &Case,
    (h_b, h): (&common::Buf, &[f32]),
    scale: &[Arg; 3],
    inv: &[f64],
) -> Result<(), TestCaseError> {
    let (cols, n) = (32 * c.row_blocks as usize, c.n as usize);
    let out_b = poisoned::<f32>(dev, n * cols, 0xff);
    let oq_b = poisoned::<i8>(dev, n * cols, 0x80);
    let ods_b = poisoned::<f32>(dev, n * cols / QK * 2, 0xff);
    let dims = dev.shapes().quantize_q8_1(cols as u32, n as u32);
    let args = [
        h_b.arg(),
        scale[0],
        scale[1],
        out_b.arg(),
        oq_b.arg(),
        ods_b.arg(),
        Arg::U32(cols as u32),
        scale[2],
    ];
    dev.launch(names::kiln_norm_settle_q8, dims, &args);
    let out = download::<f32>(dev, &out_b);
    check_written(dev, "norm_settle output", &out)?;
    let want: Vec<f64> = h
        .iter()
        .enumerate()
        .map(|(i, &v)| v as f64 * inv[i / cols])
        .collect();
    let abs: Vec<f64> = want.iter().map(|v| v.abs()).collect();
    check_err(
        dev,
        "norm_settle",
        r::err_vs_magnitude(&out, &want, &abs),
        1e-6,
    )?;
    let (_, _, want_q, want_ds) = common::quantize_q8_1(dev, &out, cols, n)?;
    let (oq, ods) = (download::<i8>(dev, &oq_b), download::<f32>(dev, &ods_b));
    let label = dev.label();
    prop_assert!(
        oq == want_q
            && ods
                .iter()
                .zip(&want_ds)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{label}: norm_settle's Q8_1 blocks differ from quantize_q8_1 of its output"
    );
    Ok(())
}

/// Host cases per format: each case is eight launches of a few thousand OS threads on the
/// host executor (three policies), so fewer than the suite's default; the GPU runs the usual
/// count.
fn host_cases() -> u32 {
    common::host_cases().min(6)
}

macro_rules! deferred_norm_properties {
    ($( $host:ident, $gpu:ident: $fmt:expr; )*) => {$(
        #[test]
        fn $host() {
            common::run_host(host_cases(), case($fmt), deferred_norm);
        }
        #[test]
        fn $gpu() {
            common::run_gpu(stringify!($gpu), common::gpu_cases(), case($fmt), deferred_norm);
        }
    )*};
}

deferred_norm_properties! {
    host_deferred_norm_q4_0, gpu_deferred_norm_q4_0: BlockFormat::Q4_0;
    host_deferred_norm_q4_1, gpu_deferred_norm_q4_1: BlockFormat::Q4_1;
    host_deferred_norm_q8_0, gpu_deferred_norm_q8_0: BlockFormat::Q8_0;
    host_deferred_norm_q6k, gpu_deferred_norm_q6k: BlockFormat::Q6K;
    host_deferred_norm_q5k, gpu_deferred_norm_q5k: BlockFormat::Q5K;
    host_deferred_norm_q4k, gpu_deferred_norm_q4k: BlockFormat::Q4K;
}
