//! Properties of `kernels/attention.rs`: causal grouped-query split-KV attention over the f16
//! KV cache, decode (one token) and prefill (several tokens after `pos0` cached ones).
//!
//! The cache is filled by the `kv_store` kernel, as the model does, so a case exercises the
//! pair; both read the position from a device buffer. Two references: one over the f16 values the
//! cache really holds (only f32 arithmetic separates kernel and reference: ~1e-5), one over the
//! unrounded K/V (the error f16 storage costs: ~1e-3). Caches, scratch and output start as NaN,
//! so a read of a slot never stored, or a partial never written, shows.
//!
//! Shapes to reach: histories crossing chunk boundaries (`ATTN_CHUNK` is 128 or 256), caches
//! much larger than the history (most splits empty), groups larger than one block's
//! `MAX_GROUP` (slices), and prefills over caches so large that the splits are capped to
//! `ATTN_MAX_PARTIALS` per head and span several chunks each.
mod common;

use common::data::{Gen, head_dim, seed};
use common::reference as r;
use common::{
    Arg, Buf, Device, check_err, check_written, download, names, poisoned, same_bits, upload,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct AttnCase {
    kv_heads: u32,
    group: u32,
    head_dim: u32,
    n: u32,
    pos0: u32,
    /// Cache slots past the last token (never read).
    spare: u32,
    /// Logit scale multiplier over 1/sqrt(head_dim): >1 makes the softmax peaky.
    sharpness: f32,
    seed: u64,
}

/// Cases from strategies for the shape `(kv_heads, group, head_dim, n, pos0)`, the spare cache
/// slots and the sharpness, each with its own seed.
fn cases(
    shape: impl Strategy<Value = (u32, u32, u32, u32, u32)>,
    spare: impl Strategy<Value = u32>,
    sharp: impl Strategy<Value = f32>,
) -> impl Strategy<Value = AttnCase> {
    (shape, spare, sharp, seed()).prop_map(
        |((kv_heads, group, head_dim, n, pos0), spare, sharpness, seed)| AttnCase {
            kv_heads,
            group,
            head_dim,
            n,
            pos0,
            spare,
            sharpness,
            seed,
        },
    )
}

/// GQA group sizes 1–6 (1 = plain multi-head, 5 and 6 take two blocks per group), decode and
/// prefill. The host executor pays for every warp shuffle round, so histories past the first
/// chunks (up to 600 positions: several chunk boundaries) come with one KV head and token;
/// short histories get the full head/token mix. A quarter of the cases have a cache thousands
/// of positions larger than the history.
fn attn_case() -> impl Strategy<Value = AttnCase> {
    let short = (1..=2u32, 1..=6u32, head_dim(), 1..=3u32, 0..16u32);
    let long = (Just(1u32), 1..=4u32, head_dim(), Just(1u32), 16..600u32);
    let shape = prop_oneof![3 => short, 1 => long];
    let spare = prop_oneof![3 => 0..3u32, 1 => 1000..3000u32];
    let sharp = prop::sample::select(vec![1.0f32, 4.0]);
    cases(shape, spare, sharp)
}

/// Prefill of 2–4 tokens into a cache of ~70k positions: `tokens × chunks` is over the 1024
/// partials per head every policy allows, so splits of several chunks each (Spark: from 4
/// tokens on). Histories up to 700 cross split boundaries.
fn capped_case() -> impl Strategy<Value = AttnCase> {
    (
        1..=3u32,
        prop::sample::select(vec![32u32, 64]),
        2..=4u32,
        0..700u32,
        seed(),
    )
        .prop_map(|(group, head_dim, n, pos0, seed)| AttnCase {
            kv_heads: 1,
            group,
            head_dim,
            n,
            pos0,
            spare: 70_000,
            sharpness: 1.0,
            seed,
        })
}

/// The first `rows` positions of each head of a `kv_heads × max_ctx × head_dim` cache.
fn history<T: Copy>(cache: &[T], max_ctx: usize, rows: usize, head_dim: usize) -> Vec<T> {
    cache
        .chunks(max_ctx * head_dim)
        .flat_map(|h| &h[..rows * head_dim])
        .copied()
        .collect()
}

/// A case's inputs on the device: queries, and the whole history stored by one `kv_store` into
/// NaN-poisoned caches (a read of a slot never stored turns the output NaN).
struct Filled {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qb: Buf,
    kb: Buf,
    vb: Buf,
    pos: Buf,
    heads: usize,
    total: usize,
    max_ctx: usize,
    scale: f32,
}

fn fill(dev: &mut dyn Device, c: &AttnCase) -> Filled {
    let (kvh, hd, n) = (c.kv_heads as usize, c.head_dim as usize, c.n as usize);
    let heads = kvh * c.group as usize;
    let total = c.pos0 as usize + n; // tokens in the cache after this step
    let max_ctx = total + c.spare as usize;
    let mut g = Gen::new(c.seed);
    let q = g.normals(n * heads * hd, 1.0);
    let k = g.normals(total * kvh * hd, 1.0);
    let vs = g.magnitude(-1.0, 1.0);
    let v = g.normals(total * kvh * hd, vs);
    let zero = upload(dev, &[0u32]);
    let (ks, vs_b) = (upload(dev, &k), upload(dev, &v));
    let kb = poisoned::<u16>(dev, kvh * max_ctx * hd, 0xff);
    let vb = poisoned::<u16>(dev, kvh * max_ctx * hd, 0xff);
    let threads = (total * kvh * hd) as u32;
    let args = [
        ks.arg(),
        vs_b.arg(),
        kb.arg(),
        vb.arg(),
        Arg::U32(c.kv_heads),
        Arg::U32(c.head_dim),
        Arg::U32(max_ctx as u32),
        zero.arg(),
        Arg::U32(threads),
    ];
    dev.launch(names::kiln_kv_store, dev.shapes().flat(threads), &args);
    let (qb, pos) = (upload(dev, &q), upload(dev, &[c.pos0]));
    let scale = c.sharpness / (hd as f32).sqrt();
    Filled {
        q,
        k,
        v,
        qb,
        kb,
        vb,
        pos,
        heads,
        total,
        max_ctx,
        scale,
    }
}

/// The float64 attention over the f16 values the cache really holds.
fn exact(dev: &mut dyn Device, c: &AttnCase, f: &Filled) -> Vec<f64> {
    let (kvh, hd) = (c.kv_heads as usize, c.head_dim as usize);
    // References over the history only (`total` positions per head), so a huge cache costs nothing.
    let k16 = r::f16_values(&history(
        &download::<u16>(dev, &f.kb),
        f.max_ctx,
        f.total,
        hd,
    ));
    let v16 = r::f16_values(&history(
        &download::<u16>(dev, &f.vb),
        f.max_ctx,
        f.total,
        hd,
    ));
    r::attention(
        &f.q,
        &k16,
        &v16,
        f.heads,
        kvh,
        hd,
        f.total,
        c.pos0 as usize,
        f.scale as f64,
    )
}

/// Which decode attention kernels a case runs.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// Split-KV, pass 1 in f32, then the combine.
    F32,
    /// Split-KV, pass 1 on tensor cores (`flash::attention_chunks_mma`), then the combine.
    Mma,
    /// One launch, one split per KV head over the whole history (`flash::attention_short_mma`).
    Short,
}

