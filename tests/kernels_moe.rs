//! Properties of `kernels/moe.rs`: the router's f32 mat-vec, top-k routing, and the experts'
//! SwiGLU and down projections, which find each slot's expert through the route in device
//! memory. The mat-vecs are checked on the exact Q8_1 activations the kernels read (only float
//! rounding separates them from float64, ~1e-5); the route's indices exactly.
mod common;

use common::data::{Gen, seed};
use common::reference::{self as r, BlockFormat, QK};
use common::{Arg, Device, check_err, check_written, download, names, poisoned, upload};
use kernels_gpu::entries::families;
use kernels_gpu::kernels::mma::MOE_TILE_WORDS;
use kernels_gpu::kernels::moe::MOE_MAX_EXPERTS;
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct RouteCase {
    n: u32,
    n_expert: u32,
    k: u32,
    norm: bool,
    /// Copy some logits onto others: exact ties, which the lower index must win.
    ties: bool,
    seed: u64,
}

fn route_case() -> impl Strategy<Value = RouteCase> {
    let experts = prop_oneof![
        prop::sample::select(vec![1u32, 8, 31, 32, 33, 64, 128, 160, MOE_MAX_EXPERTS]),
        1..=MOE_MAX_EXPERTS
    ];
    (
        1..=9u32,
        experts,
        1..=10u32,
        any::<bool>(),
        any::<bool>(),
        seed(),
    )
        .prop_map(|(n, n_expert, k, norm, ties, seed)| RouteCase {
            n,
            n_expert,
            k: k.min(n_expert),
            norm,
            ties,
            seed,
        })
}

fn moe_route(dev: &mut dyn Device, c: &RouteCase) -> Result<(), TestCaseError> {
    let (n, e, k) = (c.n as usize, c.n_expert as usize, c.k as usize);
    let mut g = Gen::new(c.seed);
    let scale = g.magnitude(-1.0, 1.0);
    let mut logits = g.normals(n * e, scale);
    if c.ties {
        for _ in 0..e / 2 + 1 {
            let (a, b) = (g.below(n * e), g.below(e));
            logits[a] = logits[a - a % e + b];
        }
    }
    let l_b = upload(dev, &logits);
    let out_b = poisoned::<f32>(dev, n * 2 * k, 0xff);
    let dims = dev.shapes().per_warp(c.n);
    let args = [
        l_b.arg(),
        out_b.arg(),
        Arg::U32(c.n_expert),
        Arg::U32(c.k),
        Arg::U32(u32::from(c.norm)),
        Arg::U32(c.n),
    ];
    dev.launch(names::kiln_moe_route, dims, &args);
    let out = download::<f32>(dev, &out_b);
    check_written(dev, "moe_route output", &out)?;
    let label = dev.label();
    for (t, row) in out.chunks_exact(2 * k).enumerate() {
        let (ids, w) = r::moe_route(&logits[t * e..(t + 1) * e], k, c.norm);
        let got: Vec<f32> = ids.iter().map(|&i| i as f32).collect();
        prop_assert_eq!(&row[..k], &got[..], "{}: token {} experts", label, t);
        let err = row[k..].iter().zip(&w).fold(0f64, |m, (&a, &b)| {
            m.max((a as f64 - b).abs() / b.max(1e-6))
        });
        check_err(dev, &format!("moe_route weights of token {t}"), err, 1e-5)?;
    }
    Ok(())
}

#[derive(Clone, Debug)]
struct RouterCase {
    rows: u32,
    cols: u32,
    n: u32,
    seed: u64,
}

fn router_case() -> impl Strategy<Value = RouterCase> {
    let cols = prop_oneof![Just(4u32), (1..=40u32).prop_map(|c| 4 * c), Just(2048)];
    (1..=40u32, cols, 1..=3u32, seed()).prop_map(|(rows, cols, n, seed)| RouterCase {
        rows,
        cols,
        n,
        seed,
    })
}

