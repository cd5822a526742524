//! Properties of `kernels/matvec.rs`: activation quantization (`quantize_q8_1`), the integer
//! mat-vec over split Q4_0/Q4_1/Q8_0 weights, and the f16 mat-vec.
//!
//! The integer path is checked twice: against the float64 value of the Q8_1 dot definition on
//! the *exact* quantized activations the kernel produced (codes, f16 d and s: only float
//! rounding separates them, ~1e-5), and against the raw f32 activations with a per-output
//! bound that is the worst case of Q8_1 activation rounding, computed from x alone.
mod common;

use common::data::{Gen, length, seed};
use common::reference::{self as r, BlockFormat, QK};
use common::{Arg, Device, check_err, check_written, download, entry, names, poisoned, upload};
use kernels_gpu::entries::families;
use proptest::prelude::*;

/// The `(ss, ss_parts, eps)` arguments of a mat-vec whose input is already normalized
/// (`tests/kernels_residual_norm.rs` covers the deferred norm).
const NO_DEFERRED_NORM: [Arg; 3] = [Arg::Ptr(0), Arg::U32(0), Arg::F32(0.0)];

/// Σ|w·x| per output of [`r::matvec`]: the magnitudes [`r::err_vs_magnitude`] measures against.
fn matvec_abs(w: &[f64], x: &[f64], rows: usize, cols: usize, n: usize) -> Vec<f64> {
    let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
    r::matvec(&abs(w), &abs(x), rows, cols, n)
}

#[derive(Clone, Debug)]
struct QCase {
    fmt: BlockFormat,
    rows: u32,
    blocks: u32,
    n: u32,
    /// Launch at most this many blocks along x (a resident wave, as `launch::matvec_resident`
    /// sizes it on a GPU with few SMs): the kernel must stride over the other row groups.
    wave: Option<u32>,
    /// Which instantiation: one row per warp or wide.
    shape: Shape,
    seed: u64,
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    OneRow,
    /// `kiln_matvec_wide_*`: the policy's wide rows per warp.
    Wide,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop::sample::select(vec![Shape::OneRow, Shape::Wide])
}

/// The single-matrix mat-vec entry for `fmt` in `shape`.
fn matvec_entry(fmt: BlockFormat, shape: Shape) -> &'static str {
    let family = match shape {
        Shape::OneRow => families::MATVEC,
        Shape::Wide => families::MATVEC_WIDE,
    };
    entry(fmt, family)
}

/// Rows around the rows-per-block of every policy (4 and 8) and arbitrary counts up to 24;
/// block counts from one (cols = 32) past one warp's worth (a lane takes a second block), and
/// rows of up to five 32-block steps per lane (a partial last one included), as model rows are.
fn qcase(fmt: BlockFormat) -> impl Strategy<Value = QCase> {
    let rows = prop_oneof![
        prop::sample::select(vec![1u32, 3, 4, 5, 7, 8, 9, 16, 17]),
        1..=24u32
    ];
    let blocks = prop_oneof![
        Just(1u32),
        1..=12u32,
        30..=40u32,
        prop::sample::select(vec![8u32, 64, 72, 136])
    ];
    let wave = prop_oneof![Just(None), (1..=3u32).prop_map(Some)];
    (rows, blocks, 1..=2u32, wave, shape(), seed()).prop_map(
        move |(rows, blocks, n, wave, shape, seed)| QCase {
            fmt,
            rows,
            blocks: blocks.next_multiple_of(fmt.group() as u32),
            n,
            wave,
            shape,
            seed,
        },
    )
}

