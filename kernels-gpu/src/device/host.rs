//! The host grid executor: runs kernel bodies on the CPU with GPU semantics.
//!
//! A launch spawns one OS thread per GPU thread of a block; those threads walk the grid's blocks
//! in order, so blocks run one after another and threads within a block run truly concurrently.
//! `sync_threads` is a real barrier, warp shuffles and `mma` exchange values through a per-warp
//! slot array between two warp barriers, and dynamic shared memory is one buffer per launch
//! filled with NaN-pattern bytes so a kernel that reads what it never wrote is caught.
//!
//! A barrier that not every thread reaches (a divergent `sync_threads` or shuffle, which is
//! undefined behaviour on the GPU) panics after a timeout instead of hanging the test suite.
use std::boxed::Box;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use std::vec::Vec;

const WARP: usize = 32;
/// Values one lane may publish in a single warp exchange (an mma publishes 4+2+4).
const SLOTS: usize = 10;
const DEADLOCK_TIMEOUT: Duration = Duration::from_secs(20);

/// Grid and block shape of one launch: the very type the launch helpers compute, so a host
/// launch takes `launch::matvec::<P>(..)` and friends as they are.
pub use crate::kernels::launch::Dims as LaunchDims;

/// Payload of a panic that only echoes another thread's failure; `launch` re-raises the root
/// cause (the first other payload) instead of whichever thread happened to be joined first.
struct EchoPanic;

struct BarrierState {
    arrived: usize,
    generation: u64,
    /// Where the first thread of this generation waits; a later arrival elsewhere means the
    /// threads are not at the same barrier (e.g. some at `sync_threads`, the rest already at the
    /// end of the block), which a count alone would let pass.
    first: &'static str,
    mixed: Option<&'static str>,
}

struct Barrier {
    state: Mutex<BarrierState>,
    cv: Condvar,
    n: usize,
    timeout: Duration,
}

