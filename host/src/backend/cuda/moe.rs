//! Mixture-of-experts on the CUDA backend: the route and both expert mat-vecs read each other
//! through device memory, so a decode step with experts records into one graph like a dense one.
//!
//! Decode runs the slot-major mat-vecs (`moe_swiglu_split`, `moe_down_add_split`). Several
//! tokens (prefill) first sort their slots by expert on the device (`moe_sort`), then run the
//! expert-sorted mat-vecs, whose concurrently running blocks share weight rows through L2, and
//! mix the slots' outputs into the residual (`moe_mix`). From `GEMM_MIN_TOKENS` tokens the
//! experts run as grouped tensor-core GEMMs instead (`kernels::mma::moe_mma_split`): each
//! expert's sorted slots are token tiles of the dense GEMM's tile body, over that expert's rows.

use anyhow::{Result, bail, ensure};
use kernels_gpu::entries::families::{
    MOE_DOWN_ADD, MOE_DOWN_SORTED, MOE_MATVEC_F32X, MOE_MMA, MOE_SWIGLU, MOE_SWIGLU_SORTED,
};
use kernels_gpu::entries::names;
use kernels_gpu::kernels::mma::MOE_TILE_WORDS;
use kernels_gpu::kernels::moe::MOE_MAX_EXPERTS;

use super::{
    Cuda, CudaTensor, CudaWeight, Storage, by_format, gemm::gemm_entries, split_parts, to_u32,
    u32_arg,
};
use crate::backend::Backend;
use crate::backend::Moe;
use crate::cuda::{Arg, DBuf};