fn matvec_quantized(dev: &mut dyn Device, c: &QCase) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (c.rows as usize, c.blocks as usize * QK, c.n as usize);
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let (xq_b, xds_b, xq, xds) = common::quantize_q8_1(dev, &x, cols, n)?;

    let gguf = g.gguf_blocks(c.fmt, rows * cols / QK);
    let (qs, sc) = common::split_planes(c.fmt, &gguf, rows, cols);
    let (qs_b, sc_b) = (upload(dev, &qs), upload(dev, &sc));
    let y_b = poisoned::<f32>(dev, n * rows, 0xff);
    let entry = matvec_entry(c.fmt, c.shape);
    let (sh, r) = (dev.shapes(), rows as u32);
    let all = match c.shape {
        Shape::Wide => sh.matvec_wide_multi(&[r], n as u32, u32::MAX / 64),
        Shape::OneRow => sh.matvec_resident(r, n as u32, u32::MAX / 64),
    };
    let dims = common::Dims {
        grid_x: all.grid_x.min(c.wave.unwrap_or(u32::MAX)),
        ..all
    };
    let args = |y: &common::Buf, acc: u32| {
        [
            qs_b.arg(),
            sc_b.arg(),
            xq_b.arg(),
            xds_b.arg(),
            y.arg(),
            Arg::U32(rows as u32),
            Arg::U32(cols as u32),
            Arg::U32(acc),
        ]
    };
    dev.launch(entry, dims, &args(&y_b, 0));
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "matvec output", &y)?;
    // acc = 1 adds into a residual: each output is `residual + y`, bit for bit.
    let residual = g.activations(n, rows);
    let acc_b = upload(dev, &residual);
    dev.launch(entry, dims, &args(&acc_b, 1));
    let summed = download::<f32>(dev, &acc_b);
    if let Some(i) = summed
        .iter()
        .zip(residual.iter().zip(&y))
        .position(|(s, (r, v))| s.to_bits() != (r + v).to_bits())
    {
        prop_assert!(
            false,
            "{}: acc = 1, output {i}: {} vs residual {} + {}",
            dev.label(),
            summed[i],
            residual[i],
            y[i]
        );
    }

    let exact = r::matvec_q8_1(c.fmt, &gguf, rows, cols, &xq, &xds);
    // f32 sums over blocks that may cancel: bounded relative to the sum of |block dots|.
    let abs = r::matvec_q8_1_abs(c.fmt, &gguf, rows, cols, &xq, &xds);
    let err = r::err_vs_magnitude(&y, &exact, &abs);
    check_err(dev, "vs exact Q8_1 activations", err, 1e-5)?;

    // Against the raw activations, bounded by what Q8_1 may lose, from x alone: each element
    // is off by at most d/2 (the code's rounding) + 127·|d − f16(d)|, and s = f16(d·Σq)
    // stands in for d_x·Σq in the weight block's constant part c, off by |Σq|·|d − f16(d)|
    // + |s − d·Σq| with |Σq| ≤ Σ|x|/d + 16. An f16 rounding errs by ≤ 2^-11 relative, or
    // 2^-25 absolute for subnormals (tiny activation blocks have subnormal d).
    let w = r::dequantize(c.fmt, &gguf, rows, cols);
    let raw = r::matvec(&w, &r::widen(&x), rows, cols, n);
    let blocks: Vec<&[u8]> = gguf.chunks_exact(c.fmt.block_bytes()).collect();
    let nb = cols / QK;
    let f16_err = |v: f64| (v.abs() * 2f64.powi(-11)).max(2f64.powi(-25));
    for t in 0..n {
        for row in 0..rows {
            let (mut bound, mut scale) = (0.0, 0.0);
            for b in 0..nb {
                let xb = &x[(t * nb + b) * QK..][..QK];
                let wb = &w[row * cols + b * QK..][..QK];
                let d = xb.iter().fold(0f64, |m, v| m.max(v.abs() as f64)) / 127.0;
                if d == 0.0 {
                    continue; // an all-zero block is represented exactly
                }
                let sum_q = xb.iter().map(|v| v.abs() as f64).sum::<f64>() / d + 16.0;
                let offset = r::q8_1_offset(c.fmt, blocks[row * nb + b]).abs();
                bound += wb.iter().map(|w| w.abs()).sum::<f64>() * (d / 2.0 + 127.0 * f16_err(d));
                bound += offset * (sum_q * f16_err(d) + f16_err(d * sum_q));
                scale += wb
                    .iter()
                    .zip(xb)
                    .map(|(w, &v)| (w * v as f64).abs())
                    .sum::<f64>();
            }
            let bound = bound * (1.0 + 1e-3) + 1e-5 * scale;
            let (got, want) = (y[t * rows + row] as f64, raw[t * rows + row]);
            prop_assert!(
                (got - want).abs() <= bound,
                "{}: token {t} row {row}: {got} vs raw-activation reference {want} (bound {bound:.3e})",
                dev.label()
            );
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
struct F16Case {
    rows: u32,
    cols: u32,
    n: u32,
    seed: u64,
}

fn f16_case() -> impl Strategy<Value = F16Case> {
    let rows = prop_oneof![prop::sample::select(vec![1u32, 4, 5, 8, 9]), 1..=24u32];
    // cols is a multiple of 8; up to 80 chunks so lanes wrap around the row.
    let chunks = prop_oneof![Just(1u32), Just(32), Just(33), 1..=80u32];
    (rows, chunks, 1..=2u32, seed()).prop_map(|(rows, chunks, n, seed)| F16Case {
        rows,
        cols: chunks * 8,
        n,
        seed,
    })
}

fn matvec_f16(dev: &mut dyn Device, c: &F16Case) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (c.rows as usize, c.cols as usize, c.n as usize);
    let mut g = Gen::new(c.seed);
    let ws = g.magnitude(-2.0, 0.0);
    let w: Vec<u16> = g
        .normals(rows * cols, ws)
        .into_iter()
        .map(|v| half::f16::from_f32(v).to_bits())
        .collect();
    let xs = g.magnitude(-2.0, 2.0);
    let x = g.normals(n * cols, xs);
    let (w_b, x_b) = (upload(dev, &w), upload(dev, &x));
    let y_b = poisoned::<f32>(dev, n * rows, 0xff);
    let dims = dev.shapes().matvec(rows as u32, n as u32);
    dev.launch(
        names::kiln_matvec_f16,
        dims,
        &[
            w_b.arg(),
            x_b.arg(),
            y_b.arg(),
            Arg::U32(rows as u32),
            Arg::U32(cols as u32),
        ],
    );
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "matvec_f16 output", &y)?;
    let (wv, xv) = (r::f16_values(&w), r::widen(&x));
    let want = r::matvec(&wv, &xv, rows, cols, n);
    // Relative to Σ|w·x|, not to the result: a short row of random terms can cancel to a value
    // far below its terms, and f32 rounding of the terms (FMA or not) is relative to them.
    let mag = matvec_abs(&wv, &xv, rows, cols, n);
    let err = r::err_vs_magnitude(&y, &want, &mag);
    check_err(dev, "matvec_f16", err, 1e-5)
}

