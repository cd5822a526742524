//! Weights into device memory: GGUF blocks split into quant and scale planes, K-quants
//! re-blocked by 32, and the formats without kernels widened to f16.

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use kernels_gpu::kernels::formats::{self, SplitFormat};
use kernels_gpu::quant::reblock::{self, ReblockError};

use super::{Cuda, CudaWeight, Storage};
use crate::cuda::Gpu;
use crate::gguf::{GgmlType, GgufFile};

impl Cuda {
    /// Uploads the named tensor: split quantized formats into device memory, or into mapped
    /// host memory with `mapped` ([`Gpu::upload_mapped`]); f16/f32 always into device memory.
    pub(super) fn load(
        &self,
        file: &Arc<GgufFile>,
        name: &str,
        mapped: bool,
    ) -> Result<CudaWeight> {
        let info = file.tensor(name)?;
        let cols = info.row_len() as usize;
        let rows = info.rows() as usize;
        let data = file.tensor_data(info);
        let gpu = &self.gpu;
        let storage = match info.ggml_type {
            GgmlType::Q4_0 => {
                split::<formats::Q4_0>(gpu, info.ggml_type, data, rows, cols, name, mapped)?
            }
            GgmlType::Q4_1 => {
                split::<formats::Q4_1>(gpu, info.ggml_type, data, rows, cols, name, mapped)?
            }
            GgmlType::Q8_0 => {
                split::<formats::Q8_0>(gpu, info.ggml_type, data, rows, cols, name, mapped)?
            }
            GgmlType::F16 => {
                ensure!(
                    cols.is_multiple_of(8),
                    "tensor {name}: f16 rows of {cols} are not a multiple of 8"
                );
                let v: Vec<u16> = data
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                Storage::F16(gpu.upload(&v)?)
            }
            GgmlType::F32 => {
                let v: Vec<f32> = data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                Storage::F32(gpu.upload(&v)?)
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                let r = match info.ggml_type {
                    GgmlType::Q4_K => &Q4_K_AS_Q4K,
                    GgmlType::Q5_K => &Q5_K_AS_Q5K,
                    _ => &Q6_K_AS_Q6K,
                };
                match reblock_rows(data, rows, cols, name, r)? {
                    Some(blocks) => (r.store)(gpu, r.from, &blocks, rows, cols, name, mapped)?,
                    // A scale past f16's range once multiplied out (Q4_K, Q5_K): keep the
                    // tensor, at f16.
                    None => Storage::F16(gpu.upload(&widen_to_f16(
                        info.ggml_type,
                        data,
                        rows,
                        cols,
                        name,
                    )?)?),
                }
            }
            // Q5_1 (`d·q + m`, its own f16 `d` and `m` per 32 weights) fits no split format:
            // Q5K shares them over 256, and Q8_0 has no minimum. Widened, rounded once to f16.
            GgmlType::BF16 | GgmlType::Q5_1 => {
                Storage::F16(gpu.upload(&widen_to_f16(info.ggml_type, data, rows, cols, name)?)?)
            }
            // Exactly as Q8_0 blocks (8.5 bits per weight instead of 5.5).
            GgmlType::Q5_0 => {
                let blocks = q5_0_as_q8_0(data, name)?;
                split::<formats::Q8_0>(gpu, GgmlType::Q8_0, &blocks, rows, cols, name, mapped)?
            }
            other => bail!(
                "tensor {name}: {} weights are not supported by the CUDA backend yet (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, F32 natively; Q5_0 as Q8_0; BF16, Q5_1 widened to f16); use --device cpu",
                other.name()
            ),
        };
        Ok(CudaWeight {
            name: name.to_string(),
            storage,
            rows,
            cols,
        })
    }
}

/// A GGUF tensor's blocks as the split quants and scales planes, uploaded to device memory or,
/// with `mapped`, to mapped host memory ([`Gpu::upload_mapped`]).
fn split<F: SplitFormat>(
    gpu: &Gpu,
    ty: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    name: &str,
    mapped: bool,
) -> Result<Storage> {
    let (qs, scales) = split_planes::<F>(ty, data, rows, cols, name)?;
    let (qs, scales) = if mapped {
        (gpu.upload_mapped(&qs)?, gpu.upload_mapped(&scales)?)
    } else {
        (gpu.upload(&qs)?, gpu.upload(&scales)?)
    };
    Ok(Storage::Split { ty, qs, scales })
}

/// A GGUF tensor's blocks as the split quants and scales planes.
fn split_planes<F: SplitFormat>(
    ty: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    name: &str,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let (qb, sb) = formats::split_plane_bytes::<F>(rows, cols);
    let (mut qs, mut scales) = (vec![0u8; qb], vec![0u8; sb]);
    ensure!(
        formats::split_gguf_blocks::<F>(data, rows, cols, &mut qs, &mut scales),
        "tensor {name}: {} bytes do not hold {rows}x{cols} {} values",
        data.len(),
        ty.name()
    );
    Ok((qs, scales))
}

/// A K-quant's re-blocking by 32 for its split format (`kernels_gpu::quant::reblock`).
struct Reblock {
    from: GgmlType,
    /// Bytes of one 256-element super-block, and of one unpacked 32-element block made from it.
    super_bytes: usize,
    block_bytes: usize,
    run: fn(&[u8], &mut [u8]) -> Result<(), ReblockError>,
    /// The split that packs and uploads the blocks.
    store: SplitStore,
}

