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
    LaunchDims {
        grid_x,
        grid_y,
        block,
        shared_bytes,
    }
}

/// Per-thread output slots the kernels write through shared references (atomics keep the
/// closures `Sync` without raw pointers).
fn slots(n: usize) -> Vec<AtomicU32> {
    (0..n).map(|_| AtomicU32::new(u32::MAX)).collect()
}
fn read_f32(s: &[AtomicU32]) -> Vec<f32> {
    s.iter()
        .map(|a| f32::from_bits(a.load(Ordering::Relaxed)))
        .collect()
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
        assert_eq!(
            idx[t as usize].load(Ordering::Relaxed),
            1000 + base + (t % 32 * 7 + 3) % 32
        );
        assert_eq!(
            xor[t as usize].load(Ordering::Relaxed),
            1000 + base + ((t % 32) ^ 5)
        );
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
        let want_m = (0..block)
            .map(|t| val(b, t))
            .fold(f32::NEG_INFINITY, f32::max);
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
        neighbour[t as usize].store(
            unsafe { *smem.add(((t + 1) % block) as usize) },
            Ordering::Relaxed,
        );
    });
    for t in 0..block {
        let p = before[t as usize].load(Ordering::Relaxed);
        assert!(
            f32::from_bits(p).is_nan(),
            "shared word {t} not poisoned: {p:#x}"
        );
        assert_eq!(
            neighbour[t as usize].load(Ordering::Relaxed),
            (t + 1) % block * 3
        );
    }
}

#[test]
fn mma_m16n8k16_matches_a_plain_matrix_product() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..4 {
        // Round 0 uses small dyadic values (exact in f16 and in every f32 sum): bit-exact check.
        let sample = |rng: &mut Rng| {
            if round == 0 {
                (rng.next_u32() % 64) as f32 / 16.0 - 2.0
            } else {
                2.0 * rng.unit()
            }
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
            let fa = [
                af(g, 2 * t),
                af(g + 8, 2 * t),
                af(g, 2 * t + 8),
                af(g + 8, 2 * t + 8),
            ];
            let fb = [bf(2 * t, g), bf(2 * t + 8, g)];
            let fc = [
                c[g * 8 + 2 * t],
                c[g * 8 + 2 * t + 1],
                c[(g + 8) * 8 + 2 * t],
                c[(g + 8) * 8 + 2 * t + 1],
            ];
            let r = mma_m16n8k16_f32_f16(fa, fb, fc);
            for (i, (m, n)) in [
                (g, 2 * t),
                (g, 2 * t + 1),
                (g + 8, 2 * t),
                (g + 8, 2 * t + 1),
            ]
            .into_iter()
            .enumerate()
            {
                d[m * 8 + n].store(r[i].to_bits(), Ordering::Relaxed);
            }
        });
        let d = read_f32(&d);
        for m in 0..16 {
            for n in 0..8 {
                let want: f64 = c[m * 8 + n] as f64
                    + (0..16)
                        .map(|k| f16_to_f32(a[m * 16 + k]) as f64 * f16_to_f32(b[k * 8 + n]) as f64)
                        .sum::<f64>();
                let got = d[m * 8 + n] as f64;
                let tol = if round == 0 {
                    0.0
                } else {
                    1e-5 * (1.0 + want.abs())
                };
                assert!(
                    (got - want).abs() <= tol,
                    "round {round} D[{m}][{n}] = {got}, want {want}"
                );
            }
        }
    }
}

/// `frag_k32` against the PTX ISA's per-element table for m16n8k32 with .s8/.u8 ("Matrix
/// Fragments for mma.m16n8k32"), spelled here as the ISA spells it: element `i` of a lane's
/// A fragment (a0..a15, four per register, low byte first) sits at row `groupID` for
/// `i < 4 || 8 <= i < 12`, else `groupID + 8`, column `threadID_in_group * 4 + (i & 3)` plus 16
/// for `i >= 8`; B element `i` (b0..b7) at row `threadID_in_group * 4 + (i & 3)` plus 16 for
/// `i >= 4`, column `groupID`; C element `i` (c0..c3) at row `groupID` (+8 for `i >= 2`),
/// column `threadID_in_group * 2 + (i & 1)`.
#[test]
fn frag_k32_follows_the_ptx_isa_table() {
    for lane in 0..32u32 {
        let (group, tig) = (lane >> 2, lane % 4);
        for i in 0..16u32 {
            let row = if i < 4 || (8..12).contains(&i) {
                group
            } else {
                group + 8
            };
            let col = tig * 4 + (i & 3) + if i >= 8 { 16 } else { 0 };
            let (r, k0) = frag_k32::a(lane, i / 4);
            assert_eq!((r, k0 + i % 4), (row, col), "A lane {lane} element a{i}");
        }
        for i in 0..8u32 {
            let row = tig * 4 + (i & 3) + if i >= 4 { 16 } else { 0 };
            let (n, k0) = frag_k32::b(lane, i / 4);
            assert_eq!((k0 + i % 4, n), (row, group), "B lane {lane} element b{i}");
        }
        for i in 0..4u32 {
            let want = (group + if i >= 2 { 8 } else { 0 }, tig * 2 + (i & 1));
            assert_eq!(frag_k32::c(lane, i), want, "C lane {lane} element c{i}");
        }
    }
}

