//! Causal attention of a prefill chunk on f16 tensor cores ("flash attention"): a block takes
//! [`FLASH_Q`] query tokens of one head and walks the cache in tiles of [`FLASH_KV`] positions up
//! to the block's causal end. Per tile, `S = Q·Kᵀ` and `O += P·V` run as `mma.m16n8k16` with an
//! online softmax between them, so scores never leave registers: each warp owns 16 query rows,
//! and the accumulator layout of `S` is already the operand layout `P·V` needs.
//!
//! The split-KV kernels (`attention.rs`) read K/V once per query token, which is right for
//! decode and slow for prefill (every row of the cache is re-read hundreds of times, and each
//! score is a shuffle reduction). Here a K/V tile is read once per 64 tokens and the arithmetic
//! is on tensor cores; the price is f16 operands (the query pre-scaled, the probabilities in
//! [0, 1]) with f32 accumulation, which the host keeps for its default (Q8_1) mode only.
//!
//! [`attention_chunks_mma`] is split-KV decode's pass 1 on the same tensor-core steps: the M
//! rows of an mma are a KV group's query heads instead of 16 tokens, so one mma scores eight
//! positions for all of them where the f32 kernel reduces each (row, head) dot by butterflies.
use crate::device::*;
use crate::kernels::attention::{
    STATS, SplitBlock, kv_row, merge_floats, merge_slots, record_floats,
};
use crate::kernels::matvec::quantize_block;
use crate::kernels::norm::{HeadRope, Team, norm_rope_head};
use policies::TargetPolicy;

/// Query tokens per block: 16 per warp.
pub const FLASH_Q: u32 = 64;
/// Cache positions per tile.
pub const FLASH_KV: u32 = 64;
/// Warps per block.
pub const FLASH_WARPS: u32 = FLASH_Q / 16;
/// f16 padding of a shared-memory K/V row: rows 16 bytes apart (mod 128) put the 8 rows × 4
/// words a fragment load touches in 32 distinct banks.
const PAD: u32 = 8;

/// Head dimensions with an instantiation (fragment arrays are sized at compile time).
pub const fn flash_supports(head_dim: u32) -> bool {
    head_dim == 64 || head_dim == 128
}

/// Dynamic shared memory: one K and one V tile.
pub const fn flash_smem_bytes(head_dim: u32) -> u32 {
    2 * FLASH_KV * (head_dim + PAD) * 2
}

/// `out` (`n × heads × head_dim` f32) = causal softmax(`scale`·Q·Kᵀ)·V for the `n` query tokens
/// `q` (same layout) at positions `*pos ..`, over the f16 cache `k`, `v` (`kv_heads × max_ctx ×
/// head_dim`, 16-byte aligned) that already holds them. [`flash_supports`]`(head_dim)`.
/// Launch: [`launch::flash_prefill`](crate::kernels::launch::flash_prefill).
#[allow(clippy::too_many_arguments)] // a kernel's parameters are its launch's argument list
pub unsafe fn flash_prefill<P: TargetPolicy>(
    q: *const f32,
    k: *const u16,
    v: *const u16,
    out: *mut f32,
    pos: *const u32,
    n: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    max_ctx: u32,
    scale: f32,
) {
    let a = (q, k, v, out, pos, n, heads, kv_heads, max_ctx, scale);
    // D = head_dim, KS = D / 16 k-steps of Q·Kᵀ, ND = D / 8 n-tiles of P·V.
    unsafe {
        match head_dim {
            64 => body::<P, 64, 4, 8>(a),
            _ => body::<P, 128, 8, 16>(a),
        }
    }
}

type Args = (
    *const f32,
    *const u16,
    *const u16,
    *mut f32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
    f32,
);

/// Two f32 as the f16 pair of one fragment register (the lower k in the low half).
#[inline(always)]
fn pack(lo: f32, hi: f32) -> u32 {
    f32_to_f16(lo) as u32 | (f32_to_f16(hi) as u32) << 16
}

