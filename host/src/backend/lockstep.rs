//! Two backends in lockstep: every op runs on both with identical inputs, the second backend's
//! result is compared with the first's and then replaced by it, so a difference always belongs
//! to the op that produced it. Free-running comparisons of quantized models cannot isolate ops
//! this way: a sub-ulp difference can flip one 8-bit activation code and move the logits by ~1e-2.
use std::cell::RefCell;
use std::sync::Arc;

use anyhow::Result;

use super::{Attention, Backend, KvSpec, Moe, Rope, Shape};
use crate::gguf::GgufFile;

/// What a lockstep run found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Ops compared.
    pub ops: usize,
    /// Largest relative difference (max |a−b| / max |a|) seen per op kind.
    pub worst: Vec<(String, f32)>,
    /// Ops above the tolerance: description with the first offending element.
    pub mismatches: Vec<String>,
}

pub struct Lockstep<R: Backend, C: Backend> {
    reference: R,
    candidate: C,
    tolerance: f32,
    report: RefCell<Report>,
}

pub struct Pair<R: Backend, C: Backend>(R::Tensor, C::Tensor);
pub struct PairW<R: Backend, C: Backend>(R::Weight, C::Weight, String);

impl<R: Backend, C: Backend> Shape for Pair<R, C> {
    fn rows(&self) -> usize {
        self.0.rows()
    }
    fn cols(&self) -> usize {
        self.0.cols()
    }
}
impl<R: Backend, C: Backend> Shape for PairW<R, C> {
    fn rows(&self) -> usize {
        self.0.rows()
    }
    fn cols(&self) -> usize {
        self.0.cols()
    }
}

impl<R: Backend, C: Backend> Lockstep<R, C> {
    /// `tolerance`: max |reference − candidate| over max |reference| allowed per op.
    pub fn new(reference: R, candidate: C, tolerance: f32) -> Self {
        Lockstep {
            reference,
            candidate,
            tolerance,
            report: RefCell::default(),
        }
    }
    pub fn report(&self) -> Report {
        self.report.borrow().clone()
    }

    fn check(&self, op: &str, kind: &str, r: R::Tensor, c: C::Tensor) -> Result<Pair<R, C>> {
        let (a, b) = (self.reference.read(&r)?, self.candidate.read(&c)?);
        let scale = a
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(f32::MIN_POSITIVE);
        let (at, diff) = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .enumerate()
            .fold(
                (0, 0f32),
                |m, (i, d)| if d > m.1 || d.is_nan() { (i, d) } else { m },
            );
        let rel = diff / scale;
        let mut rep = self.report.borrow_mut();
        rep.ops += 1;
        match rep.worst.iter_mut().find(|(k, _)| k == kind) {
            Some((_, w)) => *w = w.max(rel),
            None => rep.worst.push((kind.to_string(), rel)),
        }
        #[allow(clippy::neg_cmp_op_on_partial_ord)] // a NaN difference is a mismatch too
        if !(rel <= self.tolerance) {
            rep.mismatches.push(format!(
                "{op}: rel diff {rel:.2e} at element {at} (reference {}, candidate {})",
                a[at],
                b.get(at).copied().unwrap_or(f32::NAN)
            ));
        }
        drop(rep);
        let synced = self.candidate.upload(&a, r.rows(), r.cols())?;
        Ok(Pair(r, synced))
    }

    fn resync(&self, op: &str, kind: &str, x: &mut Pair<R, C>) -> Result<()> {
        let r = self.reference.rows(&x.0, 0, x.0.rows())?;
        let c = self.candidate.rows(&x.1, 0, x.0.rows())?;
        *x = self.check(op, kind, r, c)?;
        Ok(())
    }
}

impl<R: Backend, C: Backend> Backend for Lockstep<R, C> {
    type Tensor = Pair<R, C>;
    type Weight = PairW<R, C>;
    type KvCache = (R::KvCache, C::KvCache);

