//! Context-extension RoPE, read from the file the way llama.cpp reads it for llama and qwen3:
//! Llama 3.1+'s per-pair `rope_freqs.weight`, and `{arch}.rope.scaling.*` (linear or YaRN).
//!
//! Every variant comes down to two numbers the backends already take: a per-pair divisor of
//! the rotation frequency ([`Rope::factors`](crate::backend::Rope)) and a magnitude `mscale`
//! that llama.cpp multiplies into both cos and sin. Rotating q and k each by `mscale` scales
//! `q·k` by `mscale²`, so kiln folds it into the attention scale instead ([`RopeScaling::
//! attn_scale`]) and stores unscaled keys.

use std::sync::Arc;

use anyhow::{Result, bail, ensure};

use crate::gguf::{GgmlType, GgufFile};

/// YaRN's default correction range (llama.cpp reads no override for llama or qwen3 files).
const YARN_BETA_FAST: f32 = 32.0;
const YARN_BETA_SLOW: f32 = 1.0;

#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// Per rotary pair: the frequency is divided by this (`None`: all 1).
    pub factors: Option<Arc<[f32]>>,
    /// Multiplies `q·k` on top of `1/sqrt(head_dim)`: the square of llama.cpp's rotation
    /// magnitude.
    pub attn_scale: f32,
}

/// Reads `rope_freqs.weight` and the `{arch}.rope.scaling.*` keys for `rot_dim` rotary dims.
pub fn read(
    file: &GgufFile,
    arch: &str,
    rot_dim: usize,
    freq_base: f32,
    n_ctx_train: usize,
) -> Result<RopeScaling> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let pairs = rot_dim / 2;
    let mut divisors = freq_factors(file, rot_dim)?;
    let kind = match file.get(&key("type")) {
        None => "none",
        Some(_) => file.get_str(&key("type"))?,
    };
    // llama.cpp: `rope.scaling.factor`, else the older `rope.scale_linear`; 0 means none.
    let factor = match opt_f32(file, &key("factor"))? {
        Some(f) => f,
        None => opt_f32(file, &format!("{arch}.rope.scale_linear"))?.unwrap_or(0.0),
    };
    let factor = if factor == 0.0 { 1.0 } else { factor };
    ensure!(
        factor.is_finite() && factor > 0.0,
        "{} = {factor}: must be a positive number",
        key("factor")
    );
    let attn_factor = opt_f32(file, &key("attn_factor"))?.unwrap_or(1.0);
    ensure!(
        attn_factor.is_finite() && attn_factor > 0.0,
        "{} = {attn_factor}: must be a positive number",
        key("attn_factor")
    );
    // Each pair's angle is multiplied by `gain(i)`; the table stores its inverse.
    let gain: Box<dyn Fn(usize) -> f32> = match kind {
        "none" => Box::new(|_| 1.0),
        "linear" => Box::new(move |_| 1.0 / factor),
        "yarn" => {
            if let Some(m) = opt_f32(file, &key("yarn_log_multiplier"))?.filter(|&m| m != 0.0) {
                bail!(
                    "{} = {m}: YaRN with a log multiplier (DeepSeek) is not supported",
                    key("yarn_log_multiplier")
                );
            }
            let orig = match file.get(&key("original_context_length")) {
                None => n_ctx_train,
                Some(_) => file.get_u32(&key("original_context_length"))? as usize,
            };
            ensure!(orig > 0, "{}: zero", key("original_context_length"));
            let (low, high) = yarn_corr_dims(rot_dim, orig, freq_base);
            Box::new(move |i| {
                // Pairs below `low` keep their angle (extrapolate), pairs above `high` are
                // interpolated by 1/factor, a linear ramp in between.
                let keep = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                (1.0 - keep) / factor + keep
            })
        }
        other => bail!(
            "{} = {other:?}: only none, linear and yarn RoPE scaling are supported",
            key("type")
        ),
    };
    if (0..pairs).any(|i| gain(i) != 1.0) {
        let base = divisors.unwrap_or_else(|| vec![1.0; pairs]);
        divisors = Some((0..pairs).map(|i| base[i] / gain(i)).collect());
    }
    // llama.cpp's rotation magnitude: YaRN adds 1 + 0.1·ln(factor) when it stretches
    // (factor > 1); `attn_factor` multiplies every kind.
    let mscale = match kind {
        "yarn" if factor > 1.0 => attn_factor * (1.0 + 0.1 * factor.ln()),
        _ => attn_factor,
    };
    Ok(RopeScaling {
        factors: divisors.map(Into::into),
        attn_scale: mscale * mscale,
    })
}

/// The first and last rotary pair YaRN blends between (llama.cpp's `corr_dims`): the pairs
/// that turn `beta_fast` and `beta_slow` times over `orig` positions, floored/ceiled and clipped.
fn yarn_corr_dims(rot_dim: usize, orig: usize, base: f32) -> (f32, f32) {
    let pair_for = |turns: f32| {
        rot_dim as f32 * (orig as f32 / (turns * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let low = pair_for(YARN_BETA_FAST).floor().max(0.0);
    let high = pair_for(YARN_BETA_SLOW).ceil().min(rot_dim as f32 - 1.0);
    (low, high)
}

/// A float key that may be absent; present with another type is an error naming it.
fn opt_f32(file: &GgufFile, key: &str) -> Result<Option<f32>> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(file.get_f32(key)?)),
    }
}

/// `rope_freqs.weight` (Llama 3.1+): one f32 divisor per rotary pair.
fn freq_factors(file: &GgufFile, rot_dim: usize) -> Result<Option<Vec<f32>>> {
    const NAME: &str = "rope_freqs.weight";
    let Ok(t) = file.tensor(NAME) else {
        return Ok(None);
    };
    ensure!(
        t.ggml_type == GgmlType::F32 && t.dims == [rot_dim as u64 / 2],
        "{NAME}: {} {:?}, expected F32 [{}] (half the rotary dims)",
        t.ggml_type.name(),
        t.dims,
        rot_dim / 2
    );
    let f: Vec<f32> = file
        .tensor_data(t)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    ensure!(
        f.iter().all(|v| v.is_finite() && *v > 0.0),
        "{NAME}: every factor must be a positive number"
    );
    Ok(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3's YaRN setting (128 rotary dims, base 1e6, 32768 original positions): worked by
    /// hand from the definition, 128·ln(32768 / (β·2π)) / (2·ln 1e6) = 23.6 (β = 32) and
    /// 39.65 (β = 1), so pairs 0..=23 keep their angle and 40.. are divided by the factor.
    #[test]
    fn yarn_correction_range_for_qwen3() {
        assert_eq!(yarn_corr_dims(128, 32768, 1e6), (23.0, 40.0));
        // Clipped to the rotary pairs at both ends for a short original context.
        assert_eq!(yarn_corr_dims(32, 64, 1e4), (0.0, 5.0));
    }
}
