//! Device primitives as inline PTX. Each function is one instruction (or a fixed short sequence);
//! the doc comment names it. All warp collectives use the full-warp mask: callers must be
//! converged (every lane of the warp executes the call).
use core::arch::asm;
use core::arch::nvptx as n;

#[inline(always)]
pub fn thread_idx() -> u32 {
    unsafe { n::_thread_idx_x() }
}
#[inline(always)]
pub fn block_idx() -> u32 {
    unsafe { n::_block_idx_x() }
}
#[inline(always)]
pub fn block_idx_y() -> u32 {
    unsafe { n::_block_idx_y() }
}
#[inline(always)]
pub fn block_dim() -> u32 {
    unsafe { n::_block_dim_x() }
}
#[inline(always)]
pub fn grid_dim() -> u32 {
    unsafe { n::_grid_dim_x() }
}
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    unsafe { n::_grid_dim_y() }
}

/// `bar.sync 0`: every thread of the block must reach it.
#[inline(always)]
pub fn sync_threads() {
    unsafe { n::_syncthreads() }
}

/// Base of the block's dynamic shared memory (size given at launch).
#[inline(always)]
pub fn shared_mem<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}

/// `shfl.sync.bfly.b32 d, v, mask, 0x1f, 0xffffffff` (sm_30+, PTX 6.0).
#[inline(always)]
pub fn shfl_xor_u32(v: u32, lane_mask: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, m = in(reg32) lane_mask, options(nomem, nostack));
    }
    r
}

/// `shfl.sync.idx.b32 d, v, src, 0x1f, 0xffffffff`.
#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, s = in(reg32) src, options(nomem, nostack));
    }
    r
}

/// `dp4a.s32.s32 d, a, b, c`: c + the dot product of the four signed bytes of a and b (sm_61+).
#[inline(always)]
pub fn dp4a_s32(a: u32, b: u32, c: i32) -> i32 {
    let r: i32;
    unsafe {
        asm!("dp4a.s32.s32 {r}, {a}, {b}, {c};",
             r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack));
    }
    r
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (sm_80+, PTX 7.0).
/// Fragments per the PTX ISA: A 4×b32 (8 halves), B 2×b32 (4 halves), C/D 4×f32.
#[inline(always)]
pub fn mma_m16n8k16_f32_f16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let d: [f32; 4];
    let (mut d0, mut d1, mut d2, mut d3) = (0f32, 0f32, 0f32, 0f32);
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
             d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
             a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
             b0 = in(reg32) b[0], b1 = in(reg32) b[1],
             c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
             options(nomem, nostack));
    }
    d = [d0, d1, d2, d3];
    d
}

/// `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32` (sm_80+, PTX 7.0): D = A·B + C exactly
/// (32-bit wrapping adds). Fragments as [`crate::device::frag_k32`] maps them: A 4×b32, B 2×b32
/// (four s8 each), C/D 4×s32. Every lane of the warp must execute it.
#[inline(always)]
pub fn mma_m16n8k32_s32_s8(a: [u32; 4], b: [u32; 2], c: [i32; 4]) -> [i32; 4] {
    let (d0, d1, d2, d3): (i32, i32, i32, i32);
    unsafe {
        asm!("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
             d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
             a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
             b0 = in(reg32) b[0], b1 = in(reg32) b[1],
             c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
             options(pure, nomem, nostack));
    }
    [d0, d1, d2, d3]
}

/// `cp.async.cg.shared.global [dst], [src], 16` (sm_80+, PTX 7.0): start copying 16 bytes from
/// global to shared memory without holding registers; complete only after a
/// [`cp_async_commit`] and a [`cp_async_wait`] that covers its group. `dst` is a generic
/// pointer into the block's shared memory, converted to a `.shared` address here.
///
/// # Safety
/// `dst` (shared) and `src` (global) must be valid and 16-byte aligned.
#[inline(always)]
pub unsafe fn cp_async_16(dst: *mut u32, src: *const u32) {
    unsafe {
        asm!("{{ .reg .u64 t; .reg .u32 s; cvta.to.shared.u64 t, {d}; cvt.u32.u64 s, t; cp.async.cg.shared.global [s], [{p}], 16; }}",
             d = in(reg64) dst, p = in(reg64) src, options(nostack));
    }
}

