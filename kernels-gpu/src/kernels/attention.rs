//! Attention of `n` query tokens over one sequence's f16 KV cache: causal, grouped-query, and
//! split over the cache (split-KV, "flash decoding"), so a long history is read by many blocks
//! at once rather than by one block per query head.
//!
//! Pass 1, [`attention_chunks`]: a block takes one token, the query heads of one KV head's group
//! (up to [`MAX_GROUP`] of them, so each K/V row is read once per group) and one split of the
//! cache (whole chunks of `P::ATTN_CHUNK` positions). It runs an online softmax (running max,
//! exp-sum, weighted V sum) and writes one unnormalized partial per query head to a scratch
//! buffer. Pass 2, [`attention_combine`], merges each (token, head)'s partials into the output.
//!
//! Neither launch depends on where the sequence stands: the step's first position is read from
//! device memory (`pos`), and splits past the causal end exit at once, so one recorded launch (a
//! CUDA graph) serves every decode step up to the cache size.
use crate::device::*;
use crate::kernels::matvec::quantize_block;
use core::f32::consts::LOG2_E;
use policies::TargetPolicy;

/// Largest head dimension: a K/V row is at most one 16-byte load per lane of a warp.
pub const MAX_HEAD_DIM: u32 = 256;
/// Query heads one pass-1 block serves. Each lane keeps 8 query values and a running softmax
/// (10 floats) per head in registers; a larger group is split over several blocks (slices) that
/// sit next to each other in the grid, so their reads of the same K/V rows mostly hit L2.
pub const MAX_GROUP: u32 = 4;
/// f16 values of a K/V row one lane loads at once: 16 bytes.
const VEC: usize = 8;
/// K/V rows each lane has loads in flight for. Decode is bound by cache reads, and the bytes a
/// block has in flight are what keeps them coming.
const ROWS_IN_FLIGHT: u32 = 4;
/// Floats of a softmax partial record before its `head_dim` weighted V sums: max, exp-sum.
pub(crate) const STATS: u32 = 2;

const _: () = assert!(
    MAX_HEAD_DIM / WARP == VEC as u32,
    "pass 2 keeps head_dim / 32 sums per lane in a VEC array"
);

/// How the cache of `max_ctx` positions is split for `n` tokens: `(splits, span)`, `span` being
/// the positions of one split (whole chunks). One split per chunk unless that would exceed
/// `P::ATTN_MAX_PARTIALS` per head. Depends on neither the position nor the history.
pub const fn kv_splits<P: TargetPolicy>(n: u32, max_ctx: u32) -> (u32, u32) {
    let chunks = max_ctx.div_ceil(P::ATTN_CHUNK);
    let cap = P::ATTN_MAX_PARTIALS / n;
    let wanted = if chunks <= cap {
        chunks
    } else if cap > 0 {
        cap
    } else {
        1
    };
    let span = chunks.div_ceil(wanted) * P::ATTN_CHUNK;
    (max_ctx.div_ceil(span), span)
}

/// Positions of one split for a token attending `len` positions: the static `span` of
/// [`kv_splits`], or, for a history too short to fill the `splits` blocks at that span, `len`
/// spread over all of them in whole block steps ([`chunk_slots`] rows) (at least
/// `P::ATTN_MIN_SPAN` positions). A short context then runs as many blocks of a few steps each
/// instead of one block per KV head walking it alone. Pass 1 and pass 2 both derive a token's
/// splits from this, from the same `len`.
pub const fn live_span<P: TargetPolicy>(len: u32, splits: u32, span: u32, head_dim: u32) -> u32 {
    let step = chunk_slots::<P>(head_dim); // rows a block reads per step
    let even = len.div_ceil(splits);
    let even = if even < P::ATTN_MIN_SPAN {
        P::ATTN_MIN_SPAN
    } else {
        even
    };
    let even = even.div_ceil(step) * step;
    if even < span { even } else { span }
}

/// Query heads per pass-1 block and blocks (slices) per KV head: `(per_block, slices)`.
pub const fn head_slices(heads: u32, kv_heads: u32) -> (u32, u32) {
    let group = heads / kv_heads;
    let per_block = if group < MAX_GROUP { group } else { MAX_GROUP };
    (per_block, group.div_ceil(per_block))
}