fn attention(dev: &mut dyn Device, c: &AttnCase) -> Result<(), TestCaseError> {
    split_kv(dev, c, Path::F32)
}

fn attention_mma(dev: &mut dyn Device, c: &AttnCase) -> Result<(), TestCaseError> {
    split_kv(dev, c, Path::Mma)
}

fn attention_short(dev: &mut dyn Device, c: &AttnCase) -> Result<(), TestCaseError> {
    split_kv(dev, c, Path::Short)
}

/// The two split-KV passes, pass 1 in f32 or on tensor cores, or the one-launch short form;
/// the tensor-core steps' f16 operands (queries pre-scaled, probabilities in [0, 1]) put them
/// ~1e-3 from the float64 reference over the cache's values, more when the softmax is peaky,
/// as the flash prefill kernel.
fn split_kv(dev: &mut dyn Device, c: &AttnCase, path: Path) -> Result<(), TestCaseError> {
    let mma = path != Path::F32;
    let f = fill(dev, c);
    let (kvh, hd, n) = (c.kv_heads as usize, c.head_dim as usize, c.n as usize);
    let (heads, total, max_ctx, scale) = (f.heads, f.total, f.max_ctx, f.scale);
    let (qb, kb, vb, pos) = (&f.qb, &f.kb, &f.vb, &f.pos);
    let (k, v) = (&f.k, &f.v);
    let (h32, ctx32) = (heads as u32, max_ctx as u32);
    let ob = poisoned::<f32>(dev, n * heads * hd, 0xff);
    let width = n * heads * hd;
    let (xq, xds) = (
        poisoned::<i8>(dev, width, 0x80),
        poisoned::<f32>(dev, width / 16, 0xff),
    );
    let shape = [
        Arg::U32(h32),
        Arg::U32(c.kv_heads),
        Arg::U32(c.head_dim),
        Arg::U32(ctx32),
        Arg::F32(scale),
    ];
    if path == Path::Short {
        let dims = dev
            .shapes()
            .attention_short_mma(h32, c.kv_heads, c.head_dim, c.n);
        let io = [
            qb.arg(),
            kb.arg(),
            vb.arg(),
            ob.arg(),
            xq.arg(),
            xds.arg(),
            pos.arg(),
        ];
        dev.launch(
            names::kiln_attention_short_mma,
            dims,
            &[&io[..], &shape[..]].concat(),
        );
    } else {
        let sh = dev.shapes();
        let (pass1, dims) = match path {
            Path::F32 => (
                names::kiln_attention_chunks,
                sh.attention_chunks(h32, c.kv_heads, c.head_dim, c.n, ctx32),
            ),
            _ => (
                names::kiln_attention_chunks_mma,
                sh.attention_chunks_mma(h32, c.kv_heads, c.head_dim, c.n, ctx32),
            ),
        };
        let scratch = sh.attention_scratch(h32, c.head_dim, c.n, ctx32);
        let part = poisoned::<f32>(dev, scratch, 0xff);
        let io = [qb.arg(), kb.arg(), vb.arg(), part.arg(), pos.arg()];
        dev.launch(pass1, dims, &[&io[..], &shape[..]].concat());
        let dims = dev.shapes().attention_combine(h32, c.head_dim, c.n);
        dev.launch(
            names::kiln_attention_combine,
            dims,
            &[
                part.arg(),
                ob.arg(),
                xq.arg(),
                xds.arg(),
                pos.arg(),
                Arg::U32(h32),
                Arg::U32(c.head_dim),
                Arg::U32(ctx32),
            ],
        );
    }
    let out = download::<f32>(dev, &ob);
    check_written(dev, "attention", &out)?;
    // Its Q8_1 blocks are what quantize_q8_1 makes of the output, bit for bit.
    let (q_ref, ds_ref) = (
        poisoned::<i8>(dev, width, 0x80),
        poisoned::<f32>(dev, width / 16, 0xff),
    );
    let row = (heads * hd) as u32;
    dev.launch(
        names::kiln_quantize_q8_1,
        dev.shapes().quantize_q8_1(row, c.n),
        &[ob.arg(), q_ref.arg(), ds_ref.arg(), Arg::U32(row)],
    );
    prop_assert!(
        download::<i8>(dev, &xq) == download::<i8>(dev, &q_ref),
        "{}: Q8_1 codes of the output",
        dev.label()
    );
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    prop_assert!(
        bits(download::<f32>(dev, &xds)) == bits(download::<f32>(dev, &ds_ref)),
        "{}: Q8_1 scales of the output",
        dev.label()
    );

    let err = r::rel_err(&out, &exact(dev, c, &f));
    let tol = if mma { 2e-3 * c.sharpness as f64 } else { 2e-5 };
    check_err(dev, "attention vs f16 cache values", err, tol)?;
    if mma {
        return Ok(()); // its operand roundings dominate the storage error checked below
    }

    // The same layout with the unrounded K/V (stored token-major: `total × kv_heads × head_dim`).
    let mut kf = vec![0.0; kvh * total * hd];
    let mut vf = vec![0.0; kvh * total * hd];
    for (i, (&kv, &vv)) in k.iter().zip(v).enumerate() {
        let (d, h, t) = (i % hd, i / hd % kvh, i / (hd * kvh));
        kf[(h * total + t) * hd + d] = kv as f64;
        vf[(h * total + t) * hd + d] = vv as f64;
    }
    let raw = r::attention(
        &f.q,
        &kf,
        &vf,
        heads,
        kvh,
        hd,
        total,
        c.pos0 as usize,
        scale as f64,
    );
    check_err(
        dev,
        "attention vs unrounded K/V",
        r::rel_err(&out, &raw),
        2e-3 * c.sharpness as f64,
    )
}

