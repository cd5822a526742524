//! The device layer kernels are written against: what `cuda_std` would provide.
//!
//! Every primitive has two implementations with one signature: [`nvptx`] (inline PTX, used when
//! the crate is built for the GPU) and [`host`] (a grid executor that runs each GPU thread as an OS
//! thread, so the same kernel bodies run and are property-tested on a machine with no GPU).
//! Kernels only ever call the functions re-exported here.

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
#[cfg(not(target_arch = "nvptx64"))]
use host as imp;

#[cfg(target_arch = "nvptx64")]
pub mod nvptx;
#[cfg(target_arch = "nvptx64")]
use nvptx as imp;

pub use imp::{
    atomic_add_u32, block_dim, block_idx, block_idx_y, cp_async_16, cp_async_commit, cp_async_wait,
    dp4a_s32, fence_gpu, fma_f16x2, fma_f32, grid_dep_launch_dependents, grid_dep_wait, grid_dim,
    grid_dim_y, ld_cg_f32, ld_nc_v4, ld_stream_v4, mma_m16n8k16_f32_f16, mma_m16n8k32_s32_s8,
    mul_f16x2, prefetch_line_l2, prmt, round_half_away_to_i32, round_to_i32, shared_mem,
    shfl_idx_u32, shfl_xor_u32, sqrt_f64, st_v4, sub_f16x2, sync_threads, sync_warp, thread_idx,
};

pub const WARP: u32 = policies::WARP;

/// Fragment layout of `mma.m16n8k32` with 8-bit inputs (PTX ISA, "Matrix Fragments for
/// mma.m16n8k32"): which matrix elements lane `lane` holds. Every 32-bit A or B register packs
/// four consecutive k, lowest k in the lowest byte. The host emulation assembles its matrices
/// with these functions and the kernels pick the words they load with them, so the two cannot
/// disagree; `kernels-gpu/tests/host_grid.rs` checks them against the ISA's per-element table.
pub mod frag_k32 {
    /// A (16×32, `.row`): register `r` (0..4) holds row `.0`, k `.1 .. .1 + 4`.
    #[inline(always)]
    pub const fn a(lane: u32, r: u32) -> (u32, u32) {
        (lane / 4 + 8 * (r % 2), 4 * (lane % 4) + 16 * (r / 2))
    }
    /// B (32×8, `.col`): register `r` (0..2) holds column (token) `.0`, k `.1 .. .1 + 4`.
    #[inline(always)]
    pub const fn b(lane: u32, r: u32) -> (u32, u32) {
        (lane / 4, 4 * (lane % 4) + 16 * r)
    }
    /// C/D (16×8 s32): element `i` (0..4) is at (row, column).
    #[inline(always)]
    pub const fn c(lane: u32, i: u32) -> (u32, u32) {
        (lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2)
    }
}

/// `f(0), f(1), …, f(N − 1)` as straight-line code. For loops whose index selects an element of
/// a register array (accumulators, fragments): LLVM's unroller declines large bodies, and a
/// loop that stays rolled indexes the array at run time, which puts it in local memory.
#[inline(always)]
pub fn unroll<const N: usize>(mut f: impl FnMut(usize)) {
    macro_rules! calls {
        ($($n:literal: [$($i:literal)*])*) => {
            match N {
                $($n => { $(f($i);)* })*
                _ => {
                    let mut i = 0;
                    while i < N {
                        f(i);
                        i += 1;
                    }
                }
            }
        };
    }
    calls! {
        1: [0] 2: [0 1] 3: [0 1 2] 4: [0 1 2 3] 5: [0 1 2 3 4] 6: [0 1 2 3 4 5] 7: [0 1 2 3 4 5 6]
        8: [0 1 2 3 4 5 6 7] 16: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]
    }
}

/// Programmatic dependent launch, device side: waits until the previous grid on the stream has
/// completed (its writes visible), then lets the next grid start launching. Every kernel calls
/// this before it reads anything another kernel wrote (the kernel table's entries do so unless
/// the row is marked `waits_itself`). A no-op where the policy has no `griddepcontrol`.
#[inline(always)]
pub fn pdl_wait<P: policies::TargetPolicy>() {
    if P::HAS_PDL && P::PDL_EARLY_TRIGGER {
        grid_dep_launch_dependents();
        grid_dep_wait();
    } else if P::HAS_PDL {
        grid_dep_wait();
        grid_dep_launch_dependents();
    }
}