    fn name(&self) -> &'static str {
        "lockstep"
    }
    fn load_weight(&self, f: &Arc<GgufFile>, n: &str) -> Result<Self::Weight> {
        Ok(PairW(
            self.reference.load_weight(f, n)?,
            self.candidate.load_weight(f, n)?,
            n.to_string(),
        ))
    }
    fn kv_cache(&self, s: &KvSpec) -> Result<Self::KvCache> {
        Ok((self.reference.kv_cache(s)?, self.candidate.kv_cache(s)?))
    }
    fn upload(&self, d: &[f32], r: usize, c: usize) -> Result<Self::Tensor> {
        Ok(Pair(
            self.reference.upload(d, r, c)?,
            self.candidate.upload(d, r, c)?,
        ))
    }
    fn read(&self, x: &Self::Tensor) -> Result<Vec<f32>> {
        self.reference.read(&x.0)
    }
    fn argmax(&self, x: &Self::Tensor) -> Result<Vec<u32>> {
        self.reference.argmax(&x.0)
    }
    fn rows(&self, x: &Self::Tensor, s: usize, n: usize) -> Result<Self::Tensor> {
        self.check(
            "rows",
            "rows",
            self.reference.rows(&x.0, s, n)?,
            self.candidate.rows(&x.1, s, n)?,
        )
    }
    fn embed(&self, t: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor> {
        self.check(
            &format!("embed {}", t.2),
            "embed",
            self.reference.embed(&t.0, ids)?,
            self.candidate.embed(&t.1, ids)?,
        )
    }
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor> {
        self.check(
            &format!("matmul {}", w.2),
            "matmul",
            self.reference.matmul(&x.0, &w.0)?,
            self.candidate.matmul(&x.1, &w.1)?,
        )
    }
    fn matmul_many(&self, x: &Self::Tensor, ws: &[&Self::Weight]) -> Result<Vec<Self::Tensor>> {
        let r = self
            .reference
            .matmul_many(&x.0, &ws.iter().map(|w| &w.0).collect::<Vec<_>>())?;
        let c = self
            .candidate
            .matmul_many(&x.1, &ws.iter().map(|w| &w.1).collect::<Vec<_>>())?;
        r.into_iter()
            .zip(c)
            .zip(ws)
            .map(|((r, c), w)| self.check(&format!("matmul_many {}", w.2), "matmul", r, c))
            .collect()
    }
    fn matmul_swiglu(
        &self,
        x: &Self::Tensor,
        g: &Self::Weight,
        u: &Self::Weight,
    ) -> Result<Self::Tensor> {
        let r = self.reference.matmul_swiglu(&x.0, &g.0, &u.0)?;
        let c = self.candidate.matmul_swiglu(&x.1, &g.1, &u.1)?;
        self.check(&format!("matmul_swiglu {}", g.2), "matmul_swiglu", r, c)
    }
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Result<Self::Tensor> {
        let r = self.reference.rms_norm(&x.0, &w.0, eps)?;
        let c = self.candidate.rms_norm(&x.1, &w.1, eps)?;
        self.check(&format!("rms_norm {}", w.2), "rms_norm", r, c)
    }
    fn rms_norm_rope(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        p: usize,
        rope: &Rope,
    ) -> Result<Self::Tensor> {
        let r = self.reference.rms_norm_rope(&x.0, &w.0, eps, p, rope)?;
        let c = self.candidate.rms_norm_rope(&x.1, &w.1, eps, p, rope)?;
        self.check(
            &format!("rms_norm_rope {} pos {p}", w.2),
            "rms_norm_rope",
            r,
            c,
        )
    }
    fn rope(&self, x: &mut Self::Tensor, p: usize, rope: &Rope) -> Result<()> {
        self.reference.rope(&mut x.0, p, rope)?;
        self.candidate.rope(&mut x.1, p, rope)?;
        self.resync(&format!("rope pos {p}"), "rope", x)
    }
    fn swiglu(&self, g: &Self::Tensor, u: &Self::Tensor) -> Result<Self::Tensor> {
        self.check(
            "swiglu",
            "swiglu",
            self.reference.swiglu(&g.0, &u.0)?,
            self.candidate.swiglu(&g.1, &u.1)?,
        )
    }
    fn moe_route(&self, logits: &Self::Tensor, moe: &Moe) -> Result<Self::Tensor> {
        self.check(
            "moe_route",
            "moe_route",
            self.reference.moe_route(&logits.0, moe)?,
            self.candidate.moe_route(&logits.1, moe)?,
        )
    }
    fn moe_swiglu_add(
        &self,
        x: &mut Self::Tensor,
        h: &Self::Tensor,
        route: &Self::Tensor,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        moe: &Moe,
    ) -> Result<()> {
        let (g, u, d) = (gate, up, down);
        self.reference
            .moe_swiglu_add(&mut x.0, &h.0, &route.0, &g.0, &u.0, &d.0, moe)?;
        self.candidate
            .moe_swiglu_add(&mut x.1, &h.1, &route.1, &g.1, &u.1, &d.1, moe)?;
        self.resync(&format!("moe_swiglu_add {}", g.2), "moe_swiglu_add", x)
    }
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()> {
        self.reference.add_assign(&mut x.0, &y.0)?;
        self.candidate.add_assign(&mut x.1, &y.1)?;
        self.resync("add", "add", x)
    }
    fn add_row(&self, x: &mut Self::Tensor, row: &Self::Tensor) -> Result<()> {
        self.reference.add_row(&mut x.0, &row.0)?;
        self.candidate.add_row(&mut x.1, &row.1)?;
        self.resync("add_row", "add_row", x)
    }
    fn attention(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        pos: usize,
        a: &Attention,
    ) -> Result<Self::Tensor> {
        let r = self
            .reference
            .attention(&mut cache.0, layer, &q.0, &k.0, &v.0, pos, a)?;
        let c = self
            .candidate
            .attention(&mut cache.1, layer, &q.1, &k.1, &v.1, pos, a)?;
        self.check(
            &format!("attention layer {layer} pos {pos}"),
            "attention",
            r,
            c,
        )
    }
}