impl Barrier {
    fn new(n: usize, timeout: Duration) -> Self {
        let state = BarrierState { arrived: 0, generation: 0, first: "", mixed: None };
        Barrier { state: Mutex::new(state), cv: Condvar::new(), n, timeout }
    }
    fn wait(&self, poisoned: &AtomicBool, what: &'static str) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = g.generation;
        if g.arrived == 0 {
            g.first = what;
        } else if g.first != what {
            g.mixed = Some(what);
        }
        g.arrived += 1;
        if g.arrived == self.n {
            if let Some(other) = g.mixed {
                let first = g.first;
                drop(g);
                // The waiters see `poisoned` (set when this panic leaves the kernel) and unwind.
                panic!("host grid: deadlock: divergent barrier: threads of one block wait at `{first}` and at `{other}`");
            }
            g.arrived = 0;
            g.generation += 1;
            self.cv.notify_all();
            return;
        }
        let deadline = std::time::Instant::now() + self.timeout;
        while g.generation == generation {
            if poisoned.load(Ordering::Relaxed) {
                std::panic::panic_any(EchoPanic);
            }
            if std::time::Instant::now() > deadline {
                panic!("host grid: deadlock in {what}: not every thread reached it (divergent barrier/shuffle)");
            }
            g = self.cv.wait_timeout(g, Duration::from_millis(20)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

struct Warp {
    barrier: Barrier,
    slots: Vec<AtomicU32>, // WARP * SLOTS
}

struct Block {
    barrier: Barrier,
    warps: Vec<Warp>,
    smem: Vec<u128>,
    poisoned: AtomicBool,
}

#[derive(Clone, Copy)]
struct Ctx {
    block: *const Block,
    tid: u32,
    bx: u32,
    by: u32,
    dims: LaunchDims,
}

std::thread_local! {
    static CTX: Cell<Option<Ctx>> = const { Cell::new(None) };
}

fn ctx() -> Ctx {
    CTX.with(|c| c.get()).expect("device function called outside a host-grid launch")
}

fn block() -> &'static Block {
    // The Block outlives every thread of the launch (scoped threads join before it drops).
    unsafe { &*ctx().block }
}

/// Run `kernel` over the grid. Each call of `kernel` is one GPU thread; it reads its indices
/// through the device functions. Panics inside the kernel propagate to the caller.
pub fn launch<F: Fn() + Sync>(dims: LaunchDims, kernel: F) {
    launch_with_timeout(dims, DEADLOCK_TIMEOUT, kernel)
}

/// [`launch`] with a custom deadlock timeout: how long a thread waits at a barrier before it
/// declares the barrier divergent (tests of the detection itself use a short one).
pub fn launch_with_timeout<F: Fn() + Sync>(dims: LaunchDims, timeout: Duration, kernel: F) {
    assert!(dims.block >= 1 && dims.block <= 1024, "block size {} out of range", dims.block);
    assert!(dims.block as usize % WARP == 0, "host grid needs whole warps (block {})", dims.block);
    let warps = dims.block as usize / WARP;
    let words = (dims.shared_bytes as usize).div_ceil(16);
    let blk = Box::new(Block {
        barrier: Barrier::new(dims.block as usize, timeout),
        warps: (0..warps)
            .map(|_| Warp { barrier: Barrier::new(WARP, timeout), slots: (0..WARP * SLOTS).map(|_| AtomicU32::new(0)).collect() })
            .collect(),
        // 0x7FC0_0001-style pattern per f32: a quiet NaN, also an absurd integer.
        smem: std::vec![0x7fc0_0bad_7fc0_0bad_7fc0_0bad_7fc0_0badu128; words],
        poisoned: AtomicBool::new(false),
    });
    let blk_ref: &Block = &blk;
    let kernel = &kernel;
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for tid in 0..dims.block {
            handles.push(s.spawn(move || {
                let b: *const Block = blk_ref;
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for by in 0..dims.grid_y {
                        for bx in 0..dims.grid_x {
                            CTX.with(|c| c.set(Some(Ctx { block: b, tid, bx, by, dims })));
                            kernel();
                            // Blocks run in sequence: nobody starts block n+1 before all left n.
                            blk_ref.barrier.wait(&blk_ref.poisoned, "end of block");
                        }
                    }
                }));
                CTX.with(|c| c.set(None));
                if let Err(e) = result {
                    blk_ref.poisoned.store(true, Ordering::Relaxed);
                    std::panic::resume_unwind(e);
                }
            }));
        }
        let mut first_panic = None;
        for h in handles {
            if let Err(e) = h.join() {
                // Keep the first root cause; an echo only if nothing else panicked.
                let echo = e.is::<EchoPanic>();
                match &first_panic {
                    Some((true, _)) if !echo => first_panic = Some((false, e)),
                    None => first_panic = Some((echo, e)),
                    _ => {}
                }
            }
        }
        if let Some((_, e)) = first_panic {
            std::panic::resume_unwind(e);
        }
    });
    drop(blk);
}

pub fn thread_idx() -> u32 {
    ctx().tid
}
pub fn block_idx() -> u32 {
    ctx().bx
}
pub fn block_idx_y() -> u32 {
    ctx().by
}
pub fn block_dim() -> u32 {
    ctx().dims.block
}
pub fn grid_dim() -> u32 {
    ctx().dims.grid_x
}
pub fn grid_dim_y() -> u32 {
    ctx().dims.grid_y
}

pub fn sync_threads() {
    let b = block();
    b.barrier.wait(&b.poisoned, "sync_threads");
}

pub fn shared_mem<T>() -> *mut T {
    let b = block();
    assert!(core::mem::align_of::<T>() <= 16);
    b.smem.as_ptr() as *mut T
}

