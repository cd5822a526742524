//! Shared harness of the kernel property tests.
//!
//! A property is written once against [`Device`]: upload bytes, launch an entry by its name
//! from the kernel table with the same `Arg` list the CUDA runtime passes, download bytes. Two
//! devices implement it: [`HostDev<P>`] runs the kernel bodies on the host grid executor for a
//! chosen policy (every policy in CI), [`GpuDev`] runs the embedded PTX on a real GPU. The same
//! property, the same random cases, the same tolerances on both.
#![allow(dead_code)]

pub mod data;
mod host_dev;

pub use host_dev::HostDev;
pub use kernels_gpu::entries::names;
pub use kernels_gpu::kernels::launch::Dims;
pub use kiln_host::cuda::{Arg, LaunchShapes};
pub use kiln_host::reference;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::cell::RefCell;
use std::fmt::Debug;

/// A device buffer: its address (what a kernel argument carries) and size.
#[derive(Clone, Copy, Debug)]
pub struct Buf {
    pub ptr: u64,
    pub bytes: usize,
    slot: usize,
}

impl Buf {
    pub fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }
}

/// What a property needs from a device. Object safe, so properties take `&mut dyn Device`.
pub trait Device {
    /// Names the device and policy in failure messages (`host sm_90`, `GPU NVIDIA H200 sm_90`).
    fn label(&self) -> String;
    /// Launch shapes of the policy the kernels were instantiated with.
    fn shapes(&self) -> &dyn LaunchShapes;
    /// Copy bytes to a new buffer, 16-byte aligned (the kernels' vector loads need it).
    fn upload_bytes(&mut self, bytes: &[u8]) -> Buf;
    fn download_bytes(&mut self, buf: &Buf) -> Vec<u8>;
    /// Launch an entry and wait for it; a launch or kernel fault panics with the device's error.
    fn launch(&mut self, entry: &'static str, dims: Dims, args: &[Arg]);
    /// Free every buffer (between cases).
    fn reset(&mut self);
}

/// Plain-old-data element types the kernels read and write.
pub trait Pod: Copy + Default + 'static {}
impl Pod for f32 {}
impl Pod for u32 {}
impl Pod for u16 {}
impl Pod for u8 {}
impl Pod for i8 {}
impl Pod for f64 {}

pub fn as_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: Pod types have no padding and every byte is initialized.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub fn upload<T: Pod>(d: &mut dyn Device, v: &[T]) -> Buf {
    d.upload_bytes(as_bytes(v))
}

/// A buffer of `n` elements of `T` with every byte set to `byte`: outputs start poisoned so a
/// result the kernel never wrote stays recognizable (0xFF: NaN as f32 and as f16).
pub fn poisoned<T: Pod>(d: &mut dyn Device, n: usize, byte: u8) -> Buf {
    d.upload_bytes(&vec![byte; n * std::mem::size_of::<T>()])
}

pub fn download<T: Pod>(d: &mut dyn Device, b: &Buf) -> Vec<T> {
    let bytes = d.download_bytes(b);
    let n = b.bytes / std::mem::size_of::<T>();
    let mut out = vec![T::default(); n];
    // SAFETY: `out` has exactly `n * size_of::<T>()` bytes; any bit pattern is a valid Pod.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            out.as_mut_ptr() as *mut u8,
            n * std::mem::size_of::<T>(),
        )
    };
    out
}

/// The host executor for all three policies.
pub fn host_devices() -> Vec<Box<dyn Device>> {
    vec![
        Box::new(HostDev::<policies::Ampere>::new()),
        Box::new(HostDev::<policies::Hopper>::new()),
        Box::new(HostDev::<policies::SparkGb10>::new()),
    ]
}

/// The first GPU with the module for its architecture, or `None` after printing why the GPU
/// variant is skipped (so a skip is visible in `--nocapture` output and in CI logs).
pub fn gpu_device(test: &str) -> Option<GpuDev> {
    if !kiln_host::cuda::driver_present() {
        visible(&format!(
            "SKIP {test}: no CUDA device (no CUDA driver library could be loaded)"
        ));
        return None;
    }
    match kiln_host::cuda::Gpu::new(kiln::PTX_MODULES, 0) {
        Ok(gpu) => Some(GpuDev {
            gpu,
            bufs: Vec::new(),
        }),
        Err(e) => {
            visible(&format!("SKIP {test}: no CUDA device ({e:#})"));
            None
        }
    }
}

