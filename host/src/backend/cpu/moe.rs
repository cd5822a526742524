//! Mixture-of-experts on the CPU: routing (softmax, top-k) and the experts' SwiGLU feed-forwards.
//!
//! Tokens are grouped by expert, so each chosen expert's weights are streamed once per forward
//! pass however many tokens picked it (prefill), and its mat-muls run over all those tokens at
//! once. Each (token, slot) output lands in its own row, and the weighted sum runs in slot order
//! afterwards, so the grouping does not change the result.

use anyhow::{Result, ensure};

use super::{Cpu, CpuTensor, CpuWeight};
use crate::backend::Moe;
use crate::quant::{self, QMatrix};

/// The route of one row: the chosen experts' indices (descending probability, the lower index
/// first on ties) and their weights. Shared by the CPU backend and the tests' expectations.
pub fn route_row(logits: &[f32], moe: &Moe) -> (Vec<usize>, Vec<f32>) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    // Ranked by logit, not by probability: exp can round two different logits to one value.
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(moe.n_used);
    let mut w: Vec<f32> = order.iter().map(|&e| exps[e] / sum).collect();
    if moe.norm_weights {
        let chosen: f32 = w.iter().sum();
        w.iter_mut().for_each(|p| *p /= chosen);
    }
    (order, w)
}

pub(super) fn route(logits: &CpuTensor, moe: &Moe) -> Result<CpuTensor> {
    moe.check_logits(logits)?;
    let k = moe.n_used;
    let mut out = Vec::with_capacity(logits.rows * 2 * k);
    for row in logits.data.chunks_exact(logits.cols) {
        ensure!(
            row.iter().all(|v| v.is_finite()),
            "moe_route: router logits are not finite"
        );
        let (ids, w) = route_row(row, moe);
        out.extend(ids.iter().map(|&e| e as f32));
        out.extend(w);
    }
    CpuTensor::new(out, logits.rows, 2 * k)
}

/// The (expert index, weight) pairs of `route`'s row `t`, checked against `n_expert`.
pub(super) fn route_pairs(route: &[f32], moe: &Moe) -> Result<Vec<(usize, f32)>> {
    let k = moe.n_used;
    (0..k)
        .map(|j| {
            let e = route[j];
            ensure!(
                e >= 0.0 && e.fract() == 0.0 && (e as usize) < moe.n_expert,
                "moe route names expert {e} of {}",
                moe.n_expert
            );
            Ok((e as usize, route[k + j]))
        })
        .collect()
}

/// Expert `e`'s rows of a stacked expert weight (`[n_expert·rows, cols]`).
fn expert<'a>(w: &'a CpuWeight, e: usize, moe: &Moe) -> Result<QMatrix<'a>> {
    let m = w.qmatrix();
    ensure!(
        m.rows.is_multiple_of(moe.n_expert),
        "tensor {}: {} rows are not {} experts",
        w.info.name,
        m.rows,
        moe.n_expert
    );
    let rows = m.rows / moe.n_expert;
    let rb = m.row_bytes();
    Ok(QMatrix {
        data: &m.data[e * rows * rb..(e + 1) * rows * rb],
        rows,
        ..m
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) fn swiglu_add(
    cpu: &Cpu,
    x: &mut CpuTensor,
    h: &CpuTensor,
    route: &CpuTensor,
    gate: &CpuWeight,
    up: &CpuWeight,
    down: &CpuWeight,
    moe: &Moe,
) -> Result<()> {
    let n_ff = moe.check_ffn(
        x,
        h,
        route,
        [
            (gate, &gate.info.name),
            (up, &up.info.name),
            (down, &down.info.name),
        ],
    )?;
    let (n, k) = (h.rows, moe.n_used);
    let pairs = route
        .data
        .chunks_exact(2 * k)
        .map(|r| route_pairs(r, moe))
        .collect::<Result<Vec<_>>>()?;
    // Slot (t, j)'s expert output goes to row t·k + j.
    let n_embd = x.cols;
    let mut outs = vec![0f32; n * k * n_embd];
    for e in 0..moe.n_expert {
        let slots: Vec<usize> = (0..n * k).filter(|&s| pairs[s / k][s % k].0 == e).collect();
        if slots.is_empty() {
            continue;
        }
        let m = slots.len();
        let mut xe = Vec::with_capacity(m * h.cols);
        for &s in &slots {
            let t = s / k;
            xe.extend_from_slice(&h.data[t * h.cols..(t + 1) * h.cols]);
        }
        let (g, u, d) = (
            expert(gate, e, moe)?,
            expert(up, e, moe)?,
            expert(down, e, moe)?,
        );
        let mut act = vec![0f32; m * n_ff];
        let mut ye = vec![0f32; m * n_embd];
        if cpu.f32_activations {
            let mut ua = vec![0f32; m * n_ff];
            g.matmul_f32x(&xe, m, &mut act)?;
            u.matmul_f32x(&xe, m, &mut ua)?;
            for (a, &b) in act.iter_mut().zip(&ua) {
                *a = cpu.numerics.silu_mul(*a, b);
            }
            d.matmul_f32x(&act, m, &mut ye)?;
        } else {
            quant::matmul_swiglu(cpu.numerics, &g, &u, &xe, m, &mut act)?;
            quant::matmul_many(cpu.numerics, &[d], &act, m, &mut [&mut ye])?;
        }
        for (&s, y) in slots.iter().zip(ye.chunks_exact(n_embd)) {
            outs[s * n_embd..(s + 1) * n_embd].copy_from_slice(y);
        }
    }
    for (t, row) in x.data.chunks_exact_mut(n_embd).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            let mut sum = 0f32;
            for (j, &(_, w)) in pairs[t].iter().enumerate() {
                sum += w * outs[(t * k + j) * n_embd + c];
            }
            *v += sum;
        }
    }
    Ok(())
}