#[inline(always)]
unsafe fn body<P: TargetPolicy, const D: u32, const KS: usize, const ND: usize>(args: Args) {
    let (q, k, v, out, pos, n, heads, kv_heads, max_ctx, scale) = args;
    let (h, q0) = (block_idx(), block_idx_y() * FLASH_Q);
    let kvh = h / (heads / kv_heads);
    let p0 = unsafe { *pos };
    let (g, t) = (lane() / 4, lane() % 4);
    // This thread's two query rows (fragment rows g and g + 8 of its warp's 16).
    let rows = [q0 + 16 * warp_id() + g, q0 + 16 * warp_id() + g + 8];
    // Q as A fragments, pre-scaled into the exp2 domain (2^(s·log2 e) = e^s); rows past `n`
    // are zero and never stored.
    let qv = |r: usize, d: u32| {
        let x = if rows[r] < n {
            unsafe { *q.add(((rows[r] * heads + h) * D + d) as usize) }
        } else {
            0.0
        };
        x * scale * core::f32::consts::LOG2_E
    };
    let mut qa = [[0u32; 4]; KS];
    unroll::<KS>(|ks| {
        let d = 16 * ks as u32 + 2 * t;
        qa[ks] = [
            pack(qv(0, d), qv(0, d + 1)),
            pack(qv(1, d), qv(1, d + 1)),
            pack(qv(0, d + 8), qv(0, d + 9)),
            pack(qv(1, d + 8), qv(1, d + 9)),
        ];
    });

    // The last position any row of this block attends.
    let last = p0 + (q0 + FLASH_Q).min(n) - 1;
    let stride = D + PAD;
    let ks_mem: *mut u16 = shared_mem();
    let vs_mem = unsafe { ks_mem.add((FLASH_KV * stride) as usize) };
    let mut o = [[0f32; 4]; ND];
    // Running max and (this lane's share of the) exp-sum of rows g and g + 8.
    let (mut m, mut l) = ([f32::NEG_INFINITY; 2], [0f32; 2]);
    for tile in 0..last / FLASH_KV + 1 {
        let base = tile * FLASH_KV;
        sync_threads(); // every warp is done with the previous tile
        let mut c = thread_idx();
        while c < FLASH_KV * D / 8 {
            let (row, col) = (c / (D / 8), c % (D / 8) * 8);
            let p = base + row;
            let src = (kv_row::<P>(kvh, p, kv_heads, max_ctx) * D + col) as usize;
            // Positions past the causal end are zeros (finite: their scores are masked anyway).
            let (kw, vw) = if p <= last {
                unsafe {
                    (
                        ld_nc_v4(k.add(src) as *const u32),
                        ld_nc_v4(v.add(src) as *const u32),
                    )
                }
            } else {
                ([0; 4], [0; 4])
            };
            let dst = (row * stride + col) as usize;
            unsafe {
                *(ks_mem.add(dst) as *mut [u32; 4]) = kw;
                *(vs_mem.add(dst) as *mut [u32; 4]) = vw;
            }
            c += FLASH_WARPS * WARP;
        }
        sync_threads();

        // S = Q·Kᵀ: 16 rows × FLASH_KV positions, 8 positions per n-tile. Kᵀ as the .col B
        // operand is K's rows as stored: two consecutive dimensions of one position per word.
        let mut s = [[0f32; 4]; (FLASH_KV / 8) as usize];
        unroll::<{ (FLASH_KV / 8) as usize }>(|nt| {
            let krow = unsafe { ks_mem.add(((8 * nt as u32 + g) * stride + 2 * t) as usize) };
            unroll::<KS>(|ks| {
                let b = unsafe {
                    [
                        *(krow.add(16 * ks) as *const u32),
                        *(krow.add(16 * ks + 8) as *const u32),
                    ]
                };
                s[nt] = mma_m16n8k16_f32_f16(qa[ks], b, s[nt]);
            });
        });
        // Causal mask, then the online softmax of each row: a lane holds columns 2t, 2t + 1 of
        // every n-tile; the quad of lanes sharing a row reduces its max by two butterflies.
        let mut scale_old = [0f32; 2];
        unroll::<2>(|r| {
            let limit = p0 + rows[r];
            let mut mx = f32::NEG_INFINITY;
            unroll::<{ (FLASH_KV / 8) as usize }>(|nt| {
                unroll::<2>(|i| {
                    let p = base + 8 * nt as u32 + 2 * t + i as u32;
                    let e = 2 * r + i;
                    if p > limit || p > last {
                        s[nt][e] = f32::NEG_INFINITY;
                    }
                    mx = mx.max(s[nt][e]);
                })
            });
            let mx = lane_group_max(mx, 4);
            // A row may see no position of a late tile; its max stays (finite after tile 0,
            // where position 0 is always visible).
            let new = m[r].max(mx);
            scale_old[r] = exp2(m[r] - new);
            let mut sum = 0.0;
            unroll::<{ (FLASH_KV / 8) as usize }>(|nt| {
                unroll::<2>(|i| {
                    let e = 2 * r + i;
                    s[nt][e] = exp2(s[nt][e] - new);
                    sum += s[nt][e];
                })
            });
            l[r] = l[r] * scale_old[r] + sum;
            m[r] = new;
        });
        unroll::<ND>(|nd| {
            unroll::<4>(|i| o[nd][i] *= scale_old[i / 2]);
        });
        // O += P·V: P's accumulator fragments are the A operand of the next mma as they are
        // (n-tiles 2kk and 2kk + 1 make k-step kk); V as the .col B operand needs two
        // positions of one dimension per word, read as halves.
        unroll::<{ (FLASH_KV / 16) as usize }>(|kk| {
            let (s0, s1) = (s[2 * kk], s[2 * kk + 1]);
            let pa = [
                pack(s0[0], s0[1]),
                pack(s0[2], s0[3]),
                pack(s1[0], s1[1]),
                pack(s1[2], s1[3]),
            ];
            let vrow = |dr: u32, col: u32| unsafe {
                *vs_mem.add(((16 * kk as u32 + 2 * t + dr) * stride + col) as usize)
            } as u32;
            unroll::<ND>(|nd| {
                let col = 8 * nd as u32 + g;
                let b = [
                    vrow(0, col) | vrow(1, col) << 16,
                    vrow(8, col) | vrow(9, col) << 16,
                ];
                o[nd] = mma_m16n8k16_f32_f16(pa, b, o[nd]);
            });
        });
    }
    // The quad's shares of each row's exp-sum, then the normalized rows.
    let l = [lane_group_sum(l[0], 4), lane_group_sum(l[1], 4)];
    unroll::<ND>(|nd| {
        unroll::<4>(|i| {
            let r = i / 2;
            if rows[r] < n {
                let d = 8 * nd as u32 + 2 * t + (i % 2) as u32;
                unsafe { *out.add(((rows[r] * heads + h) * D + d) as usize) = o[nd][i] / l[r] };
            }
        })
    });
}

