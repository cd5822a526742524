//! Properties of `kernels/attention.rs`: causal grouped-query attention over the f16 KV cache,
//! decode (one token) and prefill (several tokens after `pos0` cached ones).
//!
//! The cache is filled by the `kv_store` kernel, as the model does, so a case exercises the
//! pair. Two references: one over the f16 values the cache really holds (only f32 arithmetic
//! separates kernel and reference: ~1e-5), one over the unrounded K/V (the error f16 storage
//! costs: ~1e-3).
mod common;

use common::data::{Gen, head_dim, seed};
use common::reference as r;
use common::{Arg, Device, check_err, check_written, download, names, poisoned, upload};
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

/// GQA group sizes 1–4 (1 = plain multi-head), decode and prefill. The host executor pays
/// ~1 ms per warp shuffle round on two cores, so histories up to ~300 positions come with a
/// single KV head and token (≤ 4 blocks); short histories get the full head/token mix.
fn attn_case() -> impl Strategy<Value = AttnCase> {
    let short = (1..=2u32, 1..=4u32, head_dim(), 1..=2u32, 0..16u32);
    let long = (Just(1u32), 1..=4u32, head_dim(), Just(1u32), 16..300u32);
    let shape = prop_oneof![3 => short, 1 => long];
    let sharp = prop::sample::select(vec![1.0f32, 4.0]);
    (shape, 0..3u32, sharp, seed()).prop_map(|((kv_heads, group, head_dim, n, pos0), spare, sharpness, seed)| AttnCase {
        kv_heads,
        group,
        head_dim,
        n,
        pos0,
        spare,
        sharpness,
        seed,
    })
}

fn attention(dev: &mut dyn Device, c: &AttnCase) -> Result<(), TestCaseError> {
    let (kvh, hd, n) = (c.kv_heads as usize, c.head_dim as usize, c.n as usize);
    let heads = kvh * c.group as usize;
    let total = c.pos0 as usize + n; // tokens in the cache after this step
    let max_ctx = total + c.spare as usize;
    let mut g = Gen::new(c.seed);
    let q = g.normals(n * heads * hd, 1.0);
    let k = g.normals(total * kvh * hd, 1.0);
    let vs = g.magnitude(-1.0, 1.0);
    let v = g.normals(total * kvh * hd, vs);

    // Store all `total` tokens with one kv_store each for K and V, into NaN-poisoned caches:
    // a read of a slot never stored turns the output NaN.
    let mut caches = Vec::new();
    for src in [&k, &v] {
        let sb = upload(dev, src);
        let cb = poisoned::<u16>(dev, kvh * max_ctx * hd, 0xff);
        let threads = (total * kvh * hd) as u32;
        let zero = upload(dev, &[0u32]);
        let args = [sb.arg(), cb.arg(), Arg::U32(c.kv_heads), Arg::U32(c.head_dim), Arg::U32(max_ctx as u32), zero.arg(), Arg::U32(threads)];
        dev.launch(names::kiln_kv_store, dev.shapes().flat(threads), &args);
        caches.push(cb);
    }
    let (kb, vb) = (caches[0], caches[1]);

    let qb = upload(dev, &q);
    let pos = upload(dev, &[c.pos0]);
    let ob = poisoned::<f32>(dev, n * heads * hd, 0xff);
    let scale = c.sharpness / (hd as f32).sqrt();
    let dims = dev.shapes().attention(heads as u32, c.n, total as u32);
    let args = [
        qb.arg(),
        kb.arg(),
        vb.arg(),
        ob.arg(),
        Arg::U32(heads as u32),
        Arg::U32(c.kv_heads),
        Arg::U32(c.head_dim),
        Arg::U32(max_ctx as u32),
        pos.arg(),
        Arg::F32(scale),
    ];
    dev.launch(names::kiln_attention, dims, &args);
    let out = download::<f32>(dev, &ob);
    check_written(dev, "attention", &out)?;

    let (k16, v16) = (r::f16_values(&download::<u16>(dev, &kb)), r::f16_values(&download::<u16>(dev, &vb)));
    let exact = r::attention(&q, &k16, &v16, heads, kvh, hd, max_ctx, c.pos0 as usize, scale as f64);
    check_err(dev, "attention vs f16 cache values", r::rel_err(&out, &exact), 2e-5)?;

    // The same layout with the unrounded K/V (slots past `total` are never read).
    let mut kf = vec![0.0; kvh * max_ctx * hd];
    let mut vf = vec![0.0; kvh * max_ctx * hd];
    for (i, (&kv, &vv)) in k.iter().zip(&v).enumerate() {
        let (d, h, t) = (i % hd, i / hd % kvh, i / (hd * kvh));
        kf[(h * max_ctx + t) * hd + d] = kv as f64;
        vf[(h * max_ctx + t) * hd + d] = vv as f64;
    }
    let raw = r::attention(&q, &kf, &vf, heads, kvh, hd, max_ctx, c.pos0 as usize, scale as f64);
    check_err(dev, "attention vs unrounded K/V", r::rel_err(&out, &raw), 2e-3 * c.sharpness as f64)
}

kernel_properties! {
    host_attention, gpu_attention: attn_case() => attention;
}

/// Long contexts (up to 4096 cached positions: 16 KiB of scores in shared memory), head_dim up
/// to the kernel's maximum (256) and prefill chunks: GPU only. Sizes keep the float64 reference
/// (heads × tokens × context × head_dim) to about a second per case.
#[test]
fn gpu_attention_long_context() {
    let case = (1..=4u32, 1..=4u32, prop::sample::select(vec![64u32, 128, 256]), 1..=8u32, 0..4096u32, seed()).prop_map(
        |(kv_heads, group, head_dim, n, pos0, seed)| AttnCase { kv_heads, group, head_dim, n, pos0, spare: 7, sharpness: 1.0, seed },
    );
    common::run_gpu("gpu_attention_long_context", 32, case, attention);
}
