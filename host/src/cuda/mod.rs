//! The CUDA runtime layer, on cudarc with dynamic loading: the binary builds and starts on a
//! machine without CUDA, and asking for the GPU there is a clear error instead of a panic.
//!
//! [`Gpu`] picks the embedded PTX module for the device (the newest whose `min_cc` is not above
//! the device's compute capability), loads it once, resolves every kernel entry up front, owns
//! the stream, and launches with shapes from the same policy the module was compiled with.
mod shapes;

use anyhow::{Context, Result, anyhow, bail, ensure};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use kernels_gpu::kernels::launch::Dims;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use shapes::LaunchShapes;

/// One embedded PTX module: built for policy `name`, runs on compute capability ≥ `min_cc`.
#[derive(Clone, Copy, Debug)]
pub struct PtxModule {
    pub name: &'static str,
    /// major·10 + minor.
    pub min_cc: u32,
    pub ptx: &'static str,
}

/// `ptx` with a `.maxntid threads, 1, 1` directive on every entry whose name starts with one of
/// the `bounds` prefixes (rustc has no launch-bounds attribute for nvptx kernels, and without
/// one ptxas may give a kernel more registers than a large block can have). An error if a
/// prefix names no entry: the bound would silently not apply.
pub fn with_launch_bounds(ptx: &str, bounds: &[(&str, u32)]) -> Result<String> {
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut hits = vec![0usize; bounds.len()];
    let mut pending = None;
    for line in ptx.split_inclusive('\n') {
        out.push_str(line);
        if let Some(name) = line.trim_start().strip_prefix(".visible .entry ") {
            pending = bounds
                .iter()
                .position(|(prefix, _)| name.starts_with(prefix));
        }
        // The parameter list closes on a line of its own, before the body's `{`.
        if line.starts_with(')')
            && let Some(i) = pending.take()
        {
            out.push_str(&format!(".maxntid {}, 1, 1\n", bounds[i].1));
            hits[i] += 1;
        }
    }
    if let Some(i) = hits.iter().position(|&h| h == 0) {
        bail!(
            "no kernel entry starts with {:?} for its launch bound",
            bounds[i].0
        );
    }
    Ok(out)
}

/// Launch shapes of policy `P` (what a module built for `P` is launched with).
pub fn launch_shapes<P: policies::TargetPolicy>() -> &'static dyn LaunchShapes {
    launch_shapes_of(P::NAME)
}

/// Launch shapes of the policy a module named `name` (`PtxModule::name`) was built for.
pub fn launch_shapes_of(name: &str) -> &'static dyn LaunchShapes {
    shapes::for_module(name).expect("every policy has launch shapes")
}