/// `matvec_f32` against float64: only f32 rounding, bounded by the sum of |w·x|.
fn matvec_f32(dev: &mut dyn Device, c: &RouterCase) -> Result<(), TestCaseError> {
    let (rows, cols, n) = (c.rows as usize, c.cols as usize, c.n as usize);
    let mut g = Gen::new(c.seed);
    let (w, x) = (g.normals(rows * cols, 0.1), g.normals(n * cols, 1.0));
    let (w_b, x_b) = (upload(dev, &w), upload(dev, &x));
    let y_b = poisoned::<f32>(dev, n * rows, 0xff);
    let dims = dev.shapes().matvec_multi(&[c.rows], c.n, u32::MAX / 64);
    let args = [
        w_b.arg(),
        x_b.arg(),
        y_b.arg(),
        Arg::U32(c.rows),
        Arg::U32(c.cols),
    ];
    dev.launch(names::kiln_matvec_f32, dims, &args);
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "matvec_f32 output", &y)?;
    let (wd, xd) = (r::widen(&w), r::widen(&x));
    let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
    let want = r::matvec(&wd, &xd, rows, cols, n);
    let mag = r::matvec(&abs(&wd), &abs(&xd), rows, cols, n);
    check_err(
        dev,
        "matvec_f32",
        r::err_vs_magnitude(&y, &want, &mag),
        1e-6,
    )
}

#[derive(Clone, Debug)]
struct FfnCase {
    fmt: BlockFormat,
    n: u32,
    n_expert: u32,
    k: u32,
    /// 32-blocks of the input width and of the expert width.
    blocks: u32,
    ff_blocks: u32,
    /// Output rows of the down projection (the model width).
    rows: u32,
    /// Launch at most this many blocks along x: the kernels must stride over the rest.
    wave: Option<u32>,
    /// The prefill path: slots sorted by expert (`moe_sort`), the expert-sorted mat-vecs, then
    /// `moe_mix`; else the slot-major decode kernels.
    sorted: bool,
    seed: u64,
}

/// Decode-like expert widths: many slots of rows wider than a warp's 32 blocks, so the down
/// projection's lanes walk several steps of (slot, block) pairs (30B-A3B: 8 slots × 24).
fn wide_ffn_case(fmt: BlockFormat) -> impl Strategy<Value = FfnCase> {
    let gr = fmt.group() as u32;
    let ff = prop::sample::select(match gr > 1 {
        true => vec![1u32, 3],
        false => vec![17u32, 24, 40],
    });
    // One block per launch row (wave 1): the host executor runs a thread per GPU thread.
    (8..=9u32, 6..=8u32, ff, 1..=4u32, seed()).prop_map(
        move |(n_expert, k, ff_blocks, rows, seed)| FfnCase {
            fmt,
            n: 1,
            n_expert,
            k,
            blocks: gr,
            ff_blocks: ff_blocks * gr,
            rows,
            wave: Some(1),
            sorted: false,
            seed,
        },
    )
}

fn ffn_case(fmt: BlockFormat) -> impl Strategy<Value = FfnCase> {
    // K-quant rows come in 256-column super-blocks: one each, and fewer tokens and slots,
    // keep the host executor quick (its warp shuffles are thread barriers).
    let gr = fmt.group() as u32;
    let (max_blocks, max_ff, max_n, max_k): (u32, u32, u32, u32) =
        if gr > 1 { (1, 1, 1, 2) } else { (3, 2, 3, 3) };
    // Mostly capped launches: the host executor runs a thread per GPU thread.
    let wave = prop_oneof![1 => Just(None), 3 => (1..=4u32).prop_map(Some)];
    (
        1..=max_n,
        1..=5u32,
        1..=max_k,
        1..=max_blocks,
        1..=max_ff,
        prop_oneof![1..=12u32, Just(32u32), Just(33u32)],
        (wave, any::<bool>()),
        seed(),
    )
        .prop_map(
            move |(n, n_expert, k, blocks, ff_blocks, rows, (wave, sorted), seed)| FfnCase {
                fmt,
                n,
                n_expert,
                k: k.min(n_expert),
                blocks: blocks * gr,
                ff_blocks: ff_blocks * gr,
                rows,
                wave,
                sorted,
                seed,
            },
        )
}

