//! Quick mat-vec micro benchmark (no criterion):
//!     cargo run --release -p kiln-host --example quant_bench
//!
//! Prints weight-streaming GB/s for the SmolLM2-135M decode shapes (Q4_1 576×1536 etc., Q8_0
//! 49152×576 tied output), cache-hot (one matrix repeated) and cold (a whole model's worth of
//! distinct matrices per "token", like real decode), for the detected ISA and for scalar.

use kiln_host::gguf::GgmlType;
use kiln_host::quant::{Isa, QMatrix, quantize_row};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn weights(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let mut w = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
    quantize_row(ty, &x, &mut w).unwrap();
    w
}

/// Best-of-5 average seconds per call of `f`, after a warm-up.
fn time(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

fn main() {
    let mut rng = StdRng::seed_from_u64(1);
    let isa = Isa::detect();
    println!(
        "isa {isa:?}, rayon threads {}",
        rayon::current_num_threads()
    );
    let shapes = [
        (
            "Q4_1 ffn gate/up  rows 1536 × cols 576 ",
            GgmlType::Q4_1,
            1536,
            576,
            2000,
        ),
        (
            "Q4_1 ffn down     rows 576  × cols 1536",
            GgmlType::Q4_1,
            576,
            1536,
            2000,
        ),
        (
            "Q4_1 attn q/o     rows 576  × cols 576 ",
            GgmlType::Q4_1,
            576,
            576,
            5000,
        ),
        (
            "Q8_0 output       rows 49152 × cols 576",
            GgmlType::Q8_0,
            49152,
            576,
            50,
        ),
    ];
    for (name, ty, rows, cols, iters) in shapes {
        let w = weights(&mut rng, ty, rows, cols);
        let m = QMatrix::try_new(ty, &w, rows, cols).unwrap();
        let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut y = vec![0f32; rows];
        for isa in [isa, Isa::Avx2, Isa::Scalar] {
            let s = time(iters, || m.matmul_with(isa, &x, 1, &mut y).unwrap());
            println!(
                "{name} {isa:>6?}: {:8.1} µs  {:6.1} GB/s",
                s * 1e6,
                w.len() as f64 / s / 1e9
            );
        }
        if isa != Isa::Scalar {
            // Single-thread kernel speed, no rayon.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let s = pool.install(|| time(iters, || m.matmul_with(isa, &x, 1, &mut y).unwrap()));
            println!(
                "{name} {isa:>6?} 1 thread: {:8.1} µs  {:6.1} GB/s",
                s * 1e6,
                w.len() as f64 / s / 1e9
            );
        }
    }

    // A whole decode token's mat-vecs with distinct (DRAM-cold) matrices: 30 layers of
    // q,k,v,o,gate,up,down + the tied Q8_0 output. llama.cpp: 148 tok/s on this machine.
    let layer = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let mut mats: Vec<(GgmlType, Vec<u8>, usize, usize)> = Vec::new();
    for _ in 0..30 {
        for &(r, c) in &layer {
            mats.push((
                GgmlType::Q4_1,
                weights(&mut rng, GgmlType::Q4_1, r, c),
                r,
                c,
            ));
        }
    }
    mats.push((
        GgmlType::Q8_0,
        weights(&mut rng, GgmlType::Q8_0, 49152, 576),
        49152,
        576,
    ));
    let bytes: usize = mats.iter().map(|m| m.1.len()).sum();
    let x: Vec<f32> = (0..1536).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut y = vec![0f32; 49152];
    let s = time(20, || {
        for (ty, w, r, c) in &mats {
            let m = QMatrix::try_new(*ty, w, *r, *c).unwrap();
            m.matmul(&x[..*c], 1, &mut y[..*r]).unwrap();
        }
    });
    println!(
        "decode token (all mat-vecs, {:.1} MB of weights): {:.2} ms  {:.1} GB/s  => {:.0} tok/s upper bound",
        bytes as f64 / 1e6,
        s * 1e3,
        bytes as f64 / s / 1e9,
        1.0 / s
    );

    // Prefill-style mat-mat: 64 activation rows through the ffn up matrix.
    let (rows, cols, n) = (1536, 576, 64);
    let w = weights(&mut rng, GgmlType::Q4_1, rows, cols);
    let m = QMatrix::try_new(GgmlType::Q4_1, &w, rows, cols).unwrap();
    let x: Vec<f32> = (0..n * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let mut y = vec![0f32; n * rows];
    let s = time(20, || m.matmul(&x, n, &mut y).unwrap());
    println!(
        "prefill Q4_1 {rows}×{cols}, n={n}: {:.2} ms  {:.1} GFLOP/s",
        s * 1e3,
        2.0 * (rows * cols * n) as f64 / s / 1e9
    );
}