/// `cp.async.commit_group`: close the group of copies this thread issued since the last commit.
#[inline(always)]
pub fn cp_async_commit() {
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group n`: wait until at most `pending` of this thread's committed groups are
/// still in flight. `pending` must be a compile-time constant: it becomes the immediate (above 5,
/// waiting for every group is the safe reading).
#[inline(always)]
pub fn cp_async_wait(pending: u32) {
    unsafe {
        match pending {
            0 => asm!("cp.async.wait_group 0;", options(nostack)),
            1 => asm!("cp.async.wait_group 1;", options(nostack)),
            2 => asm!("cp.async.wait_group 2;", options(nostack)),
            3 => asm!("cp.async.wait_group 3;", options(nostack)),
            4 => asm!("cp.async.wait_group 4;", options(nostack)),
            5 => asm!("cp.async.wait_group 5;", options(nostack)),
            _ => asm!("cp.async.wait_group 0;", options(nostack)),
        }
    }
}

/// `ex2.approx.ftz.f32`.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// `rsqrt.approx.f32`.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("rsqrt.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// `prmt.b32` (default mode): byte `i` of the result is byte `sel[4i+2..4i]` (0..8) of the
/// eight bytes `b:a` (a = bytes 0..4).
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("prmt.b32 {r}, {a}, {b}, {s};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, s = in(reg32) sel, options(pure, nomem, nostack))
    };
    r
}

/// `sub.rn.f16x2`: two f16 differences, each rounded once.
#[inline(always)]
pub fn sub_f16x2(a: u32, b: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("sub.rn.f16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack))
    };
    r
}

/// `mul.rn.f16x2`: two f16 products, each rounded once.
#[inline(always)]
pub fn mul_f16x2(a: u32, b: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("mul.rn.f16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack))
    };
    r
}

/// `fma.rn.f16x2`: two f16 `a·b + c`, each rounded once.
#[inline(always)]
pub fn fma_f16x2(a: u32, b: u32, c: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("fma.rn.f16x2 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack))
    };
    r
}

/// `fma.rn.f32`: `a·b + c` rounded once (what the CPU's `f32::mul_add` returns).
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack))
    };
    r
}

/// `sqrt.rn.f64`: the correctly rounded square root (what the CPU's `f64::sqrt` returns).
#[inline(always)]
pub fn sqrt_f64(x: f64) -> f64 {
    let r: f64;
    unsafe {
        asm!("sqrt.rn.f64 {r}, {x};", r = out(reg64) r, x = in(reg64) x, options(pure, nomem, nostack))
    };
    r
}

/// Cody–Waite reduction to [-π, π] with a three-part 2π, then `sin.approx`/`cos.approx`.
#[inline(always)]
pub fn sin_cos(x: f32) -> (f32, f32) {
    const INV_2PI: f32 = 0.159_154_94;
    // 2π = P1 + P2 + P3 with P1, P2 short enough that k·P1 and k·P2 are exact for the k
    // (< 2^12) RoPE angles reach, so the reduction loses nothing before the last term.
    const P1: f32 = 6.28125;
    const P2: f32 = 0.001_935_243_6;
    const P3: f32 = 6.357_302e-8;
    let k = round(x * INV_2PI);
    let r = ((x - k * P1) - k * P2) - k * P3;
    let (s, c): (f32, f32);
    unsafe {
        asm!("sin.approx.f32 {s}, {r};", s = out(reg32) s, r = in(reg32) r, options(pure, nomem, nostack));
        asm!("cos.approx.f32 {c}, {r};", c = out(reg32) c, r = in(reg32) r, options(pure, nomem, nostack));
    }
    (s, c)
}

#[inline(always)]
fn round(x: f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("cvt.rni.f32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// One 16-byte load by the `.v4.u32` instruction `$op` (the pointer must be 16-byte aligned).
macro_rules! load_v4 {
    ($op:literal, $p:expr) => {{
        let (a, b, c, d): (u32, u32, u32, u32);
        unsafe {
            asm!(concat!($op, " {{{a}, {b}, {c}, {d}}}, [{p}];"),
                 a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) $p,
                 options(readonly, nostack, pure));
        }
        [a, b, c, d]
    }};
}

/// [`ld_nc_v4`] for bytes read once per launch (the mat-vec weights): `L1::evict_first`, so
/// the weight stream does not push the activation row its warps share out of L1 (session 33:
/// 8B decode +1.4 % Q8_0, +2.1 % Q4_0 on an H100; `no_allocate` lost 4.6 % on Q8_0, whose
/// second 16-byte load of a block then asks L2 for the same sector again).
#[inline(always)]
pub unsafe fn ld_stream_v4(p: *const u32) -> [u32; 4] {
    load_v4!("ld.global.nc.L1::evict_first.v4.u32", p)
}

/// `ld.global.nc.v4.u32`: one 16-byte read-only load (the pointer must be 16-byte aligned).
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    load_v4!("ld.global.nc.v4.u32", p)
}

/// `bar.warp.sync 0xffffffff`: every lane of the warp arrives; memory accesses before it are
/// ordered before those after it among the warp's lanes.
#[inline(always)]
pub fn sync_warp() {
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}

/// `fence.acq_rel.gpu`: this thread's memory accesses before it are ordered, for every thread
/// of the GPU, before its accesses after it (CUDA's `__threadfence`).
#[inline(always)]
pub fn fence_gpu() {
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// `atom.global.add.u32`: adds `v` to `*p` and returns the old value.
#[inline(always)]
pub unsafe fn atomic_add_u32(p: *mut u32, v: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("atom.global.add.u32 {r}, [{p}], {v};", r = out(reg32) r, p = in(reg64) p, v = in(reg32) v,
             options(nostack));
    }
    r
}

/// `ld.global.cg.f32`: a load served by L2, never by this SM's (incoherent) L1: for data other
/// blocks of the same grid wrote.
#[inline(always)]
pub unsafe fn ld_cg_f32(p: *const f32) -> f32 {
    let r: f32;
    unsafe {
        asm!("ld.global.cg.f32 {r}, [{p}];", r = out(reg32) r, p = in(reg64) p, options(nostack, readonly));
    }
    r
}

/// `griddepcontrol.wait`: blocks until the grids this one programmatically depends on have
/// completed and their writes are visible (a no-op when launched without that dependency).
/// sm_90+ only: callers check `TargetPolicy::HAS_PDL`.
#[inline(always)]
pub fn grid_dep_wait() {
    unsafe { asm!("griddepcontrol.wait;", options(nostack)) };
}

/// `griddepcontrol.launch_dependents`: lets the next programmatically dependent grid start
/// launching once every block of this grid has issued it (or exited). sm_90+ only.
#[inline(always)]
pub fn grid_dep_launch_dependents() {
    unsafe { asm!("griddepcontrol.launch_dependents;", options(nostack)) };
}

/// `prefetch.global.L2`: brings the line holding `p` into L2; no result, no fault.
#[inline(always)]
pub fn prefetch_line_l2(p: *const u8) {
    unsafe { asm!("prefetch.global.L2 [{p}];", p = in(reg64) p, options(nostack, readonly)) };
}

/// `st.global.v4.u32`: one 16-byte store (the pointer must be 16-byte aligned).
#[inline(always)]
pub unsafe fn st_v4(p: *mut u32, v: [u32; 4]) {
    unsafe {
        asm!("st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             options(nostack));
    }
}

/// `cvt.rni.s32.f32`: round to nearest, ties to even.
#[inline(always)]
pub fn round_to_i32(x: f32) -> i32 {
    let r: i32;
    unsafe {
        asm!("cvt.rni.s32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack))
    };
    r
}

/// Round half away from zero (C's `roundf`) to an integer: `cvt.rzi` truncation plus a
/// correction, since PTX's own `cvt.rni` rounds ties to even.
#[inline(always)]
pub fn round_half_away_to_i32(x: f32) -> i32 {
    let t: f32;
    unsafe {
        asm!("cvt.rzi.f32.f32 {t}, {x};", t = out(reg32) t, x = in(reg32) x, options(pure, nomem, nostack))
    };
    let r = if (x - t).abs() >= 0.5 {
        t + x.signum()
    } else {
        t
    };
    r as i32
}