/// A launch of `rows` one-row-per-warp groups over `n` block rows, capped at `wave` blocks
/// along x.
fn groups(dev: &dyn Device, rows: usize, n: usize, wave: Option<u32>) -> common::Dims {
    let all = dev
        .shapes()
        .matvec_multi(&[rows as u32], n as u32, u32::MAX / 64);
    common::Dims {
        grid_x: all.grid_x.min(wave.unwrap_or(u32::MAX)),
        ..all
    }
}

/// A random route of `n` tokens: `k` distinct experts of `n_expert` each, random weights. The
/// route tensor (`n × 2k`) and its slots' (expert, weight) in slot order.
fn random_route(g: &mut Gen, n: usize, n_expert: usize, k: usize) -> (Vec<f32>, Vec<(usize, f32)>) {
    let mut route = Vec::with_capacity(n * 2 * k);
    let mut slots = Vec::new();
    for _ in 0..n {
        let mut ids: Vec<usize> = (0..n_expert).collect();
        for i in 0..k {
            ids.swap(i, i + g.below(n_expert - i));
        }
        let w: Vec<f32> = (0..k).map(|_| g.uniform(0.05, 1.0)).collect();
        route.extend(ids[..k].iter().map(|&e| e as f32));
        route.extend(&w);
        slots.extend(ids[..k].iter().copied().zip(w));
    }
    (route, slots)
}

/// `moe_sort` on the device: checks `order` (each expert's slots ascending, experts in turn)
/// against a stable sort of `slots` by expert, and the token-tile table against each expert's
/// run cut every `moe_tile_n` positions, padded with `u32::MAX` to its bound. Returns the
/// `order` and `tiles` buffers.
fn sort_slots(
    dev: &mut dyn Device,
    route_b: &common::Buf,
    slots: &[(usize, f32)],
    k: usize,
    n_expert: usize,
) -> Result<(common::Buf, common::Buf), TestCaseError> {
    let n_slots = slots.len();
    let sh = dev.shapes();
    let (tile_n, max_tiles) = (
        sh.moe_tile_n(),
        sh.moe_gemm_tiles(n_slots as u32, n_expert as u32),
    );
    let order_b = poisoned::<u32>(dev, n_slots, 0xff);
    let tiles_b = poisoned::<u32>(dev, max_tiles as usize * MOE_TILE_WORDS, 0xa5);
    let args = [
        route_b.arg(),
        order_b.arg(),
        tiles_b.arg(),
        Arg::U32(n_slots as u32),
        Arg::U32(k as u32),
        Arg::U32(n_expert as u32),
        Arg::U32(tile_n),
        Arg::U32(max_tiles),
    ];
    dev.launch(
        names::kiln_moe_sort,
        dev.shapes().moe_sort(n_expert as u32, n_slots as u32),
        &args,
    );
    let got = download::<u32>(dev, &order_b);
    let mut want: Vec<u32> = (0..n_slots as u32).collect();
    want.sort_by_key(|&s| slots[s as usize].0);
    prop_assert_eq!(got, want, "{}: moe_sort order", dev.label());

    let mut want_tiles = Vec::new();
    let mut at = 0u32;
    for e in 0..n_expert {
        let end = at + slots.iter().filter(|s| s.0 == e).count() as u32;
        for first in (at..end).step_by(tile_n as usize) {
            want_tiles.extend([e as u32, first, end]);
        }
        at = end;
    }
    prop_assert!(
        want_tiles.len() <= max_tiles as usize * MOE_TILE_WORDS,
        "{} token tiles exceed the bound {max_tiles}",
        want_tiles.len() / MOE_TILE_WORDS
    );
    want_tiles.resize(max_tiles as usize * MOE_TILE_WORDS, u32::MAX);
    let got = download::<u32>(dev, &tiles_b);
    prop_assert_eq!(got, want_tiles, "{}: moe_sort token tiles", dev.label());
    Ok((order_b, tiles_b))
}

#[derive(Clone, Debug)]
struct SortCase {
    n: u32,
    n_expert: u32,
    k: u32,
    /// Route every slot to one of the first `hot` experts: long runs, several tiles each.
    hot: u32,
    seed: u64,
}