/// Cache positions [`attention_chunks_mma`] stages in shared memory per round: a chunk, at most
/// 128 (a split of more takes several rounds).
pub const fn split_tile<P: TargetPolicy>() -> u32 {
    if P::ATTN_CHUNK < 128 {
        P::ATTN_CHUNK
    } else {
        128
    }
}

/// Dynamic shared memory of [`attention_chunks_mma`]: a K and a V tile, then the warps'
/// partial records for `per_block` heads.
pub const fn split_smem_bytes<P: TargetPolicy>(per_block: u32, head_dim: u32) -> u32 {
    2 * split_tile::<P>() * (head_dim + PAD) * 2
        + merge_floats(P::ATTN_WARPS, per_block, head_dim) * 4
}

/// Dynamic shared memory of [`attention_short_rope_mma`]: [`split_smem_bytes`], then the
/// block's normalized, rotated query rows (f32).
pub const fn short_rope_smem_bytes<P: TargetPolicy>(per_block: u32, head_dim: u32) -> u32 {
    split_smem_bytes::<P>(per_block, head_dim) + per_block * head_dim * 4
}

/// Split-KV pass 1 on tensor cores: the partials [`attention_chunks`] writes (same grid, same
/// records, merged by [`attention_combine`]), for [`flash_supports`]`(head_dim)`. The block
/// copies its split's K/V rows into shared memory (`cp.async`, all in flight at once); warp
/// `w` then takes positions `16w, 16w + 16·warps, ...`: `S = Q·Kᵀ` for the group's heads (rows
/// `g < heads in block` of the mma, the other rows zero), an online softmax per head, `O += P·V`
/// — as [`flash_prefill`]'s tile steps. The warps' partials merge in shared memory.
///
/// [`attention_chunks`]: crate::kernels::attention::attention_chunks
/// [`attention_combine`]: crate::kernels::attention::attention_combine
#[allow(clippy::too_many_arguments)] // a kernel's parameters are its launch's argument list
pub unsafe fn attention_chunks_mma<P: TargetPolicy>(
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
    let sink = Sink::Records(part);
    let a = (q, k, v, sink, pos, heads, kv_heads, max_ctx, scale, None);
    unsafe { split_head_dim::<P>(head_dim, a) }
}