#[derive(Clone, Debug)]
struct FusedCase {
    fmt: BlockFormat,
    /// Rows of each matrix; a third of 0 is the two-matrix form.
    rows: [u32; 3],
    blocks: u32,
    n: u32,
    wave: Option<u32>,
    /// q/k/v through the wide instantiation (`kiln_matvec3_wide_*`).
    wide: bool,
    seed: u64,
}

fn fused_case(fmt: BlockFormat) -> impl Strategy<Value = FusedCase> {
    let rows = (1..=20u32, 1..=12u32, prop_oneof![Just(0u32), 1..=12u32]);
    let wave = prop_oneof![Just(None), (1..=3u32).prop_map(Some)];
    (
        rows,
        prop_oneof![
            Just(1u32),
            1..=12u32,
            30..=36u32,
            prop::sample::select(vec![8u32, 64, 72, 136])
        ],
        1..=2u32,
        wave,
        any::<bool>(),
        seed(),
    )
        .prop_map(move |((a, b, c), blocks, n, wave, wide, seed)| FusedCase {
            fmt,
            rows: [a, b, c],
            blocks: blocks.next_multiple_of(fmt.group() as u32),
            n,
            wave,
            wide,
            seed,
        })
}

/// `matvec3_split` (q/k/v in one launch) equals three separate mat-vecs' definition, and
/// `matvec_swiglu_split` equals silu(x·Gᵀ)·(x·Uᵀ), both on the exact quantized activations.
fn matvec_fused(dev: &mut dyn Device, c: &FusedCase) -> Result<(), TestCaseError> {
    let (cols, n) = (c.blocks as usize * QK, c.n as usize);
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let (xq_b, xds_b, xq, xds) = common::quantize_q8_1(dev, &x, cols, n)?;
    let mut args = Vec::new();
    let mut mats = Vec::new();
    for &rows in &c.rows {
        let rows = rows as usize;
        if rows == 0 {
            args.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::U32(0)]);
            continue;
        }
        let gguf = g.gguf_blocks(c.fmt, rows * cols / QK);
        let (qs, sc) = common::split_planes(c.fmt, &gguf, rows, cols);
        let (qs_b, sc_b, y_b) = (
            upload(dev, &qs),
            upload(dev, &sc),
            poisoned::<f32>(dev, n * rows, 0xff),
        );
        args.extend([qs_b.arg(), sc_b.arg(), y_b.arg(), Arg::U32(rows as u32)]);
        mats.push((gguf, qs_b, sc_b, y_b, rows));
    }
    args.extend([xq_b.arg(), xds_b.arg(), Arg::U32(cols as u32)]);
    args.extend(NO_DEFERRED_NORM);
    let (sh, many) = (dev.shapes(), u32::MAX / 64);
    let (all, k) = match c.wide {
        false => (
            sh.matvec_multi(&c.rows, n as u32, many),
            entry(c.fmt, families::MATVEC3),
        ),
        true => (
            sh.matvec_wide_multi(&c.rows, n as u32, many),
            entry(c.fmt, families::MATVEC3_WIDE),
        ),
    };
    let dims = common::Dims {
        grid_x: all.grid_x.min(c.wave.unwrap_or(u32::MAX)),
        ..all
    };
    dev.launch(k, dims, &args);
    let mut exact = Vec::new();
    for (m, (gguf, _, _, y_b, rows)) in mats.iter().enumerate() {
        let y = download::<f32>(dev, y_b);
        check_written(dev, &format!("matvec3 output {m}"), &y)?;
        let want = r::matvec_q8_1(c.fmt, gguf, *rows, cols, &xq, &xds);
        // f32 sums over blocks that may cancel: bounded relative to the sum of |block dots|.
        let abs = r::matvec_q8_1_abs(c.fmt, gguf, *rows, cols, &xq, &xds);
        let err = r::err_vs_magnitude(&y, &want, &abs);
        check_err(dev, &format!("matvec3 matrix {m}"), err, 1e-5)?;
        exact.push(want);
    }

    // SwiGLU over the first matrix and a second of the same shape.
    let rows = mats[0].4;
    let up = g.gguf_blocks(c.fmt, rows * cols / QK);
    let (uq, us) = common::split_planes(c.fmt, &up, rows, cols);
    let (uq_b, us_b, y_b) = (
        upload(dev, &uq),
        upload(dev, &us),
        poisoned::<f32>(dev, n * rows, 0xff),
    );
    let all = dev
        .shapes()
        .matvec_multi(&[rows as u32], n as u32, u32::MAX / 64);
    let dims = common::Dims {
        grid_x: all.grid_x.min(c.wave.unwrap_or(u32::MAX)),
        ..all
    };
    let (gq_b, gs_b) = (mats[0].1, mats[0].2);
    let sargs = [
        gq_b.arg(),
        gs_b.arg(),
        uq_b.arg(),
        us_b.arg(),
        xq_b.arg(),
        xds_b.arg(),
        y_b.arg(),
        Arg::U32(rows as u32),
        Arg::U32(cols as u32),
        NO_DEFERRED_NORM[0],
        NO_DEFERRED_NORM[1],
        NO_DEFERRED_NORM[2],
    ];
    dev.launch(entry(c.fmt, families::MATVEC_SWIGLU), dims, &sargs);
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "matvec_swiglu output", &y)?;
    let up_exact = r::matvec_q8_1(c.fmt, &up, rows, cols, &xq, &xds);
    let want: Vec<f64> = exact[0]
        .iter()
        .zip(&up_exact)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    // Relative to |g·u|, not to the result: for g ≲ −88 silu(g) underflows f32 to 0 while the
    // f64 value is ~1e-40, a relative error of 1 that is no error at all.
    let err: f64 = y
        .iter()
        .zip(&want)
        .map(|(&o, &w)| (o as f64 - w).abs())
        .sum();
    let scale: f64 = exact[0]
        .iter()
        .zip(&up_exact)
        .map(|(g, u)| (g * u).abs())
        .sum::<f64>()
        .max(1e-30);
    check_err(dev, "matvec_swiglu", err / scale, 2e-5)
}

