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
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::thread::Thread;
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

/// Where a thread waits; a barrier generation whose arrivals come from different sites means the
/// threads are not at the same barrier (e.g. some at `sync_threads`, the rest already at the end
/// of the block), which an arrival count alone would let pass.
#[derive(Clone, Copy)]
enum Site {
    SyncThreads = 1,
    EndOfBlock = 2,
    WarpCollective = 4,
}

impl Site {
    fn name(self) -> &'static str {
        match self {
            Site::SyncThreads => "sync_threads",
            Site::EndOfBlock => "end of block",
            Site::WarpCollective => "warp collective",
        }
    }
}

/// A reusable barrier over threads `first_tid..first_tid + n` of the block. Arrival is one
/// atomic add; waiters park and the last arrival unparks them. (A mutex + condvar version spent
/// most of the test suite's time in futex contention: every barrier woke all waiters into one
/// lock.)
struct Barrier {
    arrived: AtomicUsize,
    generation: AtomicU64,
    /// Bit set of the `Site`s seen in the current generation.
    sites: AtomicU32,
    first_tid: usize,
    n: usize,
    timeout: Duration,
}

impl Barrier {
    fn new(first_tid: usize, n: usize, timeout: Duration) -> Self {
        Barrier {
            arrived: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            sites: AtomicU32::new(0),
            first_tid,
            n,
            timeout,
        }
    }
    fn wake_all(&self, blk: &Block) {
        for t in &blk.threads[self.first_tid..self.first_tid + self.n] {
            if let Some(t) = t.get() {
                t.unpark();
            }
        }
    }
    fn wait(&self, blk: &Block, site: Site) {
        // Everyone of this generation reads the old generation before arriving; the next
        // generation's arrivals only start after they see it bumped.
        let generation = self.generation.load(Ordering::Acquire);
        self.sites.fetch_or(site as u32, Ordering::AcqRel);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            let sites = self.sites.swap(0, Ordering::AcqRel);
            if sites.count_ones() > 1 {
                let names: Vec<&str> = [Site::SyncThreads, Site::EndOfBlock, Site::WarpCollective]
                    .into_iter()
                    .filter(|s| sites & *s as u32 != 0)
                    .map(Site::name)
                    .collect();
                blk.poisoned.store(true, Ordering::Release);
                self.wake_all(blk);
                panic!(
                    "host grid: deadlock: divergent barrier: threads of one block wait at different barriers ({})",
                    names.join(", ")
                );
            }
            self.arrived.store(0, Ordering::Release);
            self.generation.store(generation + 1, Ordering::Release);
            self.wake_all(blk);
            return;
        }
        let deadline = std::time::Instant::now() + self.timeout;
        while self.generation.load(Ordering::Acquire) == generation {
            if blk.poisoned.load(Ordering::Acquire) {
                std::panic::panic_any(EchoPanic);
            }
            let now = std::time::Instant::now();
            if now > deadline {
                blk.poisoned.store(true, Ordering::Release);
                self.wake_all(blk);
                panic!(
                    "host grid: deadlock in {}: not every thread reached it (divergent barrier/shuffle)",
                    site.name()
                );
            }
            // Unpark tokens make a wake between the check and the park harmless; the timeout
            // only bounds how late a panic elsewhere in the block is noticed.
            std::thread::park_timeout((deadline - now).min(Duration::from_millis(20)));
        }
    }
}

struct Warp {
    barrier: Barrier,
    slots: Vec<AtomicU32>, // WARP * SLOTS
}