/// Decode attention of a short history in one launch: [`attention_chunks_mma`] with a single
/// split per KV head (slice) covering every position, whose merge is already the final
/// softmax, so it writes `out` (`n × heads × head_dim` f32) and, unless `xq` is null, its Q8_1
/// blocks for the output projection, as [`attention_combine`] would from one partial. No
/// scratch, no second launch: at a few hundred positions the combine's launch cost more than
/// the split's parallelism saved. The host takes it while the step's history is at most
/// `ATTN_SHORT_MAX` positions. Launch:
/// [`launch::attention_short_mma`](crate::kernels::launch::attention_short_mma).
///
/// [`attention_combine`]: crate::kernels::attention::attention_combine
#[allow(clippy::too_many_arguments)]
pub unsafe fn attention_short_mma<P: TargetPolicy>(
    q: *const f32,
    k: *const u16,
    v: *const u16,
    out: *mut f32,
    xq: *mut i8,
    xds: *mut f32,
    pos: *const u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    max_ctx: u32,
    scale: f32,
) {
    let sink = Sink::Output { out, xq, xds };
    let a = (q, k, v, sink, pos, heads, kv_heads, max_ctx, scale, None);
    unsafe { split_head_dim::<P>(head_dim, a) }
}

/// [`attention_short_mma`] for one token (decode) with `rope_store`'s work folded in, one
/// launch fewer per layer: each block normalizes (QK-norm, when `norm != 0`) and rotates its own
/// query heads from the projection `q`, and the key and value row of the new position from
/// `k`, `v`; writes that row into its K/V tiles and (the KV head's first slice) into the caches;
/// and reads the history from the caches. One warp per head row ([`Team::Warp`]), the same
/// arithmetic as `rope_store`, so the outputs and the caches are the two launches' bits.
/// Before waiting for the previous grid (PDL) a block already has the history's rows in flight:
/// earlier steps wrote them, and the previous grid does not touch the cache.
///
/// The host launches it only where the whole history fits one tile round
/// ([`split_tile`] positions, the new one included). Launch:
/// [`launch::attention_short_rope_mma`](crate::kernels::launch::attention_short_rope_mma).
#[allow(clippy::too_many_arguments)]
pub unsafe fn attention_short_rope_mma<P: TargetPolicy>(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    q_norm: *const f32,
    k_norm: *const f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    out: *mut f32,
    xq: *mut i8,
    xds: *mut f32,
    pos: *const u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    max_ctx: u32,
    log2_base: f32,
    factors: *const f32,
    neox: u32,
    norm: u32,
    eps: f32,
    scale: f32,
) {
    let sink = Sink::Output { out, xq, xds };
    let fresh = Fresh {
        k,
        v,
        q_norm: if norm != 0 { q_norm } else { core::ptr::null() },
        k_norm: if norm != 0 { k_norm } else { core::ptr::null() },
        k_cache,
        v_cache,
        rope: HeadRope {
            rot_dim,
            log2_base,
            factors,
            neox,
        },
        eps,
    };
    let a = (
        q,
        k_cache as *const u16,
        v_cache as *const u16,
        sink,
        pos,
        heads,
        kv_heads,
        max_ctx,
        scale,
        Some(fresh),
    );
    unsafe { split_head_dim::<P>(head_dim, a) }
}