/// A line on the real stderr: libtest captures `eprintln!` of passing tests, and a skipped GPU
/// test must not look like a passed one.
fn visible(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

pub struct GpuDev {
    gpu: kiln_host::cuda::Gpu,
    bufs: Vec<kiln_host::cuda::DBuf<u8>>,
}

impl Device for GpuDev {
    fn label(&self) -> String {
        let (ma, mi) = self.gpu.compute_capability();
        format!(
            "GPU {} (cc {ma}.{mi}, module {})",
            self.gpu.name(),
            self.gpu.module_name()
        )
    }
    fn shapes(&self) -> &dyn LaunchShapes {
        self.gpu.shapes()
    }
    fn upload_bytes(&mut self, bytes: &[u8]) -> Buf {
        let b = if bytes.is_empty() {
            self.gpu.alloc::<u8>(1)
        } else {
            self.gpu.upload(bytes)
        };
        let b = b.unwrap_or_else(|e| panic!("{}: {e:#}", self.label()));
        assert!(b.ptr() % 16 == 0, "device allocation not 16-byte aligned");
        let buf = Buf {
            ptr: b.ptr(),
            bytes: bytes.len(),
            slot: self.bufs.len(),
        };
        self.bufs.push(b);
        buf
    }
    fn download_bytes(&mut self, buf: &Buf) -> Vec<u8> {
        let mut v = self
            .gpu
            .download(&self.bufs[buf.slot])
            .unwrap_or_else(|e| panic!("{}: {e:#}", self.label()));
        v.truncate(buf.bytes);
        v
    }
    fn launch(&mut self, entry: &'static str, dims: Dims, args: &[Arg]) {
        // Synchronize per launch so a fault is blamed on the kernel that caused it.
        let r = self
            .gpu
            .launch(entry, dims, args)
            .and_then(|_| self.gpu.synchronize());
        r.unwrap_or_else(|e| panic!("{}: {entry} {dims:?}: {e:#}", self.label()));
    }
    fn reset(&mut self) {
        self.bufs.clear();
    }
}

/// Cases per property on the host executor: few, because every launch there spawns one OS
/// thread per GPU thread and the suite must stay quick on two cores. `KILN_HOST_CASES`
/// overrides (a nightly job can afford more).
pub fn host_cases() -> u32 {
    env_cases("KILN_HOST_CASES", 16)
}
/// Cases per property on a GPU, where a case costs milliseconds (`KILN_GPU_CASES` overrides).
pub fn gpu_cases() -> u32 {
    env_cases("KILN_GPU_CASES", 256)
}

fn env_cases(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(cases: u32) -> TestRunner {
    // No regression files (the harness is not the `proptest!` macro), bounded shrinking since
    // each host case costs tens of milliseconds.
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    })
}

/// A property over one device and one generated case.
pub type Property<T> = fn(&mut dyn Device, &T) -> Result<(), TestCaseError>;

