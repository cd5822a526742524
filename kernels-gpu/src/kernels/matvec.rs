//! Batch-1 (and small-batch) mat-vec: `y[t] = W · x[t]` for weights in split layout.
//!
//! Each warp owns `P::MATVEC_ROWS_PER_WARP` consecutive rows. A lane walks the row's blocks
//! `lane, lane+32, ...`, so a warp reads 32 consecutive blocks (512 or 1024 contiguous bytes) per
//! step with 16-byte loads, and each activation block it loads is reused for all of its rows.
use crate::device::*;
use crate::kernels::formats::{QK, SplitFormat};
use policies::TargetPolicy;


/// Quantize activations `x` (`n × cols` f32) to 32-element blocks: `xq` (`n × cols` i8) and
/// `xds` (`n × cols/32` pairs of f32: `d`, `d·Σq`). `cols % 32 == 0`. Launch: [`launch::quantize_q8_1`].
///
/// [`launch::quantize_q8_1`]: crate::kernels::launch::quantize_q8_1
pub unsafe fn quantize_q8_1<P: TargetPolicy>(x: *const f32, xq: *mut i8, xds: *mut f32, cols: u32) {
    let nb = cols / QK as u32;
    let b = block_idx() * (block_dim() / WARP) + warp_id();
    let t = block_idx_y();
    if b >= nb {
        return; // warp-uniform: the whole warp leaves together, no collective is skipped
    }
    let i = (t * cols + b * QK as u32 + lane()) as usize;
    let v = unsafe { *x.add(i) };
    let amax = warp_max(v.abs());
    let d = amax / 127.0;
    let q = if d == 0.0 { 0 } else { round_to_i32(v / d) };
    let sum = warp_sum(q as f32);
    unsafe { *xq.add(i) = q as i8 };
    if lane() == 0 {
        let s = 2 * (t * nb + b) as usize;
        unsafe {
            *xds.add(s) = d;
            *xds.add(s + 1) = d * sum;
        }
    }
}

/// One block's quants with one or two 16-byte loads (the branch folds away per format).
#[inline(always)]
unsafe fn load_block_quants<F: SplitFormat>(p: *const u32) -> [u32; 8] {
    let a = unsafe { ld_nc_v4(p) };
    if F::QS_WORDS == 4 {
        [a[0], a[1], a[2], a[3], 0, 0, 0, 0]
    } else {
        let b = unsafe { ld_nc_v4(p.add(4)) };
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

/// `y` (`n × rows`) = `x` · Wᵀ with W (`rows × cols`) in split layout `F` (`qs` 16-byte aligned)
/// and `x` already quantized by [`quantize_q8_1`]. Launch: [`launch::matvec`].
///
/// [`launch::matvec`]: crate::kernels::launch::matvec
pub unsafe fn matvec_split<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
) {
    // The rows-per-warp count becomes a const generic so the accumulators are a fixed-size
    // register array (a run-time bound would put them in local memory).
    unsafe {
        match P::MATVEC_ROWS_PER_WARP {
            1 => matvec_split_rows::<P, F, 1>(qs, scales, xq, xds, y, rows, cols),
            2 => matvec_split_rows::<P, F, 2>(qs, scales, xq, xds, y, rows, cols),
            _ => matvec_split_rows::<P, F, 4>(qs, scales, xq, xds, y, rows, cols),
        }
    }
}

#[inline(always)]
unsafe fn matvec_split_rows<P: TargetPolicy, F: SplitFormat, const R: usize>(
    qs: *const u32,
    scales: *const u8,
    xq: *const u32,
    xds: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
) {
    let nb = (cols / QK as u32) as usize;
    let (rows, t) = (rows as usize, block_idx_y() as usize);
    let row0 = (block_idx() * P::MATVEC_WARPS + warp_id()) as usize * R;
    let xq_row = unsafe { xq.add(t * nb * 8) };
    let xds_row = unsafe { xds.add(t * nb * 2) };
    let mut acc = [0f32; R];
    let mut b = lane() as usize;
    while b < nb {
        let x_lo = unsafe { ld_nc_v4(xq_row.add(b * 8)) };
        let x_hi = unsafe { ld_nc_v4(xq_row.add(b * 8 + 4)) };
        let xw = [x_lo[0], x_lo[1], x_lo[2], x_lo[3], x_hi[0], x_hi[1], x_hi[2], x_hi[3]];
        let (xd, xs) = unsafe { (*xds_row.add(2 * b), *xds_row.add(2 * b + 1)) };
        for (r, a) in acc.iter_mut().enumerate() {
            let row = row0 + r;
            if row < rows {
                let blk = row * nb + b;
                let w = unsafe { load_block_quants::<F>(qs.add(blk * F::QS_WORDS)) };
                *a += F::block_dot(&w, unsafe { scales.add(blk * F::SCALE_BYTES) }, &xw, xd, xs);
            }
        }
        b += WARP as usize;
    }
    for (r, a) in acc.iter().enumerate() {
        let s = warp_sum(*a);
        let row = row0 + r;
        if lane() == 0 && row < rows {
            unsafe { *y.add(t * rows + row) = s };
        }
    }
}

/// `y` (`n × rows`) = `x` (`n × cols` f32) · Wᵀ with W f16 (`rows × cols`, 16-byte aligned,
/// `cols % 8 == 0`). Each lane takes 8 columns per step. Launch: [`launch::matvec`].
///
/// [`launch::matvec`]: crate::kernels::launch::matvec
pub unsafe fn matvec_f16<P: TargetPolicy>(w: *const u16, x: *const f32, y: *mut f32, rows: u32, cols: u32) {
    unsafe {
        match P::MATVEC_ROWS_PER_WARP {
            1 => matvec_f16_rows::<P, 1>(w, x, y, rows, cols),
            2 => matvec_f16_rows::<P, 2>(w, x, y, rows, cols),
            _ => matvec_f16_rows::<P, 4>(w, x, y, rows, cols),
        }
    }
}

#[inline(always)]
unsafe fn matvec_f16_rows<P: TargetPolicy, const R: usize>(w: *const u16, x: *const f32, y: *mut f32, rows: u32, cols: u32) {
    let (rows, cols, t) = (rows as usize, cols as usize, block_idx_y() as usize);
    let row0 = (block_idx() * P::MATVEC_WARPS + warp_id()) as usize * R;
    let x_row = unsafe { x.add(t * cols) } as *const u32;
    let mut acc = [0f32; R];
    let mut c = lane() as usize;
    while c < cols / 8 {
        let xa = unsafe { ld_nc_v4(x_row.add(c * 8)) };
        let xb = unsafe { ld_nc_v4(x_row.add(c * 8 + 4)) };
        let xv = [xa[0], xa[1], xa[2], xa[3], xb[0], xb[1], xb[2], xb[3]].map(f32::from_bits);
        for (r, a) in acc.iter_mut().enumerate() {
            let row = row0 + r;
            if row < rows {
                let wv = unsafe { ld_nc_v4((w.add(row * cols + c * 8)) as *const u32) };
                for (k, word) in wv.iter().enumerate() {
                    *a += f16_to_f32(*word as u16) * xv[2 * k] + f16_to_f32((*word >> 16) as u16) * xv[2 * k + 1];
                }
            }
        }
        c += WARP as usize;
    }
    for (r, a) in acc.iter().enumerate() {
        let s = warp_sum(*a);
        let row = row0 + r;
        if lane() == 0 && row < rows {
            unsafe { *y.add(t * rows + row) = s };
        }
    }
}