fn sort_case() -> impl Strategy<Value = SortCase> {
    (1..=300u32, 1..=40u32, 1..=8u32, 1..=4u32, seed()).prop_map(|(n, n_expert, k, hot, seed)| {
        let k = k.min(n_expert);
        SortCase {
            n,
            n_expert,
            k,
            hot: hot.max(k).min(n_expert),
            seed,
        }
    })
}

/// `moe_sort` alone over many slots (up to 2400): the order and the token tiles, with runs
/// long enough to span several tiles when `hot` experts take every slot.
fn moe_sort(dev: &mut dyn Device, c: &SortCase) -> Result<(), TestCaseError> {
    let (n, ne, k) = (c.n as usize, c.n_expert as usize, c.k as usize);
    let mut g = Gen::new(c.seed);
    let narrow = g.chance(0.5);
    let (route, slots) = random_route(&mut g, n, if narrow { c.hot as usize } else { ne }, k);
    let route_b = upload(dev, &route);
    sort_slots(dev, &route_b, &slots, k, ne).map(|_| ())
}

/// `moe_swiglu_split` and `moe_down_add_split` (or, `sorted`, their prefill forms) over a random route (distinct experts per
/// token, random weights), each against its float64 definition on the exact Q8_1 activations
/// its kernel read.
fn moe_ffn(dev: &mut dyn Device, c: &FfnCase) -> Result<(), TestCaseError> {
    let (n, ne, k) = (c.n as usize, c.n_expert as usize, c.k as usize);
    let (cols, ff) = (c.blocks as usize * QK, c.ff_blocks as usize * QK);
    let mut g = Gen::new(c.seed);
    let x = g.activations(n, cols);
    let (xq_b, xds_b, xq, xds) = common::quantize_q8_1(dev, &x, cols, n)?;
    let (route, slots) = random_route(&mut g, n, ne, k);
    let route_b = upload(dev, &route);
    let (gate, gq_b, gs_b) = common::split_weights(dev, &mut g, c.fmt, ne * ff, cols);
    let (up, uq_b, us_b) = common::split_weights(dev, &mut g, c.fmt, ne * ff, cols);
    let act_b = poisoned::<f32>(dev, n * k * ff, 0xff);
    let order_b = match c.sorted {
        true => Some(sort_slots(dev, &route_b, &slots, k, ne)?.0),
        false => None,
    };
    let mut args = vec![
        gq_b.arg(),
        gs_b.arg(),
        uq_b.arg(),
        us_b.arg(),
        xq_b.arg(),
        xds_b.arg(),
        route_b.arg(),
    ];
    match &order_b {
        Some(order) => {
            args.extend([order.arg(), act_b.arg()]);
            args.extend([
                Arg::U32(ff as u32),
                Arg::U32(cols as u32),
                Arg::U32(k as u32),
            ]);
            let dims = dev.shapes().moe_sorted((n * k) as u32, ff as u32);
            dev.launch(families::MOE_SWIGLU_SORTED[c.fmt as usize], dims, &args);
        }
        None => {
            args.extend([act_b.arg(), Arg::U32(ff as u32), Arg::U32(cols as u32)]);
            args.push(Arg::U32(k as u32));
            let entry = families::MOE_SWIGLU[c.fmt as usize];
            dev.launch(entry, groups(dev, ff, n * k, c.wave), &args);
        }
    }
    let act = download::<f32>(dev, &act_b);
    check_written(dev, "moe_swiglu output", &act)?;
    // Every expert's rows for every token, then each slot's expert picked out.
    let g_all = r::matvec_q8_1(c.fmt, &gate, ne * ff, cols, &xq, &xds);
    let u_all = r::matvec_q8_1(c.fmt, &up, ne * ff, cols, &xq, &xds);
    let (mut err, mut scale) = (0f64, 1e-30f64);
    for (s, &(e, _)) in slots.iter().enumerate() {
        let t = s / k;
        for i in 0..ff {
            let at = t * ne * ff + e * ff + i;
            let (gv, uv) = (g_all[at], u_all[at]);
            err += (act[s * ff + i] as f64 - gv / (1.0 + (-gv).exp()) * uv).abs();
            scale += (gv * uv).abs();
        }
    }
    check_err(dev, "moe_swiglu", err / scale, 2e-5)?;
    moe_down_part(dev, c, &mut g, &route_b, &slots, order_b.as_ref())
}