/// Lanes that share one K/V row: one 16-byte load each, rounded up to a power of two so a
/// butterfly reduces the row's dot product (lanes past the row idle when `head_dim / 8` is not one).
pub const fn row_lanes(head_dim: u32) -> u32 {
    (head_dim / VEC as u32).next_power_of_two()
}

/// Partials a pass-1 block merges per query head: one per (warp, row a warp reads per step).
pub const fn chunk_slots<P: TargetPolicy>(head_dim: u32) -> u32 {
    P::ATTN_WARPS * (WARP / row_lanes(head_dim))
}

/// Shared memory floats of [`merge_slots`]: `slots × heads` records plus one weight each.
pub const fn merge_floats(slots: u32, heads: u32, head_dim: u32) -> u32 {
    slots * heads * (head_dim + STATS + 1)
}

/// Floats of a partial record (max, exp-sum, `head_dim` sums): the scratch holds one per
/// (token, query head, split).
pub const fn record_floats(head_dim: u32) -> u32 {
    head_dim + STATS
}

/// What a split-KV pass-1 block works on (its place in the grid of
/// [`launch::attention_chunks`](crate::kernels::launch::attention_chunks)): token `t`, split
/// `split` of `splits`, positions `start..end`, KV head `kvh` and the `gs` query heads from `h0`
/// (of up to `per_block`).
#[derive(Clone, Copy)]
pub(crate) struct SplitBlock {
    pub t: u32,
    pub splits: u32,
    pub split: u32,
    pub kvh: u32,
    pub start: u32,
    pub end: u32,
    pub h0: u32,
    pub per_block: u32,
    pub gs: u32,
}

impl SplitBlock {
    /// The calling block's work; `None` if its split lies past its token's causal end.
    #[inline(always)]
    pub(crate) unsafe fn of<P: TargetPolicy>(
        pos: *const u32,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        max_ctx: u32,
    ) -> Option<SplitBlock> {
        let (splits, span) = kv_splits::<P>(grid_dim_y(), max_ctx);
        let (per_block, slices) = head_slices(heads, kv_heads);
        let (slice, split, kvh, t) = (
            block_idx() % slices,
            block_idx() / slices % splits,
            block_idx() / slices / splits,
            block_idx_y(),
        );
        let len = unsafe { *pos } + t + 1;
        let span = live_span::<P>(len, splits, span, head_dim);
        let start = split * span;
        if start >= len {
            return None;
        }
        let (h0, gs) = slice_heads(heads, kv_heads, per_block, kvh, slice);
        Some(SplitBlock {
            t,
            splits,
            split,
            kvh,
            start,
            end: len.min(start + span),
            h0,
            per_block,
            gs,
        })
    }

    /// The calling block's work when one split is the whole history (the grid of
    /// [`launch::attention_short_mma`](crate::kernels::launch::attention_short_mma): slices ×
    /// KV heads, tokens): positions `0..=*pos + t`.
    #[inline(always)]
    pub(crate) unsafe fn whole(pos: *const u32, heads: u32, kv_heads: u32) -> SplitBlock {
        let (per_block, slices) = head_slices(heads, kv_heads);
        let (slice, kvh, t) = (block_idx() % slices, block_idx() / slices, block_idx_y());
        let (h0, gs) = slice_heads(heads, kv_heads, per_block, kvh, slice);
        SplitBlock {
            t,
            splits: 1,
            split: 0,
            kvh,
            start: 0,
            end: unsafe { *pos } + t + 1,
            h0,
            per_block,
            gs,
        }
    }
}

/// First query head and head count `(h0, gs)` of slice `slice` (of `per_block` heads) of KV
/// head `kvh`'s group.
#[inline(always)]
fn slice_heads(heads: u32, kv_heads: u32, per_block: u32, kvh: u32, slice: u32) -> (u32, u32) {
    let group = heads / kv_heads;
    (
        kvh * group + slice * per_block,
        per_block.min(group - slice * per_block),
    )
}