pub(super) fn route(cuda: &Cuda, logits: &CudaTensor, moe: &Moe) -> Result<CudaTensor> {
    moe.check_logits(logits)?;
    ensure!(
        moe.n_expert <= MOE_MAX_EXPERTS as usize,
        "mixture of experts: {} experts, the CUDA router ranks at most {MOE_MAX_EXPERTS}",
        moe.n_expert
    );
    let out = cuda.tensor(logits.rows, 2 * moe.n_used)?;
    let n = to_u32(logits.rows, "tokens")?;
    cuda.gpu.launch(
        names::kiln_moe_route,
        cuda.gpu.shapes().per_warp(n),
        &[
            logits.arg(),
            out.arg(),
            u32_arg(moe.n_expert, "experts")?,
            u32_arg(moe.n_used, "experts used")?,
            Arg::U32(u32::from(moe.norm_weights)),
            Arg::U32(n),
        ],
    )?;
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn swiglu_add(
    cuda: &Cuda,
    x: &mut CudaTensor,
    h: &CudaTensor,
    route: &CudaTensor,
    gate: &CudaWeight,
    up: &CudaWeight,
    down: &CudaWeight,
    moe: &Moe,
) -> Result<()> {
    let Some((ty, gu)) = split_parts(&[gate, up]) else {
        bail!(
            "tensors {} and {}: CUDA experts need one quantized block format for both (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K)",
            gate.name,
            up.name
        );
    };
    let Storage::Split {
        ty: down_ty,
        qs: dq,
        scales: ds,
    } = &down.storage
    else {
        bail!(
            "tensor {}: CUDA experts need a quantized block format",
            down.name
        );
    };
    let n_ff = moe.check_ffn(
        x,
        h,
        route,
        [(gate, &gate.name), (up, &up.name), (down, &down.name)],
    )?;
    ensure!(
        n_ff.is_multiple_of(32),
        "tensor {}: experts {n_ff} wide are not whole 32-blocks",
        down.name
    );
    let (n, k, n_embd) = (h.rows, moe.n_used, x.cols);
    let (sh, sms) = (cuda.gpu.shapes(), cuda.gpu.sm_count());
    let (rows_ff, rows_embd) = (to_u32(n_ff, "expert width")?, to_u32(n_embd, "width")?);
    let slots = to_u32(n * k, "token slots")?;
    let k_arg = u32_arg(k, "experts used")?;
    let n_expert = u32_arg(moe.n_expert, "experts")?;
    let ((gq, gs), (uq, us)) = (gu[0], gu[1]);
    if cuda.f32_activations {
        // Every slot's three expert mat-vecs over f32 activations (the CPU backend's
        // `--f32-activations` arithmetic), then the slots mixed in route order.
        let matvec = |(qs, scales): (&DBuf<u8>, &DBuf<u8>), ty, x: &CudaTensor, rows, div| {
            let kernel = by_format(ty, MOE_MATVEC_F32X);
            let dims = cuda
                .gpu
                .one_wave(kernel, sh.matvec_multi(&[rows], slots, sms));
            let y = cuda.tensor(n * k, rows as usize)?;
            let args = [qs.arg(), scales.arg(), x.arg(), route.arg(), y.arg()];
            let dims_args = [
                Arg::U32(rows),
                u32_arg(x.cols, "cols")?,
                k_arg,
                Arg::U32(div),
            ];
            cuda.gpu
                .launch(kernel, dims, &[&args[..], &dims_args[..]].concat())?;
            Ok::<_, anyhow::Error>(y)
        };
        let g = matvec((gq, gs), ty, h, rows_ff, k as u32)?;
        let u = matvec((uq, us), ty, h, rows_ff, k as u32)?;
        let y = matvec((dq, ds), *down_ty, &cuda.swiglu(&g, &u)?, rows_embd, 1)?;
        x.q8 = None;
        return mix(cuda, x, &y, route, k_arg);
    }
    // Several tokens: their slots sorted by expert (u32 indices in an f32-sized buffer), and,
    // for a prompt long enough for the grouped GEMM, the sorted runs cut into its token tiles.
    let grouped = cuda.moe_gemm && cuda.gemm_for(n);
    let sorted = match n > 1 {
        true => {
            let order = cuda.tensor(n * k, 1)?;
            let max_tiles = match grouped {
                true => sh.moe_gemm_tiles(slots, moe.n_expert as u32),
                false => 0, // no table: the sort writes none
            };
            let tiles = grouped
                .then(|| cuda.tensor(max_tiles as usize * MOE_TILE_WORDS, 1))
                .transpose()?;
            let dims = sh.moe_sort(moe.n_expert as u32, slots);
            ensure!(
                dims.shared_bytes <= sh.max_shared_bytes(),
                "mixture of experts: {n} tokens × {k} experts are {slots} slots, more than one expert sort holds ({} bytes of shared memory); use shorter prompt chunks",
                sh.max_shared_bytes()
            );
            cuda.gpu.launch(
                names::kiln_moe_sort,
                dims,
                &[
                    route.arg(),
                    order.arg(),
                    tiles.as_ref().map_or(Arg::Ptr(0), CudaTensor::arg),
                    Arg::U32(slots),
                    k_arg,
                    n_expert,
                    Arg::U32(sh.moe_tile_n()),
                    Arg::U32(max_tiles),
                ],
            )?;
            Some((order, tiles))
        }
        false => None,
    };
    if let Some((order, Some(tiles))) = sorted.as_ref() {
        // A prompt: the grouped tensor-core GEMMs, gate and up in one launch.
        let gemm = |ty, mats: &[(Arg, Arg, &CudaTensor)], rows, x: &CudaTensor, div| {
            let e = gemm_entries(ty);
            let dims = sh.moe_mma(
                rows,
                mats.len() as u32,
                slots,
                moe.n_expert as u32,
                e.qs_words,
                e.staged_words,
            );
            let x16 = cuda.to_f16(x)?; // alive until the launch is issued
            let mut args = Vec::with_capacity(13);
            for m in 0..2 {
                match mats.get(m) {
                    Some(&(q, s, y)) => args.extend([q, s, y.arg()]),
                    None => args.extend([Arg::Ptr(0); 3]),
                }
            }
            args.extend([Arg::U32(mats.len() as u32), Arg::U32(rows), x16.arg()]);
            args.extend([
                u32_arg(x.cols, "cols")?,
                order.arg(),
                Arg::U32(div),
                tiles.arg(),
            ]);
            cuda.gpu.launch(by_format(ty, MOE_MMA), dims, &args)
        };
        let (yg, yu) = (cuda.tensor(n * k, n_ff)?, cuda.tensor(n * k, n_ff)?);
        let gate_up = [(gq.arg(), gs.arg(), &yg), (uq.arg(), us.arg(), &yu)];
        gemm(ty, &gate_up, rows_ff, h, k as u32)?;
        let act = cuda.swiglu(&yg, &yu)?;
        let y = cuda.tensor(n * k, n_embd)?;
        gemm(*down_ty, &[(dq.arg(), ds.arg(), &y)], rows_embd, &act, 1)?;
        x.q8 = None;
        return mix(cuda, x, &y, route, k_arg);
    }
    let order = sorted.map(|(order, _)| order);
    let act = cuda.tensor(n * k, n_ff)?;
    let slot_major = |family, fmt, rows: &[u32], n: usize| {
        let kernel = by_format(fmt, family);
        (
            kernel,
            cuda.gpu
                .one_wave(kernel, sh.matvec_multi(rows, n as u32, sms)),
        )
    };
    let (kernel, dims) = match order {
        Some(_) => (
            by_format(ty, MOE_SWIGLU_SORTED),
            sh.moe_sorted(slots, rows_ff),
        ),
        None => slot_major(MOE_SWIGLU, ty, &[rows_ff], n * k),
    };
    cuda.with_q8(h, |xq, xds| {
        let mut args = vec![gq.arg(), gs.arg(), uq.arg(), us.arg(), xq, xds, route.arg()];
        args.extend(order.as_ref().map(CudaTensor::arg));
        args.extend([
            act.arg(),
            Arg::U32(rows_ff),
            u32_arg(h.cols, "cols")?,
            k_arg,
        ]);
        cuda.gpu.launch(kernel, dims, &args)
    })?;
    x.q8 = None;
    // Decode adds the mixed slots into `x` in the down projection; prefill writes each slot's
    // row to `y`, then mixes.
    let (kernel, dims, y) = match order {
        Some(_) => (
            by_format(*down_ty, MOE_DOWN_SORTED),
            sh.moe_sorted(slots, rows_embd),
            Some(cuda.tensor(n * k, n_embd)?),
        ),
        None => {
            let (kernel, dims) = slot_major(MOE_DOWN_ADD, *down_ty, &[rows_embd], n);
            (kernel, dims, None)
        }
    };
    cuda.with_q8(&act, |aq, ads| {
        let mut args = vec![dq.arg(), ds.arg(), aq, ads, route.arg()];
        args.extend(order.as_ref().map(CudaTensor::arg));
        args.push(y.as_ref().unwrap_or(&*x).arg());
        args.extend([Arg::U32(rows_embd), Arg::U32(rows_ff), k_arg]);
        cuda.gpu.launch(kernel, dims, &args)
    })?;
    match y {
        Some(y) => mix(cuda, x, &y, route, k_arg),
        None => Ok(()),
    }
}

/// `x[t] += Σ_j w_j · y[t·k + j]`: the slots' outputs weighed by the route, in route order.
fn mix(cuda: &Cuda, x: &CudaTensor, y: &CudaTensor, route: &CudaTensor, k: Arg) -> Result<()> {
    let len = to_u32(x.len(), "residual elements")?;
    cuda.gpu.launch(
        names::kiln_moe_mix,
        cuda.gpu.shapes().flat(len),
        &[
            y.arg(),
            route.arg(),
            x.arg(),
            u32_arg(x.cols, "width")?,
            k,
            Arg::U32(len),
        ],
    )
}