/// The down projection alone over a random route (decode-like widths, where the swiglu half
/// of [`moe_ffn`] would be slow on the host executor).
fn moe_down(dev: &mut dyn Device, c: &FfnCase) -> Result<(), TestCaseError> {
    let mut g = Gen::new(c.seed);
    let (route, slots) = random_route(&mut g, c.n as usize, c.n_expert as usize, c.k as usize);
    let route_b = upload(dev, &route);
    moe_down_part(dev, c, &mut g, &route_b, &slots, None)
}

/// `moe_down_add_split` (or, with `order_b`, `moe_down_sorted` + `moe_mix`) against its
/// float64 definition on the exact Q8_1 activations its kernel read.
fn moe_down_part(
    dev: &mut dyn Device,
    c: &FfnCase,
    g: &mut Gen,
    route_b: &common::Buf,
    slots: &[(usize, f32)],
    order_b: Option<&common::Buf>,
) -> Result<(), TestCaseError> {
    let (n, ne, k) = (c.n as usize, c.n_expert as usize, c.k as usize);
    let (ff, rows) = (c.ff_blocks as usize * QK, c.rows as usize);
    // Fresh activations of model-like size for the down projection: products of the random
    // test weights reach ~1e6, where a Q8_1 block's f16 d·Σq overflows (as it would in any
    // engine that stores it in f16).
    let a = g.activations(n * k, ff);
    let (aq_b, ads_b, aq, ads) = common::quantize_q8_1(dev, &a, ff, n * k)?;
    let (down, dq_b, ds_b) = common::split_weights(dev, g, c.fmt, ne * rows, ff);
    let x0 = g.normals(n * rows, 1.0);
    let res_b = upload(dev, &x0);
    let (dims_u32, k_arg) = (
        [Arg::U32(rows as u32), Arg::U32(ff as u32)],
        Arg::U32(k as u32),
    );
    let mut args = vec![
        dq_b.arg(),
        ds_b.arg(),
        aq_b.arg(),
        ads_b.arg(),
        route_b.arg(),
    ];
    match order_b {
        Some(order) => {
            // Per-slot outputs, then their mix into the residual.
            let y_b = poisoned::<f32>(dev, n * k * rows, 0xff);
            args.extend([order.arg(), y_b.arg()]);
            args.extend(dims_u32);
            args.push(k_arg);
            let dims = dev.shapes().moe_sorted((n * k) as u32, rows as u32);
            dev.launch(families::MOE_DOWN_SORTED[c.fmt as usize], dims, &args);
            let y = download::<f32>(dev, &y_b);
            check_written(dev, "moe_down_sorted output", &y)?;
            let len = (n * rows) as u32;
            let margs = [
                y_b.arg(),
                route_b.arg(),
                res_b.arg(),
                dims_u32[0],
                k_arg,
                Arg::U32(len),
            ];
            dev.launch(names::kiln_moe_mix, dev.shapes().flat(len), &margs);
        }
        None => {
            args.push(res_b.arg());
            args.extend(dims_u32);
            args.push(k_arg);
            let entry = families::MOE_DOWN_ADD[c.fmt as usize];
            dev.launch(entry, groups(dev, rows, n, c.wave), &args);
        }
    }
    let got = download::<f32>(dev, &res_b);
    check_written(dev, "moe_down_add output", &got)?;
    let d_all = r::matvec_q8_1(c.fmt, &down, ne * rows, ff, &aq, &ads);
    let d_abs = r::matvec_q8_1_abs(c.fmt, &down, ne * rows, ff, &aq, &ads);
    let mut want = r::widen(&x0);
    let mut mag: Vec<f64> = want.iter().map(|v| v.abs()).collect();
    for (s, &(e, w)) in slots.iter().enumerate() {
        let t = s / k;
        for i in 0..rows {
            let at = s * ne * rows + e * rows + i;
            want[t * rows + i] += w as f64 * d_all[at];
            mag[t * rows + i] += (w as f64 * d_abs[at]).abs();
        }
    }
    check_err(
        dev,
        "moe_down_add",
        r::err_vs_magnitude(&got, &want, &mag),
        1e-5,
    )
}

