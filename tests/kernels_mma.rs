//! Properties of `kernels/mma.rs`, the tensor-core GEMM over split Q4_0/Q4_1/Q8_0 weights and
//! Q8_1 activations: against the float64 value of the Q8_1 dot definition on the activations the
//! quantize kernel produced, and against the mat-vec kernel on the very same inputs. Both
//! finish each block with the same f32 arithmetic, so per output they may differ only by the
//! rounding of summing blocks in another order: a few ulps of `Σ_b |term_b|`.
mod common;

use common::data::{Gen, length, seed};
use common::reference::{self as r, BlockFormat, QK};
use common::{Arg, Device, check_err, check_written, download, names, poisoned, upload};
use kernels_gpu::kernels::formats::{self, SplitFormat};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Case {
    fmt: BlockFormat,
    rows: u32,
    blocks: u32,
    n: u32,
    seed: u64,
}

/// Rows and tokens around the block tiles (64 and 128 rows, 64 tokens) and ragged counts;
/// block counts around a stage (4 blocks) and past the 2- and 3-deep rings (9 and 13 blocks).
/// Mostly small: the host executor runs every mma as a warp exchange between OS threads, so a
/// case with two tiles each way costs seconds.
fn case(fmt: BlockFormat) -> impl Strategy<Value = Case> {
    let rows = prop_oneof![prop::sample::select(vec![1u32, 17, 64, 65, 129]), 1..=72u32];
    let blocks = prop_oneof![prop::sample::select(vec![1u32, 4, 5, 9, 13]), 1..=9u32];
    let n = prop_oneof![prop::sample::select(vec![2u32, 9, 64, 65]), 2..=40u32];
    (rows, blocks, n, seed()).prop_map(move |(rows, blocks, n, seed)| Case { fmt, rows, blocks, n, seed })
}

fn entries(fmt: BlockFormat) -> (&'static str, &'static str, u32) {
    match fmt {
        BlockFormat::Q4_0 => (names::kiln_mma_q4_0, names::kiln_matvec_q4_0, formats::Q4_0::QS_WORDS as u32),
        BlockFormat::Q4_1 => (names::kiln_mma_q4_1, names::kiln_matvec_q4_1, formats::Q4_1::QS_WORDS as u32),
        BlockFormat::Q8_0 => (names::kiln_mma_q8_0, names::kiln_matvec_q8_0, formats::Q8_0::QS_WORDS as u32),
    }
}

fn gemm(dev: &mut dyn Device, c: &Case) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (c.rows as usize, c.blocks as usize * QK, c.n as usize);
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let gguf = g.gguf_blocks(c.fmt, rows * cols / QK);
    let (qs, sc) = common::split_planes(c.fmt, &gguf, rows, cols);

    let x_b = upload(dev, &x);
    let xq_b = poisoned::<i8>(dev, n * cols, 0x80);
    let xds_b = poisoned::<f32>(dev, n * cols / QK * 2, 0xff);
    let dims = dev.shapes().quantize_q8_1(cols as u32, n as u32);
    dev.launch(names::kiln_quantize_q8_1, dims, &[x_b.arg(), xq_b.arg(), xds_b.arg(), Arg::U32(cols as u32)]);
    let (xq, xds) = (download::<i8>(dev, &xq_b), download::<f32>(dev, &xds_b));

    let (qs_b, sc_b) = (upload(dev, &qs), upload(dev, &sc));
    let (mma, matvec, qs_words) = entries(c.fmt);
    let args = |y: &common::Buf| [qs_b.arg(), sc_b.arg(), xq_b.arg(), xds_b.arg(), y.arg(), Arg::U32(rows as u32), Arg::U32(cols as u32)];
    let y_b = poisoned::<f32>(dev, n * rows, 0xff);
    let dims = dev.shapes().mma(rows as u32, n as u32, qs_words);
    dev.launch(mma, dims, &[&args(&y_b)[..], &[Arg::U32(n as u32)]].concat()); // n: the GEMM's last parameter
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "mma output", &y)?;

    let mv_b = poisoned::<f32>(dev, n * rows, 0xff);
    dev.launch(matvec, dev.shapes().matvec(rows as u32, n as u32), &[&args(&mv_b)[..], &[Arg::U32(0)]].concat()); // acc = 0
    let mv = download::<f32>(dev, &mv_b);

    let exact = r::matvec_q8_1(c.fmt, &gguf, rows, cols, &xq, &xds);
    check_err(dev, "vs exact Q8_1 activations", r::rel_err(&y, &exact), 1e-5)?;
    let scale = r::matvec_q8_1_abs(c.fmt, &gguf, rows, cols, &xq, &xds);
    for i in 0..n * rows {
        // Each block term is rounded a few times and summed once: ~(nb + 3)·2⁻²⁴ of Σ|terms|.
        let bound = 1e-5 * scale[i] + 1e-30;
        let (t, row) = (i / rows, i % rows);
        prop_assert!(
            (y[i] as f64 - exact[i]).abs() <= bound,
            "{}: token {t} row {row}: mma {} vs exact {} (bound {bound:.2e})",
            dev.label(),
            y[i],
            exact[i]
        );
        prop_assert!(
            (y[i] as f64 - mv[i] as f64).abs() <= bound,
            "{}: token {t} row {row}: mma {} vs mat-vec {} (bound {bound:.2e})",
            dev.label(),
            y[i],
            mv[i]
        );
    }
    Ok(())
}

kernel_properties! {
    host_mma_q4_0, gpu_mma_q4_0: case(BlockFormat::Q4_0) => gemm;
    host_mma_q4_1, gpu_mma_q4_1: case(BlockFormat::Q4_1) => gemm;
    host_mma_q8_0, gpu_mma_q8_0: case(BlockFormat::Q8_0) => gemm;
}

/// Model-sized shapes (thousands of rows, up to 4096 columns, hundreds of tokens): GPU only.
#[test]
fn gpu_mma_large() {
    let formats = prop::sample::select(vec![BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0]);
    let case = (formats, length(3000), 1..=128u32, length(300).prop_map(|n| n.max(2)), seed())
        .prop_map(|(fmt, rows, blocks, n, seed)| Case { fmt, rows, blocks, n, seed });
    common::run_gpu("gpu_mma_large", 32, case, gemm);
}
