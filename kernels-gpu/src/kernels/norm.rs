//! Row kernels: one block per row, reductions through warp shuffles and a few words of shared
//! memory. Launch: [`launch::per_row`](crate::kernels::launch::per_row).
use crate::device::*;
use policies::TargetPolicy;

/// `out[r] = x[r] / rms(x[r]) * w` for each of the grid's rows (`cols` each). `w` (`cols`) is
/// shared by all rows, so per-head QK-norm is this kernel with rows = tokens × heads.
/// `out` may equal `x`.
pub unsafe fn rms_norm<P: TargetPolicy>(x: *const f32, w: *const f32, out: *mut f32, cols: u32, eps: f32) {
    let scratch: *mut f32 = shared_mem();
    let row = block_idx() as usize * cols as usize;
    let mut ss = 0.0;
    let mut c = thread_idx();
    while c < cols {
        let v = unsafe { *x.add(row + c as usize) };
        ss += v * v;
        c += block_dim();
    }
    let total = unsafe { block_sum(ss, scratch) };
    let inv = rsqrt(total / cols as f32 + eps);
    let mut c = thread_idx();
    while c < cols {
        let i = row + c as usize;
        unsafe { *out.add(i) = *x.add(i) * inv * *w.add(c as usize) };
        c += block_dim();
    }
}

/// Numerically safe softmax of each row (`cols`), `out` may equal `x`.
pub unsafe fn softmax<P: TargetPolicy>(x: *const f32, out: *mut f32, cols: u32) {
    let scratch: *mut f32 = shared_mem();
    let row = block_idx() as usize * cols as usize;
    let mut m = f32::NEG_INFINITY;
    let mut c = thread_idx();
    while c < cols {
        m = m.max(unsafe { *x.add(row + c as usize) });
        c += block_dim();
    }
    let m = unsafe { block_max(m, scratch) };
    let mut s = 0.0;
    let mut c = thread_idx();
    while c < cols {
        let i = row + c as usize;
        let e = exp(unsafe { *x.add(i) } - m);
        unsafe { *out.add(i) = e };
        s += e;
        c += block_dim();
    }
    let inv = 1.0 / unsafe { block_sum(s, scratch) };
    let mut c = thread_idx();
    while c < cols {
        unsafe { *out.add(row + c as usize) *= inv };
        c += block_dim();
    }
}