/// Pass 1: the softmax partials of token `t`'s query heads in one KV head's group (or a slice of
/// it) over one split of the cache, as records `part[(t, head, split)]` of [`record_floats`].
/// Row (of `head_dim` f16) of cache position `p` of KV head `kvh` in one layer's cache of
/// `max_ctx` positions: head-major, `kvh·max_ctx + p`, or with `P::KV_POSITION_MAJOR`
/// position-major, `p·kv_heads + kvh`. Every kernel that reads or writes the cache indexes it
/// through here.
#[inline(always)]
pub fn kv_row<P: TargetPolicy>(kvh: u32, p: u32, kv_heads: u32, max_ctx: u32) -> u32 {
    if P::KV_POSITION_MAJOR {
        p * kv_heads + kvh
    } else {
        kvh * max_ctx + p
    }
}

/// `q`: `n × heads × head_dim` f32; `k`, `v`: `kv_heads × max_ctx × head_dim` f16, 16-byte
/// aligned; `*pos`: the step's first position; token `t` attends positions `0..=*pos + t`.
/// `head_dim % 32 == 0`, `head_dim <= MAX_HEAD_DIM`, `heads % kv_heads == 0`.
/// Launch: [`launch::attention_chunks`](crate::kernels::launch::attention_chunks).
#[allow(clippy::too_many_arguments)] // a kernel's parameters are its launch's argument list
pub unsafe fn attention_chunks<P: TargetPolicy>(
    q: *const f32,
    k: *const u16,
    v: *const u16,
    part: *mut f32,
    pos: *const u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    max_ctx: u32,
    scale: f32,
) {
    // Block-uniform: a split past the causal end has nothing to do, pass 2 will not read it.
    let Some(b) = (unsafe { SplitBlock::of::<P>(pos, heads, kv_heads, head_dim, max_ctx) }) else {
        return;
    };
    let SplitBlock {
        t,
        splits,
        split,
        kvh,
        start,
        end,
        h0,
        per_block,
        gs,
    } = b;
    let gs = gs as usize;
    let (lanes, warps) = (row_lanes(head_dim), P::ATTN_WARPS);
    let rows = WARP / lanes; // rows a warp reads per step, `lanes` lanes each
    let (sub, dim0) = (lane() / lanes, (lane() % lanes) * VEC as u32);
    let active = dim0 < head_dim;
    // Queries pre-scaled into the exp2 domain: 2^(s·log2 e) = e^s. Register arrays are only
    // indexed in loops of constant trip count with the run-time bound as a guard inside, so
    // every index is a constant after unrolling (a run-time bound puts them in local memory).
    let mut qs = [[0f32; VEC]; MAX_GROUP as usize];
    for (g, qg) in qs.iter_mut().enumerate() {
        if g < gs && active {
            let row = unsafe { q.add(((t * heads + h0 + g as u32) * head_dim + dim0) as usize) };
            for (j, x) in qg.iter_mut().enumerate() {
                *x = unsafe { *row.add(j) } * scale * LOG2_E;
            }
        }
    }
    // Each step the block reads `step` consecutive rows, warp w the `rows` at w·rows. A lane
    // keeps the loads of its next ROWS_IN_FLIGHT rows queued: a step takes the head of the queue
    // and loads the row ROWS_IN_FLIGHT steps ahead, so that many are always in flight.
    let step = warps * rows;
    let mine = start + warp_id() * rows + sub; // this lane's row in the first step
    let load = |p: u32| {
        if p < end && active {
            let at = |cache: *const u16| unsafe {
                cache.add((kv_row::<P>(kvh, p, kv_heads, max_ctx) * head_dim + dim0) as usize)
            } as *const u32;
            unsafe { (ld_nc_v4(at(k)), ld_nc_v4(at(v))) }
        } else {
            ([0; 4], [0; 4])
        }
    };
    let mut queue: [([u32; 4], [u32; 4]); ROWS_IN_FLIGHT as usize] =
        core::array::from_fn(|u| load(mine + u as u32 * step));
    let mut run = [Running::EMPTY; MAX_GROUP as usize];
    let mut b = start;
    while b < end {
        // `b` is block-uniform, so every lane of a warp joins each butterfly below.
        let p = mine + (b - start);
        let (kf, vf) = (halves(queue[0].0), halves(queue[0].1));
        for u in 1..ROWS_IN_FLIGHT as usize {
            queue[u - 1] = queue[u];
        }
        queue[ROWS_IN_FLIGHT as usize - 1] = load(p + ROWS_IN_FLIGHT * step);
        // Scores of the row for every head, then the fold: two short loops unroll fully where
        // one long one would not (and would leave `qs` and `run` in local memory).
        let mut scores = [0f32; MAX_GROUP as usize];
        for (g, (qg, s)) in qs.iter().zip(&mut scores).enumerate() {
            if g < gs {
                *s = lane_group_sum(qg.iter().zip(&kf).map(|(a, b)| a * b).sum(), lanes);
            }
        }
        for (g, (r, s)) in run.iter_mut().zip(&scores).enumerate() {
            if g < gs && p < end {
                r.merge(*s, 1.0, &vf);
            }
        }
        b += step;
    }
    let smem: *mut f32 = shared_mem();
    let slot = warp_id() * rows + sub;
    for (g, r) in run.iter().enumerate() {
        if g < gs {
            let rec = unsafe {
                smem.add(((slot * per_block + g as u32) * record_floats(head_dim)) as usize)
            };
            unsafe {
                r.store(rec, dim0 == 0, if active { VEC as u32 } else { 0 }, |j| {
                    dim0 + j
                })
            };
        }
    }
    unsafe {
        merge_slots(
            smem,
            warps * rows,
            per_block,
            gs as u32,
            head_dim,
            |g, d, m, l, a| {
                let rec = part.add(
                    (((t * heads + h0 + g) * splits + split) * record_floats(head_dim)) as usize,
                );
                if d == 0 {
                    *rec = m;
                    *rec.add(1) = l;
                }
                *rec.add((STATS + d) as usize) = a;
            },
        )
    };
}

