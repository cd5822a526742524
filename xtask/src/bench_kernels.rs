//! `cargo xtask bench kernels`: GPU mat-vec bandwidth against the device's own copy bandwidth.
//!
//! Protocol: measure device-to-device copy bandwidth (bytes read + written); for each shape and
//! weight format, upload random weights in enough copies to defeat L2 (every launch reads a copy
//! that was not read by the previous launch), check the result against a float64 CPU reference,
//! warm up, then time every launch with its own pair of events and report the median and p95.
use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use kernels_gpu::entries::names;
use kernels_gpu::kernels::formats::{self, SplitFormat, load_side};
use kernels_gpu::kernels::launch::Dims;
use kiln_host::cuda::{Arg, DBuf, Gpu};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;

use crate::measure::percentile;

#[derive(ClapArgs)]
pub struct Args {
    /// Timed launches per case.
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Write the JSON results here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Case {
    kernel: String,
    rows: usize,
    cols: usize,
    bytes: usize,
    median_us: f64,
    p95_us: f64,
    gbps: f64,
    pct_of_copy: f64,
    floor_us: f64,
    max_rel_err: f64,
}

/// One prefill GEMM shape: the tensor-core kernel against the mat-vec launched once per token
/// (the path prefill took before the GEMM).
#[derive(Serialize)]
struct GemmCase {
    kernel: String,
    tokens: usize,
    rows: usize,
    cols: usize,
    median_us: f64,
    p95_us: f64,
    /// 2·tokens·rows·cols over the median time.
    tflops: f64,
    matvec_us: f64,
    speedup: f64,
    max_rel_err: f64,
}

#[derive(Serialize)]
struct Report {
    device: String,
    module: String,
    commit: String,
    copy_gbps: f64,
    cases: Vec<Case>,
    gemm: Vec<GemmCase>,
}

/// Copy bandwidth: 1 GiB device-to-device, bytes read + written over median time.
fn copy_bandwidth(gpu: &Gpu) -> Result<f64> {
    let n = 1 << 28; // u32s = 1 GiB
    let src = gpu.alloc::<u32>(n)?;
    let mut dst = gpu.alloc::<u32>(n)?;
    let mut t = Vec::new();
    for i in 0..25 {
        let ms = gpu.time_ms(|| gpu.copy(&src, &mut dst))?;
        if i >= 5 {
            t.push(ms as f64);
        }
    }
    Ok(2.0 * (n * 4) as f64 / (percentile(&mut t, 0.5) * 1e-3) / 1e9)
}

struct Weights {
    qs: Vec<DBuf<u8>>,
    scales: Vec<DBuf<u8>>,
    host_qs: Vec<u8>,
    host_scales: Vec<u8>,
}

fn random_split<F: SplitFormat>(
    gpu: &Gpu,
    rows: usize,
    cols: usize,
    copies: usize,
    rng: &mut StdRng,
) -> Result<Weights> {
    let (qb, sb) = formats::split_plane_bytes::<F>(rows, cols);
    let host_qs: Vec<u8> = (0..qb).map(|_| rng.random()).collect();
    let mut host_scales = vec![0u8; sb];
    for c in host_scales.chunks_mut(2) {
        let v = half::f16::from_f32(rng.random_range(-0.02f32..0.02));
        c.copy_from_slice(&v.to_le_bytes());
    }
    let mut qs = Vec::new();
    let mut scales = Vec::new();
    for _ in 0..copies {
        qs.push(gpu.upload(&host_qs)?);
        scales.push(gpu.upload(&host_scales)?);
    }
    Ok(Weights {
        qs,
        scales,
        host_qs,
        host_scales,
    })
}

fn bench_matvec<F: SplitFormat>(
    gpu: &Gpu,
    label: &str,
    rows: usize,
    cols: usize,
    iters: usize,
    copy_gbps: f64,
    rng: &mut StdRng,
) -> Result<Case> {
    let (qb, sb) = formats::split_plane_bytes::<F>(rows, cols);
    let bytes = qb + sb;
    // Enough copies that consecutive launches never find their weights in the 50 MB L2.
    let copies = (256 << 20) / bytes + 2;
    let w = random_split::<F>(gpu, rows, cols, copies.min(16), rng)?;
    let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let xd = gpu.upload(&x)?;
    let xq = gpu.alloc::<i8>(cols)?;
    let xds = gpu.alloc::<f32>(cols / 16)?;
    let y = gpu.alloc::<f32>(rows)?;
    let sh = gpu.shapes();
    gpu.launch(
        names::kiln_quantize_q8_1,
        sh.quantize_q8_1(cols as u32, 1),
        &[xd.arg(), xq.arg(), xds.arg(), Arg::U32(cols as u32)],
    )?;
    let (kernel, mut dims, groups) = matvec_launch::<F>(gpu, rows as u32, 1);
    // Sweep hook: KILN_MATVEC_BLOCKS_PER_SM overrides the policy's resident wave (the kernel
    // grid-strides, so any grid is correct).
    if let Some(b) = std::env::var("KILN_MATVEC_BLOCKS_PER_SM")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        dims.grid_x = groups.min(b * gpu.sm_count());
    }
    let launch = |k: usize| {
        let k = k % w.qs.len();
        gpu.launch(
            kernel,
            dims,
            &[
                w.qs[k].arg(),
                w.scales[k].arg(),
                xq.arg(),
                xds.arg(),
                y.arg(),
                Arg::U32(rows as u32),
                Arg::U32(cols as u32),
                Arg::U32(0),
            ],
        )
    };
    launch(0)?;
    gpu.synchronize()?;
    // Correctness: float64 over the exact quantized activations the kernel used.
    let got = gpu.download(&y)?;
    let q = gpu.download(&xq)?;
    let s = gpu.download(&xds)?;
    let mut max_rel = 0f64;
    let mut worst = (0usize, 0f64, 0f64);
    let nb = cols / 32;
    for row in (0..rows).step_by((rows / 97).max(1)).chain([rows - 1]) {
        let mut acc = 0f64;
        let mut mag = 0f64;
        for b in 0..nb {
            let blk = row * nb + b;
            let qs = &w.host_qs[blk * F::QS_WORDS * 4..];
            let side = load_side::<F>(w.host_scales.as_ptr(), blk);
            for i in 0..32 {
                let wv = F::element(qs.as_ptr(), side, i) as f64;
                let xv = q[b * 32 + i] as f64 * s[2 * b] as f64;
                acc += wv * xv;
                mag += (wv * xv).abs();
            }
        }
        let rel = (got[row] as f64 - acc).abs() / mag.max(1e-30);
        #[allow(clippy::neg_cmp_op_on_partial_ord)] // a NaN error must become the worst
        if !(rel <= max_rel) {
            max_rel = rel;
            worst = (row, got[row] as f64, acc);
        }
    }
    if !max_rel.is_finite() || max_rel > 1e-4 {
        bail!(
            "{label} {rows}x{cols}: result differs from the float64 reference (max rel err {max_rel:.2e} at row {}: got {}, want {})",
            worst.0,
            worst.1,
            worst.2
        );
    }
    for k in 0..20 {
        launch(k)?;
    }
    // Launches go back to back, as in a decode step: time BATCH of them per event pair (each on
    // a different weight copy) and take the per-launch mean of each batch as one sample.
    const BATCH: usize = 10;
    let mut t = Vec::with_capacity(iters);
    for k in 0..iters {
        let ms = gpu.time_ms(|| (0..BATCH).try_for_each(|j| launch(k * BATCH + j)))?;
        t.push(ms as f64 * 1e3 / BATCH as f64);
    }
    let median = percentile(&mut t, 0.5);
    let p95 = percentile(&mut t, 0.95);
    let gbps = bytes as f64 / (median * 1e-6) / 1e9;
    Ok(Case {
        kernel: label.into(),
        rows,
        cols,
        bytes,
        median_us: median,
        p95_us: p95,
        gbps,
        pct_of_copy: 100.0 * gbps / copy_gbps,
        floor_us: bytes as f64 / (copy_gbps * 1e9) * 1e6,
        max_rel_err: max_rel,
    })
}