/// [`attn_case`] at the head dimensions the tensor-core kernels take (64, 128).
fn mma_case() -> impl Strategy<Value = AttnCase> {
    attn_case().prop_map(|c| AttnCase {
        head_dim: if c.head_dim <= 64 { 64 } else { 128 },
        ..c
    })
}

kernel_properties! {
    host_attention, gpu_attention: attn_case() => attention;
    host_attention_mma, gpu_attention_mma: mma_case() => attention_mma;
    host_attention_short, gpu_attention_short: mma_case() => attention_short;
}

#[test]
fn host_attention_capped_splits() {
    common::run_host(3, capped_case(), attention);
}

#[test]
fn gpu_attention_capped_splits() {
    common::run_gpu("gpu_attention_capped_splits", 32, capped_case(), attention);
}

/// [`capped_case`] for the tensor-core pass 1: a split of several chunks takes several rounds
/// of its shared-memory tile.
fn capped_mma_case() -> impl Strategy<Value = AttnCase> {
    capped_case().prop_map(|c| AttnCase { head_dim: 64, ..c })
}

#[test]
fn host_attention_mma_capped_splits() {
    common::run_host(3, capped_mma_case(), attention_mma);
}

#[test]
fn gpu_attention_mma_capped_splits() {
    let case = capped_mma_case();
    common::run_gpu("gpu_attention_mma_capped_splits", 32, case, attention_mma);
}