/// [`split`] for one format.
type SplitStore = fn(&Gpu, GgmlType, &[u8], usize, usize, &str, bool) -> Result<Storage>;
const Q4_K_AS_Q4K: Reblock = Reblock {
    from: GgmlType::Q4_K,
    super_bytes: 144,
    block_bytes: formats::Q4K::BLOCK_BYTES,
    run: reblock::q4_k,
    store: split::<formats::Q4K>,
};
const Q5_K_AS_Q5K: Reblock = Reblock {
    from: GgmlType::Q5_K,
    super_bytes: 176,
    block_bytes: formats::Q5K::BLOCK_BYTES,
    run: reblock::q5_k,
    store: split::<formats::Q5K>,
};
const Q6_K_AS_Q6K: Reblock = Reblock {
    from: GgmlType::Q6_K,
    super_bytes: 210,
    block_bytes: formats::Q6K::BLOCK_BYTES,
    run: reblock::q6_k,
    store: split::<formats::Q6K>,
};

/// A Q5_0 tensor's blocks as Q8_0 blocks ([`reblock::q5_0_as_q8_0`]), in parallel. Said once per
/// process on stderr: VRAM and decode speed are Q8_0's, not what the file's size suggests.
fn q5_0_as_q8_0(data: &[u8], name: &str) -> Result<Vec<u8>> {
    use rayon::prelude::*;
    static NOTED: std::sync::Once = std::sync::Once::new();
    NOTED.call_once(|| {
        eprintln!("kiln: Q5_0 weights run as Q8_0 on the GPU (every weight exact; 8.5 bits per weight instead of 5.5)")
    });
    use kernels_gpu::quant::{BlockQ5_0, BlockQ8_0, QuantBlock};
    let (q5, q8) = (BlockQ5_0::BYTES, BlockQ8_0::BYTES);
    ensure!(
        data.len().is_multiple_of(q5),
        "tensor {name}: {} bytes are not whole Q5_0 blocks",
        data.len()
    );
    let mut out = vec![0u8; data.len() / q5 * q8];
    // 1024 blocks per task: whole blocks on both sides.
    let (from, to) = (1024 * q5, 1024 * q8);
    out.par_chunks_mut(to)
        .zip(data.par_chunks(from))
        .try_for_each(|(dst, src)| reblock::q5_0_as_q8_0(src, dst))
        .map_err(|e| anyhow::anyhow!("tensor {name}: re-blocking Q5_0 as Q8_0 failed ({e:?})"))?;
    Ok(out)
}

/// A K-quant tensor's rows re-blocked by 32, row-parallel; `None` if a scale does not fit f16
/// once multiplied out (Q4_K, Q5_K; the caller widens that tensor instead).
fn reblock_rows(
    data: &[u8],
    rows: usize,
    cols: usize,
    name: &str,
    r: &Reblock,
) -> Result<Option<Vec<u8>>> {
    use rayon::prelude::*;
    let supers = cols / 256;
    ensure!(
        cols.is_multiple_of(256) && rows > 0 && data.len() == rows * supers * r.super_bytes,
        "tensor {name}: {} bytes do not hold {rows}x{cols} {} values",
        data.len(),
        r.from.name()
    );
    let out_row = supers * 8 * r.block_bytes;
    let mut out = vec![0u8; rows * out_row];
    let done = out
        .par_chunks_mut(out_row)
        .zip(data.par_chunks(supers * r.super_bytes))
        .try_for_each(|(dst, src)| (r.run)(src, dst));
    match done {
        Ok(()) => Ok(Some(out)),
        Err(ReblockError::ScaleRange) => Ok(None),
        Err(ReblockError::Size) => bail!(
            "tensor {name}: re-blocking {} rows failed on sizes",
            r.from.name()
        ),
    }
}

/// A tensor of a format the GPU has no kernels for (BF16, Q5_1, or a K-quant whose scales
/// overflow f16), dequantized on the host and stored as f16 (the f16 mat-vec and embedding
/// kernels take it): it runs, at 2 bytes per weight instead of 0.56–0.82. Said once per process
/// on stderr, since VRAM and speed are not what the file's size suggests.
fn widen_to_f16(
    ty: GgmlType,
    data: &[u8],
    rows: usize,
    cols: usize,
    name: &str,
) -> Result<Vec<u16>> {
    use rayon::prelude::*;
    static NOTED: std::sync::Once = std::sync::Once::new();
    NOTED.call_once(|| {
        eprintln!(
            "kiln: {} weights have no GPU kernels here: widened to f16 at load (more VRAM, slower decode than the file suggests)",
            ty.name()
        )
    });
    ensure!(
        cols.is_multiple_of(8) && rows > 0 && data.len().is_multiple_of(rows),
        "tensor {name}: {} rows of {cols} cannot be widened to f16 (need whole rows, cols % 8 == 0)",
        ty.name()
    );
    let row_bytes = data.len() / rows;
    let mut out = vec![0u16; rows * cols];
    out.par_chunks_mut(cols)
        .zip(data.par_chunks(row_bytes))
        .enumerate()
        .try_for_each_init(
            || vec![0f32; cols],
            |row, (r, (dst, src))| {
                crate::quant::dequantize_row(ty, src, row)
                    .with_context(|| format!("tensor {name}, row {r}"))?;
                for (d, &v) in dst.iter_mut().zip(row.iter()) {
                    let h = half::f16::from_f32(v);
                    ensure!(
                        h.is_finite(),
                        "tensor {name}: row {r} holds {v}, outside f16's range: this {} tensor cannot run on the GPU yet",
                        ty.name()
                    );
                    *d = h.to_bits();
                }
                Ok(())
            },
        )?;
    Ok(out)
}