#[derive(Clone, Debug)]
struct GemmCase {
    fmt: BlockFormat,
    n: u32,
    n_expert: u32,
    k: u32,
    blocks: u32,
    /// Rows of each expert's matrix.
    rows: u32,
    /// Gate and up in one launch (activations per token, `order_div = k`), or the down
    /// projection (activations per slot, `order_div = 1`).
    gate_up: bool,
    seed: u64,
}

fn gemm_case(fmt: BlockFormat) -> impl Strategy<Value = GemmCase> {
    // Small: the host executor runs every mma as a warp exchange between OS threads.
    let gr = fmt.group() as u32;
    let max_blocks: u32 = if gr > 1 { 1 } else { 3 };
    // Mostly short runs (≤ 12 slots an expert: the later warp columns of a tile idle); some
    // long ones (up to 150 tokens over 1–2 experts): every warp column live, and runs of more
    // than one token tile (64 on sm_80/sm_121, 128 on sm_90).
    let shape = prop_oneof![
        4 => (1..=12u32, 1..=4u32, 1..=3u32),
        1 => (60..=150u32, 1..=2u32, Just(1u32)),
    ];
    (
        shape,
        1..=max_blocks,
        // 129: two row tiles of 128 (Hopper), the second one row.
        prop_oneof![4 => 1..=20u32, 1 => Just(129u32)],
        any::<bool>(),
        seed(),
    )
        .prop_map(
            move |((n, n_expert, k), blocks, rows, gate_up, seed)| GemmCase {
                fmt,
                n,
                n_expert,
                k: k.min(n_expert),
                blocks: blocks * gr,
                rows,
                gate_up,
                seed,
            },
        )
}

/// The grouped expert GEMM (`moe_mma_split`) after `moe_sort`: each slot's output row against
/// float64 on the f16 values the tensor cores multiply (each weight dequantized and rounded
/// once, each activation rounded), where only the f32 accumulation may differ, as for the
/// dense GEMM (`kernels_mma.rs`).
fn moe_gemm(dev: &mut dyn Device, c: &GemmCase) -> Result<(), TestCaseError> {
    let (n, ne, k) = (c.n as usize, c.n_expert as usize, c.k as usize);
    let (cols, rows) = (c.blocks as usize * QK, c.rows as usize);
    let mut g = Gen::new(c.seed);
    let (route, slots) = random_route(&mut g, n, ne, k);
    let route_b = upload(dev, &route);
    let (order_b, tiles_b) = sort_slots(dev, &route_b, &slots, k, ne)?;
    let (x_rows, div) = if c.gate_up { (n, k) } else { (n * k, 1) };
    let x = g.activations(x_rows, cols);
    let xh: Vec<u16> = x
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let xh_b = upload(dev, &xh);
    let n_mats = if c.gate_up { 2 } else { 1 };
    let mut args = Vec::with_capacity(13);
    let mut mats = Vec::new();
    for m in 0..2 {
        if m >= n_mats {
            args.extend([Arg::Ptr(0); 3]);
            continue;
        }
        let (gguf, qs_b, sc_b) = common::split_weights(dev, &mut g, c.fmt, ne * rows, cols);
        let y_b = poisoned::<f32>(dev, n * k * rows, 0xff);
        args.extend([qs_b.arg(), sc_b.arg(), y_b.arg()]);
        mats.push((gguf, y_b));
    }
    args.extend([
        Arg::U32(n_mats as u32),
        Arg::U32(rows as u32),
        xh_b.arg(),
        Arg::U32(cols as u32),
        order_b.arg(),
        Arg::U32(div as u32),
        tiles_b.arg(),
    ]);
    let (qs_words, staged) = common::gemm_words(c.fmt);
    let dims = dev.shapes().moe_mma(
        rows as u32,
        n_mats as u32,
        (n * k) as u32,
        ne as u32,
        qs_words,
        staged,
    );
    dev.launch(families::MOE_MMA[c.fmt as usize], dims, &args);
    let x16 = r::f16_values(&xh);
    for (m, (gguf, y_b)) in mats.iter().enumerate() {
        let y = download::<f32>(dev, y_b);
        check_written(dev, "moe_mma output", &y)?;
        let w16 = r::gemm_weights_f16(c.fmt, gguf, ne * rows, cols);
        // Every output of a small case; a spread sample (and the last) of a model-sized one.
        const CHECKED: usize = 8192;
        let total = slots.len() * rows;
        let picked: Vec<usize> = match total <= CHECKED {
            true => (0..total).collect(),
            false => (0..CHECKED)
                .map(|i| i * 7919 % total)
                .chain([total - 1])
                .collect(),
        };
        for at in picked {
            let (s, i) = (at / rows, at % rows);
            let e = slots[s].0;
            let xr = &x16[(s / div) * cols..(s / div + 1) * cols];
            let wr = &w16[(e * rows + i) * cols..(e * rows + i + 1) * cols];
            let (want, abs) = wr.iter().zip(xr).fold((0f64, 0f64), |(s, a), (&w, &x)| {
                (s + w * x, a + (w * x).abs())
            });
            // f32 accumulation of exact products over 2 mma steps per block.
            let bound = (2 * c.blocks as usize + 8) as f64 * 2f64.powi(-22) * abs + 1e-30;
            let got = y[s * rows + i] as f64;
            prop_assert!(
                (got - want).abs() <= bound,
                "{}: matrix {m} slot {s} (expert {e}) row {i}: {got} vs f64 {want} (bound {bound:.2e})",
                dev.label()
            );
        }
    }
    Ok(())
}