/// Long contexts (up to 4096 cached positions, in caches up to 40k positions: the model's
/// largest), head dimensions from `dims`, groups up to 8 (two blocks per group past
/// `MAX_GROUP`) and prefill chunks: GPU only. Sizes keep the float64 reference (heads × tokens ×
/// context × head_dim) to about a second per case.
fn long_case(dims: Vec<u32>) -> impl Strategy<Value = AttnCase> {
    let shape = (
        1..=4u32,
        1..=8u32,
        prop::sample::select(dims),
        1..=8u32,
        0..4096u32,
    );
    let spare = prop::sample::select(vec![7u32, 1000, 36_000]);
    cases(shape, spare, Just(1.0f32))
}

#[test]
fn gpu_attention_long_context() {
    let case = long_case(vec![64, 96, 128, 256]); // up to the f32 kernel's maximum
    common::run_gpu("gpu_attention_long_context", 32, case, attention);
}

/// The same for the tensor-core pass 1 (head_dim 64, 128).
#[test]
fn gpu_attention_mma_long_context() {
    let case = long_case(vec![64, 128]);
    common::run_gpu("gpu_attention_mma_long_context", 32, case, attention_mma);
}

/// Prefill chunks for the tensor-core kernel (`kernels/flash.rs`): up to 150 tokens (three
/// query tiles, rows past the end of the last) after up to 150 cached ones (K/V tiles crossing
/// the causal diagonal at every offset), head_dim 64 and 128, groups 1–4.
fn flash_case() -> impl Strategy<Value = AttnCase> {
    let shape = (
        1..=2u32,
        1..=4u32,
        prop::sample::select(vec![64u32, 128]),
        1..=150u32,
        0..150u32,
    );
    let spare = prop_oneof![3 => 0..3u32, 1 => 100..300u32];
    let sharp = prop::sample::select(vec![1.0f32, 4.0]);
    cases(shape, spare, sharp)
}

/// Its operands are f16 (queries pre-scaled, probabilities in [0, 1]) with f32 accumulation:
/// ~1e-3 from the float64 reference, more when the softmax is peaky.
fn flash(dev: &mut dyn Device, c: &AttnCase) -> Result<(), TestCaseError> {
    let f = fill(dev, c);
    let width = c.n as usize * f.heads * c.head_dim as usize;
    let ob = poisoned::<f32>(dev, width, 0xff);
    let h32 = f.heads as u32;
    let args = [
        f.qb.arg(),
        f.kb.arg(),
        f.vb.arg(),
        ob.arg(),
        f.pos.arg(),
        Arg::U32(c.n),
        Arg::U32(h32),
        Arg::U32(c.kv_heads),
        Arg::U32(c.head_dim),
        Arg::U32(f.max_ctx as u32),
        Arg::F32(f.scale),
    ];
    dev.launch(
        names::kiln_flash_prefill,
        dev.shapes().flash_prefill(h32, c.head_dim, c.n),
        &args,
    );
    let out = download::<f32>(dev, &ob);
    check_written(dev, "flash attention", &out)?;
    let err = r::rel_err(&out, &exact(dev, c, &f));
    check_err(
        dev,
        "flash attention vs f16 cache values",
        err,
        2e-3 * c.sharpness as f64,
    )
}