/// Pass 2: `out[t, h]` (`n × heads × head_dim` f32) from the partials pass 1 wrote for the
/// splits `0..ceil(len / live_span)` of token `t` (`len = *pos + t + 1`), head `h`: warp `w` folds splits
/// `w, w + warps, ...`, then the block merges the warps' partials. Unless `xq` is null, the
/// output is also written as Q8_1 blocks (`xq`, `xds`, as `quantize_q8_1` writes them) for the
/// output projection, which then needs no quantize launch: a warp emits 32 consecutive
/// dimensions of one head, one whole block (`head_dim % 32 == 0`).
/// Launch: [`launch::attention_combine`](crate::kernels::launch::attention_combine).
#[allow(clippy::too_many_arguments)]
pub unsafe fn attention_combine<P: TargetPolicy>(
    part: *const f32,
    out: *mut f32,
    xq: *mut i8,
    xds: *mut f32,
    pos: *const u32,
    heads: u32,
    head_dim: u32,
    max_ctx: u32,
) {
    let (h, t) = (block_idx(), block_idx_y());
    let (splits, span) = kv_splits::<P>(grid_dim_y(), max_ctx);
    let len = unsafe { *pos } + t + 1;
    let live = len.div_ceil(live_span::<P>(len, splits, span, head_dim));
    let rec_len = record_floats(head_dim);
    let recs = unsafe { part.add(((t * heads + h) * splits * rec_len) as usize) };
    let per_lane = head_dim / WARP;
    let mut run = Running::EMPTY;
    let mut s = warp_id();
    while s < live {
        let rec = unsafe { recs.add((s * rec_len) as usize) };
        let mut sums = [0f32; VEC];
        for (j, x) in sums.iter_mut().enumerate() {
            if (j as u32) < per_lane {
                *x = unsafe { *rec.add((STATS + lane() + WARP * j as u32) as usize) };
            }
        }
        run.merge(unsafe { *rec }, unsafe { *rec.add(1) }, &sums);
        s += P::ATTN_WARPS;
    }
    let smem: *mut f32 = shared_mem();
    unsafe {
        run.store(
            smem.add((warp_id() * rec_len) as usize),
            lane() == 0,
            per_lane,
            |j| lane() + WARP * j,
        );
        // `merge_slots` hands dimension d to thread d mod block_dim, in warp-uniform rounds
        // (head_dim and block_dim are multiples of 32), so a warp holds one Q8_1 block.
        merge_slots(smem, P::ATTN_WARPS, 1, 1, head_dim, |_, d, _, l, a| {
            let i = ((t * heads + h) * head_dim + d) as usize;
            *out.add(i) = a / l;
            if !xq.is_null() {
                quantize_block(a / l, xq.add(i), xds.add(2 * (i / 32)));
            }
        });
    }
}

