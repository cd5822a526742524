//! CPU side of the quant formats: row (de)quantizers bit-compatible with llama.cpp's GGUF
//! files, fast weight-row × activation dot products, and [`QMatrix`], the mat-vec / mat-mat the
//! CPU backend runs on memory-mapped weights.
//!
//! Dot products follow each format's fast path: activations are quantized once per call into
//! the weight format's partner ([`activation_type`]): Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for
//! Q4_1/Q5_1, Q8_K for the K-quants, plain f32 for F32/F16/BF16; the inner loops then run on
//! integers.
//! Block layouts live in [`kernels_gpu::quant`], shared with the GPU kernels.
//!
//! Every kernel has a portable scalar version and, on x86-64, an AVX2+FMA(+F16C) one (with an
//! AVX-VNNI variant for the 32-element formats) chosen once at run time ([`Isa::detect`]);
//! tests hold them against each other.

mod float;
#[cfg(target_arch = "x86_64")]
mod float_avx2;
mod kquants;
#[cfg(target_arch = "x86_64")]
mod kquants_avx2;
mod legacy;
#[cfg(target_arch = "x86_64")]
mod legacy_avx2;
mod matmul;

use anyhow::{Result, bail};

use crate::numerics::Numerics;

pub use crate::gguf::GgmlType;
pub use kernels_gpu::quant as blocks;
pub use matmul::{QMatrix, matmul_many, matmul_many_with, matmul_swiglu, matmul_swiglu_with};

/// Which kernel implementation to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, always available.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 plus AVX-VNNI (`vpdpbusd`, one instruction for the u8×i8→i32 dot step).
    AvxVnni,
}

impl Isa {
    /// The fastest ISA this CPU supports; detected once, then cached.
    pub fn detect() -> Isa {
        static CACHE: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *CACHE.get_or_init(|| {
            [Isa::AvxVnni, Isa::Avx2]
                .into_iter()
                .find(|i| i.available())
                .unwrap_or(Isa::Scalar)
        })
    }

    /// Whether this CPU can run kernels of this ISA.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => Isa::Avx2.available() && is_x86_feature_detected!("avxvnni"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::AvxVnni => false,
        }
    }
}

/// `dst.len()` values (a whole number of blocks) to the element type `ty`, row layout
/// identical to GGUF's.
fn check_sizes(ty: GgmlType, n_elems: usize, n_bytes: usize, what: &str) -> Result<()> {
    let (qk, bs) = ty.block();
    if !n_elems.is_multiple_of(qk) {
        bail!(
            "{what} {}: {n_elems} elements is not a multiple of the block size {qk}",
            ty.name()
        );
    }
    let want = n_elems / qk * bs;
    if want != n_bytes {
        bail!(
            "{what} {}: {n_elems} elements need {want} bytes ({} blocks of {bs}), got {n_bytes}",
            ty.name(),
            n_elems / qk
        );
    }
    Ok(())
}

/// Dequantizes one row (any whole number of blocks) of `ty` from `src` into `dst`.
/// Bit-identical to llama.cpp / the `gguf` Python package.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_sizes(ty, dst.len(), src.len(), "dequantize")?;
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => float::dequantize(ty, src, dst),
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => legacy::dequantize(ty, src, dst),
        Q4_K | Q5_K | Q6_K | Q8_K => kquants::dequantize(ty, src, dst),
        _ => bail!("dequantize: type {} is not supported", ty.name()),
    }
    Ok(())
}

/// Quantizes one row into `ty` with llama.cpp's reference (round-to-nearest) quantizers:
/// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (bit-identical to the reference), and the
/// activation formats Q8_1 and Q8_K.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    quantize_row_in(Numerics::Kiln, ty, src, dst)
}

fn quantize_row_in(numerics: Numerics, ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check_sizes(ty, src.len(), dst.len(), "quantize")?;
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => float::quantize(ty, src, dst),
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => legacy::quantize(ty, src, dst, numerics),
        Q8_K => kquants::quantize_q8_k(src, dst),
        _ => bail!("quantize: type {} is not supported", ty.name()),
    }
    Ok(())
}

/// The activation format the dot product of weight type `weight` consumes.
pub fn activation_type(weight: GgmlType) -> Result<GgmlType> {
    use GgmlType::*;
    Ok(match weight {
        F32 | F16 | BF16 => F32,
        Q4_0 | Q5_0 | Q8_0 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q4_K | Q5_K | Q6_K => Q8_K,
        _ => bail!("no CPU dot product for weight type {}", weight.name()),
    })
}

/// Quantizes an activation row `x` into the partner format of `weight`.
pub fn quantize_activations(weight: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    quantize_activations_in(Numerics::Kiln, weight, x)
}

/// [`quantize_activations`] with the 8-bit formats rounded as `numerics` says.
pub fn quantize_activations_in(numerics: Numerics, weight: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let at = activation_type(weight)?;
    let (qk, bs) = at.block();
    if !x.len().is_multiple_of(qk) {
        bail!(
            "activations for {}: {} elements is not a multiple of {qk}",
            weight.name(),
            x.len()
        );
    }
    let mut out = vec![0u8; x.len() / qk * bs];
    // Blocks are quantized independently: a batch (prefill) splits over the thread pool.
    let blocks = (QUANT_TASK_ELEMS / qk).max(1);
    if x.len() >= 2 * QUANT_TASK_ELEMS {
        use rayon::prelude::*;
        x.par_chunks(blocks * qk)
            .zip(out.par_chunks_mut(blocks * bs))
            .try_for_each(|(x, out)| quantize_row_in(numerics, at, x, out))?;
    } else {
        quantize_row_in(numerics, at, x, &mut out)?;
    }
    Ok(out)
}

