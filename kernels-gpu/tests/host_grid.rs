//! Deterministic tests of the host grid executor itself: the kernel property tests lean on it
//! emulating the GPU's collectives faithfully, so each primitive is checked against a plain
//! scalar computation here.
use kernels_gpu::device::host::{LaunchDims, launch, launch_with_timeout};
use kernels_gpu::device::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Small deterministic generator (xorshift64*): no dev-dependencies needed in this crate.
struct Rng(u64);
impl Rng {
    fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
}

fn dims(grid_x: u32, grid_y: u32, block: u32, shared_bytes: u32) -> LaunchDims {
    LaunchDims { grid_x, grid_y, block, shared_bytes }
}

/// Per-thread output slots the kernels write through shared references (atomics keep the
/// closures `Sync` without raw pointers).
fn slots(n: usize) -> Vec<AtomicU32> {
    (0..n).map(|_| AtomicU32::new(u32::MAX)).collect()
}
fn read_f32(s: &[AtomicU32]) -> Vec<f32> {
    s.iter().map(|a| f32::from_bits(a.load(Ordering::Relaxed))).collect()
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = e.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "<non-string panic payload>".into()
    }
}

#[test]
fn indices_cover_the_grid_once() {
    let (gx, gy, block) = (3, 2, 64);
    let out = slots((gx * gy * block) as usize);
    launch(dims(gx, gy, block, 0), || {
        assert_eq!((block_dim(), grid_dim(), grid_dim_y()), (block, gx, gy));
        let i = (block_idx_y() * gx + block_idx()) * block + thread_idx();
        let prev = out[i as usize].swap(i, Ordering::Relaxed);
        assert_eq!(prev, u32::MAX, "thread {i} ran twice");
    });
    for (i, v) in out.iter().enumerate() {
        assert_eq!(v.load(Ordering::Relaxed), i as u32);
    }
}

#[test]
fn warp_sum_and_max_per_warp() {
    // Two warps with different values: each lane must get its own warp's total, not the block's.
    let val = |tid: u32| ((tid * 37 + 11) % 101) as f32 - 50.0; // integers: sums are exact
    let (sum, max) = (slots(64), slots(64));
    launch(dims(1, 1, 64, 0), || {
        let t = thread_idx();
        sum[t as usize].store(warp_sum(val(t)).to_bits(), Ordering::Relaxed);
        max[t as usize].store(warp_max(val(t)).to_bits(), Ordering::Relaxed);
    });
    let (sum, max) = (read_f32(&sum), read_f32(&max));
    for w in 0..2u32 {
        let lanes = w * 32..w * 32 + 32;
        let s: f32 = lanes.clone().map(val).sum();
        let m = lanes.clone().map(val).fold(f32::NEG_INFINITY, f32::max);
        for t in lanes {
            assert_eq!(sum[t as usize], s, "warp_sum lane {t}");
            assert_eq!(max[t as usize], m, "warp_max lane {t}");
        }
    }
}

#[test]
fn shuffles_read_the_named_lane() {
    let (idx, xor) = (slots(64), slots(64));
    launch(dims(1, 1, 64, 0), || {
        let t = thread_idx();
        let v = 1000 + t;
        idx[t as usize].store(shfl_idx_u32(v, (lane() * 7 + 3) % 32), Ordering::Relaxed);
        xor[t as usize].store(shfl_xor_u32(v, 5), Ordering::Relaxed);
    });
    for t in 0..64u32 {
        let base = t / 32 * 32;
        assert_eq!(idx[t as usize].load(Ordering::Relaxed), 1000 + base + (t % 32 * 7 + 3) % 32);
        assert_eq!(xor[t as usize].load(Ordering::Relaxed), 1000 + base + ((t % 32) ^ 5));
    }
}

#[test]
fn block_sum_and_max_over_several_warps_and_blocks() {
    let block = 256u32;
    let out_sum = slots((3 * block) as usize);
    let out_max = slots((3 * block) as usize);
    let val = |b: u32, t: u32| (t as f32) * if b == 1 { -1.0 } else { 1.0 } + b as f32;
    launch(dims(3, 1, block, (block / WARP) * 4), || {
        let (b, t) = (block_idx(), thread_idx());
        let scratch: *mut f32 = shared_mem();
        let s = unsafe { block_sum(val(b, t), scratch) };
        // Reusing the scratch right away is allowed by block_sum's contract.
        let m = unsafe { block_max(val(b, t), scratch) };
        out_sum[(b * block + t) as usize].store(s.to_bits(), Ordering::Relaxed);
        out_max[(b * block + t) as usize].store(m.to_bits(), Ordering::Relaxed);
    });
    let (s, m) = (read_f32(&out_sum), read_f32(&out_max));
    for b in 0..3u32 {
        let want_s: f32 = (0..block).map(|t| val(b, t)).sum();
        let want_m = (0..block).map(|t| val(b, t)).fold(f32::NEG_INFINITY, f32::max);
        for t in 0..block {
            assert_eq!(s[(b * block + t) as usize], want_s, "block {b} thread {t}");
            assert_eq!(m[(b * block + t) as usize], want_m, "block {b} thread {t}");
        }
    }
}

