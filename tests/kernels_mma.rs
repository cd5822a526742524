//! Properties of `kernels/mma.rs`, the tensor-core GEMM over split Q4_0/Q4_1/Q8_0/Q6K/Q5K weights and
//! f16 activations (from the `to_f16` kernel): against float64 on the very values the tensor
//! cores multiply (each weight dequantized and rounded once to f16, each activation rounded to
//! f16), where only the f32 accumulation may differ; and against float64 on the exact weights
//! and f32 activations, where the two f16 roundings set the error.
mod common;

use common::data::{Gen, length, seed};
use common::reference::{self as r, BlockFormat, QK};
use common::{Arg, Device, check_err, check_written, download, names, poisoned, upload};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Case {
    fmt: BlockFormat,
    rows: u32,
    blocks: u32,
    n: u32,
    /// `y +=` instead of `y =`.
    acc: bool,
    /// The rows are split into this many matrices (1 to 3, at most `rows`), one launch over all.
    parts: u32,
    /// Which instantiation runs it.
    tile: Tile,
    /// Shares of the reduction over k (`splits`; the host splits main-tile launches only).
    splits: u32,
    seed: u64,
}

/// The GEMM's instantiations: the policy's main tile, its deep k-stages (`kiln_mma_deep_*`,
/// `policies::DeepK`) and its short-prompt tile (`kiln_mma_short_*`, `policies::ShortTile`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tile {
    Main,
    Deep,
    Short,
}

fn tile() -> impl Strategy<Value = Tile> {
    prop::sample::select(vec![Tile::Main, Tile::Deep, Tile::Short])
}

/// Rows and tokens around the block tiles (64 and 128 rows, 64 and 128 tokens) and ragged counts;
/// block counts around a stage (2 and 4 blocks) and past the 2- and 4-deep rings (9 and 13
/// blocks). Mostly small: the host executor runs every mma as a warp exchange between OS
/// threads, so a case with two tiles each way costs seconds.
fn case(fmt: BlockFormat) -> impl Strategy<Value = Case> {
    let rows = prop_oneof![prop::sample::select(vec![1u32, 17, 64, 65, 129]), 1..=72u32];
    let blocks = prop_oneof![prop::sample::select(vec![1u32, 2, 4, 5, 9, 13]), 1..=9u32];
    let n = prop_oneof![prop::sample::select(vec![2u32, 9, 64, 65, 129]), 2..=40u32];
    // Split-K on a third of the main-tile cases, up to more shares than some cases have
    // stages (an empty share must still count in).
    let splits = prop_oneof![2 => Just(1u32), 1 => 2..=5u32];
    (
        rows,
        blocks,
        n,
        any::<bool>(),
        1..=3u32,
        tile(),
        splits,
        seed(),
    )
        .prop_map(
            move |(rows, blocks, n, acc, parts, tile, splits, seed)| Case {
                fmt,
                rows,
                blocks: blocks.next_multiple_of(fmt.group() as u32),
                n,
                acc,
                parts,
                splits: if tile == Tile::Main { splits } else { 1 },
                tile,
                seed,
            },
        )
}

/// The GEMM entry of `fmt` and its (quant, staged) words per block.
fn entry(fmt: BlockFormat, tile: Tile) -> (&'static str, (u32, u32)) {
    use names::*;
    let [main, deep, short] = match fmt {
        BlockFormat::Q4_0 => [kiln_mma_q4_0, kiln_mma_deep_q4_0, kiln_mma_short_q4_0],
        BlockFormat::Q4_1 => [kiln_mma_q4_1, kiln_mma_deep_q4_1, kiln_mma_short_q4_1],
        BlockFormat::Q8_0 => [kiln_mma_q8_0, kiln_mma_deep_q8_0, kiln_mma_short_q8_0],
        BlockFormat::Q6K => [kiln_mma_q6k, kiln_mma_deep_q6k, kiln_mma_short_q6k],
        BlockFormat::Q5K => [kiln_mma_q5k, kiln_mma_deep_q5k, kiln_mma_short_q5k],
        BlockFormat::Q4K => [kiln_mma_q4k, kiln_mma_deep_q4k, kiln_mma_short_q4k],
    };
    let name = match tile {
        Tile::Main => main,
        Tile::Deep => deep,
        Tile::Short => short,
    };
    (name, common::gemm_words(fmt))
}

/// The launch shape of `tile`'s GEMM over matrices of `rows`.
fn dims(dev: &dyn Device, tile: Tile, rows: &[u32], n: u32, words: (u32, u32)) -> common::Dims {
    let sh = dev.shapes();
    match tile {
        Tile::Main => sh.mma(rows, n, words.0, words.1),
        Tile::Deep => sh.mma_deep(rows, n, words.0, words.1),
        Tile::Short => sh.mma_short(rows, n, words.0, words.1),
    }
}

