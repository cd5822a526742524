//! [`Device`] on the host grid executor: buffers are host allocations whose addresses travel in
//! `Arg::Ptr` just like device addresses, and `launch` runs the kernel table's host dispatch
//! (`kernels_gpu::entries::run_on_host`), which checks the argument list against the entry's
//! parameters, for policy `P`.
use super::{Arg, Buf, Device, Dims, LaunchShapes};
use policies::TargetPolicy;
use std::marker::PhantomData;

pub struct HostDev<P> {
    /// Owned allocations (u128 for 16-byte alignment), freed on reset/drop. Kernels write into
    /// them through the raw addresses handed out in `Buf::ptr`.
    bufs: Vec<Box<[u128]>>,
    shapes: &'static dyn LaunchShapes,
    policy: PhantomData<P>,
}

impl<P: TargetPolicy> HostDev<P> {
    pub fn new() -> Self {
        HostDev {
            bufs: Vec::new(),
            shapes: kiln_host::cuda::launch_shapes::<P>(),
            policy: PhantomData,
        }
    }
}

impl<P: TargetPolicy + Send + Sync> Device for HostDev<P> {
    fn label(&self) -> String {
        format!("host {}", P::NAME)
    }
    fn shapes(&self) -> &dyn LaunchShapes {
        self.shapes
    }
    fn upload_bytes(&mut self, bytes: &[u8]) -> Buf {
        let mut mem = vec![0u128; bytes.len().div_ceil(16).max(1)].into_boxed_slice();
        let ptr = mem.as_mut_ptr() as *mut u8;
        // SAFETY: `mem` has at least `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        self.bufs.push(mem);
        Buf {
            ptr: ptr as u64,
            bytes: bytes.len(),
            slot: self.bufs.len() - 1,
        }
    }
    fn download_bytes(&mut self, buf: &Buf) -> Vec<u8> {
        let mem = &self.bufs[buf.slot];
        // SAFETY: the allocation holds at least `buf.bytes` bytes; no launch is running.
        unsafe { std::slice::from_raw_parts(mem.as_ptr() as *const u8, buf.bytes) }.to_vec()
    }
    fn launch(&mut self, entry: &'static str, dims: Dims, args: &[Arg]) {
        // SAFETY: pointer arguments are addresses of this device's live host allocations.
        if let Err(e) = unsafe { kernels_gpu::entries::run_on_host::<P>(entry, dims, args) } {
            panic!("host: entry {entry} launched with arguments {args:?}: {e}");
        }
    }
    fn reset(&mut self) {
        self.bufs.clear();
    }
}