/// An online softmax over the scores seen so far, in the exp2 domain: max `m`, `l = Σ 2^(s-m)`,
/// `acc = Σ 2^(s-m)·v` over this lane's (up to) 8 dimensions. Empty: `m = -∞`, `l = acc = 0`.
#[derive(Clone, Copy)]
struct Running {
    m: f32,
    l: f32,
    acc: [f32; VEC],
}

impl Running {
    const EMPTY: Running = Running {
        m: f32::NEG_INFINITY,
        l: 0.0,
        acc: [0.0; VEC],
    };

    /// Fold in another partial (max `m`, exp-sum `l`, sums `acc`; a single score `s` with its V
    /// row is `(s, 1, v)`), rescaling both to the larger max. `m` must be finite.
    #[inline(always)]
    fn merge(&mut self, m: f32, l: f32, acc: &[f32; VEC]) {
        let new = self.m.max(m);
        let (a, b) = (exp2(self.m - new), exp2(m - new));
        self.l = self.l * a + l * b;
        for (x, y) in self.acc.iter_mut().zip(acc) {
            *x = *x * a + y * b;
        }
        self.m = new;
    }

    /// Write as a record: the stats if `lead`, sum `j` at dimension `dim(j)` for `j < count`.
    #[inline(always)]
    unsafe fn store(&self, rec: *mut f32, lead: bool, count: u32, dim: impl Fn(u32) -> u32) {
        if lead {
            unsafe { (*rec, *rec.add(1)) = (self.m, self.l) };
        }
        for (j, a) in self.acc.iter().enumerate() {
            if (j as u32) < count {
                unsafe { *rec.add((STATS + dim(j as u32)) as usize) = *a };
            }
        }
    }
}

/// Merges the partial records in shared memory at `recs`: `slots × stride` of them (slot `s`,
/// head `g` at record `s·stride + g`), of which heads `g < heads` are live. Calls
/// `emit(g, d, max, exp-sum, sum_d)` once per (head, dimension), spread over the block. Every
/// thread must call, after storing its records; `recs` needs [`merge_floats`]`(slots, stride,
/// head_dim)` floats.
#[inline(always)]
pub(crate) unsafe fn merge_slots(
    recs: *mut f32,
    slots: u32,
    stride: u32,
    heads: u32,
    head_dim: u32,
    emit: impl Fn(u32, u32, f32, f32, f32),
) {
    let rec_len = record_floats(head_dim);
    let rec = |s: u32, g: u32| unsafe { recs.add(((s * stride + g) * rec_len) as usize) };
    let weights = unsafe { recs.add((slots * stride * rec_len) as usize) };
    let max_of = |g: u32| (0..slots).fold(f32::NEG_INFINITY, |m, s| m.max(unsafe { *rec(s, g) }));
    sync_threads();
    // Each record's weight against its head's largest max, computed once (not per dimension).
    // A slot that saw no position has max -∞ and weight 0; some slot always saw one.
    let mut i = thread_idx();
    while i < slots * heads {
        let (s, g) = (i / heads, i % heads);
        unsafe { *weights.add((s * stride + g) as usize) = exp2(*rec(s, g) - max_of(g)) };
        i += block_dim();
    }
    sync_threads();
    let mut i = thread_idx();
    while i < heads * head_dim {
        let (g, d) = (i / head_dim, i % head_dim);
        let (mut l, mut a) = (0.0, 0.0);
        for s in 0..slots {
            let w = unsafe { *weights.add((s * stride + g) as usize) };
            l += w * unsafe { *rec(s, g).add(1) };
            a += w * unsafe { *rec(s, g).add((STATS + d) as usize) };
        }
        emit(g, d, max_of(g), l, a);
        i += block_dim();
    }
}

/// Eight f16 values of one 16-byte load (little-endian: the low half of each word first).
#[inline(always)]
fn halves(w: [u32; 4]) -> [f32; VEC] {
    core::array::from_fn(|j| f16_to_f32((w[j / 2] >> (16 * (j % 2))) as u16))
}