/// [`gemm_case`]'s shapes with few tokens and rows: a mat-vec launch is a block row per slot,
/// each a set of OS threads on the host executor.
fn f32x_case(fmt: BlockFormat) -> impl Strategy<Value = GemmCase> {
    gemm_case(fmt).prop_map(|c| GemmCase {
        n: c.n.min(6),
        rows: c.rows.min(33),
        ..c
    })
}

/// `moe_matvec_f32x` (the `--f32-activations` expert mat-vec) against float64 on the exact
/// weights and f32 activations: for every slot, its expert's rows times its token's row
/// (`div = k`, gate/up) or its own row (`div = 1`, down).
fn moe_matvec_f32x(dev: &mut dyn Device, c: &GemmCase) -> Result<(), TestCaseError> {
    let (n, ne, k) = (c.n as usize, c.n_expert as usize, c.k as usize);
    let (cols, rows) = (c.blocks as usize * QK, c.rows as usize);
    let mut g = Gen::new(c.seed);
    let (route, slots) = random_route(&mut g, n, ne, k);
    let (x_rows, div) = if c.gate_up { (n, k) } else { (n * k, 1) };
    let x = g.activations(x_rows, cols);
    let (gguf, qs_b, sc_b) = common::split_weights(dev, &mut g, c.fmt, ne * rows, cols);
    let (route_b, x_b) = (upload(dev, &route), upload(dev, &x));
    let y_b = poisoned::<f32>(dev, n * k * rows, 0xff);
    let args = [
        qs_b.arg(),
        sc_b.arg(),
        x_b.arg(),
        route_b.arg(),
        y_b.arg(),
        Arg::U32(rows as u32),
        Arg::U32(cols as u32),
        Arg::U32(k as u32),
        Arg::U32(div as u32),
    ];
    let dims = groups(dev, rows, n * k, Some(1 + (c.seed % 3) as u32));
    dev.launch(families::MOE_MATVEC_F32X[c.fmt as usize], dims, &args);
    let y = download::<f32>(dev, &y_b);
    check_written(dev, "moe_matvec_f32x output", &y)?;
    let w = r::dequantize(c.fmt, &gguf, ne * rows, cols);
    let xd = r::widen(&x);
    let (mut want, mut mag) = (Vec::new(), Vec::new());
    for (s, &(e, _)) in slots.iter().enumerate() {
        let xr = &xd[s / div * cols..(s / div + 1) * cols];
        for i in 0..rows {
            let wr = &w[(e * rows + i) * cols..(e * rows + i + 1) * cols];
            let (d, a) = wr.iter().zip(xr).fold((0f64, 0f64), |(d, a), (&w, &x)| {
                (d + w * x, a + (w * x).abs())
            });
            want.push(d);
            mag.push(a);
        }
    }
    check_err(
        dev,
        "moe_matvec_f32x",
        r::err_vs_magnitude(&y, &want, &mag),
        1e-5,
    )
}