/// A case of the gate/up + SwiGLU that emits Q8_1 (`matvec_swiglu_q8`): whole 32-row blocks,
/// rows per warp 2, 4 and 8.
#[derive(Debug, Clone)]
struct SwigluQ8Case {
    fmt: BlockFormat,
    /// Output rows in 32-row (one Q8_1 block) units.
    row_blocks: u32,
    blocks: u32,
    n: u32,
    rows_per_warp: u32,
    seed: u64,
}

fn swiglu_q8_case(fmt: BlockFormat) -> impl Strategy<Value = SwigluQ8Case> {
    (
        1..=3u32,
        prop_oneof![
            Just(1u32),
            1..=12u32,
            prop::sample::select(vec![8u32, 64, 136])
        ],
        1..=2u32,
        // Not 1: a 1024-thread block needs ≤ 64 registers, which the Q4_0/Q8_0/K entries
        // exceed; the host takes 1 only where the driver's occupancy says it launches.
        prop::sample::select(vec![2u32, 4, 8]),
        seed(),
    )
        .prop_map(
            move |(row_blocks, blocks, n, rows_per_warp, seed)| SwigluQ8Case {
                fmt,
                row_blocks,
                blocks: blocks.next_multiple_of(fmt.group() as u32),
                n,
                rows_per_warp,
                seed,
            },
        )
}