struct Block {
    barrier: Barrier,
    /// Every thread of the block, registered before it runs any kernel code (barriers wake them).
    threads: Vec<OnceLock<Thread>>,
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
    /// This thread's `cp.async` copies (dst, src addresses): committed groups, oldest first,
    /// then the open one. They land only at a `cp_async_wait` that covers them, so a kernel
    /// that reads shared memory before waiting reads the poison.
    static CP_ASYNC: std::cell::RefCell<(Vec<CopyGroup>, CopyGroup)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// One `cp.async` group: (destination, source) addresses of its 16-byte copies.
type CopyGroup = Vec<(usize, usize)>;

fn ctx() -> Ctx {
    CTX.with(|c| c.get())
        .expect("device function called outside a host-grid launch")
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
    assert!(
        dims.block >= 1 && dims.block <= 1024,
        "block size {} out of range",
        dims.block
    );
    assert!(
        (dims.block as usize).is_multiple_of(WARP),
        "host grid needs whole warps (block {})",
        dims.block
    );
    let warps = dims.block as usize / WARP;
    let words = (dims.shared_bytes as usize).div_ceil(16);
    let blk = Box::new(Block {
        barrier: Barrier::new(0, dims.block as usize, timeout),
        threads: (0..dims.block).map(|_| OnceLock::new()).collect(),
        warps: (0..warps)
            .map(|w| Warp {
                barrier: Barrier::new(w * WARP, WARP, timeout),
                slots: (0..WARP * SLOTS).map(|_| AtomicU32::new(0)).collect(),
            })
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
                let _ = blk_ref.threads[tid as usize].set(std::thread::current());
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for by in 0..dims.grid_y {
                        for bx in 0..dims.grid_x {
                            CTX.with(|c| {
                                c.set(Some(Ctx {
                                    block: b,
                                    tid,
                                    bx,
                                    by,
                                    dims,
                                }))
                            });
                            kernel();
                            // Copies never waited for die with the block (as on the GPU, where
                            // nothing could read them afterwards).
                            CP_ASYNC.with(|q| *q.borrow_mut() = (Vec::new(), Vec::new()));
                            // Blocks run in sequence: nobody starts block n+1 before all left n.
                            blk_ref.barrier.wait(blk_ref, Site::EndOfBlock);
                        }
                    }
                }));
                CTX.with(|c| c.set(None));
                if let Err(e) = result {
                    blk_ref.poisoned.store(true, Ordering::Release);
                    // Waiters at a barrier notice at once instead of at their next poll.
                    blk_ref.barrier.wake_all(blk_ref);
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
    b.barrier.wait(b, Site::SyncThreads);
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
    w.barrier.wait(b, Site::WarpCollective);
    let mut all = [[0u32; N]; WARP];
    for (l, row) in all.iter_mut().enumerate() {
        for (i, v) in row.iter_mut().enumerate() {
            *v = w.slots[l * SLOTS + i].load(Ordering::Relaxed);
        }
    }
    // Nobody may overwrite the slots before everyone has read them.
    w.barrier.wait(b, Site::WarpCollective);
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
    (
        f16::from_bits(w as u16) as f32,
        f16::from_bits((w >> 16) as u16) as f32,
    )
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

/// The PTX ISA's m16n8k32 s8 semantics: D = A·B + C with 32-bit wrapping adds, the fragments
/// placed by [`crate::device::frag_k32`] (the mapping the kernels load by).
pub fn mma_m16n8k32_s32_s8(a: [u32; 4], b: [u32; 2], c: [i32; 4]) -> [i32; 4] {
    use crate::device::frag_k32;
    let all = warp_exchange([a[0], a[1], a[2], a[3], b[0], b[1]]);
    let mut am = [[0i32; 32]; 16];
    let mut bm = [[0i32; 8]; 32]; // bm[k][n]
    for (lane, f) in all.iter().enumerate() {
        for r in 0..4 {
            let (row, k0) = frag_k32::a(lane as u32, r);
            for (i, byte) in f[r as usize].to_le_bytes().into_iter().enumerate() {
                am[row as usize][k0 as usize + i] = byte as i8 as i32;
            }
        }
        for r in 0..2 {
            let (n, k0) = frag_k32::b(lane as u32, r);
            for (i, byte) in f[4 + r as usize].to_le_bytes().into_iter().enumerate() {
                bm[k0 as usize + i][n as usize] = byte as i8 as i32;
            }
        }
    }
    let lane = (ctx().tid as usize % WARP) as u32;
    core::array::from_fn(|i| {
        let (m, n) = frag_k32::c(lane, i as u32);
        (0..32).fold(c[i], |acc, k| {
            acc.wrapping_add(am[m as usize][k] * bm[k][n as usize])
        })
    })
}

/// Queues the copy in this thread's open group; see `CP_ASYNC`.
pub unsafe fn cp_async_16(dst: *mut u32, src: *const u32) {
    assert!(
        (dst as usize).is_multiple_of(16) && (src as usize).is_multiple_of(16),
        "cp_async_16: {dst:p} <- {src:p} not 16-byte aligned"
    );
    let smem = block().smem.as_ptr_range();
    assert!(
        smem.contains(&(dst as *const u128)),
        "cp_async_16: destination {dst:p} is not in shared memory"
    );
    CP_ASYNC.with(|q| q.borrow_mut().1.push((dst as usize, src as usize)));
}

pub fn cp_async_commit() {
    CP_ASYNC.with(|q| {
        let (groups, open) = &mut *q.borrow_mut();
        groups.push(core::mem::take(open));
    });
}

/// Performs the oldest committed groups until at most `pending` remain.
pub fn cp_async_wait(pending: u32) {
    CP_ASYNC.with(|q| {
        let groups = &mut q.borrow_mut().0;
        while groups.len() > pending as usize {
            for (dst, src) in groups.remove(0) {
                unsafe { core::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, 16) };
            }
        }
    });
}

pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = ((b as u64) << 32 | a as u64).to_le_bytes();
    u32::from_le_bytes(core::array::from_fn(|i| {
        bytes[(sel >> (4 * i)) as usize & 7]
    }))
}