/// Activation elements one task of [`quantize_activations`] quantizes (~1 µs of work).
const QUANT_TASK_ELEMS: usize = 4096;

/// A dot-product kernel: weight row bytes × activation row bytes (whole blocks; a kernel only
/// reads as many blocks as both slices hold, so a short slice cannot make it read out of bounds).
pub(crate) type DotFn = fn(&[u8], &[u8]) -> f32;

/// Four consecutive weight rows (`row_bytes` apart, starting at the slice) × one activation row:
/// activation loads and block sums are shared across the rows.
pub(crate) type Dot4Fn = fn(&[u8], usize, &[u8]) -> [f32; 4];

/// Whole weight blocks (first slice) to an expanded form (second slice, the same number of
/// blocks of [`Expanded::block_bytes`]).
pub(crate) type ExpandFn = fn(&[u8], &mut [u8]);

/// A format batched mat-muls may expand each L1 tile of weights into before running every
/// activation row over it: the expander and the kernels of the expanded blocks. Their results
/// are bit-identical to the plain kernels'.
#[derive(Clone, Copy)]
pub(crate) struct Expanded {
    pub expand: ExpandFn,
    pub dot: DotFn,
    pub dot4: Dot4Fn,
    pub block_bytes: usize,
}

/// The expanded form of weight type `ty` on `isa`, where there is one.
pub(crate) fn expanded(isa: Isa, ty: GgmlType) -> Option<Expanded> {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.available() {
        let vnni = isa == Isa::AvxVnni;
        return match ty {
            GgmlType::Q4_0 => legacy_avx2::expanded(legacy_avx2::Q4_0, vnni),
            GgmlType::Q4_1 => legacy_avx2::expanded(legacy_avx2::Q4_1, vnni),
            _ => None,
        };
    }
    let _ = (isa, ty);
    None
}

/// The kernels for weight type `ty` on `isa` (scalar if `isa` is unavailable here); `stream`:
/// weights read once per call (a mat-vec), so kernels that prefetch ahead may be chosen.
pub(crate) fn kernel(isa: Isa, ty: GgmlType, stream: bool) -> Result<(DotFn, Option<Dot4Fn>)> {
    use GgmlType::*;
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.available() {
        let vnni = isa == Isa::AvxVnni;
        let legacy = |f| {
            let (one, four) = legacy_avx2::kernels(f, vnni, stream);
            (one, Some(four))
        };
        return Ok(match ty {
            F32 => (float_avx2::dot_f32 as DotFn, None),
            F16 => (float_avx2::dot_f16, None),
            BF16 => (float_avx2::dot_bf16, None),
            Q4_0 => legacy(legacy_avx2::Q4_0),
            Q4_1 => legacy(legacy_avx2::Q4_1),
            Q8_0 => legacy(legacy_avx2::Q8_0),
            // No vector kernels for these rarer formats: the portable ones.
            Q5_0 => (legacy::dot_q5_0_q8_0 as DotFn, None),
            Q5_1 => (legacy::dot_q5_1_q8_1, None),
            Q4_K => (kquants_avx2::dot_q4_k_q8_k, None),
            Q5_K => (kquants_avx2::dot_q5_k_q8_k, None),
            Q6_K => (kquants_avx2::dot_q6_k_q8_k, None),
            _ => bail!("no CPU dot product for weight type {}", ty.name()),
        });
    }
    let _ = (isa, stream);
    Ok((
        match ty {
            F32 => float::dot_f32,
            F16 => float::dot_f16,
            BF16 => float::dot_bf16,
            Q4_0 => legacy::dot_q4_0_q8_0,
            Q4_1 => legacy::dot_q4_1_q8_1,
            Q5_0 => legacy::dot_q5_0_q8_0,
            Q5_1 => legacy::dot_q5_1_q8_1,
            Q8_0 => legacy::dot_q8_0_q8_0,
            Q4_K => kquants::dot_q4_k_q8_k,
            Q5_K => kquants::dot_q5_k_q8_k,
            Q6_K => kquants::dot_q6_k_q8_k,
            _ => bail!("no CPU dot product for weight type {}", ty.name()),
        },
        None,
    ))
}

/// Dot product of one weight row (`w`, type `ty`) with an activation row already in the partner
/// format ([`quantize_activations`]), using [`Isa::detect`].
pub fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> Result<f32> {
    vec_dot_with(Isa::detect(), ty, w, act)
}

/// [`vec_dot`] on a chosen ISA (tests compare scalar against AVX2).
pub fn vec_dot_with(isa: Isa, ty: GgmlType, w: &[u8], act: &[u8]) -> Result<f32> {
    let (f, _) = kernel(isa, ty, false)?;
    let (wqk, wbs) = ty.block();
    let at = activation_type(ty)?;
    let (aqk, abs) = at.block();
    if !w.len().is_multiple_of(wbs) {
        bail!(
            "dot: {} weight row of {} bytes is not whole blocks of {wbs}",
            ty.name(),
            w.len()
        );
    }
    let n = w.len() / wbs * wqk;
    if act.len() != n / aqk * abs {
        bail!(
            "dot: {} weight row has {n} elements, needing {} bytes of {} activations; got {}",
            ty.name(),
            n / aqk * abs,
            at.name(),
            act.len()
        );
    }
    Ok(f(w, act))
}