/// Hints that the `bytes` from `p` will be read soon: each thread of the block asks for every
/// `block_dim`-th 128-byte line into L2 (`prefetch.global.L2`; nothing on the host executor).
#[inline(always)]
pub fn prefetch_l2(p: *const u8, bytes: usize) {
    let mut at = thread_idx() as usize * 128;
    while at < bytes {
        prefetch_line_l2(p.wrapping_add(at));
        at += block_dim() as usize * 128;
    }
}

/// Lane of the calling thread within its warp.
#[inline(always)]
pub fn lane() -> u32 {
    thread_idx() % WARP
}

/// Warp of the calling thread within its block.
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx() / WARP
}

/// `shfl.sync.bfly` of an f32 over the full warp.
#[inline(always)]
pub fn shfl_xor(v: f32, lane_mask: u32) -> f32 {
    f32::from_bits(shfl_xor_u32(v.to_bits(), lane_mask))
}

/// `shfl.sync.idx` of an f32 over the full warp: the value of lane `src`.
#[inline(always)]
pub fn shfl_idx(v: f32, src: u32) -> f32 {
    f32::from_bits(shfl_idx_u32(v.to_bits(), src))
}

/// Sum over the 32 lanes of a warp (butterfly: every lane gets the total). All lanes must call.
#[inline(always)]
pub fn warp_sum(v: f32) -> f32 {
    lane_group_sum(v, WARP)
}

/// Sum within each aligned group of `width` lanes (a power of two ≤ 32): every lane gets its
/// group's total, `log2(width)` butterfly rounds. All lanes of the warp must call, same `width`.
/// The rounds are a constant-trip loop with `width` as a guard, so loops around a call still
/// unroll fully (a run-time-trip loop inside keeps their register arrays in local memory).
#[inline(always)]
pub fn lane_group_sum(mut v: f32, width: u32) -> f32 {
    for round in 0..5 {
        let m = (WARP / 2) >> round;
        if m < width {
            v += shfl_xor(v, m);
        }
    }
    v
}

/// Maximum within each aligned group of `width` lanes; the contract of [`lane_group_sum`].
#[inline(always)]
pub fn lane_group_max(mut v: f32, width: u32) -> f32 {
    for round in 0..5 {
        let m = (WARP / 2) >> round;
        if m < width {
            v = v.max(shfl_xor(v, m));
        }
    }
    v
}

/// Maximum over the 32 lanes of a warp; every lane gets it. All lanes must call.
#[inline(always)]
pub fn warp_max(mut v: f32) -> f32 {
    let mut m = WARP / 2;
    while m > 0 {
        v = v.max(shfl_xor(v, m));
        m /= 2;
    }
    v
}

/// The larger of two (value, index) candidates; the lower index on equal values, so a
/// reduction keeps the first maximum. NaN is never larger; (−∞, `u32::MAX`) is the empty one.
#[inline(always)]
pub fn better(a: (f32, u32), b: (f32, u32)) -> (f32, u32) {
    if b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) {
        b
    } else {
        a
    }
}

/// The [`better`] of the 32 lanes' candidates; every lane gets it. All lanes must call. The
/// rounds are a constant-trip loop so they unroll into straight-line selects: written as a walk
/// over an array of lane masks (the route before 2026-12) they stayed a loop with branches
/// between the shuffles, and the 1-token router top-8 took 28 µs on an H100.
#[inline(always)]
pub fn warp_argmax(mut best: (f32, u32)) -> (f32, u32) {
    let mut m = WARP / 2;
    while m > 0 {
        let other = (shfl_xor(best.0, m), shfl_xor_u32(best.1, m));
        best = better(best, other);
        m /= 2;
    }
    best
}

/// Sum over the whole block. `scratch` is shared memory with room for one f32 per warp.
/// Every thread of the block must call; every thread gets the total.
///
/// # Safety
/// `scratch` must point to at least `block_dim()/32` f32 of shared memory that no other code
/// uses between the two barriers inside.
#[inline(always)]
pub unsafe fn block_sum(v: f32, scratch: *mut f32) -> f32 {
    unsafe { block_reduce(v, scratch, warp_sum, |a, b| a + b, 0.0) }
}