/// Whether a CUDA driver library can be loaded at all (cudarc panics if we try without one).
pub fn driver_present() -> bool {
    // SAFETY: only probes for the shared library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The module for a device of compute capability `cc` (major·10 + minor): the newest whose
/// `min_cc` is not above it. Arch-specific features stay out of the modules, so this holds.
pub fn pick_module(modules: &[PtxModule], cc: u32) -> Option<&PtxModule> {
    modules
        .iter()
        .filter(|m| m.min_cc <= cc)
        .max_by_key(|m| m.min_cc)
}

pub use kernels_gpu::entries::Arg;

/// An on/off A/B switch (README, "Switches"): on unless the variable is set to `0`.
pub(crate) fn env_on(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}

enum Mem<T> {
    Cuda(CudaSlice<T>),
    /// Page-locked host memory mapped into the device's address space (read by kernels over
    /// the bus; never copied by `write`/`download`, which only device buffers take).
    Mapped(#[allow(dead_code)] PinnedHostSlice<T>), // held for its lifetime; kernels use `ptr`
    /// Host-executor memory (u128 words: 16-byte aligned like device allocations).
    Host(Box<[u128]>),
}

/// A device buffer of `T` (or, on the host executor, a host allocation standing in for one).
/// A recorded sequence of launches (a CUDA graph), replayed with [`Gpu::replay`].
pub struct Graph(cudarc::driver::CudaGraph);

pub struct DBuf<T> {
    mem: Mem<T>,
    ptr: u64,
    len: usize,
}

impl<T> DBuf<T> {
    /// Device address, for kernel arguments.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Address of element `i`.
    pub fn ptr_at(&self, i: usize) -> u64 {
        debug_assert!(i <= self.len);
        self.ptr + (i * std::mem::size_of::<T>()) as u64
    }
    pub fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

struct CudaImp {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Launch with programmatic stream serialization (the policy's `HAS_PDL`; `KILN_PDL=0` turns it off).
    pdl: bool,
    /// Resident blocks per SM by (kernel, block size, shared bytes), asked of the driver once.
    occupancy: Mutex<HashMap<(&'static str, u32, u32), u32>>,
    _module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
}

/// Runs one kernel-table entry on the host grid executor (`run_on_host::<P>`).
type HostRun = unsafe fn(&str, Dims, &[Arg]) -> Result<(), &'static str>;

enum Imp {
    Cuda(CudaImp),
    /// With the launches per kernel so far ([`Gpu::host_launches`]).
    Host(HostRun, Mutex<HashMap<&'static str, usize>>),
}

/// The GPU: one device, one stream, the module for its architecture. [`Gpu::host`] makes the
/// same object over the host grid executor, so everything above this layer (the CUDA backend
/// included) can be tested on a machine without a GPU.
pub struct Gpu {
    imp: Imp,
    module_name: &'static str,
    shapes: &'static dyn LaunchShapes,
    name: String,
    cc: (i32, i32),
    sms: u32,
}

fn host_bytes(words: &[u128], n: usize) -> &[u8] {
    // SAFETY: the allocation holds at least `n` bytes (checked by callers via `len`).
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, n) }
}

impl Gpu {
    /// Open device `ordinal` and load the matching module from `modules`.
    pub fn new(modules: &[PtxModule], ordinal: usize) -> Result<Gpu> {
        if !driver_present() {
            bail!("no CUDA driver found (libcuda.so could not be loaded); use --device cpu");
        }
        let count = CudaContext::device_count()
            .map_err(|e| anyhow!("CUDA driver present but unusable: {e:?}"))?;
        if ordinal as i32 >= count {
            bail!("CUDA device {ordinal} requested but {count} device(s) found");
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| anyhow!("cannot open CUDA device {ordinal}: {e:?}"))?;
        // kiln orders its own work on one stream; cudarc's per-buffer event tracking would add
        // two event calls per argument per launch.
        unsafe { ctx.disable_event_tracking() };
        let cc = ctx.compute_capability().map_err(|e| anyhow!("{e:?}"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let cc_num = (cc.0 * 10 + cc.1) as u32;
        let module = *pick_module(modules, cc_num).ok_or_else(|| {
            anyhow!("{name} (compute capability {}.{}) is older than every kiln kernel module (oldest: sm_80)", cc.0, cc.1)
        })?;
        let shapes = shapes::for_module(module.name)
            .ok_or_else(|| anyhow!("no launch shapes for module {}", module.name))?;
        // Developer hook for trying a kernel variant without relinking the binary: a PTX file
        // built from kernels-gpu for the same policy (same entries, same launch shapes).
        let ptx_text = match std::env::var_os("KILN_PTX_OVERRIDE") {
            Some(path) => std::fs::read_to_string(&path)
                .with_context(|| format!("KILN_PTX_OVERRIDE={}", path.to_string_lossy()))?,
            None => module.ptx.to_string(),
        };
        let ptx_text = with_launch_bounds(&ptx_text, &shapes.launch_bounds())
            .with_context(|| format!("the {} PTX module", module.name))?;
        let loaded = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx_text))
            .map_err(|e| {
                anyhow!(
                    "loading the {} PTX module on {name} failed: {e:?}",
                    module.name
                )
            })?;
        let mut functions = HashMap::new();
        for &entry in kernels_gpu::entries::names::ALL {
            let f = loaded.load_function(entry).map_err(|e| {
                anyhow!("kernel {entry} missing from module {}: {e:?}", module.name)
            })?;
            functions.insert(entry, f);
        }
        // A stream of our own: the legacy default stream cannot be captured into a CUDA graph.
        let stream = ctx
            .new_stream()
            .map_err(|e| anyhow!("cannot create a CUDA stream: {e:?}"))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| anyhow!("{e:?}"))? as u32;
        let pdl = shapes.pdl() && env_on("KILN_PDL");
        Ok(Gpu {
            imp: Imp::Cuda(CudaImp {
                ctx,
                stream,
                pdl,
                occupancy: Mutex::default(),
                _module: loaded,
                functions,
            }),
            module_name: module.name,
            shapes,
            name,
            cc,
            sms,
        })
    }

    /// The same runtime over the host grid executor, with kernels instantiated for policy `P`
    /// (slow: one OS thread per GPU thread; for tests and debugging).
    pub fn host<P: policies::TargetPolicy>() -> Gpu {
        Gpu {
            imp: Imp::Host(kernels_gpu::entries::run_on_host::<P>, Mutex::default()),
            module_name: P::NAME,
            shapes: launch_shapes::<P>(),
            name: format!("host grid executor ({})", P::NAME),
            cc: ((P::MIN_CC / 10) as i32, (P::MIN_CC % 10) as i32),
            sms: 2,
        }
    }

    /// Launches of `kernel` so far on the host grid executor (0 on a GPU): lets a test see
    /// which path a backend took.
    pub fn host_launches(&self, kernel: &str) -> usize {
        match &self.imp {
            Imp::Host(_, launches) => launches.lock().unwrap().get(kernel).copied().unwrap_or(0),
            Imp::Cuda(_) => 0,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }
    /// Streaming multiprocessors on the device.
    pub fn sm_count(&self) -> u32 {
        self.sms
    }
    /// The policy/module in use (`sm_90`, ...).
    pub fn module_name(&self) -> &'static str {
        self.module_name
    }
    /// Launch shapes of the loaded module's policy.
    pub fn shapes(&self) -> &'static dyn LaunchShapes {
        self.shapes
    }

    fn host_alloc<T>(n: usize, init: Option<&[T]>) -> DBuf<T> {
        let bytes = n * std::mem::size_of::<T>();
        let mut words = vec![0u128; bytes.div_ceil(16).max(1)].into_boxed_slice();
        if let Some(src) = init {
            // SAFETY: `words` holds at least `bytes` bytes; `src` is `n` plain values.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr() as *const u8,
                    words.as_mut_ptr() as *mut u8,
                    bytes,
                )
            };
        }
        let ptr = words.as_ptr() as u64;
        DBuf {
            mem: Mem::Host(words),
            ptr,
            len: n,
        }
    }

    fn wrap<T>(&self, slice: CudaSlice<T>, stream: &Arc<CudaStream>) -> DBuf<T> {
        let len = slice.len();
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(stream);
            ptr
        };
        DBuf {
            mem: Mem::Cuda(slice),
            ptr,
            len,
        }
    }

    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<DBuf<T>> {
        match &self.imp {
            Imp::Cuda(c) => {
                let slice = c.stream.clone_htod(data).map_err(|e| {
                    anyhow!(
                        "upload of {} bytes failed: {e:?}",
                        std::mem::size_of_val(data)
                    )
                })?;
                Ok(self.wrap(slice, &c.stream))
            }
            Imp::Host(..) => Ok(Self::host_alloc(data.len(), Some(data))),
        }
    }

    /// `data` in page-locked host memory that kernels read directly over the bus: no device
    /// memory, for tables of which a step reads a few rows (llama.cpp keeps the token embedding
    /// on the host for the same reason). The host executor's "device" memory is host memory
    /// anyway.
    pub fn upload_mapped<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        data: &[T],
    ) -> Result<DBuf<T>> {
        match &self.imp {
            Imp::Cuda(c) => {
                let bytes = std::mem::size_of_val(data);
                let fail = |e| anyhow!("mapping {bytes} bytes of pinned host memory failed: {e:?}");
                // SAFETY: every element is written below before any kernel can read it.
                let mut host = unsafe {
                    c.ctx.alloc_pinned_with_flags::<T>(
                        data.len().max(1),
                        cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP,
                    )
                }
                .map_err(fail)?;
                host.as_mut_slice().map_err(fail)?[..data.len()].copy_from_slice(data);
                let mut ptr = 0;
                let hp = host.as_mut_ptr().map_err(fail)? as *mut std::ffi::c_void;
                // SAFETY: `hp` is a live allocation made with CU_MEMHOSTALLOC_DEVICEMAP in this context.
                let r =
                    unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut ptr, hp, 0) };
                r.result().map_err(fail)?;
                Ok(DBuf {
                    mem: Mem::Mapped(host),
                    ptr,
                    len: data.len(),
                })
            }
            Imp::Host(..) => Ok(Self::host_alloc(data.len(), Some(data))),
        }
    }

    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<DBuf<T>> {
        match &self.imp {
            Imp::Cuda(c) => {
                let slice = c.stream.alloc_zeros::<T>(n.max(1)).map_err(|e| {
                    anyhow!(
                        "allocating {} bytes on the GPU failed: {e:?}",
                        n * std::mem::size_of::<T>()
                    )
                })?;
                Ok(self.wrap(slice, &c.stream))
            }
            Imp::Host(..) => Ok(Self::host_alloc::<T>(n.max(1), None)),
        }
    }

    pub fn write<T: DeviceRepr>(&self, dst: &mut DBuf<T>, data: &[T]) -> Result<()> {
        self.write_at(dst, 0, data)
    }

    /// `data` into `dst[at..]`, ordered on the stream like a launch.
    pub fn write_at<T: DeviceRepr>(&self, dst: &mut DBuf<T>, at: usize, data: &[T]) -> Result<()> {
        if at + data.len() > dst.len() {
            bail!(
                "write of {} elements at {at} into a buffer of {}",
                data.len(),
                dst.len()
            );
        }
        match (&self.imp, &mut dst.mem) {
            (Imp::Cuda(c), Mem::Cuda(slice)) => {
                let mut view = slice.slice_mut(at..at + data.len());
                c.stream
                    .memcpy_htod(data, &mut view)
                    .map_err(|e| anyhow!("host-to-device copy failed: {e:?}"))
            }
            (Imp::Host(..), Mem::Host(words)) => {
                let off = at * std::mem::size_of::<T>();
                // SAFETY: bounds checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr() as *const u8,
                        (words.as_mut_ptr() as *mut u8).add(off),
                        std::mem::size_of_val(data),
                    )
                };
                Ok(())
            }
            _ => bail!("buffer belongs to another device"),
        }
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, src: &DBuf<T>) -> Result<Vec<T>> {
        self.download_prefix(src, src.len())
    }

    /// Copy the first `n` elements back (waits for the work that writes them).
    pub fn download_prefix<T: DeviceRepr + Default + Clone>(
        &self,
        src: &DBuf<T>,
        n: usize,
    ) -> Result<Vec<T>> {
        if n > src.len() {
            bail!("download of {n} elements from a buffer of {}", src.len());
        }
        let mut out = vec![T::default(); n];
        match (&self.imp, &src.mem) {
            (Imp::Cuda(c), Mem::Cuda(slice)) => {
                c.stream
                    .memcpy_dtoh(&slice.slice(..n), &mut out)
                    .map_err(|e| anyhow!("device-to-host copy failed: {e:?}"))?;
                self.synchronize()?;
            }
            (Imp::Host(..), Mem::Host(words)) => {
                let bytes = host_bytes(words, n * std::mem::size_of::<T>());
                // SAFETY: `out` has room for `n` values of plain-data `T`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        out.as_mut_ptr() as *mut u8,
                        bytes.len(),
                    )
                };
            }
            _ => bail!("buffer belongs to another device"),
        }
        Ok(out)
    }

    /// Device-to-device copy of `src` into the start of `dst`.
    pub fn copy<T: DeviceRepr>(&self, src: &DBuf<T>, dst: &mut DBuf<T>) -> Result<()> {
        self.copy_range(src, 0, dst, 0, src.len())
    }

    /// Copy `n` elements from `src[src_at..]` to `dst[dst_at..]` on the device.
    pub fn copy_range<T: DeviceRepr>(
        &self,
        src: &DBuf<T>,
        src_at: usize,
        dst: &DBuf<T>,
        dst_at: usize,
        n: usize,
    ) -> Result<()> {
        if src_at + n > src.len() || dst_at + n > dst.len() {
            bail!("copy_range out of bounds");
        }
        let bytes = n * std::mem::size_of::<T>();
        match &self.imp {
            // SAFETY: both ranges were bounds-checked above; the copy is ordered on our stream.
            Imp::Cuda(c) => unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst.ptr_at(dst_at),
                    src.ptr_at(src_at),
                    bytes,
                    c.stream.cu_stream(),
                )
            }
            .map_err(|e| anyhow!("device-to-device copy failed: {e:?}")),
            Imp::Host(..) => {
                // SAFETY: bounds checked; `copy` tolerates overlap.
                unsafe {
                    std::ptr::copy(
                        src.ptr_at(src_at) as *const u8,
                        dst.ptr_at(dst_at) as *mut u8,
                        bytes,
                    )
                };
                Ok(())
            }
        }
    }

    /// Milliseconds the device spent on the work `f` enqueues, measured with two events (the
    /// host executor: wall time).
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        match &self.imp {
            Imp::Cuda(c) => {
                let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                let start = c.stream.record_event(flags).map_err(|e| anyhow!("{e:?}"))?;
                f()?;
                let end = c.stream.record_event(flags).map_err(|e| anyhow!("{e:?}"))?;
                start
                    .elapsed_ms(&end)
                    .map_err(|e| anyhow!("CUDA error during timed work: {e:?}"))
            }
            Imp::Host(..) => {
                let t = std::time::Instant::now();
                f()?;
                Ok(t.elapsed().as_secs_f32() * 1e3)
            }
        }
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        match &self.imp {
            Imp::Cuda(c) => c.ctx.mem_get_info().map_err(|e| anyhow!("{e:?}")),
            Imp::Host(..) => bail!("the host executor has no device memory"),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        match &self.imp {
            Imp::Cuda(c) => c
                .stream
                .synchronize()
                .map_err(|e| anyhow!("CUDA error (a kernel faulted?): {e:?}")),
            Imp::Host(..) => Ok(()),
        }
    }

    /// Whether this is a real device (graphs, timing events) rather than the host executor.
    pub fn is_device(&self) -> bool {
        matches!(self.imp, Imp::Cuda(_))
    }

    /// Records the work `f` issues on the stream into a CUDA graph instead of running it
    /// (nothing executes until [`Gpu::replay`]). `f` must not allocate, synchronize or copy to
    /// the host. Capture is always ended, also when `f` fails; then the error is returned.
    pub fn capture<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(T, Graph)> {
        let Imp::Cuda(c) = &self.imp else {
            bail!("graph capture needs a CUDA device")
        };
        // Thread-local mode: a forbidden call (allocation, sync copy) made by this thread while
        // capturing fails at once instead of corrupting the capture.
        c.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|e| anyhow!("cannot start a CUDA graph capture: {e:?}"))?;
        let r = f();
        let g = c
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        let value = r?;
        match g {
            Ok(Some(graph)) => Ok((value, Graph(graph))),
            Ok(None) => bail!("the CUDA graph capture recorded nothing"),
            Err(e) => bail!("CUDA graph capture failed: {e:?}"),
        }
    }

    /// Runs a recorded graph on the stream (asynchronously, ordered like a launch).
    pub fn replay(&self, g: &Graph) -> Result<()> {
        g.0.launch()
            .map_err(|e| anyhow!("CUDA graph launch failed: {e:?}"))
    }

    /// `dims` with its grid cut to one resident wave of `kernel` on this device: at most as many
    /// blocks as fit on every multiprocessor at once (the driver's occupancy for its registers
    /// and shared memory). For grid-striding kernels only: a launch past one wave leaves a
    /// partial second wave running alone (a fused mat-vec at 77 registers fits 6 blocks per
    /// SM, not the policy's 8). Unchanged on the host executor. The driver is asked once per
    /// (kernel, block, shared memory): this sits on every eager mat-vec launch.
    pub fn one_wave(&self, kernel: &'static str, dims: Dims) -> Dims {
        match self.blocks_per_sm(kernel, dims) {
            Some(per_sm) if per_sm > 0 => Dims {
                grid_x: dims.grid_x.min(per_sm * self.sms),
                ..dims
            },
            _ => dims,
        }
    }

    /// Whether all of `dims`' blocks are resident at once (at least one fits per SM, and the
    /// whole grid in one wave). Always on the host executor, which has no occupancy.
    pub fn fits_one_wave(&self, kernel: &'static str, dims: Dims) -> bool {
        match self.blocks_per_sm(kernel, dims) {
            None => !self.is_device(),
            Some(per_sm) => per_sm > 0 && dims.blocks() <= per_sm * self.sms,
        }
    }

    /// The driver's resident blocks per SM for `kernel` at `dims`' block size and shared memory
    /// (asked once per combination); `None` on the host executor or for an unknown kernel.
    fn blocks_per_sm(&self, kernel: &'static str, dims: Dims) -> Option<u32> {
        let Imp::Cuda(c) = &self.imp else { return None };
        let f = c.functions.get(kernel)?;
        let mut known = c.occupancy.lock().unwrap_or_else(|e| e.into_inner());
        Some(
            *known
                .entry((kernel, dims.block, dims.shared_bytes))
                .or_insert_with(|| {
                    f.occupancy_max_active_blocks_per_multiprocessor(
                        dims.block,
                        dims.shared_bytes as usize,
                        None,
                    )
                    .unwrap_or(0)
                }),
        )
    }

    /// Launch `kernel` (a `kernels_gpu::entries::names` constant) with `dims` and `args`, which
    /// must match the entry's parameter list in the kernel table.
    pub fn launch(&self, kernel: &'static str, dims: Dims, args: &[Arg]) -> Result<()> {
        if dims.grid_x == 0 || dims.grid_y == 0 {
            return Ok(()); // empty problem
        }
        let c = match &self.imp {
            // SAFETY: pointer arguments are addresses of live host-executor buffers.
            Imp::Host(run, launches) => {
                *launches.lock().unwrap().entry(kernel).or_default() += 1;
                return unsafe { run(kernel, dims, args) }
                    .map_err(|e| anyhow!("host launch of {kernel}: {e}"));
            }
            Imp::Cuda(c) => c,
        };
        let f = c
            .functions
            .get(kernel)
            .ok_or_else(|| anyhow!("unknown kernel {kernel}"))?;
        let want = kernels_gpu::entries::names::param_count(kernel);
        ensure!(
            want == Some(args.len()),
            "{kernel}: {} arguments, the kernel table lists {want:?}",
            args.len()
        );
        let cfg = LaunchConfig {
            grid_dim: (dims.grid_x, dims.grid_y, 1),
            block_dim: (dims.block, 1, 1),
            shared_mem_bytes: dims.shared_bytes,
        };
        if dims.shared_bytes > 48 * 1024 {
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dims.shared_bytes as i32,
            )
            .map_err(|e| anyhow!("{kernel}: cannot raise shared memory to {} bytes: {e:?}", dims.shared_bytes))?;
        }
        if c.pdl {
            return unsafe { launch_pdl(f, &c.stream, &cfg, args) }
                .with_context(|| format!("launching {kernel} with {dims:?}"));
        }
        let mut b = c.stream.launch_builder(f);
        // The builder keeps the addresses of the values, which `args` holds until launch.
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::U32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        // SAFETY: the argument list follows the kernel table; pointers are live device buffers.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .with_context(|| format!("launching {kernel} with {dims:?}"))
    }
}