#[test]
fn host_flash_prefill() {
    common::run_host(6, flash_case(), flash);
}

#[test]
fn gpu_flash_prefill() {
    common::run_gpu("gpu_flash_prefill", 128, flash_case(), flash);
}

proptest! {
    /// `live_span`, which pass 1 and pass 2 both derive a token's splits from: whole block
    /// steps, never past the static span, never more splits than the grid has, and the splits
    /// cover the token's history — for every policy, head size and cache.
    #[test]
    fn live_span_splits_cover_history_within_grid(
        max_ctx in 1..200_000u32,
        n in 1..=64u32,
        hd in head_dim(),
        at in 0.0..1.0f64,
    ) {
        fn check<P: policies::TargetPolicy>(max_ctx: u32, n: u32, hd: u32, at: f64) -> Result<(), TestCaseError> {
            use kernels_gpu::kernels::attention::{chunk_slots, kv_splits, live_span};
            let (splits, span) = kv_splits::<P>(n, max_ctx);
            let len = 1 + ((max_ctx - 1) as f64 * at) as u32;
            let live = live_span::<P>(len, splits, span, hd);
            prop_assert!(live <= span, "{}: live span {live} over the static {span}", P::NAME);
            prop_assert!(live.is_multiple_of(chunk_slots::<P>(hd)) || live == span, "{}: span {live} is not whole steps", P::NAME);
            prop_assert!(len.div_ceil(live) <= splits, "{}: {len} positions need {} splits of {live}, the grid has {splits}", P::NAME, len.div_ceil(live));
            Ok(())
        }
        check::<policies::Ampere>(max_ctx, n, hd, at)?;
        check::<policies::Hopper>(max_ctx, n, hd, at)?;
        check::<policies::SparkGb10>(max_ctx, n, hd, at)?;
    }
}

/// One decode token for the short attention with `rope_store` folded in: GQA groups 1–6 (5
/// and 6: two slices per KV head, only the first stores the cache row), both head dimensions
/// the tensor-core kernels take, histories inside one tile round (any policy's: 64 positions),
/// QK-norm or not, NeoX or interleaved pairs, full or half rotary, RoPE factors or not.
#[derive(Clone, Debug)]
struct ShortRopeCase {
    kv_heads: u32,
    group: u32,
    head_dim: u32,
    pos: u32,
    norm: bool,
    neox: bool,
    partial: bool,
    factors: bool,
    seed: u64,
}

fn short_rope_case() -> impl Strategy<Value = ShortRopeCase> {
    (
        (
            1..=2u32,
            1..=6u32,
            prop::sample::select(vec![64u32, 128]),
            0..64u32,
        ),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        seed(),
    )
        .prop_map(
            |((kv_heads, group, head_dim, pos), (norm, neox, partial, factors), seed)| {
                ShortRopeCase {
                    kv_heads,
                    group,
                    head_dim,
                    pos,
                    norm,
                    neox,
                    partial,
                    factors,
                    seed,
                }
            },
        )
}

