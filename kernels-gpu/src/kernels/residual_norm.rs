//! A decode layer's RMSNorm without a launch of its own.
//!
//! The norm of the residual stream `x` needs `1/rms(x)`, a function of the whole row, so as a
//! separate kernel it is a dependent node between the projection that writes `x` and the ones
//! that read `norm(x)` (~1.9 µs per node on 0.6B in the replayed graph, session 21). Here the
//! producer, the projection adding into `x`, writes `h = x ⊙ g` (not yet scaled), its Q8_1
//! blocks and, per 32 rows, `Σx²`; each consumer mat-vec sums those partials and multiplies
//! its dot products by `1/rms`. Dot products are linear in the activations, so this is the
//! norm's value up to float rounding (the activation codes quantize `x ⊙ g`, whose 32-blocks
//! have the same codes as `x ⊙ g / rms` but for rounding).
use crate::device::*;
use crate::kernels::formats::{QK, SplitFormat};
use crate::kernels::matvec::{
    WeightRow, prefetch_rows, q8_1_code, q8_1_scale, q8_row, quantize_block, warp_dots_in_flight,
};
use crate::kernels::norm::inv_rms_of;
use policies::TargetPolicy;

/// Rows per warp of [`matvec_add_norm_q8`], so 16 warps per 32-row block. Measured on an H100
/// (session 22) against 4 (8 warps): 0.6B +8.5 % vs +5 %, 8B +2.4 % vs −7 %. One row per warp
/// (1024 threads) needs ≤ 64 registers, which no format's entry fits.
pub const ROWS_PER_WARP: usize = 2;

/// Partial sums a lane of a consumer loads: a producer of up to `32 · 32 · LANE_PARTS` rows.
pub const LANE_PARTS: usize = 4;
/// Widest row whose norm a producer may defer (the consumers' [`NormScale`] holds its partials).
pub const MAX_DEFERRED_COLS: u32 = (WARP as usize * LANE_PARTS * QK) as u32;

/// How a consumer finishes a deferred norm of its input: the producer's `Σx²` per 32 rows
/// (`parts` per token in `ss`), the norm's width `cols` and `eps`. `parts == 0`: the input is
/// already normalized and the scale is 1.
#[derive(Clone, Copy)]
pub struct NormScale {
    pub ss: *const f64,
    pub parts: u32,
    pub cols: u32,
    pub eps: f32,
}

/// What a q/k/v or gate/up mat-vec's activations are, as a type parameter: each kind is its own
/// instantiation, so a kernel reading finished activations carries nothing of the deferred
/// path (with it inert but compiled in, ptxas gave the Q4_0 consumers 4–7 more registers and
/// 8B decode, which never defers, ran ~3 % slower).
pub trait NormInput {
    const DEFERRED: bool;
}

/// Finished activations (a norm kernel's output, or any other tensor).
pub struct Finished;
impl NormInput for Finished {
    const DEFERRED: bool = false;
}

/// A deferred norm's `x ⊙ g`, whose `1/rms` the consumer applies (`NormScale`).
pub struct Deferred;
impl NormInput for Deferred {
    const DEFERRED: bool = true;
}

impl NormScale {
    /// The scale of a consumer's launch arguments: [`NormScale::NONE`], a constant the compiler
    /// folds away, unless `N` is [`Deferred`].
    #[inline(always)]
    pub fn of<N: NormInput>(ss: *const f64, parts: u32, cols: u32, eps: f32) -> NormScale {
        match N::DEFERRED {
            true => NormScale {
                ss,
                parts,
                cols,
                eps,
            },
            false => NormScale::NONE,
        }
    }

    pub const NONE: NormScale = NormScale {
        ss: core::ptr::null(),
        parts: 0,
        cols: 0,
        eps: 0.0,
    };

    /// Issues this lane's loads of token `t`'s partial sums. Nothing waits for them until
    /// [`finish`](Self::finish), so they stay in flight under the consumer's dot products
    /// instead of adding a round trip before its first weight load.
    #[inline(always)]
    pub unsafe fn start(self, t: usize) -> [f64; LANE_PARTS] {
        let mut p = [0f64; LANE_PARTS];
        let parts = self.parts as usize;
        unroll::<LANE_PARTS>(|k| {
            let i = lane() as usize + k * WARP as usize;
            if i < parts {
                p[k] = unsafe { *self.ss.add(t * parts + i) };
            }
        });
        p
    }

    /// `1/rms` of the row from the partials [`start`](Self::start) loaded (1 when there are
    /// none): the arithmetic of the norm kernels (`inv_rms_of`, f64), so it has their bits.
    /// All lanes must call.
    #[inline(always)]
    pub fn finish(self, p: [f64; LANE_PARTS]) -> f32 {
        if self.parts == 0 {
            return 1.0;
        }
        let ss = warp_sum_f64(p.iter().sum());
        inv_rms_of(ss, self.cols, self.eps)
    }
}