fn gemm(dev: &mut dyn Device, c: &Case) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (c.rows as usize, c.blocks as usize * QK, c.n as usize);
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let gguf = g.gguf_blocks(c.fmt, rows * cols / QK);
    let y0 = if c.acc {
        g.normals(n * rows, 4.0)
    } else {
        vec![0.0; n * rows]
    };

    let x_b = upload(dev, &x);
    let xh_b = poisoned::<u16>(dev, n * cols, 0xff);
    let pairs = (n * cols / 2) as u32;
    dev.launch(
        names::kiln_to_f16,
        dev.shapes().flat(pairs),
        &[x_b.arg(), xh_b.arg(), Arg::U32(pairs)],
    );
    let xh = download::<u16>(dev, &xh_b);
    let want_h: Vec<u16> = x
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    prop_assert!(
        xh == want_h,
        "{}: to_f16 differs from round-to-nearest-even",
        dev.label()
    );

    // Matrix m holds rows bounds[m]..bounds[m + 1] of the weights, with its own output.
    let parts = (c.parts as usize).min(rows);
    let bounds: Vec<usize> = (0..=parts).map(|m| rows * m / parts).collect();
    let (mma, words) = entry(c.fmt, c.tile);
    let mut args = Vec::with_capacity(16);
    let mut outs = Vec::new();
    for m in 0..3 {
        let Some(r) = bounds.get(m + 1).map(|&end| bounds[m]..end) else {
            args.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::U32(0)]);
            continue;
        };
        let row_bytes = cols / QK * c.fmt.block_bytes();
        let (qs, sc) = common::split_planes(
            c.fmt,
            &gguf[r.start * row_bytes..r.end * row_bytes],
            r.len(),
            cols,
        );
        let y_m: Vec<f32> = (0..n)
            .flat_map(|t| y0[t * rows + r.start..t * rows + r.end].to_vec())
            .collect();
        let y_b = if c.acc {
            upload(dev, &y_m)
        } else {
            poisoned::<f32>(dev, n * r.len(), 0xff)
        };
        args.extend([
            upload(dev, &qs).arg(),
            upload(dev, &sc).arg(),
            y_b.arg(),
            Arg::U32(r.len() as u32),
        ]);
        outs.push((r, y_b));
    }
    args.extend([
        xh_b.arg(),
        Arg::U32(cols as u32),
        Arg::U32(n as u32),
        Arg::U32(c.acc as u32),
    ]);
    let part_rows: Vec<u32> = outs.iter().map(|(r, _)| r.len() as u32).collect();
    let mut dims = dims(dev, c.tile, &part_rows, n as u32, words);
    // Split-K: shares poisoned (each is written before it is read), counters zero.
    let (shares, counters) = dev.shapes().mma_split_k_scratch(dims.blocks(), c.splits);
    let shares_b = poisoned::<f32>(dev, shares, 0xff);
    let counters_b = upload(dev, &vec![0u32; counters]);
    dims.grid_y *= c.splits;
    args.extend([Arg::U32(c.splits), shares_b.arg(), counters_b.arg()]);
    dev.launch(mma, dims, &args);
    prop_assert!(
        download::<u32>(dev, &counters_b).iter().all(|&v| v == 0),
        "{}: split-K counters not zero after the launch",
        dev.label()
    );
    // Reassembled as one `n × rows` output.
    let mut y = vec![0f32; n * rows];
    for (r, y_b) in &outs {
        let y_m = download::<f32>(dev, y_b);
        check_written(dev, "mma output", &y_m)?;
        for t in 0..n {
            y[t * rows + r.start..t * rows + r.end]
                .copy_from_slice(&y_m[t * r.len()..(t + 1) * r.len()]);
        }
    }

    let w = r::dequantize(c.fmt, &gguf, rows, cols);
    let w_mag = r::weight_magnitudes(c.fmt, &gguf, rows, cols);
    let (w16, x16) = (
        r::gemm_weights_f16(c.fmt, &gguf, rows, cols),
        r::f16_values(&want_h),
    );
    // Every output of a small case; a spread sample (and the last) of a model-sized one.
    const CHECKED: usize = 8192;
    let picked: Vec<usize> = if n * rows <= CHECKED {
        (0..n * rows).collect()
    } else {
        (0..CHECKED)
            .map(|i| i * 7919 % (n * rows))
            .chain([n * rows - 1])
            .collect()
    };
    let (mut got, mut exact, mut mag) = (
        Vec::with_capacity(picked.len()),
        Vec::with_capacity(picked.len()),
        Vec::with_capacity(picked.len()),
    );
    for &i in &picked {
        let (t, row) = (i / rows, i % rows);
        {
            let (wr, xr) = (row * cols..(row + 1) * cols, t * cols..(t + 1) * cols);
            let (mut s16, mut abs16, mut s, mut abs) = (0f64, 0f64, 0f64, 0f64);
            for (k, (&a, &b)) in w16[wr.clone()].iter().zip(&x16[xr.clone()]).enumerate() {
                s16 += a * b;
                abs16 += (a * b).abs();
                let xk = x[xr.start + k] as f64;
                s += w[wr.start + k] * xk;
                abs += w_mag[wr.start + k] * xk.abs();
            }
            got.push(y[i]);
            exact.push(y0[i] as f64 + s);
            mag.push(abs + (y0[i] as f64).abs());
            // f32 accumulation of exact products over 2 mma steps per block, plus the `acc` add:
            // a few ulps of Σ|terms| per step, generously.
            let bound = (2 * c.blocks as usize + 8) as f64
                * 2f64.powi(-22)
                * (abs16 + (y0[i] as f64).abs())
                + 1e-30;
            let want = y0[i] as f64 + s16;
            prop_assert!(
                (y[i] as f64 - want).abs() <= bound,
                "{}: token {t} row {row}: mma {} vs f64 on the f16 operands {want} (bound {bound:.2e})",
                dev.label(),
                y[i]
            );
        }
    }
    // The f16 roundings of weights and activations: ~2⁻¹¹ each, relative to each term (Q4K's and
    // Q5K's weights relative to their scaled code and minimum: see `weight_magnitudes`), so the
    // error is measured against Σ|terms| (an output whose terms cancel is not held to 2⁻¹¹ of
    // itself: that failed one GPU case at de51df8, whose check against the f16 operands above
    // passed).
    check_err(
        dev,
        "vs exact weights and f32 activations",
        r::err_vs_magnitude(&got, &exact, &mag),
        3e-3,
    )
}