/// `matvec_swiglu_q8` writes the bits `matvec_swiglu_split` writes (f32 output), and Q8_1
/// blocks equal bit for bit to `quantize_q8_1` of that output (which the helper itself checks
/// against the reference quantizer): the down projection then reads exactly what it read
/// with the separate quantize launch.
fn matvec_swiglu_q8(dev: &mut dyn Device, c: &SwigluQ8Case) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (
        32 * c.row_blocks as usize,
        c.blocks as usize * QK,
        c.n as usize,
    );
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let (xq_b, xds_b, _, _) = common::quantize_q8_1(dev, &x, cols, n)?;
    let mut planes = Vec::new();
    for _ in 0..2 {
        let gguf = g.gguf_blocks(c.fmt, rows * cols / QK);
        let (qs, sc) = common::split_planes(c.fmt, &gguf, rows, cols);
        planes.push((upload(dev, &qs), upload(dev, &sc)));
    }
    let weights = [
        planes[0].0.arg(),
        planes[0].1.arg(),
        planes[1].0.arg(),
        planes[1].1.arg(),
    ];
    let x_args = [xq_b.arg(), xds_b.arg()];
    let shape = [
        Arg::U32(rows as u32),
        Arg::U32(cols as u32),
        NO_DEFERRED_NORM[0],
        NO_DEFERRED_NORM[1],
        NO_DEFERRED_NORM[2],
    ];

    let y0_b = poisoned::<f32>(dev, n * rows, 0xff);
    let dims = dev
        .shapes()
        .matvec_multi(&[rows as u32], n as u32, u32::MAX / 64);
    let args = [&weights[..], &x_args[..], &[y0_b.arg()], &shape[..]].concat();
    dev.launch(entry(c.fmt, families::MATVEC_SWIGLU), dims, &args);
    let y0 = download::<f32>(dev, &y0_b);
    check_written(dev, "matvec_swiglu output", &y0)?;

    let y_b = poisoned::<f32>(dev, n * rows, 0xff);
    // -128 never comes out of the quantizer: it marks codes never written.
    let yq_b = poisoned::<i8>(dev, n * rows, 0x80);
    let yds_b = poisoned::<f32>(dev, n * rows / QK * 2, 0xff);
    let dims = dev
        .shapes()
        .matvec_swiglu_q8(rows as u32, n as u32, c.rows_per_warp);
    let out = [y_b.arg(), yq_b.arg(), yds_b.arg()];
    let args = [&weights[..], &x_args[..], &out[..], &shape[..]].concat();
    dev.launch(entry(c.fmt, families::MATVEC_SWIGLU_Q8), dims, &args);
    let y = download::<f32>(dev, &y_b);
    let label = dev.label();
    let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
    prop_assert!(
        bits(&y) == bits(&y0),
        "{label}: matvec_swiglu_q8 f32 output differs from matvec_swiglu's"
    );

    let (_, _, want_q, want_ds) = common::quantize_q8_1(dev, &y0, rows, n)?;
    let (yq, yds) = (download::<i8>(dev, &yq_b), download::<f32>(dev, &yds_b));
    prop_assert!(
        yq == want_q,
        "{label}: matvec_swiglu_q8 codes differ from quantize_q8_1's"
    );
    prop_assert!(
        bits(&yds) == bits(&want_ds),
        "{label}: matvec_swiglu_q8 scales differ from quantize_q8_1's"
    );
    Ok(())
}

/// The f32-activation mat-vec against float64 over the dequantized weights and the raw
/// activations: only f32 rounding separates them (no activation quantization).
fn matvec_f32x(dev: &mut dyn Device, c: &QCase) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (c.rows as usize, c.blocks as usize * QK, c.n as usize);
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let gguf = g.gguf_blocks(c.fmt, rows * cols / QK);
    let (qs, sc) = common::split_planes(c.fmt, &gguf, rows, cols);
    let (qs_b, sc_b, x_b) = (upload(dev, &qs), upload(dev, &sc), upload(dev, &x));
    let y_b = poisoned::<f32>(dev, n * rows, 0xff);
    let all = dev
        .shapes()
        .matvec_multi(&[rows as u32], n as u32, u32::MAX / 64);
    let dims = common::Dims {
        grid_x: all.grid_x.min(c.wave.unwrap_or(u32::MAX)),
        ..all
    };
    let args = [
        qs_b.arg(),
        sc_b.arg(),
        x_b.arg(),
        y_b.arg(),
        Arg::U32(rows as u32),
        Arg::U32(cols as u32),
    ];
    dev.launch(entry(c.fmt, families::MATVEC_F32X), dims, &args);
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "matvec_f32x output", &y)?;
    let w = r::dequantize(c.fmt, &gguf, rows, cols);
    let want = r::matvec(&w, &r::widen(&x), rows, cols, n);
    // f32 sums of up to 1280 products: bounded relative to Σ|w·x|, not to the (possibly
    // cancelling) result.
    let abs = matvec_abs(&w, &r::widen(&x), rows, cols, n);
    let err = r::err_vs_magnitude(&y, &want, &abs);
    check_err(dev, "matvec_f32x", err, 1e-5)
}