#[test]
fn shared_memory_is_poisoned_and_shared_by_the_block() {
    let block = 128u32;
    let before = slots(block as usize);
    let neighbour = slots(block as usize);
    launch(dims(1, 1, block, block * 4), || {
        let t = thread_idx();
        let smem: *mut u32 = shared_mem();
        before[t as usize].store(unsafe { *smem.add(t as usize) }, Ordering::Relaxed);
        sync_threads(); // everyone has read the poison before anyone overwrites it
        unsafe { *smem.add(t as usize) = t * 3 };
        sync_threads();
        neighbour[t as usize].store(unsafe { *smem.add(((t + 1) % block) as usize) }, Ordering::Relaxed);
    });
    for t in 0..block {
        let p = before[t as usize].load(Ordering::Relaxed);
        assert!(f32::from_bits(p).is_nan(), "shared word {t} not poisoned: {p:#x}");
        assert_eq!(neighbour[t as usize].load(Ordering::Relaxed), (t + 1) % block * 3);
    }
}

#[test]
fn mma_m16n8k16_matches_a_plain_matrix_product() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..4 {
        // Round 0 uses small dyadic values (exact in f16 and in every f32 sum): bit-exact check.
        let sample = |rng: &mut Rng| {
            if round == 0 { (rng.next_u32() % 64) as f32 / 16.0 - 2.0 } else { 2.0 * rng.unit() }
        };
        let a: Vec<u16> = (0..16 * 16).map(|_| f32_to_f16(sample(&mut rng))).collect(); // A[m][k]
        let b: Vec<u16> = (0..16 * 8).map(|_| f32_to_f16(sample(&mut rng))).collect(); // B[k][n]
        let c: Vec<f32> = (0..16 * 8).map(|_| sample(&mut rng)).collect(); // C[m][n]
        let pair = |lo: u16, hi: u16| lo as u32 | (hi as u32) << 16;
        let d = slots(16 * 8);
        launch(dims(1, 1, 32, 0), || {
            // Fragments per the PTX ISA (m16n8k16, .row.col, f16 inputs, f32 accumulators).
            let l = lane() as usize;
            let (g, t) = (l / 4, l % 4);
            let af = |r: usize, k: usize| pair(a[r * 16 + k], a[r * 16 + k + 1]);
            let bf = |k: usize, n: usize| pair(b[k * 8 + n], b[(k + 1) * 8 + n]);
            let fa = [af(g, 2 * t), af(g + 8, 2 * t), af(g, 2 * t + 8), af(g + 8, 2 * t + 8)];
            let fb = [bf(2 * t, g), bf(2 * t + 8, g)];
            let fc = [c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]];
            let r = mma_m16n8k16_f32_f16(fa, fb, fc);
            for (i, (m, n)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate() {
                d[m * 8 + n].store(r[i].to_bits(), Ordering::Relaxed);
            }
        });
        let d = read_f32(&d);
        for m in 0..16 {
            for n in 0..8 {
                let want: f64 =
                    c[m * 8 + n] as f64 + (0..16).map(|k| f16_to_f32(a[m * 16 + k]) as f64 * f16_to_f32(b[k * 8 + n]) as f64).sum::<f64>();
                let got = d[m * 8 + n] as f64;
                let tol = if round == 0 { 0.0 } else { 1e-5 * (1.0 + want.abs()) };
                assert!((got - want).abs() <= tol, "round {round} D[{m}][{n}] = {got}, want {want}");
            }
        }
    }
}

#[test]
fn dp4a_matches_scalar_bytes() {
    let mut rng = Rng(12345);
    let mut cases: Vec<(u32, u32, i32)> = vec![
        (0x8080_8080, 0x8080_8080, 0),        // (-128)² · 4
        (0x7f7f_7f7f, 0x8080_8080, i32::MAX), // wraps like the hardware's 32-bit add
        (0xffff_ffff, 0x0102_0304, -7),
    ];
    cases.extend((0..1000).map(|_| (rng.next_u32(), rng.next_u32(), rng.next_u32() as i32)));
    for (a, b, c) in cases {
        let mut want = c;
        for i in 0..4 {
            let (x, y) = ((a >> (8 * i)) as u8 as i8 as i32, (b >> (8 * i)) as u8 as i8 as i32);
            want = want.wrapping_add(x * y);
        }
        assert_eq!(dp4a_s32(a, b, c), want, "dp4a({a:#x}, {b:#x}, {c})");
    }
}

#[test]
fn divergent_sync_threads_panics_instead_of_hanging() {
    // Half the block at `sync_threads`, the other half already at the end of the block: the
    // counts add up, so only the barrier-identity check catches it.
    let r = std::panic::catch_unwind(|| {
        launch_with_timeout(dims(1, 1, 64, 0), Duration::from_secs(5), || {
            if thread_idx() < 32 {
                sync_threads();
            }
        })
    });
    let msg = panic_message(&*r.expect_err("a divergent sync_threads must panic"));
    assert!(msg.contains("deadlock"), "unexpected panic message: {msg}");
}

#[test]
fn divergent_shuffle_times_out_with_the_deadlock_message() {
    // Half a warp in a shuffle: its warp barrier can never fill, so the timeout path fires.
    let start = std::time::Instant::now();
    let r = std::panic::catch_unwind(|| {
        launch_with_timeout(dims(1, 1, 32, 0), Duration::from_millis(300), || {
            if lane() < 16 {
                shfl_xor_u32(1, 1);
            }
        })
    });
    let msg = panic_message(&*r.expect_err("a divergent shuffle must panic"));
    assert!(msg.contains("deadlock"), "unexpected panic message: {msg}");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
}