/// Every lane publishes `N` words and receives all 32 lanes' words: the one primitive that
/// shuffles and mma fragments are built from.
fn warp_exchange<const N: usize>(mine: [u32; N]) -> [[u32; N]; WARP] {
    const { assert!(N <= SLOTS) };
    let b = block();
    let c = ctx();
    let w = &b.warps[(c.tid as usize) / WARP];
    let lane = c.tid as usize % WARP;
    for (i, v) in mine.iter().enumerate() {
        w.slots[lane * SLOTS + i].store(*v, Ordering::Relaxed);
    }
    w.barrier.wait(&b.poisoned, "warp collective");
    let mut all = [[0u32; N]; WARP];
    for (l, row) in all.iter_mut().enumerate() {
        for (i, v) in row.iter_mut().enumerate() {
            *v = w.slots[l * SLOTS + i].load(Ordering::Relaxed);
        }
    }
    // Nobody may overwrite the slots before everyone has read them.
    w.barrier.wait(&b.poisoned, "warp collective");
    all
}

pub fn shfl_xor_u32(v: u32, lane_mask: u32) -> u32 {
    let all = warp_exchange([v]);
    let src = (ctx().tid as usize % WARP) ^ (lane_mask as usize & 31);
    all[src][0]
}

pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    let all = warp_exchange([v]);
    all[src as usize & 31][0]
}

pub fn dp4a_s32(a: u32, b: u32, c: i32) -> i32 {
    let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
    let mut acc = c;
    for i in 0..4 {
        acc = acc.wrapping_add(a[i] as i8 as i32 * b[i] as i8 as i32);
    }
    acc
}

fn h2(w: u32) -> (f32, f32) {
    (f16::from_bits(w as u16) as f32, f16::from_bits((w >> 16) as u16) as f32)
}

/// The PTX ISA's fragment layout for m16n8k16 with f16 A (row) / B (col) and f32 C/D:
/// groupID = lane/4, tid_in_group = lane%4.
/// A: a[0]=(g, 2t..2t+1) a[1]=(g+8, 2t..) a[2]=(g, 2t+8..) a[3]=(g+8, 2t+8..)
/// B: b[0]=(k=2t..2t+1, n=g) b[1]=(k=2t+8.., n=g)
/// C/D: c[0..2]=(g, 2t..2t+1) c[2..4]=(g+8, 2t..2t+1)
pub fn mma_m16n8k16_f32_f16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let all = warp_exchange([a[0], a[1], a[2], a[3], b[0], b[1]]);
    let mut am = [[0f32; 16]; 16];
    let mut bm = [[0f32; 8]; 16];
    for (lane, f) in all.iter().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        let put_a = |am: &mut [[f32; 16]; 16], r: usize, k: usize, w: u32| {
            let (x, y) = h2(w);
            am[r][k] = x;
            am[r][k + 1] = y;
        };
        put_a(&mut am, g, 2 * t, f[0]);
        put_a(&mut am, g + 8, 2 * t, f[1]);
        put_a(&mut am, g, 2 * t + 8, f[2]);
        put_a(&mut am, g + 8, 2 * t + 8, f[3]);
        let (x, y) = h2(f[4]);
        bm[2 * t][g] = x;
        bm[2 * t + 1][g] = y;
        let (x, y) = h2(f[5]);
        bm[2 * t + 8][g] = x;
        bm[2 * t + 9][g] = y;
    }
    let lane = ctx().tid as usize % WARP;
    let (g, t) = (lane / 4, lane % 4);
    let dot = |r: usize, n: usize| (0..16).map(|k| am[r][k] * bm[k][n]).sum::<f32>();
    [
        c[0] + dot(g, 2 * t),
        c[1] + dot(g, 2 * t + 1),
        c[2] + dot(g + 8, 2 * t),
        c[3] + dot(g + 8, 2 * t + 1),
    ]
}

pub fn exp2(x: f32) -> f32 {
    x.exp2()
}
pub fn rsqrt(x: f32) -> f32 {
    1.0 / x.sqrt()
}
pub fn sin_cos(x: f32) -> (f32, f32) {
    x.sin_cos()
}

pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    assert!(p as usize % 16 == 0, "ld_nc_v4: pointer {p:p} is not 16-byte aligned");
    unsafe { [*p, *p.add(1), *p.add(2), *p.add(3)] }
}

pub fn round_to_i32(x: f32) -> i32 {
    x.round_ties_even() as i32
}