/// Sum over the 32 lanes of a warp in f64 (butterfly: every lane gets the total, each f64
/// crossing lanes as two 32-bit shuffles). All lanes must call.
#[inline(always)]
pub fn warp_sum_f64(mut v: f64) -> f64 {
    let mut m = WARP / 2;
    while m > 0 {
        let bits = v.to_bits();
        let other = ((shfl_xor_u32((bits >> 32) as u32, m) as u64) << 32)
            | shfl_xor_u32(bits as u32, m) as u64;
        v += f64::from_bits(other);
        m /= 2;
    }
    v
}

/// [`block_sum`] in f64; `scratch` holds one f64 per warp. Every thread gets the total.
///
/// # Safety
/// As [`block_sum`], with `block_dim()/32` f64 of scratch.
#[inline(always)]
pub unsafe fn block_sum_f64(v: f64, scratch: *mut f64) -> f64 {
    let v = warp_sum_f64(v);
    if lane() == 0 {
        unsafe { *scratch.add(warp_id() as usize) = v };
    }
    sync_threads();
    let mut total = 0.0;
    for i in 0..block_dim() / WARP {
        total += unsafe { *scratch.add(i as usize) };
    }
    sync_threads();
    total
}

/// Maximum over the whole block; same contract as [`block_sum`].
#[inline(always)]
pub unsafe fn block_max(v: f32, scratch: *mut f32) -> f32 {
    unsafe { block_reduce(v, scratch, warp_max, f32::max, f32::NEG_INFINITY) }
}

#[inline(always)]
unsafe fn block_reduce(
    v: f32,
    scratch: *mut f32,
    in_warp: fn(f32) -> f32,
    combine: fn(f32, f32) -> f32,
    identity: f32,
) -> f32 {
    let w = in_warp(v);
    let warps = block_dim() / WARP;
    if lane() == 0 {
        unsafe { *scratch.add(warp_id() as usize) = w };
    }
    sync_threads();
    let mut total = identity;
    for i in 0..warps {
        total = combine(total, unsafe { *scratch.add(i as usize) });
    }
    // The scratch slots may be reused right after this call: make sure everyone has read them.
    sync_threads();
    total
}

/// `x·σ(x)`, the SwiGLU gate activation.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// IEEE half (as bits) to f32. The nightly `f16` primitive lowers to one `cvt.f32.f16` on the GPU.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits) as f32
}

/// f32 to IEEE half bits, round to nearest even (`cvt.rn.f16.f32`).
#[inline(always)]
pub fn f32_to_f16(v: f32) -> u16 {
    (v as f16).to_bits()
}

/// `x` rounded to the nearest f16 and widened back (`cvt.rn.f16.f32` + `cvt.f32.f16`).
#[inline(always)]
pub fn f16_round(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// 2^x. `ex2.approx.ftz.f32` on the GPU (max rel. error 2^-22).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    imp::exp2(x)
}

/// e^x through [`exp2`].
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * core::f32::consts::LOG2_E)
}

/// 1/sqrt(x). `rsqrt.approx.f32` on the GPU.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    imp::rsqrt(x)
}

/// (sin x, cos x) with a range reduction good for the large angles RoPE produces at long
/// positions (the hardware `sin.approx` is only accurate near zero).
#[inline(always)]
pub fn sin_cos(x: f32) -> (f32, f32) {
    imp::sin_cos(x)
}

/// A raw device pointer that may cross into the host executor's threads. Kernels get plain raw
/// pointers; this wrapper only exists so a host-side launch closure is `Sync`.
#[derive(Clone, Copy, Debug)]
pub struct DevPtr<T>(pub *mut T);
unsafe impl<T> Send for DevPtr<T> {}
unsafe impl<T> Sync for DevPtr<T> {}
impl<T> DevPtr<T> {
    pub fn from_slice(s: &[T]) -> Self {
        DevPtr(s.as_ptr() as *mut T)
    }
    pub fn from_mut(s: &mut [T]) -> Self {
        DevPtr(s.as_mut_ptr())
    }
    /// The pointer. A method (not `.0`) so closures capture the whole `Sync` wrapper.
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}
