//! Attention over the KV cache: flash prefill, the one-launch short-history decode, and
//! split-KV (pass 1 into partials, then the combine that also emits Q8_1 for the o projection).

use anyhow::{Result, ensure};
use kernels_gpu::entries::names;
use kernels_gpu::kernels::flash;
use kernels_gpu::kernels::launch::Dims;

use super::{Cuda, CudaKvCache, CudaTensor, FLASH_MIN_TOKENS, to_u32};
use crate::backend::{Attention, KvSpec};
use crate::cuda::Arg;
use kernels_gpu::kernels::attention::MAX_HEAD_DIM;

impl Cuda {
    /// Split-KV attention of `q` over `layer` of the cache (already holding this step's keys
    /// and values): pass 1 into a scratch of partials, pass 2 into the output.
    pub(super) fn attend_cached(
        &self,
        cache: &CudaKvCache,
        layer: usize,
        q: &CudaTensor,
        pos: usize,
        pos_d: Arg,
        attn: &Attention,
    ) -> Result<CudaTensor> {
        let sh = self.gpu.shapes();
        let (heads, kv_heads, head_dim) = (
            to_u32(attn.n_head, "heads")?,
            to_u32(attn.n_kv_head, "kv heads")?,
            to_u32(attn.head_dim, "head_dim")?,
        );
        let (tokens, max_ctx) = (
            to_u32(q.rows, "tokens")?,
            to_u32(cache.spec.max_seq, "context")?,
        );
        let (k, v) = (cache.k[layer].arg(), cache.v[layer].arg());
        // The trailing parameters every attention kernel shares.
        let shape = [
            Arg::U32(heads),
            Arg::U32(kv_heads),
            Arg::U32(head_dim),
            Arg::U32(max_ctx),
            Arg::F32(attn.scale),
        ];
        // Prefill chunks: tensor-core attention, K/V read once per 64 tokens instead of once
        // per token. Its f16 operands are for the default mode; f32-activation mode keeps the
        // f32 split-KV kernels.
        if tokens >= FLASH_MIN_TOKENS && flash::flash_supports(head_dim) && !self.f32_activations {
            let out = self.tensor(q.rows, attn.n_head * attn.head_dim)?;
            let args = [q.arg(), k, v, out.arg(), pos_d, Arg::U32(tokens)];
            self.gpu.launch(
                names::kiln_flash_prefill,
                sh.flash_prefill(heads, head_dim, tokens),
                &[&args[..], &shape[..]].concat(),
            )?;
            return Ok(out);
        }
        let mma = sh.attention_chunks_mma(heads, kv_heads, head_dim, tokens, max_ctx);
        let on_tensor_cores = self.decode_attention_mma(head_dim, mma);
        if on_tensor_cores && self.short_history(pos, q.rows) {
            // One launch: a split per KV head over the whole (short) history.
            let mut out = self.tensor(q.rows, attn.n_head * attn.head_dim)?;
            let (xq, xds) = self.q8_buffers(q.rows, attn.n_head * attn.head_dim)?;
            self.gpu.launch(
                names::kiln_attention_short_mma,
                sh.attention_short_mma(heads, kv_heads, head_dim, tokens),
                &[
                    &[q.arg(), k, v, out.arg(), xq.arg(), xds.arg(), pos_d],
                    &shape[..],
                ]
                .concat(),
            )?;
            out.q8 = Some(Box::new((xq, xds)));
            return Ok(out);
        }
        let scratch = self.tensor(sh.attention_scratch(heads, head_dim, tokens, max_ctx), 1)?;
        let (pass1, dims) = if on_tensor_cores {
            (names::kiln_attention_chunks_mma, mma)
        } else {
            (
                names::kiln_attention_chunks,
                sh.attention_chunks(heads, kv_heads, head_dim, tokens, max_ctx),
            )
        };
        self.gpu.launch(
            pass1,
            dims,
            &[&[q.arg(), k, v, scratch.arg(), pos_d], &shape[..]].concat(),
        )?;
        let mut out = self.tensor(q.rows, attn.n_head * attn.head_dim)?;
        // The output projection reads Q8_1 activations: emit them here (not in f32 mode).
        let q8 = if self.f32_activations {
            None
        } else {
            Some(self.q8_buffers(q.rows, attn.n_head * attn.head_dim)?)
        };
        let (xq, xds) = q8
            .as_ref()
            .map_or((Arg::Ptr(0), Arg::Ptr(0)), |(a, b)| (a.arg(), b.arg()));
        self.gpu.launch(
            names::kiln_attention_combine,
            sh.attention_combine(heads, head_dim, tokens),
            &[
                scratch.arg(),
                out.arg(),
                xq,
                xds,
                pos_d,
                Arg::U32(heads),
                Arg::U32(head_dim),
                Arg::U32(max_ctx),
            ],
        )?;
        out.q8 = q8.map(Box::new);
        Ok(out)
    }