/// Run `prop` for `cases` random cases, each on the host executor of every policy.
pub fn run_host<S: Strategy>(cases: u32, strategy: S, prop: Property<S::Value>)
where
    S::Value: Debug,
{
    let result = runner(cases).run(&strategy, |case| {
        for mut dev in host_devices() {
            prop(&mut *dev, &case)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Run `prop` on the GPU (if there is one; else a visible skip).
pub fn run_gpu<S: Strategy>(test: &str, cases: u32, strategy: S, prop: Property<S::Value>)
where
    S::Value: Debug,
{
    let Some(dev) = gpu_device(test) else { return };
    visible(&format!("{test}: {cases} cases on {}", dev.label()));
    let dev = RefCell::new(dev);
    let result = runner(cases).run(&strategy, |case| {
        let mut d = dev.borrow_mut();
        d.reset();
        prop(&mut *d, &case)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// `#[test] fn $host` on every policy's host executor and `#[test] fn $gpu` on the GPU, for one
/// strategy and property.
#[macro_export]
macro_rules! kernel_properties {
    ($( $host:ident, $gpu:ident: $strategy:expr => $prop:path; )*) => {$(
        #[test]
        fn $host() {
            common::run_host(common::host_cases(), $strategy, $prop);
        }
        #[test]
        fn $gpu() {
            common::run_gpu(stringify!($gpu), common::gpu_cases(), $strategy, $prop);
        }
    )*};
}

/// GGUF blocks → the split planes (quants, scales) the GPU keeps.
pub fn split_planes(
    fmt: reference::BlockFormat,
    gguf: &[u8],
    rows: usize,
    cols: usize,
) -> (Vec<u8>, Vec<u8>) {
    use kernels_gpu::kernels::formats::{self, SplitFormat, split_gguf_blocks, split_plane_bytes};
    fn go<F: SplitFormat>(gguf: &[u8], rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
        let (qb, sb) = split_plane_bytes::<F>(rows, cols);
        let (mut qs, mut sc) = (vec![0u8; qb], vec![0u8; sb]);
        assert!(split_gguf_blocks::<F>(gguf, rows, cols, &mut qs, &mut sc));
        (qs, sc)
    }
    match fmt {
        reference::BlockFormat::Q4_0 => go::<formats::Q4_0>(gguf, rows, cols),
        reference::BlockFormat::Q4_1 => go::<formats::Q4_1>(gguf, rows, cols),
        reference::BlockFormat::Q8_0 => go::<formats::Q8_0>(gguf, rows, cols),
        reference::BlockFormat::Q6K => go::<formats::Q6K>(gguf, rows, cols),
        reference::BlockFormat::Q5K => go::<formats::Q5K>(gguf, rows, cols),
        reference::BlockFormat::Q4K => go::<formats::Q4K>(gguf, rows, cols),
    }
}

/// Random GGUF blocks of a `rows × cols` matrix in `fmt` and its split planes on the device:
/// (GGUF blocks, quants buffer, scales buffer).
pub fn split_weights(
    dev: &mut dyn Device,
    g: &mut data::Gen,
    fmt: reference::BlockFormat,
    rows: usize,
    cols: usize,
) -> (Vec<u8>, Buf, Buf) {
    let gguf = g.gguf_blocks(fmt, rows * cols / reference::QK);
    let (qs, sc) = split_planes(fmt, &gguf, rows, cols);
    (gguf, upload(dev, &qs), upload(dev, &sc))
}

/// The entry of kernel family `family` (`kernels_gpu::entries::families`) for `fmt`: the
/// families list the formats in `BlockFormat`'s order.
pub fn entry(
    fmt: reference::BlockFormat,
    family: kernels_gpu::entries::families::FormatEntries,
) -> &'static str {
    family[fmt as usize]
}

/// Fail the case (with the device named) unless `err <= tol`; NaN fails too.
pub fn check_err(dev: &dyn Device, what: &str, err: f64, tol: f64) -> Result<(), TestCaseError> {
    if err <= tol {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!(
            "{}: {what}: relative error {err:.3e} > {tol:.1e}",
            dev.label()
        )))
    }
}

/// Fail unless buffers `a` and `b` hold the same elements of `T` bit for bit (so f32 NaN
/// equals itself and 0.0 differs from -0.0), naming `what` and the first element that differs.
pub fn same_bits<T: Pod + Debug>(
    dev: &mut dyn Device,
    what: &str,
    a: &Buf,
    b: &Buf,
) -> Result<(), TestCaseError> {
    let (x, y) = (download::<T>(dev, a), download::<T>(dev, b));
    let bits = |v: &T| as_bytes(std::slice::from_ref(v)).to_vec();
    let first = (0..x.len().max(y.len())).find(|&i| x.get(i).map(bits) != y.get(i).map(bits));
    match first {
        None => Ok(()),
        Some(i) => Err(TestCaseError::fail(format!(
            "{}: {what} differ: element {i} of {} / {}: {:?} vs {:?}",
            dev.label(),
            x.len(),
            y.len(),
            x.get(i),
            y.get(i)
        ))),
    }
}

/// Fail unless every f32 of `out` was written (poison is NaN; the inputs never produce NaN).
pub fn check_written(dev: &dyn Device, what: &str, out: &[f32]) -> Result<(), TestCaseError> {
    match out.iter().position(|v| v.is_nan()) {
        None => Ok(()),
        Some(i) => Err(TestCaseError::fail(format!(
            "{}: {what}: element {i} of {} is NaN (never written?); {} NaN in all",
            dev.label(),
            out.len(),
            out.iter().filter(|v| v.is_nan()).count()
        ))),
    }
}

/// Quantize `x` (`n × cols`) with the kernel and check every block against the Q8_1
/// definition (llama.cpp's, which the CPU backend shares): with d = amax/127 in f32, codes
/// q = round(x/d) (half away from zero), stored d' = f16(d) and s' = f16(d·Σq). Returns the
/// device buffers and the downloaded `xq`, `xds`.
pub fn quantize_q8_1(
    dev: &mut dyn Device,
    x: &[f32],
    cols: usize,
    n: usize,
) -> Result<(Buf, Buf, Vec<i8>, Vec<f32>), TestCaseError> {
    let nb = cols / reference::QK;
    let xb = upload(dev, x);
    // -128 never comes out of the quantizer (|x/d| <= 127): it marks bytes never written.
    let xq_b = poisoned::<i8>(dev, n * cols, 0x80);
    let xds_b = poisoned::<f32>(dev, n * nb * 2, 0xff);
    let dims = dev.shapes().quantize_q8_1(cols as u32, n as u32);
    dev.launch(
        names::kiln_quantize_q8_1,
        dims,
        &[xb.arg(), xq_b.arg(), xds_b.arg(), Arg::U32(cols as u32)],
    );
    let (xq, xds) = (download::<i8>(dev, &xq_b), download::<f32>(dev, &xds_b));
    check_written(dev, "quantize_q8_1 scales", &xds)?;
    let label = dev.label();
    let f16 = |v: f32| half::f16::from_f32(v).to_f32();
    for blk in 0..n * nb {
        let xs = &x[blk * reference::QK..][..reference::QK];
        let qs = &xq[blk * reference::QK..][..reference::QK];
        let (d_stored, s_stored) = (xds[2 * blk], xds[2 * blk + 1]);
        let d = xs.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        prop_assert!(
            d_stored == f16(d),
            "{label}: block {blk}: d = {d_stored}, want f16({d}) = {}",
            f16(d)
        );
        for (i, (&q, &v)) in qs.iter().zip(xs).enumerate() {
            let ideal = if d == 0.0 { 0.0 } else { v as f64 / d as f64 };
            // The kernel multiplies by an f32 reciprocal: a tie may go either way by an ulp.
            prop_assert!(
                q != -128 && (q as f64 - ideal).abs() <= 0.5 + 1e-4,
                "{label}: block {blk} elem {i}: q = {q}, x/d = {ideal}"
            );
        }
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        let want_s = f16(d * sum as f32);
        prop_assert!(
            s_stored == want_s,
            "{label}: block {blk}: s = {s_stored}, want f16(d·Σq) = {want_s}"
        );
    }
    Ok((xq_b, xds_b, xq, xds))
}

/// Every split block format the GPU kernels take, for strategies that pick one.
pub const ALL_FORMATS: [reference::BlockFormat; 6] = {
    use reference::BlockFormat as B;
    [B::Q4_0, B::Q4_1, B::Q8_0, B::Q6K, B::Q5K, B::Q4K]
};

/// Quant and staged-scale u32 words per block of `fmt`'s split layout (`SplitFormat::QS_WORDS`,
/// `STAGED_WORDS`): what the GEMM launch shapes size shared memory by.
pub fn gemm_words(fmt: reference::BlockFormat) -> (u32, u32) {
    use kernels_gpu::kernels::formats::{self, SplitFormat};
    use reference::BlockFormat as B;
    fn words<F: SplitFormat>() -> (u32, u32) {
        (F::QS_WORDS as u32, F::STAGED_WORDS as u32)
    }
    match fmt {
        B::Q4_0 => words::<formats::Q4_0>(),
        B::Q4_1 => words::<formats::Q4_1>(),
        B::Q8_0 => words::<formats::Q8_0>(),
        B::Q6K => words::<formats::Q6K>(),
        B::Q5K => words::<formats::Q5K>(),
        B::Q4K => words::<formats::Q4K>(),
    }
}