/// The new position's inputs and where they go, for [`attention_short_rope_mma`]: `k`, `v` the
/// projections of the step's token; QK-norm weights (null: no norm); the caches to store into.
#[derive(Clone, Copy)]
struct Fresh {
    k: *const f32,
    v: *const f32,
    q_norm: *const f32,
    k_norm: *const f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    rope: HeadRope,
    eps: f32,
}

/// Where a pass-1 block's merged softmax goes: its split's scratch records, or (one split over
/// the whole history, [`SplitBlock::whole`]) the normalized attention output and its Q8_1
/// blocks. Each entry passes one variant, so the match folds away.
#[derive(Clone, Copy)]
enum Sink {
    Records(*mut f32),
    Output {
        out: *mut f32,
        xq: *mut i8,
        xds: *mut f32,
    },
}

/// [`split_body`] instantiated for `head_dim` (64 or 128, [`flash_supports`]).
#[inline(always)]
unsafe fn split_head_dim<P: TargetPolicy>(head_dim: u32, a: SplitArgs) {
    unsafe {
        match head_dim {
            64 => split_body::<P, 64, 4, 8>(a),
            _ => split_body::<P, 128, 8, 16>(a),
        }
    }
}

type SplitArgs = (
    *const f32,
    *const u16,
    *const u16,
    Sink,
    *const u32,
    u32,
    u32,
    u32,
    f32,
    Option<Fresh>,
);