#[test]
fn mma_m16n8k32_s8_matches_a_plain_matrix_product() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for round in 0..3 {
        // Round 0: extremes only (-128 and 127 products, large C): the sums are exact integers
        // either way, so any misplaced byte shows.
        let byte = |rng: &mut Rng| {
            if round == 0 {
                [-128i8, 127, -1, 0][rng.next_u32() as usize % 4]
            } else {
                rng.next_u32() as i8
            }
        };
        let a: Vec<i8> = (0..16 * 32).map(|_| byte(&mut rng)).collect(); // A[m][k]
        let b: Vec<i8> = (0..32 * 8).map(|_| byte(&mut rng)).collect(); // B[k][n]
        let c: Vec<i32> = (0..16 * 8).map(|_| rng.next_u32() as i32 >> 8).collect(); // C[m][n]
        let pack = |v: [i8; 4]| u32::from_le_bytes(v.map(|x| x as u8));
        let d = slots(16 * 8);
        launch(dims(1, 1, 32, 0), || {
            let l = lane();
            let fa = core::array::from_fn(|r| {
                let (m, k0) = frag_k32::a(l, r as u32);
                pack(core::array::from_fn(|i| {
                    a[m as usize * 32 + k0 as usize + i]
                }))
            });
            let fb = core::array::from_fn(|r| {
                let (n, k0) = frag_k32::b(l, r as u32);
                pack(core::array::from_fn(|i| {
                    b[(k0 as usize + i) * 8 + n as usize]
                }))
            });
            let fc = core::array::from_fn(|i| {
                let (m, n) = frag_k32::c(l, i as u32);
                c[m as usize * 8 + n as usize]
            });
            let r = mma_m16n8k32_s32_s8(fa, fb, fc);
            for (i, v) in r.into_iter().enumerate() {
                let (m, n) = frag_k32::c(l, i as u32);
                d[m as usize * 8 + n as usize].store(v as u32, Ordering::Relaxed);
            }
        });
        for m in 0..16 {
            for n in 0..8 {
                let want = c[m * 8 + n]
                    + (0..32)
                        .map(|k| a[m * 32 + k] as i32 * b[k * 8 + n] as i32)
                        .sum::<i32>();
                let got = d[m * 8 + n].load(Ordering::Relaxed) as i32;
                assert_eq!(got, want, "round {round} D[{m}][{n}]");
            }
        }
    }
}

/// `cp.async` copies land only at a wait that covers their group: reading before the wait sees
/// the poison (what a missing wait reads on the GPU too, at least sometimes).
#[test]
fn cp_async_lands_at_the_covering_wait() {
    // u128 storage: the copies need 16-byte aligned sources.
    let mut words = vec![0u128; 4];
    let src = DevPtr(words.as_mut_ptr() as *mut u32);
    for i in 0..16 {
        unsafe { *src.get().add(i) = i as u32 * 7 + 1 };
    }
    let seen = slots(4 * 3);
    launch(dims(1, 1, 32, 64), || {
        let smem: *mut u32 = shared_mem();
        if thread_idx() == 0 {
            for g in 0..3 {
                unsafe { cp_async_16(smem.add(4 * g), src.get().add(4 * g)) };
                cp_async_commit();
            }
            let word = |i: usize| unsafe { *smem.add(i) };
            seen[0].store(word(0), Ordering::Relaxed); // nothing waited for
            cp_async_wait(2);
            seen[1].store(word(0), Ordering::Relaxed); // group 0 landed
            seen[2].store(word(4), Ordering::Relaxed); // group 1 still pending
            cp_async_wait(0);
            seen[3].store(word(8), Ordering::Relaxed);
        }
    });
    let v: Vec<u32> = seen
        .iter()
        .take(4)
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    assert!(
        f32::from_bits(v[0]).is_nan() && f32::from_bits(v[2]).is_nan(),
        "copies landed before their wait: {v:x?}"
    );
    assert_eq!((v[1], v[3]), (1, 8 * 7 + 1));
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
            let (x, y) = (
                (a >> (8 * i)) as u8 as i8 as i32,
                (b >> (8 * i)) as u8 as i8 as i32,
            );
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
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}