/// Most parameters any kernel-table entry has.
const MAX_ARGS: usize = 24;

/// `cuLaunchKernelEx` with programmatic stream serialization allowed: the grid may start while
/// the previous kernel on the stream runs; every entry waits for it (`griddepcontrol.wait`)
/// before it touches memory. Stream capture records the edge, so graphs keep the overlap.
///
/// # Safety
/// `args` must follow the entry's parameter list; pointers must be live device buffers.
unsafe fn launch_pdl(
    f: &CudaFunction,
    stream: &CudaStream,
    cfg: &LaunchConfig,
    args: &[Arg],
) -> Result<()> {
    use cudarc::driver::sys;
    use std::ffi::c_void;
    ensure!(
        args.len() <= MAX_ARGS,
        "{} kernel arguments, at most {MAX_ARGS}",
        args.len()
    );
    let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
    for (p, a) in params.iter_mut().zip(args) {
        *p = match a {
            Arg::Ptr(v) => v as *const u64 as *mut c_void,
            Arg::U32(v) => v as *const u32 as *mut c_void,
            Arg::F32(v) => v as *const f32 as *mut c_void,
        };
    }
    // SAFETY: a zeroed attribute is a valid plain-data value; the id and its field are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `params` points at values `args` keeps alive through the call.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuLaunchKernelEx: {r:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::with_launch_bounds;

    const PTX: &str = ".version 8.0\n.visible .entry kiln_mma_deep_q4_0(\n\t.param .u32 a\n)\n{\n\tret;\n}\n.visible .entry kiln_mma_q4_0(\n\t.param .u32 a\n)\n{\n\tret;\n}\n";

    #[test]
    fn launch_bounds_go_between_the_parameters_and_the_body_of_matching_entries_only() {
        let out = with_launch_bounds(PTX, &[("kiln_mma_deep_", 512)]).unwrap();
        let want = PTX.replacen(
            "\t.param .u32 a\n)\n{",
            "\t.param .u32 a\n)\n.maxntid 512, 1, 1\n{",
            1,
        );
        assert_eq!(out, want);
        assert_eq!(with_launch_bounds(PTX, &[]).unwrap(), PTX);
    }

    #[test]
    fn a_launch_bound_naming_no_entry_is_an_error() {
        let e = with_launch_bounds(PTX, &[("kiln_matvec_", 512)]).unwrap_err();
        assert!(e.to_string().contains("kiln_matvec_"), "{e}");
    }
}