kernel_properties! {
    host_matvec_f32x_q4_0, gpu_matvec_f32x_q4_0: qcase(BlockFormat::Q4_0) => matvec_f32x;
    host_matvec_f32x_q4_1, gpu_matvec_f32x_q4_1: qcase(BlockFormat::Q4_1) => matvec_f32x;
    host_matvec_f32x_q8_0, gpu_matvec_f32x_q8_0: qcase(BlockFormat::Q8_0) => matvec_f32x;
    host_matvec_f32x_q6k, gpu_matvec_f32x_q6k: qcase(BlockFormat::Q6K) => matvec_f32x;
    host_matvec_f32x_q5k, gpu_matvec_f32x_q5k: qcase(BlockFormat::Q5K) => matvec_f32x;
    host_matvec_f32x_q4k, gpu_matvec_f32x_q4k: qcase(BlockFormat::Q4K) => matvec_f32x;
    host_matvec_fused_q4_0, gpu_matvec_fused_q4_0: fused_case(BlockFormat::Q4_0) => matvec_fused;
    host_matvec_fused_q4_1, gpu_matvec_fused_q4_1: fused_case(BlockFormat::Q4_1) => matvec_fused;
    host_matvec_fused_q8_0, gpu_matvec_fused_q8_0: fused_case(BlockFormat::Q8_0) => matvec_fused;
    host_matvec_fused_q6k, gpu_matvec_fused_q6k: fused_case(BlockFormat::Q6K) => matvec_fused;
    host_matvec_fused_q5k, gpu_matvec_fused_q5k: fused_case(BlockFormat::Q5K) => matvec_fused;
    host_matvec_fused_q4k, gpu_matvec_fused_q4k: fused_case(BlockFormat::Q4K) => matvec_fused;
    host_matvec_swiglu_q8_q4_0, gpu_matvec_swiglu_q8_q4_0: swiglu_q8_case(BlockFormat::Q4_0) => matvec_swiglu_q8;
    host_matvec_swiglu_q8_q4_1, gpu_matvec_swiglu_q8_q4_1: swiglu_q8_case(BlockFormat::Q4_1) => matvec_swiglu_q8;
    host_matvec_swiglu_q8_q8_0, gpu_matvec_swiglu_q8_q8_0: swiglu_q8_case(BlockFormat::Q8_0) => matvec_swiglu_q8;
    host_matvec_swiglu_q8_q6k, gpu_matvec_swiglu_q8_q6k: swiglu_q8_case(BlockFormat::Q6K) => matvec_swiglu_q8;
    host_matvec_swiglu_q8_q5k, gpu_matvec_swiglu_q8_q5k: swiglu_q8_case(BlockFormat::Q5K) => matvec_swiglu_q8;
    host_matvec_swiglu_q8_q4k, gpu_matvec_swiglu_q8_q4k: swiglu_q8_case(BlockFormat::Q4K) => matvec_swiglu_q8;
    host_matvec_q4_0, gpu_matvec_q4_0: qcase(BlockFormat::Q4_0) => matvec_quantized;
    host_matvec_q4_1, gpu_matvec_q4_1: qcase(BlockFormat::Q4_1) => matvec_quantized;
    host_matvec_q8_0, gpu_matvec_q8_0: qcase(BlockFormat::Q8_0) => matvec_quantized;
    host_matvec_q6k, gpu_matvec_q6k: qcase(BlockFormat::Q6K) => matvec_quantized;
    host_matvec_q5k, gpu_matvec_q5k: qcase(BlockFormat::Q5K) => matvec_quantized;
    host_matvec_q4k, gpu_matvec_q4k: qcase(BlockFormat::Q4K) => matvec_quantized;
    host_matvec_f16, gpu_matvec_f16: f16_case() => matvec_f16;
}

/// Model-sized shapes (thousands of rows, up to 8192 columns): GPU only.
#[test]
fn gpu_matvec_large() {
    let formats = prop::sample::select(common::ALL_FORMATS.to_vec());
    let wave = prop_oneof![Just(None), (1..=200u32).prop_map(Some)];
    let case = (
        formats,
        length(5000),
        1..=256u32,
        1..=2u32,
        wave,
        shape(),
        seed(),
    )
        .prop_map(|(fmt, rows, blocks, n, wave, shape, seed)| QCase {
            fmt,
            rows,
            blocks: blocks.next_multiple_of(fmt.group() as u32),
            n,
            wave,
            shape,
            seed,
        });
    common::run_gpu("gpu_matvec_large", 32, case, matvec_quantized);
}