kernel_properties! {
    // The per-format f32 block dot is `kernels_matvec.rs`'s (all six formats); here the routing
    // around it, on one legacy and one K format.
    host_moe_matvec_f32x_q4_0, gpu_moe_matvec_f32x_q4_0: f32x_case(BlockFormat::Q4_0) => moe_matvec_f32x;
    host_moe_matvec_f32x_q4k, gpu_moe_matvec_f32x_q4k: f32x_case(BlockFormat::Q4K) => moe_matvec_f32x;
    host_moe_sort, gpu_moe_sort: sort_case() => moe_sort;
    host_moe_mma_q4_0, gpu_moe_mma_q4_0: gemm_case(BlockFormat::Q4_0) => moe_gemm;
    host_moe_mma_q4_1, gpu_moe_mma_q4_1: gemm_case(BlockFormat::Q4_1) => moe_gemm;
    host_moe_mma_q8_0, gpu_moe_mma_q8_0: gemm_case(BlockFormat::Q8_0) => moe_gemm;
    host_moe_mma_q6k, gpu_moe_mma_q6k: gemm_case(BlockFormat::Q6K) => moe_gemm;
    host_moe_mma_q5k, gpu_moe_mma_q5k: gemm_case(BlockFormat::Q5K) => moe_gemm;
    host_moe_mma_q4k, gpu_moe_mma_q4k: gemm_case(BlockFormat::Q4K) => moe_gemm;
    host_moe_route, gpu_moe_route: route_case() => moe_route;
    host_matvec_f32, gpu_matvec_f32: router_case() => matvec_f32;
    host_moe_ffn_q4_0, gpu_moe_ffn_q4_0: ffn_case(BlockFormat::Q4_0) => moe_ffn;
    host_moe_down_wide_q4_0, gpu_moe_down_wide_q4_0: wide_ffn_case(BlockFormat::Q4_0) => moe_down;
    host_moe_down_wide_q8_0, gpu_moe_down_wide_q8_0: wide_ffn_case(BlockFormat::Q8_0) => moe_down;
    host_moe_down_wide_q4k, gpu_moe_down_wide_q4k: wide_ffn_case(BlockFormat::Q4K) => moe_down;
    host_moe_ffn_q4_1, gpu_moe_ffn_q4_1: ffn_case(BlockFormat::Q4_1) => moe_ffn;
    host_moe_ffn_q8_0, gpu_moe_ffn_q8_0: ffn_case(BlockFormat::Q8_0) => moe_ffn;
    host_moe_ffn_q6k, gpu_moe_ffn_q6k: ffn_case(BlockFormat::Q6K) => moe_ffn;
    host_moe_ffn_q5k, gpu_moe_ffn_q5k: ffn_case(BlockFormat::Q5K) => moe_ffn;
    host_moe_ffn_q4k, gpu_moe_ffn_q4k: ffn_case(BlockFormat::Q4K) => moe_ffn;
}

/// The grouped GEMM at model-like shapes (hundreds of tokens, up to 32 experts of up to 512
/// rows, up to 1024 columns, up to 8 experts per token): GPU only.
#[test]
fn gpu_moe_mma_large() {
    let formats = prop::sample::select(common::ALL_FORMATS.to_vec());
    let case = (
        formats,
        1..=512u32,
        2..=32u32,
        1..=8u32,
        1..=32u32,
        1..=512u32,
        any::<bool>(),
        seed(),
    )
        .prop_map(
            |(fmt, n, n_expert, k, blocks, rows, gate_up, seed)| GemmCase {
                fmt,
                n,
                n_expert,
                k: k.min(n_expert),
                blocks: blocks.next_multiple_of(fmt.group() as u32),
                rows,
                gate_up,
                seed,
            },
        );
    common::run_gpu("gpu_moe_mma_large", 16, case, moe_gemm);
}
