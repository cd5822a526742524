//! The CUDA backend's construction and its A/B switches: the environment variables read at
//! [`Cuda::new`] (README, "Switches") and the builder methods tests use for the same choices.

use anyhow::Result;

use super::Cuda;
use crate::cuda::{Gpu, PtxModule, env_on};

impl Cuda {
    /// Opens GPU `ordinal` with the embedded kernel modules (the `kiln` package's `PTX_MODULES`).
    pub fn new(modules: &[PtxModule], ordinal: usize) -> Result<Self> {
        let base = Self::on(Gpu::new(modules, ordinal)?)?;
        // `1` names the policy's own limit; any other number is a row limit of its own.
        let norm_defer_rows = match std::env::var("KILN_NORM_DEFER").ok() {
            Some(v) if v == "1" => base.gpu.shapes().norm_defer_max_rows() as usize,
            Some(v) => parse_switch(
                "KILN_NORM_DEFER",
                &v,
                "0 (off), 1 (the policy's limit) or a row limit",
            )?,
            None => base.norm_defer_rows,
        };
        Ok(Cuda {
            swiglu_q8_rows: env_number(
                "KILN_SWIGLU_Q8_ROWS",
                base.swiglu_q8_rows,
                "a number of rows per warp (0 = off)",
            )?,
            attention_short_max: env_number(
                "KILN_ATTN_SHORT_MAX",
                base.attention_short_max,
                "a number of positions (0 = off)",
            )?,
            gemm_short_max: env_number(
                "KILN_GEMM_SHORT_MAX",
                base.gemm_short_max,
                "a number of tokens (0 = off)",
            )?,
            gemm_split_k: env_number(
                "KILN_GEMM_SPLIT_K",
                base.gemm_split_k,
                "a largest number of k shares (0 = off)",
            )?,
            norm_defer_rows,
            attention_short_rope: env_on("KILN_ATTN_SHORT_ROPE"),
            mapped_tables: env_on("KILN_MAPPED_EMBEDDING"),
            gemm_deep: env_on("KILN_GEMM_DEEP"),
            gemm_swiglu: env_on("KILN_GEMM_SWIGLU"),
            matvec_wide: env_on("KILN_MATVEC_WIDE"),
            matvec3_wide: env_on("KILN_MATVEC3_WIDE"),
            attention_mma: env_on("KILN_ATTN_MMA"),
            moe_gemm: env_on("KILN_MOE_GEMM"),
            ..base
        })
    }
    /// Matmuls keep activations in f32 instead of Q8_1 (slower): the CPU backend in the same
    /// mode agrees to float rounding, since no 8-bit activation code can flip between them.
    pub fn with_f32_activations(mut self) -> Self {
        self.f32_activations = true;
        self
    }

    /// Whether split-KV attention's pass 1 may run on tensor cores (f16 query and probability
    /// operands, ~1e-3 relative) in the default mode; off, it runs the f32 kernel, which agrees
    /// with the CPU backend's attention to float rounding.
    pub fn with_attention_mma(mut self, on: bool) -> Self {
        self.attention_mma = on;
        self
    }

    /// Decode attention in one launch for histories up to `positions` (0: never).
    pub fn with_attention_short_max(mut self, positions: usize) -> Self {
        self.attention_short_max = positions;
        self
    }

    /// GEMM launches of up to `tokens` tokens may take the short-prompt tile (0: never).
    pub fn with_gemm_short_max(mut self, tokens: usize) -> Self {
        self.gemm_short_max = tokens;
        self
    }

    /// GEMM launches whose main grid leaves SMs idle may split their reduction over k up to
    /// `max` ways (0 or 1: never).
    pub fn with_gemm_split_k(mut self, max: u32) -> Self {
        self.gemm_split_k = max;
        self
    }

    /// Whether one-token decode over a short history may fold `rope_store` into the
    /// one-launch attention (where the policy takes it): the same bits either way.
    pub fn with_attention_short_rope(mut self, on: bool) -> Self {
        self.attention_short_rope = on;
        self
    }

    /// Whether decode's residual projections leave the next norm to its consumers (off: a
    /// norm launch, which the CPU backend's arithmetic matches to float rounding).
    pub fn with_norm_defer(mut self, on: bool) -> Self {
        self.norm_defer_rows = match on {
            true => self.gpu.shapes().norm_defer_max_rows() as usize,
            false => 0,
        };
        self
    }

    /// Whether a prompt's experts run as grouped tensor-core GEMMs (f16 operands) or as the
    /// expert-sorted mat-vecs over 8-bit activations, which agree with the CPU backend's
    /// default mode to float rounding.
    pub fn with_moe_gemm(mut self, on: bool) -> Self {
        self.moe_gemm = on;
        self
    }

    /// Whether prefill's gate, up and SwiGLU run as one paired GEMM (`KILN_GEMM_SWIGLU`).
    pub fn with_gemm_swiglu(mut self, on: bool) -> Self {
        self.gemm_swiglu = on;
        self
    }
}

/// A numeric A/B switch: `default` when the variable is unset; an error naming it and what it
/// expects (`what`) when it is set to something that does not parse.
fn env_number<T: std::str::FromStr>(name: &str, default: T, what: &str) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => parse_switch(name, &v, what),
        Err(_) => Ok(default),
    }
}

/// The value `v` of switch `name`, or an error naming both and what it expects.
fn parse_switch<T: std::str::FromStr>(name: &str, v: &str, what: &str) -> Result<T> {
    v.parse()
        .map_err(|_| anyhow::anyhow!("{name}={v}: expected {what}"))
}