    /// Whether split-KV pass 1 (of launch `dims`) runs on tensor cores: where the f16 operands
    /// are acceptable (as for prefill).
    pub(super) fn decode_attention_mma(&self, head_dim: u32, dims: Dims) -> bool {
        self.attention_mma
            && flash::flash_supports(head_dim)
            && !self.f32_activations
            && dims.shared_bytes <= self.gpu.shapes().max_shared_bytes()
    }

    /// The launch of the one-launch attention with `rope_store` folded in, if a step of `n`
    /// tokens from `pos` takes it.
    pub(super) fn short_rope_dims(
        &self,
        n: usize,
        pos: usize,
        attn: &Attention,
        max_ctx: u32,
    ) -> Result<Option<Dims>> {
        let sh = self.gpu.shapes();
        let (heads, kv_heads, head_dim) = (
            to_u32(attn.n_head, "heads")?,
            to_u32(attn.n_kv_head, "kv heads")?,
            to_u32(attn.head_dim, "head_dim")?,
        );
        if !self.attention_short_rope || n != 1 || !self.short_history(pos, n) {
            return Ok(None);
        }
        let mma = sh.attention_chunks_mma(heads, kv_heads, head_dim, 1, max_ctx);
        let short_max = u32::try_from(self.attention_short_max).unwrap_or(u32::MAX);
        let dims = sh.attention_short_rope_mma(heads, kv_heads, head_dim);
        let takes = sh.attention_short_rope(short_max, heads, kv_heads)
            && self.decode_attention_mma(head_dim, mma)
            && dims.shared_bytes <= sh.max_shared_bytes();
        Ok(takes.then_some(dims))
    }

    /// Whether a step of `n` tokens from position `pos` attends a history short enough for the
    /// one-launch attention (`attention_short_max`). Also part of a recorded step's key.
    pub(super) fn short_history(&self, pos: usize, n: usize) -> bool {
        n < FLASH_MIN_TOKENS as usize && pos + n <= self.attention_short_max
    }
}

/// The shapes an attention step needs: cache layer and room, head layout the kernels take,
/// and q/k/v widths. Returns the cache's spec.
pub(super) fn check_attention(
    cache: &CudaKvCache,
    layer: usize,
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    pos: usize,
    attn: &Attention,
) -> Result<KvSpec> {
    let spec = cache.spec;
    let n = q.rows;
    ensure!(
        layer < spec.n_layer,
        "attention: layer {layer} of {}",
        spec.n_layer
    );
    ensure!(
        pos + n <= spec.max_seq,
        "context full: position {} exceeds the cache of {} tokens",
        pos + n,
        spec.max_seq
    );
    ensure!(
        attn.head_dim.is_multiple_of(32) && attn.head_dim <= MAX_HEAD_DIM as usize,
        "head_dim {} unsupported on the GPU (multiple of 32, ≤ {MAX_HEAD_DIM})",
        attn.head_dim
    );
    ensure!(
        attn.head_dim == spec.head_dim && attn.n_kv_head == spec.n_kv_head,
        "attention: heads do not match the cache's"
    );
    let kv_width = spec.n_kv_head * spec.head_dim;
    ensure!(
        q.cols == attn.n_head * attn.head_dim
            && k.rows == n
            && v.rows == n
            && k.cols == kv_width
            && v.cols == kv_width,
        "attention: q is {}x{}, k {}x{}, v {}x{} for {} heads and {} KV heads of {}",
        q.rows,
        q.cols,
        k.rows,
        k.cols,
        v.rows,
        v.cols,
        attn.n_head,
        attn.n_kv_head,
        attn.head_dim
    );
    Ok(spec)
}