/// Each half through f64 (exact for f16 products and their sums here), rounded once to f16.
fn f16x2_map(a: u32, b: u32, c: u32, f: impl Fn(f64, f64, f64) -> f64) -> u32 {
    let h = |w: u32, i: u32| f16::from_bits((w >> (16 * i)) as u16) as f64;
    let r = |i: u32| (f(h(a, i), h(b, i), h(c, i)) as f16).to_bits() as u32;
    r(0) | r(1) << 16
}

pub fn sub_f16x2(a: u32, b: u32) -> u32 {
    f16x2_map(a, b, 0, |a, b, _| a - b)
}

pub fn mul_f16x2(a: u32, b: u32) -> u32 {
    f16x2_map(a, b, 0, |a, b, _| a * b)
}

pub fn fma_f16x2(a: u32, b: u32, c: u32) -> u32 {
    f16x2_map(a, b, c, |a, b, c| a * b + c)
}

pub fn exp2(x: f32) -> f32 {
    x.exp2()
}
pub fn rsqrt(x: f32) -> f32 {
    1.0 / x.sqrt()
}
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
pub fn sqrt_f64(x: f64) -> f64 {
    x.sqrt()
}
pub fn sin_cos(x: f32) -> (f32, f32) {
    x.sin_cos()
}

pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    assert!(
        (p as usize).is_multiple_of(16),
        "ld_nc_v4: pointer {p:p} is not 16-byte aligned"
    );
    unsafe { [*p, *p.add(1), *p.add(2), *p.add(3)] }
}

pub unsafe fn ld_stream_v4(p: *const u32) -> [u32; 4] {
    unsafe { ld_nc_v4(p) }
}

pub fn sync_warp() {
    let b = block();
    let w = &b.warps[(ctx().tid as usize) / WARP];
    w.barrier.wait(b, Site::WarpCollective);
}

pub fn fence_gpu() {
    std::sync::atomic::fence(Ordering::SeqCst);
}

pub unsafe fn atomic_add_u32(p: *mut u32, v: u32) -> u32 {
    assert!(
        (p as usize).is_multiple_of(4),
        "atomic_add_u32: pointer {p:p} is not 4-byte aligned"
    );
    unsafe { AtomicU32::from_ptr(p) }.fetch_add(v, Ordering::SeqCst)
}

pub unsafe fn ld_cg_f32(p: *const f32) -> f32 {
    unsafe { p.read_volatile() }
}

/// Launches on the host executor run one after another: nothing to wait for.
pub fn grid_dep_wait() {}

pub fn grid_dep_launch_dependents() {}

pub fn prefetch_line_l2(_p: *const u8) {}

pub unsafe fn st_v4(p: *mut u32, v: [u32; 4]) {
    assert!(
        (p as usize).is_multiple_of(16),
        "st_v4: pointer {p:p} is not 16-byte aligned"
    );
    for (i, w) in v.into_iter().enumerate() {
        unsafe { *p.add(i) = w };
    }
}

pub fn round_to_i32(x: f32) -> i32 {
    x.round_ties_even() as i32
}

pub fn round_half_away_to_i32(x: f32) -> i32 {
    x.round() as i32
}