#[inline(always)]
unsafe fn split_body<P: TargetPolicy, const D: u32, const KS: usize, const ND: usize>(
    args: SplitArgs,
) {
    let (q, k, v, sink, pos, heads, kv_heads, max_ctx, scale, fresh) = args;
    // Which token, heads and positions: as `attention_chunks` takes them.
    let b = match sink {
        Sink::Output { .. } => unsafe { SplitBlock::whole(pos, heads, kv_heads) },
        Sink::Records(_) => {
            match unsafe { SplitBlock::of::<P>(pos, heads, kv_heads, D, max_ctx) } {
                Some(b) => b,
                None => return, // block-uniform: past the causal end, pass 2 will not read this split
            }
        }
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
    let (g, tq) = (lane() / 4, lane() % 4);
    // Q as A fragments, pre-scaled into the exp2 domain: row g is head h0 + g, its row at
    // `rows + g·D` (zero past the block's heads), rows g + 8 are zero (a block has at most
    // `MAX_GROUP` < 8 heads).
    let q_fragments = |rows: *const f32| {
        let qv = |d: u32| {
            let x = if g < gs {
                unsafe { *rows.add((g * D + d) as usize) }
            } else {
                0.0
            };
            x * scale * core::f32::consts::LOG2_E
        };
        let mut qa = [[0u32; 4]; KS];
        unroll::<KS>(|ks| {
            let d = 16 * ks as u32 + 2 * tq;
            qa[ks] = [pack(qv(d), qv(d + 1)), 0, pack(qv(d + 8), qv(d + 9)), 0];
        });
        qa
    };
    let q_rows = unsafe { q.add(((t * heads + h0) * D) as usize) };
    // With `fresh`, the block makes its query rows itself (below), after the PDL wait.
    let mut qa = match fresh {
        None => q_fragments(q_rows),
        Some(_) => [[0u32; 4]; KS],
    };

    let stride = D + PAD;
    let ks_mem: *mut u16 = shared_mem();
    let tile = split_tile::<P>();
    let vs_mem = unsafe { ks_mem.add((tile * stride) as usize) };
    let recs = unsafe { vs_mem.add((tile * stride) as usize) } as *mut f32;
    let fresh_q = unsafe { recs.add(merge_floats(P::ATTN_WARPS, per_block, D) as usize) };
    let mut o = [[0f32; 4]; ND];
    // Row g's running max and this lane's share of its exp-sum.
    let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
    let mut base = start;
    while base < end {
        let here = (end - base).min(tile);
        // Whole 16-row steps are read: rows past `end` are zeros (finite: masked anyway).
        let staged = here.div_ceil(16) * 16;
        sync_threads(); // every warp is done with the previous round's tile
        let mut c = thread_idx();
        while c < staged * D / 8 {
            let (row, col) = (c / (D / 8), c % (D / 8) * 8);
            let dst = (row * stride + col) as usize;
            let (kd, vd) = unsafe { (ks_mem.add(dst) as *mut u32, vs_mem.add(dst) as *mut u32) };
            // With `fresh` the new position's row is not in the cache yet: `fresh_rows` makes
            // it in place.
            let made_here = fresh.is_some() && base + row == end - 1;
            if row < here && !made_here {
                let src = (kv_row::<P>(kvh, base + row, kv_heads, max_ctx) * D + col) as usize;
                unsafe {
                    cp_async_16(kd, k.add(src) as *const u32);
                    cp_async_16(vd, v.add(src) as *const u32);
                }
            } else if row >= here {
                unsafe {
                    *(kd as *mut [u32; 4]) = [0; 4];
                    *(vd as *mut [u32; 4]) = [0; 4];
                }
            }
            c += block_dim();
        }
        cp_async_commit();
        if let Some(f) = fresh {
            // One round (the host's condition), so this runs once, with the history in flight.
            pdl_wait::<P>();
            let row = ((end - 1 - base) * stride) as usize;
            let slice0 = h0 % (heads / kv_heads) == 0;
            unsafe {
                fresh_rows::<P>(
                    f,
                    q_rows,
                    fresh_q,
                    (ks_mem.add(row), vs_mem.add(row)),
                    (t, kvh, kv_heads, gs, D, max_ctx, end - 1),
                    slice0,
                )
            };
        }
        cp_async_wait(0);
        sync_threads();
        if fresh.is_some() {
            qa = q_fragments(fresh_q);
        }

        let mut sub = 16 * warp_id();
        while sub < here {
            // S = Q·Kᵀ over positions sub..sub + 16 (two n-tiles of 8).
            let mut s = [[0f32; 4]; 2];
            unroll::<2>(|nt| {
                let krow =
                    unsafe { ks_mem.add(((sub + 8 * nt as u32 + g) * stride + 2 * tq) as usize) };
                unroll::<KS>(|ks| {
                    let b = unsafe {
                        [
                            *(krow.add(16 * ks) as *const u32),
                            *(krow.add(16 * ks + 8) as *const u32),
                        ]
                    };
                    s[nt] = mma_m16n8k16_f32_f16(qa[ks], b, s[nt]);
                });
            });
            // Online softmax of row g: this lane holds positions 2tq, 2tq + 1 of each n-tile,
            // the quad the other six; position `sub` is always visible, so the max is finite.
            let mut mx = f32::NEG_INFINITY;
            unroll::<2>(|nt| {
                unroll::<2>(|i| {
                    if base + sub + 8 * nt as u32 + 2 * tq + i as u32 >= end {
                        s[nt][i] = f32::NEG_INFINITY;
                    }
                    mx = mx.max(s[nt][i]);
                })
            });
            let new = m.max(lane_group_max(mx, 4));
            let old = exp2(m - new);
            let mut sum = 0.0;
            unroll::<2>(|nt| {
                unroll::<2>(|i| {
                    s[nt][i] = exp2(s[nt][i] - new);
                    sum += s[nt][i];
                })
            });
            l = l * old + sum;
            m = new;
            unroll::<ND>(|nd| {
                o[nd][0] *= old;
                o[nd][1] *= old;
            });
            // O += P·V: rows g + 8 of P are zero; V as in `flash_prefill`.
            let pa = [pack(s[0][0], s[0][1]), 0, pack(s[1][0], s[1][1]), 0];
            let vrow = |dr: u32, col: u32| unsafe {
                *vs_mem.add(((sub + 2 * tq + dr) * stride + col) as usize)
            } as u32;
            unroll::<ND>(|nd| {
                let col = 8 * nd as u32 + g;
                let b = [
                    vrow(0, col) | vrow(1, col) << 16,
                    vrow(8, col) | vrow(9, col) << 16,
                ];
                o[nd] = mma_m16n8k16_f32_f16(pa, b, o[nd]);
            });
            sub += 16 * P::ATTN_WARPS;
        }
        base += tile;
    }
    // This warp's partial of each head as a record (a warp that saw no position: max -∞,
    // sums 0, weighted 0 by the merge), then the block's merge into the scratch.
    let l = lane_group_sum(l, 4);
    if g < gs {
        let rec = unsafe { recs.add(((warp_id() * per_block + g) * record_floats(D)) as usize) };
        if tq == 0 {
            unsafe { (*rec, *rec.add(1)) = (m, l) };
        }
        unroll::<ND>(|nd| {
            unroll::<2>(|i| {
                let d = 8 * nd as u32 + 2 * tq + i as u32;
                unsafe { *rec.add((STATS + d) as usize) = o[nd][i] };
            })
        });
    }
    unsafe {
        merge_slots(
            recs,
            P::ATTN_WARPS,
            per_block,
            gs,
            D,
            |hg, d, mx, l, a| match sink {
                Sink::Records(part) => {
                    let rec = part.add(
                        (((t * heads + h0 + hg) * splits + split) * record_floats(D)) as usize,
                    );
                    if d == 0 {
                        *rec = mx;
                        *rec.add(1) = l;
                    }
                    *rec.add((STATS + d) as usize) = a;
                }
                // `merge_slots` hands out (head, dimension) in warp-uniform rounds of consecutive
                // dimensions (block_dim and D are multiples of 32), so a warp holds one Q8_1 block.
                Sink::Output { out, xq, xds } => {
                    let i = ((t * heads + h0 + hg) * D + d) as usize;
                    *out.add(i) = a / l;
                    if !xq.is_null() {
                        quantize_block(a / l, xq.add(i), xds.add(2 * (i / 32)));
                    }
                }
            },
        )
    };
}

/// [`attention_short_rope_mma`]'s prologue: warp `w` takes head rows `w, w + warps, ...` of the
/// `gs` query heads (normed and rotated into `q_out`, `gs × D` f32), the key row (normed and
/// rotated) and the value row (copied), the last two as f16 into the block's tile rows `kv_row`
/// and, with `store`, into the caches at position `p`. `at` = (token, KV head, KV heads, `gs`,
/// head_dim `D`, cache length, `p`).
#[inline(always)]
unsafe fn fresh_rows<P: TargetPolicy>(
    f: Fresh,
    q_rows: *const f32,
    q_out: *mut f32,
    kv_row_smem: (*mut u16, *mut u16),
    at: (u32, u32, u32, u32, u32, u32, u32),
    store: bool,
) {
    let (t, kvh, kv_heads, gs, d, max_ctx, p) = at;
    let cache_row = (kv_row::<P>(kvh, p, kv_heads, max_ctx) * d) as usize;
    let src_row = ((t * kv_heads + kvh) * d) as usize;
    let mut item = warp_id();
    while item < gs + 2 {
        if item < gs {
            let (x, out) = unsafe {
                (
                    q_rows.add((item * d) as usize),
                    q_out.add((item * d) as usize),
                )
            };
            unsafe {
                norm_rope_head(
                    Team::Warp,
                    x,
                    d,
                    f.q_norm,
                    f.eps,
                    p,
                    Some(f.rope),
                    |c, y| *out.add(c as usize) = y,
                )
            };
        } else {
            let is_v = item == gs + 1;
            let (x, w, rope) = if is_v {
                (f.v, core::ptr::null(), None)
            } else {
                (f.k, f.k_norm, Some(f.rope))
            };
            let (tile_row, cache) = if is_v {
                (kv_row_smem.1, f.v_cache)
            } else {
                (kv_row_smem.0, f.k_cache)
            };
            unsafe {
                norm_rope_head(Team::Warp, x.add(src_row), d, w, f.eps, p, rope, |c, y| {
                    let h = f32_to_f16(y);
                    *tile_row.add(c as usize) = h;
                    if store {
                        *cache.add(cache_row + c as usize) = h;
                    }
                })
            };
        }
        item += P::ATTN_WARPS;
    }
}