#[derive(Clone, Debug)]
struct SwigluCase {
    fmt: BlockFormat,
    /// Outputs (rows of each of the gate and up matrices): even, as the f16 copy pairs them.
    rows: u32,
    blocks: u32,
    n: u32,
    /// The short-prompt tile (`kiln_mma_swiglu_short_*`) instead of the main one.
    short: bool,
    seed: u64,
}

/// Outputs around the paired tile's 64 rows and ragged; tokens and blocks as for the GEMM.
fn swiglu_case(fmt: BlockFormat) -> impl Strategy<Value = SwigluCase> {
    let rows = prop_oneof![prop::sample::select(vec![2u32, 16, 64, 66, 130]), 1..=40u32];
    let blocks = prop_oneof![prop::sample::select(vec![1u32, 2, 4, 5, 9]), 1..=9u32];
    let n = prop_oneof![prop::sample::select(vec![2u32, 9, 64, 65, 129]), 2..=40u32];
    (rows, blocks, n, any::<bool>(), seed()).prop_map(move |(rows, blocks, n, short, seed)| {
        SwigluCase {
            fmt,
            rows: rows.next_multiple_of(2),
            blocks: blocks.next_multiple_of(fmt.group() as u32),
            n,
            short,
            seed,
        }
    })
}

fn swiglu_entry(fmt: BlockFormat, short: bool) -> &'static str {
    use names::*;
    let [main, short_tile] = match fmt {
        BlockFormat::Q4_0 => [kiln_mma_swiglu_q4_0, kiln_mma_swiglu_short_q4_0],
        BlockFormat::Q4_1 => [kiln_mma_swiglu_q4_1, kiln_mma_swiglu_short_q4_1],
        BlockFormat::Q8_0 => [kiln_mma_swiglu_q8_0, kiln_mma_swiglu_short_q8_0],
        BlockFormat::Q6K => [kiln_mma_swiglu_q6k, kiln_mma_swiglu_short_q6k],
        BlockFormat::Q5K => [kiln_mma_swiglu_q5k, kiln_mma_swiglu_short_q5k],
        BlockFormat::Q4K => [kiln_mma_swiglu_q4k, kiln_mma_swiglu_short_q4k],
    };
    if short { short_tile } else { main }
}