/// `attention_short_rope_mma` gives, bit for bit, what `rope_store` then `attention_short_mma`
/// give: the output, its Q8_1 blocks, and both caches (the new row stored, every other slot as
/// it was: history or poison).
fn short_rope(dev: &mut dyn Device, c: &ShortRopeCase) -> Result<(), TestCaseError> {
    let (kvh, hd) = (c.kv_heads as usize, c.head_dim as usize);
    let heads = kvh * c.group as usize;
    let max_ctx = c.pos as usize + 1 + 5;
    let rot = if c.partial {
        c.head_dim / 2
    } else {
        c.head_dim
    };
    let mut g = Gen::new(c.seed);
    let (q, k, v) = (
        g.normals(heads * hd, 1.0),
        g.normals(kvh * hd, 1.0),
        g.normals(kvh * hd, 1.0),
    );
    let (qn, kn): (Vec<f32>, Vec<f32>) = (
        (0..hd).map(|_| g.normal() + 0.5).collect(),
        (0..hd).map(|_| g.normal() + 0.5).collect(),
    );
    let factors: Vec<f32> = (0..rot / 2).map(|_| g.uniform(1.0, 8.0)).collect();
    // The history: random f16 at positions before `pos`, poison (NaN) at and after it.
    let cache = |g: &mut Gen| -> Vec<u16> {
        (0..kvh * max_ctx * hd)
            .map(|i| {
                let p = i / hd % max_ctx;
                if p < c.pos as usize {
                    let x = g.normal();
                    g.f16_bits(x)
                } else {
                    0xffff
                }
            })
            .collect()
    };
    let (kc0, vc0) = (cache(&mut g), cache(&mut g));
    let (qb, kb, vb, qnb, knb, fb) = (
        upload(dev, &q),
        upload(dev, &k),
        upload(dev, &v),
        upload(dev, &qn),
        upload(dev, &kn),
        upload(dev, &factors),
    );
    let pos = upload(dev, &[c.pos]);
    let (h32, ctx32) = (heads as u32, max_ctx as u32);
    let scale = 1.0 / (hd as f32).sqrt();
    let rope = [
        Arg::U32(rot),
        Arg::U32(ctx32),
        Arg::F32(1e6f32.log2()),
        if c.factors { fb.arg() } else { Arg::Ptr(0) },
        Arg::U32(c.neox as u32),
        Arg::U32(c.norm as u32),
        Arg::F32(1e-6),
    ];
    let outputs = |dev: &mut dyn Device| {
        (
            poisoned::<f32>(dev, heads * hd, 0xff),
            poisoned::<i8>(dev, heads * hd, 0x80),
            poisoned::<f32>(dev, heads * hd / 16, 0xff),
        )
    };

    // The two launches.
    let (kc, vc) = (upload(dev, &kc0), upload(dev, &vc0));
    let q_out = poisoned::<f32>(dev, heads * hd, 0xff);
    dev.launch(
        names::kiln_rope_store,
        dev.shapes().rope_store(h32, c.kv_heads, 1),
        &[&[
            qb.arg(),
            kb.arg(),
            vb.arg(),
            qnb.arg(),
            knb.arg(),
            q_out.arg(),
            kc.arg(),
            vc.arg(),
            Arg::U32(h32),
            Arg::U32(c.kv_heads),
            Arg::U32(c.head_dim),
            rope[0],
            Arg::U32(ctx32),
            pos.arg(),
            rope[2],
            rope[3],
            rope[4],
            rope[5],
            rope[6],
        ][..]]
        .concat(),
    );
    let (ob, xq, xds) = outputs(dev);
    dev.launch(
        names::kiln_attention_short_mma,
        dev.shapes()
            .attention_short_mma(h32, c.kv_heads, c.head_dim, 1),
        &[
            q_out.arg(),
            kc.arg(),
            vc.arg(),
            ob.arg(),
            xq.arg(),
            xds.arg(),
            pos.arg(),
            Arg::U32(h32),
            Arg::U32(c.kv_heads),
            Arg::U32(c.head_dim),
            Arg::U32(ctx32),
            Arg::F32(scale),
        ],
    );

    // The fused launch, on caches with the same history.
    let (kf, vf) = (upload(dev, &kc0), upload(dev, &vc0));
    let (of, xqf, xdsf) = outputs(dev);
    dev.launch(
        names::kiln_attention_short_rope_mma,
        dev.shapes()
            .attention_short_rope_mma(h32, c.kv_heads, c.head_dim),
        &[
            &[
                qb.arg(),
                kb.arg(),
                vb.arg(),
                qnb.arg(),
                knb.arg(),
                kf.arg(),
                vf.arg(),
                of.arg(),
                xqf.arg(),
                xdsf.arg(),
                pos.arg(),
                Arg::U32(h32),
                Arg::U32(c.kv_heads),
                Arg::U32(c.head_dim),
            ][..],
            &rope[..],
            &[Arg::F32(scale)],
        ]
        .concat(),
    );

    let out = download::<f32>(dev, &of);
    check_written(dev, "fused short attention", &out)?;
    same_bits::<f32>(dev, "outputs", &of, &ob)?;
    same_bits::<i8>(dev, "Q8_1 codes", &xqf, &xq)?;
    same_bits::<f32>(dev, "Q8_1 scales", &xdsf, &xds)?;
    same_bits::<u16>(dev, "key caches", &kf, &kc)?;
    same_bits::<u16>(dev, "value caches", &vf, &vc)?;
    let label = dev.label();
    // The new row really was stored (not left as poison by both paths).
    let row = |p: usize| (p * hd)..(p * hd + hd);
    prop_assert!(
        download::<u16>(dev, &kf)[row(c.pos as usize)]
            .iter()
            .all(|&h| h != 0xffff),
        "{}: the new key row was not stored",
        label
    );
    Ok(())
}

kernel_properties! {
    host_attention_short_rope, gpu_attention_short_rope: short_rope_case() => short_rope;
}