/// The reference's block decoding agrees with the shared GGUF block types (`kernels_gpu::quant`),
/// so the references test the layout llama.cpp writes, not one of our own making.
#[test]
fn reference_dequant_matches_gguf_block_types() {
    use kernels_gpu::quant::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QuantBlock};
    fn layout<B: QuantBlock>(bytes: &[u8]) -> Vec<f64> {
        let mut out = [0f32; QK];
        B::read(bytes).unwrap().dequant(&mut out);
        out.iter().map(|&v| v as f64).collect()
    }
    let mut g = Gen::new(7);
    for fmt in [BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0] {
        for block in g.gguf_blocks(fmt, 64).chunks_exact(fmt.block_bytes()) {
            let want = match fmt {
                BlockFormat::Q4_0 => layout::<BlockQ4_0>(block),
                BlockFormat::Q4_1 => layout::<BlockQ4_1>(block),
                BlockFormat::Q8_0 => layout::<BlockQ8_0>(block),
                BlockFormat::Q6K | BlockFormat::Q5K | BlockFormat::Q4K => {
                    unreachable!("not a GGUF block: see the re-blocking test")
                }
            };
            let got = r::dequantize_block(fmt, block);
            for i in 0..QK {
                // The block types round d·q + m to f32 once; the reference is exact.
                assert!(
                    (got[i] - want[i]).abs() <= 1e-6 * want[i].abs().max(1e-3),
                    "{fmt:?} elem {i}: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
    }
}

/// K-quant super-blocks re-blocked at load (`kernels_gpu::quant::reblock`) hold exactly the
/// values llama.cpp's layout gives them, both as the unpacked blocks the references read and,
/// packed into the split planes, as the kernels' own `element` decodes them.
#[test]
fn reblocked_k_quants_hold_the_gguf_values() {
    use kernels_gpu::kernels::formats::{self, SplitFormat, load_side, split_gguf_blocks};
    use kernels_gpu::quant::reblock::{self, ReblockError};
    use kernels_gpu::quant::{BlockQ4K, BlockQ5K, BlockQ6K, QuantBlock, f16_to_f32};
    type Reblock = fn(&[u8], &mut [u8]) -> Result<(), ReblockError>;
    /// Random bytes are valid K-quant blocks; the f16 `d` (and `dmin`) at `d_at` are set to
    /// sane magnitudes (a random f16 may be NaN or overflow once multiplied out).
    fn random_supers(g: &mut Gen, bytes: usize, d_at: &[usize], supers: usize) -> Vec<u8> {
        let mut src: Vec<u8> = (0..supers * bytes).map(|_| g.byte()).collect();
        for s in 0..supers {
            for &at in d_at {
                let d = g.sign() * g.magnitude(-4.0, -1.0);
                src[s * bytes + at..][..2].copy_from_slice(&g.f16_bits(d).to_le_bytes());
            }
        }
        src
    }
    /// The kernels' decoding of the packed planes, element by element.
    fn packed_values<F: SplitFormat>(blocks: &[u8], rows: usize) -> Vec<f64> {
        let (qb, sb) = formats::split_plane_bytes::<F>(rows, 256);
        let (mut qs, mut sc) = (vec![0u8; qb], vec![0u8; sb]);
        assert!(split_gguf_blocks::<F>(blocks, rows, 256, &mut qs, &mut sc));
        (0..rows * 256)
            .map(|e| {
                let blk = e / QK;
                let side = load_side::<F>(sc.as_ptr(), blk);
                F::element(qs[blk * 16..].as_ptr(), side, e % QK) as f64
            })
            .collect()
    }
    let mut g = Gen::new(11);
    let supers = 24;
    let cases: [(BlockFormat, usize, &[usize], Reblock); 3] = [
        (BlockFormat::Q4K, BlockQ4K::BYTES, &[0, 2], reblock::q4_k),
        (BlockFormat::Q5K, BlockQ5K::BYTES, &[0, 2], reblock::q5_k),
        (BlockFormat::Q6K, BlockQ6K::BYTES, &[208], reblock::q6_k),
    ];
    for (fmt, bytes, d_at, run) in cases {
        let src = random_supers(&mut g, bytes, d_at, supers);
        let mut blocks = vec![0u8; supers * 8 * fmt.block_bytes()];
        run(&src, &mut blocks).unwrap();
        let got = r::dequantize(fmt, &blocks, supers, 256);
        let packed = match fmt {
            BlockFormat::Q4K => packed_values::<formats::Q4K>(&blocks, supers),
            BlockFormat::Q5K => packed_values::<formats::Q5K>(&blocks, supers),
            _ => packed_values::<formats::Q6K>(&blocks, supers),
        };
        let mut want = vec![0f32; 256];
        for s in 0..supers {
            let sb = &src[s * bytes..][..bytes];
            // The magnitude each value's one f32 rounding is relative to (the larger of the
            // scaled code and the minimum; the block types and `element` round once or twice).
            let scale: Vec<f64> = match fmt {
                BlockFormat::Q6K => {
                    let b = BlockQ6K::read(sb).unwrap();
                    b.dequant(&mut want);
                    want.iter().map(|w| w.abs() as f64).collect()
                }
                _ => {
                    let (d, dmin, scales) = if fmt == BlockFormat::Q4K {
                        let b = BlockQ4K::read(sb).unwrap();
                        b.dequant(&mut want);
                        (b.d, b.dmin, b.scales)
                    } else {
                        let b = BlockQ5K::read(sb).unwrap();
                        b.dequant(&mut want);
                        (b.d, b.dmin, b.scales)
                    };
                    (0..256)
                        .map(|i| {
                            let (sc, m) = kernels_gpu::quant::get_scale_min_k4(i / 32, &scales);
                            (f16_to_f32(d) as f64 * sc as f64 * 31.0).abs()
                                + (f16_to_f32(dmin) as f64 * m as f64).abs()
                        })
                        .collect()
                }
            };
            for i in 0..256 {
                let (w, bound) = (want[i] as f64, 2f64.powi(-22) * scale[i] + 1e-30);
                let (r, p) = (got[s * 256 + i], packed[s * 256 + i]);
                assert!(
                    (r - w).abs() <= bound,
                    "{fmt:?} super {s} elem {i}: {r} vs {w}"
                );
                assert!(
                    (p - w).abs() <= bound,
                    "{fmt:?} super {s} elem {i}: packed {p} vs {w}"
                );
            }
        }
        // Wrong sizes are refused, not truncated.
        assert!(run(&src[..bytes - 1], &mut blocks).is_err());
        assert!(run(&src, &mut blocks[..fmt.block_bytes()]).is_err());
    }
    // A Q4_K block whose d·sc would overflow the f16 the GEMM stages it as is reported (the
    // load then widens that tensor to f16 instead), not stored to become infinity.
    let mut big = random_supers(&mut g, BlockQ4K::BYTES, &[0, 2], 1);
    big[0..2].copy_from_slice(&half::f16::MAX.to_le_bytes());
    big[4] = 63; // sub-block 0's scale
    let mut out = vec![0u8; 8 * formats::Q4K::BLOCK_BYTES];
    assert_eq!(reblock::q4_k(&big, &mut out), Err(ReblockError::ScaleRange));
}

/// Packing refuses K blocks that cannot share a record: a group whose blocks differ in `d`,
/// codes past the format's bits, or a row that is not whole groups.
#[test]
fn k_pack_refuses_what_it_cannot_hold() {
    use kernels_gpu::kernels::formats::{self, split_gguf_blocks, split_plane_bytes};
    let mut g = Gen::new(5);
    let good = g.gguf_blocks(BlockFormat::Q5K, 8);
    let (qb, sb) = split_plane_bytes::<formats::Q5K>(1, 256);
    let (mut qs, mut sc) = (vec![0u8; qb], vec![0u8; sb]);
    assert!(split_gguf_blocks::<formats::Q5K>(
        &good, 1, 256, &mut qs, &mut sc
    ));
    let mut other_d = good.clone();
    other_d[38] ^= 1; // block 1's d
    assert!(!split_gguf_blocks::<formats::Q5K>(
        &other_d, 1, 256, &mut qs, &mut sc
    ));
    let mut wide_code = good.clone();
    wide_code[6] = 32; // a 6-bit code in a 5-bit format
    assert!(!split_gguf_blocks::<formats::Q5K>(
        &wide_code, 1, 256, &mut qs, &mut sc
    ));
    let (qb, sb) = split_plane_bytes::<formats::Q5K>(2, 128);
    let (mut qs, mut sc) = (vec![0u8; qb], vec![0u8; sb]);
    assert!(!split_gguf_blocks::<formats::Q5K>(
        &good, 2, 128, &mut qs, &mut sc
    ));
}
