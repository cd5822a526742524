//! Random test data. Shapes come from proptest strategies (so failures shrink to small shapes);
//! the bulk data comes from a seeded generator inside the case (shrinking megabytes of floats
//! teaches nothing, and a seed reproduces them exactly).
use kiln_host::reference::{BlockFormat, QK};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub struct Gen(StdRng);

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen(StdRng::seed_from_u64(seed))
    }
    pub fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.random_bool(p)
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.0.random_range(lo..hi)
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1: f64 = self.0.random_range(f64::MIN_POSITIVE..1.0);
        let u2: f64 = self.0.random();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
    /// `n` normals times `scale`, guaranteed not all zero.
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|_| self.normal() * scale).collect();
        if v.iter().all(|&x| x == 0.0) {
            v[0] = scale;
        }
        v
    }
    /// A magnitude spread over several decades (`10^lo ..= 10^hi`).
    pub fn magnitude(&mut self, lo: f32, hi: f32) -> f32 {
        10f32.powf(self.uniform(lo, hi))
    }
    pub fn sign(&mut self) -> f32 {
        if self.chance(0.5) { -1.0 } else { 1.0 }
    }
    pub fn byte(&mut self) -> u8 {
        self.0.random()
    }
    pub fn f16_bits(&mut self, v: f32) -> u16 {
        half::f16::from_f32(v).to_bits()
    }

    /// `blocks` random blocks of `fmt`: every quant bit pattern is possible, scales are random
    /// f16 of either sign over a few decades (and Q4_1 minimums of either sign). K blocks come
    /// in groups of eight sharing `d` (`dmin`), as a super-block's sub-blocks do (`blocks` must
    /// be a multiple of eight): Q6K with any i8 sub-block scales and every 6-bit code, Q4K/Q5K
    /// with any 6-bit `sc`, `m` and every 4/5-bit code.
    pub fn gguf_blocks(&mut self, fmt: BlockFormat, blocks: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(blocks * fmt.block_bytes());
        if fmt.group() > 1 {
            assert!(
                blocks.is_multiple_of(fmt.group()),
                "{blocks} {fmt:?} blocks"
            );
            for _ in 0..blocks / fmt.group() {
                let d = self.sign() * self.magnitude(-5.0, -3.0);
                let dmin = self.sign() * self.magnitude(-4.0, -2.0);
                let header = [
                    self.f16_bits(d).to_le_bytes(),
                    self.f16_bits(dmin).to_le_bytes(),
                ];
                for _ in 0..fmt.group() {
                    out.extend(header[0]);
                    if fmt == BlockFormat::Q6K {
                        out.extend([self.byte(), self.byte()]);
                        out.extend((0..QK).map(|_| self.below(64) as u8));
                    } else {
                        out.extend(header[1]);
                        out.extend([self.below(64) as u8, self.below(64) as u8]);
                        let limit = if fmt == BlockFormat::Q5K { 32 } else { 16 };
                        out.extend((0..QK).map(|_| self.below(limit) as u8));
                    }
                }
            }
            return out;
        }
        for _ in 0..blocks {
            let d = self.sign() * self.magnitude(-3.0, -1.0);
            out.extend(self.f16_bits(d).to_le_bytes());
            if fmt == BlockFormat::Q4_1 {
                let m = self.sign() * self.magnitude(-3.0, 0.0);
                out.extend(self.f16_bits(m).to_le_bytes());
            }
            let quant_bytes = if fmt == BlockFormat::Q8_0 { QK } else { QK / 2 };
            out.extend((0..quant_bytes).map(|_| self.byte()));
        }
        out
    }

    /// Activations of `n` rows × `cols`: normal with a per-row scale over four decades; some
    /// 32-element blocks all zero (the quantizer's d = 0 path) or carrying one outlier
    /// (a coarse quant step for the rest of the block). Never all zero.
    pub fn activations(&mut self, n: usize, cols: usize) -> Vec<f32> {
        let mut x = Vec::with_capacity(n * cols);
        for _ in 0..n {
            let scale = self.magnitude(-2.0, 2.0);
            let mut row = self.normals(cols, scale);
            for b in 0..cols / QK {
                if cols > QK && self.chance(0.1) {
                    row[b * QK..(b + 1) * QK].fill(0.0);
                } else if self.chance(0.2) {
                    row[b * QK + self.below(QK)] = 8.0 * scale * self.sign();
                }
            }
            x.extend(row);
        }
        x
    }
}

/// A seed for the case's bulk data.
pub fn seed() -> impl Strategy<Value = u64> {
    any::<u64>()
}

/// Lengths that hit the edges (1, a warp, a block of 256 threads, one past each) as well as
/// arbitrary values up to `max`.
pub fn length(max: u32) -> impl Strategy<Value = u32> {
    let edges: Vec<u32> = [1, 2, 31, 32, 33, 255, 256, 257]
        .into_iter()
        .filter(|&e| e <= max)
        .collect();
    prop_oneof![prop::sample::select(edges), 1..=max]
}

/// Head dimensions the models use.
pub fn head_dim() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![32u32, 64, 128])
}