/// The tensor-core GEMM for `tokens` activation rows: checked on sampled outputs against float64
/// over its f16 operands, then timed (weights stay in L2 across launches, as
/// they would not in a model; at these sizes the GEMM is arithmetic-bound either way).
fn bench_gemm<F: SplitFormat>(
    gpu: &Gpu,
    label: &str,
    tokens: usize,
    rows: usize,
    cols: usize,
    iters: usize,
    rng: &mut StdRng,
) -> Result<GemmCase> {
    let w = random_split::<F>(gpu, rows, cols, 1, rng)?;
    let x: Vec<f32> = (0..tokens * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let xd = gpu.upload(&x)?;
    let xq = gpu.alloc::<i8>(tokens * cols)?;
    let xds = gpu.alloc::<f32>(tokens * cols / 16)?;
    let y = gpu.alloc::<f32>(tokens * rows)?;
    let sh = gpu.shapes();
    let (t32, r32, c32) = (tokens as u32, rows as u32, cols as u32);
    gpu.launch(
        names::kiln_quantize_q8_1,
        sh.quantize_q8_1(c32, t32),
        &[xd.arg(), xq.arg(), xds.arg(), Arg::U32(c32)],
    )?;
    let xh = gpu.alloc::<u16>(tokens * cols)?;
    let pairs = (tokens * cols / 2) as u32;
    gpu.launch(
        names::kiln_to_f16,
        sh.flat(pairs),
        &[xd.arg(), xh.arg(), Arg::U32(pairs)],
    )?;
    // Last arguments: overwrite y, not add to it.
    let gemm_args = [
        w.qs[0].arg(),
        w.scales[0].arg(),
        y.arg(),
        Arg::U32(r32),
        Arg::Ptr(0),
        Arg::Ptr(0),
        Arg::Ptr(0),
        Arg::U32(0),
        Arg::Ptr(0),
        Arg::Ptr(0),
        Arg::Ptr(0),
        Arg::U32(0),
        xh.arg(),
        Arg::U32(c32),
        Arg::U32(t32),
        Arg::U32(0),
        // Not split over k.
        Arg::U32(1),
        Arg::Ptr(0),
        Arg::Ptr(0),
    ];
    let args = [
        w.qs[0].arg(),
        w.scales[0].arg(),
        xq.arg(),
        xds.arg(),
        y.arg(),
        Arg::U32(r32),
        Arg::U32(c32),
        Arg::U32(0),
    ];
    let gemm = match F::BLOCK_BYTES {
        18 => names::kiln_mma_q4_0,
        20 => names::kiln_mma_q4_1,
        _ => names::kiln_mma_q8_0,
    };
    let (matvec, mv_dims, _) = matvec_launch::<F>(gpu, r32, t32);
    let gemm_dims = sh.mma(&[r32], t32, F::QS_WORDS as u32, F::STAGED_WORDS as u32);
    gpu.launch(gemm, gemm_dims, &gemm_args)?;
    gpu.synchronize()?;
    let got = gpu.download(&y)?;
    let f16 = |v: f32| half::f16::from_f32(v).to_f64();
    let nb = cols / 32;
    let mut max_rel = 0f64;
    for (t, row) in (0..97)
        .map(|i| ((i * 7919) % tokens, (i * 104_729) % rows))
        .chain([(tokens - 1, rows - 1)])
    {
        let (mut acc, mut mag) = (0f64, 0f64);
        for b in 0..nb {
            let blk = row * nb + b;
            let (qs, side) = (
                &w.host_qs[blk * F::QS_WORDS * 4..],
                load_side::<F>(w.host_scales.as_ptr(), blk),
            );
            for i in 0..32 {
                // The operands the tensor cores multiply: each rounded once to f16.
                let wv = f16(F::element(qs.as_ptr(), side, i));
                let xv = f16(x[t * cols + b * 32 + i]);
                acc += wv * xv;
                mag += (wv * xv).abs();
            }
        }
        let rel = (got[t * rows + row] as f64 - acc).abs() / mag.max(1e-30);
        max_rel = if rel.is_nan() {
            f64::NAN
        } else {
            max_rel.max(rel)
        };
    }
    if max_rel.is_nan() || max_rel > 1e-4 {
        bail!(
            "{label} {tokens}x{rows}x{cols}: result differs from the float64 reference (max rel err {max_rel:.2e})"
        );
    }
    let time = |launch: &dyn Fn() -> Result<()>| -> Result<(f64, f64)> {
        for _ in 0..5 {
            launch()?;
        }
        let mut t = Vec::with_capacity(iters);
        for _ in 0..iters {
            t.push(gpu.time_ms(launch)? as f64 * 1e3);
        }
        Ok((percentile(&mut t, 0.5), percentile(&mut t, 0.95)))
    };
    let (median, p95) = time(&|| gpu.launch(gemm, gemm_dims, &gemm_args))?;
    let (matvec_us, _) = time(&|| gpu.launch(matvec, mv_dims, &args))?;
    Ok(GemmCase {
        kernel: label.into(),
        tokens,
        rows,
        cols,
        median_us: median,
        p95_us: p95,
        tflops: 2.0 * (tokens * rows * cols) as f64 / (median * 1e-6) / 1e12,
        matvec_us,
        speedup: matvec_us / median,
        max_rel_err: max_rel,
    })
}

/// The split mat-vec entry and launch the backend takes for `rows` outputs of `n` tokens (the
/// wide instantiation where `matvec_takes_wide`; no `KILN_MATVEC_WIDE` switch here), and its
/// number of row groups (the grid without the one-wave cap).
fn matvec_launch<F: SplitFormat>(gpu: &Gpu, rows: u32, n: u32) -> (&'static str, Dims, u32) {
    let (sh, sms) = (gpu.shapes(), gpu.sm_count());
    let wide = sh.matvec_takes_wide(rows, sms);
    let k = match (F::BLOCK_BYTES, wide) {
        (18, false) => names::kiln_matvec_q4_0,
        (20, false) => names::kiln_matvec_q4_1,
        (_, false) => names::kiln_matvec_q8_0,
        (18, true) => names::kiln_matvec_wide_q4_0,
        (20, true) => names::kiln_matvec_wide_q4_1,
        (_, true) => names::kiln_matvec_wide_q8_0,
    };
    let (dims, groups) = match wide {
        true => (
            sh.matvec_wide_multi(&[rows], n, sms),
            sh.matvec_wide_multi(&[rows], n, u32::MAX / 64).grid_x,
        ),
        false => (sh.matvec_resident(rows, n, sms), sh.matvec(rows, n).grid_x),
    };
    (k, gpu.one_wave(k, dims), groups)
}

pub fn run(a: Args) -> Result<()> {
    let gpu = Gpu::new(kiln::PTX_MODULES, 0).context("bench kernels needs a CUDA GPU")?;
    let commit = crate::measure::commit();
    eprintln!(
        "device: {} (cc {:?}), module {}",
        gpu.name(),
        gpu.compute_capability(),
        gpu.module_name()
    );
    let copy_gbps = copy_bandwidth(&gpu)?;
    eprintln!("copy bandwidth: {copy_gbps:.0} GB/s (read + write)");
    let mut rng = StdRng::seed_from_u64(7);
    let mut cases = Vec::new();
    for (rows, cols) in [(14336, 4096), (4096, 14336), (151936, 4096)] {
        cases.push(bench_matvec::<formats::Q4_0>(
            &gpu,
            "matvec_q4_0",
            rows,
            cols,
            a.iters,
            copy_gbps,
            &mut rng,
        )?);
        cases.push(bench_matvec::<formats::Q8_0>(
            &gpu,
            "matvec_q8_0",
            rows,
            cols,
            a.iters,
            copy_gbps,
            &mut rng,
        )?);
        cases.push(bench_matvec::<formats::Q4_1>(
            &gpu,
            "matvec_q4_1",
            rows,
            cols,
            a.iters,
            copy_gbps,
            &mut rng,
        )?);
    }
    let mut gemm = Vec::new();
    // qwen3-8b's prefill shapes at 512 tokens: gate/up, q/o, k/v, down.
    for (tokens, rows, cols) in [
        (512, 12288, 4096),
        (512, 4096, 4096),
        (512, 1024, 4096),
        (512, 4096, 12288),
    ] {
        gemm.push(bench_gemm::<formats::Q4_0>(
            &gpu,
            "mma_q4_0",
            tokens,
            rows,
            cols,
            a.iters / 4,
            &mut rng,
        )?);
        gemm.push(bench_gemm::<formats::Q8_0>(
            &gpu,
            "mma_q8_0",
            tokens,
            rows,
            cols,
            a.iters / 4,
            &mut rng,
        )?);
        gemm.push(bench_gemm::<formats::Q4_1>(
            &gpu,
            "mma_q4_1",
            tokens,
            rows,
            cols,
            a.iters / 4,
            &mut rng,
        )?);
    }
    println!(
        "| kernel | rows×cols | MB | median µs | p95 µs | GB/s | % copy | floor µs | max rel err |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for c in &cases {
        println!(
            "| {} | {}×{} | {:.1} | {:.2} | {:.2} | {:.0} | {:.1} | {:.2} | {:.1e} |",
            c.kernel,
            c.rows,
            c.cols,
            c.bytes as f64 / 1e6,
            c.median_us,
            c.p95_us,
            c.gbps,
            c.pct_of_copy,
            c.floor_us,
            c.max_rel_err
        );
    }
    println!();
    println!(
        "| kernel | tokens×rows×cols | median µs | p95 µs | TFLOP/s | mat-vec ×tokens µs | speedup | max rel err |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for c in &gemm {
        println!(
            "| {} | {}×{}×{} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}× | {:.1e} |",
            c.kernel,
            c.tokens,
            c.rows,
            c.cols,
            c.median_us,
            c.p95_us,
            c.tflops,
            c.matvec_us,
            c.speedup,
            c.max_rel_err
        );
    }
    let report = Report {
        device: gpu.name().into(),
        module: gpu.module_name().into(),
        commit,
        copy_gbps,
        cases,
        gemm,
    };
    if let Some(p) = a.json {
        std::fs::write(&p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