/// `x += a · Wᵀ` (W `rows × cols` in split layout `F`, `a` Q8_1: a projection into the
/// residual stream, each `x[r]` getting the bits `matvec_split` with `acc` gives it), then the
/// deferred RMSNorm of the new `x` with weight `g` (`rows` long): `h = x ⊙ g`, its Q8_1 blocks
/// (`hq`; `hds` holds d and d·Σq in full f32, as only [`NormScale`] consumers read them) and
/// `ss[t · rows/32 + b]` = Σx² over rows `32b ..` in f64. A thread block owns 32 rows, so one
/// Q8_1 block: its 16 warps take [`ROWS_PER_WARP`] consecutive rows each, park the sums in
/// shared memory, and after one barrier the first warp finishes the block. `rows % 32 == 0`,
/// `rows <= MAX_DEFERRED_COLS`. Launch: [`launch::matvec_add_norm_q8`].
///
/// [`launch::matvec_add_norm_q8`]: crate::kernels::launch::matvec_add_norm_q8
#[allow(clippy::too_many_arguments)]
pub unsafe fn matvec_add_norm_q8<P: TargetPolicy, F: SplitFormat>(
    qs: *const u32,
    scales: *const u8,
    aq: *const u32,
    ads: *const f32,
    x: *mut f32,
    g: *const f32,
    h: *mut f32,
    hq: *mut i8,
    hds: *mut f32,
    ss: *mut f64,
    rows: u32,
    cols: u32,
) {
    const R: usize = ROWS_PER_WARP;
    let (nb, t) = ((cols / QK as u32) as usize, block_idx_y() as usize);
    let a = unsafe { q8_row(aq, ads, t, nb) };
    let (rows, row0) = (rows as usize, block_idx() as usize * QK);
    prefetch_rows::<P, F>(qs, scales, row0, QK, rows, nb);
    pdl_wait::<P>();
    let first = row0 + warp_id() as usize * R;
    let w = core::array::from_fn(|r| WeightRow {
        qs,
        scales,
        row: first + r,
        live: true,
    });
    let dots = unsafe { warp_dots_in_flight::<P, F, R>(&w, a, nb) };
    let parked: *mut f32 = shared_mem();
    if lane() == 0 {
        for (r, d) in dots.iter().enumerate() {
            let at = t * rows + first + r;
            unsafe { *parked.add(first - row0 + r) = *x.add(at) + *d };
        }
    }
    sync_threads();
    if warp_id() != 0 {
        return;
    }
    let (l, at) = (lane() as usize, t * rows + row0 + lane() as usize);
    let v = unsafe { *parked.add(l) };
    let u = v * unsafe { *g.add(row0 + l) };
    let (d, id) = q8_1_scale(warp_max(u.abs()));
    let code = q8_1_code(u, id);
    let sum = warp_sum(code as f32);
    let part = warp_sum_f64(v as f64 * v as f64);
    unsafe {
        *x.add(at) = v;
        *h.add(at) = u;
        *hq.add(at) = code as i8;
        if l == 0 {
            (*hds.add(2 * (at / QK)), *hds.add(2 * (at / QK) + 1)) = (d, d * sum);
            *ss.add(t * (rows / QK) + block_idx() as usize) = part;
        }
    }
}

/// Finishes a deferred norm for a consumer that takes no [`NormScale`]: `out = h · 1/rms`
/// (`h`, `ss`, `parts` as [`matvec_add_norm_q8`] wrote them) and its Q8_1 blocks, as
/// `quantize_q8_1` writes them. One warp per 32-block, as `quantize_q8_1`. Launch:
/// [`launch::quantize_q8_1`](crate::kernels::launch::quantize_q8_1).
#[allow(clippy::too_many_arguments)]
pub unsafe fn norm_settle_q8<P: TargetPolicy>(
    h: *const f32,
    ss: *const f64,
    parts: u32,
    out: *mut f32,
    oq: *mut i8,
    ods: *mut f32,
    cols: u32,
    eps: f32,
) {
    let nb = cols / QK as u32;
    let b = block_idx() * (block_dim() / WARP) + warp_id();
    let t = block_idx_y();
    if b >= nb {
        return; // warp-uniform
    }
    let mut s = 0.0;
    let mut i = lane();
    while i < parts {
        s += unsafe { *ss.add((t * parts + i) as usize) };
        i += WARP;
    }
    let inv = inv_rms_of(warp_sum_f64(s), cols, eps);
    let at = (t * cols + b * QK as u32 + lane()) as usize;
    let v = unsafe { *h.add(at) } * inv;
    unsafe {
        *out.add(at) = v;
        quantize_block(v, oq.add(at), ods.add(2 * (t * nb + b) as usize));
    }
}