/// The paired GEMM + SwiGLU (`kiln_mma_swiglu_*`, `kiln_mma_swiglu_short_*`): bit for bit what
/// the unfused launches give (the GEMM of the same tile over gate and up, then the `swiglu`
/// kernel), its f16 copy the round-to-nearest of those values, and both factors within the
/// GEMM's bound of float64 on the f16 operands.
fn gemm_swiglu(dev: &mut dyn Device, c: &SwigluCase) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (c.rows as usize, c.blocks as usize * QK, c.n as usize);
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let (gate, gq, gs) = common::split_weights(dev, &mut g, c.fmt, rows, cols);
    let (up, uq, us) = common::split_weights(dev, &mut g, c.fmt, rows, cols);
    let x_b = upload(dev, &x);
    let xh_b = poisoned::<u16>(dev, n * cols, 0xff);
    let pairs = (n * cols / 2) as u32;
    dev.launch(
        names::kiln_to_f16,
        dev.shapes().flat(pairs),
        &[x_b.arg(), xh_b.arg(), Arg::U32(pairs)],
    );
    let tile = if c.short { Tile::Short } else { Tile::Main };
    let (unfused, (qs_words, staged)) = entry(c.fmt, tile);
    let (r, nt) = (rows as u32, n as u32);

    let (y_b, yh_b) = (
        poisoned::<f32>(dev, n * rows, 0xff),
        poisoned::<u16>(dev, n * rows, 0xff),
    );
    let dims = match c.short {
        true => dev.shapes().mma_swiglu_short(r, nt, qs_words, staged),
        false => dev.shapes().mma_swiglu(r, nt, qs_words, staged),
    };
    let args = [
        gq.arg(),
        gs.arg(),
        uq.arg(),
        us.arg(),
        y_b.arg(),
        yh_b.arg(),
        Arg::U32(r),
    ];
    let rest = [xh_b.arg(), Arg::U32(cols as u32), Arg::U32(nt)];
    dev.launch(
        swiglu_entry(c.fmt, c.short),
        dims,
        &[&args[..], &rest[..]].concat(),
    );
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "SwiGLU GEMM output", &y)?;
    let yh = download::<u16>(dev, &yh_b);

    // The unfused launches: gate and up by the GEMM of the same tile, then `swiglu`.
    let (gy_b, uy_b, s_b) = (
        poisoned::<f32>(dev, n * rows, 0xff),
        poisoned::<f32>(dev, n * rows, 0xff),
        poisoned::<f32>(dev, n * rows, 0xff),
    );
    let mut args = vec![gq.arg(), gs.arg(), gy_b.arg(), Arg::U32(r)];
    args.extend([uq.arg(), us.arg(), uy_b.arg(), Arg::U32(r)]);
    args.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::U32(0)]);
    args.extend([xh_b.arg(), Arg::U32(cols as u32), Arg::U32(nt), Arg::U32(0)]);
    args.extend([Arg::U32(1), Arg::Ptr(0), Arg::Ptr(0)]); // not split
    let dims = self::dims(dev, tile, &[r, r], nt, (qs_words, staged));
    dev.launch(unfused, dims, &args);
    let len = (n * rows) as u32;
    dev.launch(
        names::kiln_swiglu,
        dev.shapes().flat(len),
        &[gy_b.arg(), uy_b.arg(), s_b.arg(), Arg::U32(len)],
    );
    let want = download::<f32>(dev, &s_b);
    let (gy, uy) = (download::<f32>(dev, &gy_b), download::<f32>(dev, &uy_b));

    let (g16, u16w) = (
        r::gemm_weights_f16(c.fmt, &gate, rows, cols),
        r::gemm_weights_f16(c.fmt, &up, rows, cols),
    );
    let x16: Vec<f64> = x.iter().map(|&v| half::f16::from_f32(v).to_f64()).collect();
    for t in 0..n {
        for row in 0..rows {
            let i = t * rows + row;
            prop_assert!(
                y[i].to_bits() == want[i].to_bits(),
                "{}: token {t} row {row}: fused {} vs unfused {}",
                dev.label(),
                y[i],
                want[i]
            );
            prop_assert!(
                yh[i] == half::f16::from_f32(y[i]).to_bits(),
                "{}: token {t} row {row}: f16 copy {:#06x} of {}",
                dev.label(),
                yh[i],
                y[i]
            );
            // The factors against float64 on the f16 operands (the GEMM's own bound).
            let xr = &x16[t * cols..(t + 1) * cols];
            for (w, got) in [(&g16, gy[i]), (&u16w, uy[i])] {
                let wr = &w[row * cols..(row + 1) * cols];
                let s: f64 = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
                let abs: f64 = wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
                let bound = (2 * c.blocks as usize + 8) as f64 * 2f64.powi(-22) * abs + 1e-30;
                prop_assert!(
                    (got as f64 - s).abs() <= bound,
                    "{}: token {t} row {row}: factor {got} vs f64 {s} (bound {bound:.2e})",
                    dev.label()
                );
            }
        }
    }
    Ok(())
}

kernel_properties! {
    host_mma_swiglu_q4_0, gpu_mma_swiglu_q4_0: swiglu_case(BlockFormat::Q4_0) => gemm_swiglu;
    host_mma_swiglu_q8_0, gpu_mma_swiglu_q8_0: swiglu_case(BlockFormat::Q8_0) => gemm_swiglu;
    host_mma_swiglu_q4k, gpu_mma_swiglu_q4k: swiglu_case(BlockFormat::Q4K) => gemm_swiglu;
}

kernel_properties! {
    host_mma_q4_0, gpu_mma_q4_0: case(BlockFormat::Q4_0) => gemm;
    host_mma_q4_1, gpu_mma_q4_1: case(BlockFormat::Q4_1) => gemm;
    host_mma_q8_0, gpu_mma_q8_0: case(BlockFormat::Q8_0) => gemm;
    host_mma_q6k, gpu_mma_q6k: case(BlockFormat::Q6K) => gemm;
    host_mma_q5k, gpu_mma_q5k: case(BlockFormat::Q5K) => gemm;
    host_mma_q4k, gpu_mma_q4k: case(BlockFormat::Q4K) => gemm;
    host_mma_split_k, gpu_mma_split_k: split_k_case() => gemm;
}

/// Split-K launches only: the main tile over any format, 2 to 6 shares (more than the stages
/// of the shortest cases, so some shares are empty and must still be counted in).
fn split_k_case() -> impl Strategy<Value = Case> {
    let formats = prop::sample::select(common::ALL_FORMATS.to_vec());
    (formats, 2..=6u32, any::<u64>()).prop_flat_map(|(fmt, splits, _)| {
        case(fmt).prop_map(move |c| Case {
            tile: Tile::Main,
            splits,
            ..c
        })
    })
}

/// Model-sized shapes (thousands of rows, up to 4096 columns, hundreds of tokens): GPU only.
#[test]
fn gpu_mma_large() {
    let formats = prop::sample::select(common::ALL_FORMATS.to_vec());
    let case = (
        formats,
        length(3000),
        1..=128u32,
        length(300).prop_map(|n| n.max(2)),
        seed(),
    )
        .prop_map(|(fmt, rows, blocks, n, seed)| Case {
            fmt,
            rows,
            blocks: blocks.next_multiple_of(fmt.group() as u32),
            n,
            acc: seed % 2 == 1,
            parts: 1 + (seed / 2 % 3) as u32,
            tile: [Tile::Main, Tile::Deep, Tile::Short][(seed / 6 % 3) as usize],
            // Main-tile cases split over k 1 to 8 ways (the host's range at model sizes).
            splits: match seed / 6 % 3 {
                0 => 1 + (seed / 18 % 8) as u32,
                _ => 1,
            },
            seed,
        });
    common::run_gpu("gpu_mma_large", 32, case, gemm);
}

/// Every policy's embedded module takes its launch bounds: on sm_90 each of the six deep GEMM
/// entries (two k groups: 512 threads) gets `.maxntid 512, 1, 1` right after its parameter
/// list, and nothing else changes; the policies whose deep GEMM keeps 256 threads get none.
#[test]
fn embedded_modules_take_the_deep_gemms_launch_bounds() {
    for m in kiln::PTX_MODULES {
        let bounds = kiln_host::cuda::launch_shapes_of(m.name).launch_bounds();
        let out = kiln_host::cuda::with_launch_bounds(m.ptx, &bounds).unwrap();
        let added = out.matches(".maxntid").count() - m.ptx.matches(".maxntid").count();
        match m.name {
            "sm_90" => {
                assert_eq!(bounds, [("kiln_mma_deep_", 512)]);
                assert_eq!(added, 6, "sm_90: deep GEMM entries bounded");
                let at = out.find(".visible .entry kiln_mma_deep_q4_0(").unwrap();
                let head = &out[at..at + out[at..].find('{').unwrap()];
                let lines: Vec<&str> = head.lines().collect();
                assert!(
                    lines[lines.len() - 2].starts_with(')')
                        && lines[lines.len() - 1] == ".maxntid 512, 1, 1",
                    "{head}"
                );
            }
            _ => assert_eq!((bounds.len(), added), (0, 0), "{}", m.name),
        }
        assert_eq!(out.replace(".maxntid 512, 1, 1\n", ""), m.ptx, "{}", m.name);
    }
}
