//! [`Device`] on the host grid executor: buffers are host allocations whose addresses travel in
//! `Arg::Ptr` just like device addresses, and `launch` maps each entry name of the kernel table
//! to its kernel body instantiated for policy `P`, checking the argument list against the
//! entry's parameters (the slice patterns below mirror `kernels-gpu/src/entries.rs`).
use super::{Arg, Buf, Device, Dims, LaunchShapes, names};
use kernels_gpu::device::host;
use kernels_gpu::kernels::{attention, elementwise as ew, formats, launch, matvec, norm};
use policies::TargetPolicy;
use std::marker::PhantomData;

pub struct HostDev<P> {
    /// Owned allocations (u128 for 16-byte alignment), freed on reset/drop. Kernels write into
    /// them through the raw addresses handed out in `Buf::ptr`.
    bufs: Vec<Box<[u128]>>,
    shapes: HostShapes<P>,
}

impl<P: TargetPolicy> HostDev<P> {
    pub fn new() -> Self {
        HostDev { bufs: Vec::new(), shapes: HostShapes(PhantomData) }
    }
}

impl<P: TargetPolicy + Send + Sync> Device for HostDev<P> {
    fn label(&self) -> String {
        format!("host {}", P::NAME)
    }
    fn shapes(&self) -> &dyn LaunchShapes {
        &self.shapes
    }
    fn upload_bytes(&mut self, bytes: &[u8]) -> Buf {
        let mut mem = vec![0u128; bytes.len().div_ceil(16).max(1)].into_boxed_slice();
        let ptr = mem.as_mut_ptr() as *mut u8;
        // SAFETY: `mem` has at least `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        self.bufs.push(mem);
        Buf { ptr: ptr as u64, bytes: bytes.len(), slot: self.bufs.len() - 1 }
    }
    fn download_bytes(&mut self, buf: &Buf) -> Vec<u8> {
        let mem = &self.bufs[buf.slot];
        // SAFETY: the allocation holds at least `buf.bytes` bytes; no launch is running.
        unsafe { std::slice::from_raw_parts(mem.as_ptr() as *const u8, buf.bytes) }.to_vec()
    }
    fn launch(&mut self, entry: &'static str, dims: Dims, args: &[Arg]) {
        run_entry::<P>(entry, dims, args);
    }
    fn reset(&mut self) {
        self.bufs.clear();
    }
}

/// Host launch of one kernel-table entry. Arguments are plain integers/floats inside the
/// closure (so it is `Sync`), turned back into pointers per GPU thread.
fn run_entry<P: TargetPolicy>(entry: &'static str, dims: Dims, args: &[Arg]) {
    use Arg::{F32 as F, Ptr as P_, U32 as U};
    fn p<T>(a: u64) -> *mut T {
        a as *mut T
    }
    let go = |k: &(dyn Fn() + Sync)| host::launch(dims, k);
    match (entry, args) {
        (names::kiln_quantize_q8_1, &[P_(x), P_(xq), P_(xds), U(cols)]) => {
            go(&|| unsafe { matvec::quantize_q8_1::<P>(p(x), p(xq), p(xds), cols) })
        }
        (names::kiln_matvec_q4_0, &[P_(qs), P_(sc), P_(xq), P_(xds), P_(y), U(rows), U(cols)]) => {
            go(&|| unsafe { matvec::matvec_split::<P, formats::Q4_0>(p(qs), p(sc), p(xq), p(xds), p(y), rows, cols) })
        }
        (names::kiln_matvec_q4_1, &[P_(qs), P_(sc), P_(xq), P_(xds), P_(y), U(rows), U(cols)]) => {
            go(&|| unsafe { matvec::matvec_split::<P, formats::Q4_1>(p(qs), p(sc), p(xq), p(xds), p(y), rows, cols) })
        }
        (names::kiln_matvec_q8_0, &[P_(qs), P_(sc), P_(xq), P_(xds), P_(y), U(rows), U(cols)]) => {
            go(&|| unsafe { matvec::matvec_split::<P, formats::Q8_0>(p(qs), p(sc), p(xq), p(xds), p(y), rows, cols) })
        }
        (names::kiln_matvec_f16, &[P_(w), P_(x), P_(y), U(rows), U(cols)]) => {
            go(&|| unsafe { matvec::matvec_f16::<P>(p(w), p(x), p(y), rows, cols) })
        }
        (names::kiln_rms_norm, &[P_(x), P_(w), P_(out), U(cols), F(eps)]) => {
            go(&|| unsafe { norm::rms_norm::<P>(p(x), p(w), p(out), cols, eps) })
        }
        (names::kiln_softmax, &[P_(x), P_(out), U(cols)]) => go(&|| unsafe { norm::softmax::<P>(p(x), p(out), cols) }),
        (names::kiln_rope, &[P_(x), U(heads), U(hd), U(rot), U(pos0), F(log2_base), U(neox), U(threads)]) => {
            go(&|| unsafe { ew::rope::<P>(p(x), heads, hd, rot, pos0, log2_base, neox, threads) })
        }
        (names::kiln_swiglu, &[P_(g), P_(u), P_(out), U(len)]) => go(&|| unsafe { ew::swiglu::<P>(p(g), p(u), p(out), len) }),
        (names::kiln_add_assign, &[P_(acc), P_(x), U(len)]) => go(&|| unsafe { ew::add_assign::<P>(p(acc), p(x), len) }),
        (names::kiln_embed_q4_0, &[P_(qs), P_(sc), P_(ids), P_(out), U(cols), U(threads)]) => {
            go(&|| unsafe { ew::embed_split::<P, formats::Q4_0>(p(qs), p(sc), p(ids), p(out), cols, threads) })
        }
        (names::kiln_embed_q4_1, &[P_(qs), P_(sc), P_(ids), P_(out), U(cols), U(threads)]) => {
            go(&|| unsafe { ew::embed_split::<P, formats::Q4_1>(p(qs), p(sc), p(ids), p(out), cols, threads) })
        }
        (names::kiln_embed_q8_0, &[P_(qs), P_(sc), P_(ids), P_(out), U(cols), U(threads)]) => {
            go(&|| unsafe { ew::embed_split::<P, formats::Q8_0>(p(qs), p(sc), p(ids), p(out), cols, threads) })
        }
        (names::kiln_embed_f16, &[P_(t), P_(ids), P_(out), U(cols), U(threads)]) => {
            go(&|| unsafe { ew::embed_f16::<P>(p(t), p(ids), p(out), cols, threads) })
        }
        (names::kiln_kv_store, &[P_(src), P_(cache), U(kvh), U(hd), U(max_ctx), U(pos0), U(threads)]) => {
            go(&|| unsafe { ew::kv_store::<P>(p(src), p(cache), kvh, hd, max_ctx, pos0, threads) })
        }
        (names::kiln_attention, &[P_(q), P_(k), P_(v), P_(out), U(heads), U(kvh), U(hd), U(max_ctx), U(pos0), F(scale)]) => {
            go(&|| unsafe { attention::attention::<P>(p(q), p(k), p(v), p(out), heads, kvh, hd, max_ctx, pos0, scale) })
        }
        _ => panic!("host: entry {entry} launched with arguments {args:?} that do not match its parameter list"),
    }
}

/// `LaunchShapes` for a policy known at compile time (the CUDA runtime's own is private).
struct HostShapes<P>(PhantomData<P>);

impl<P: TargetPolicy + Send + Sync> LaunchShapes for HostShapes<P> {
    fn policy(&self) -> &'static str {
        P::NAME
    }
    fn matvec(&self, rows: u32, n: u32) -> Dims {
        launch::matvec::<P>(rows, n)
    }
    fn matvec_resident(&self, rows: u32, n: u32, sms: u32) -> Dims {
        launch::matvec_resident::<P>(rows, n, sms)
    }
    fn quantize_q8_1(&self, cols: u32, n: u32) -> Dims {
        launch::quantize_q8_1::<P>(cols, n)
    }
    fn per_row(&self, rows: u32) -> Dims {
        launch::per_row::<P>(rows)
    }
    fn flat(&self, threads: u32) -> Dims {
        launch::flat::<P>(threads)
    }
    fn attention(&self, heads: u32, n_tokens: u32, max_len: u32) -> Dims {
        launch::attention::<P>(heads, n_tokens, max_len)
    }
    fn max_shared_bytes(&self) -> u32 {
        P::MAX_SMEM_PER_BLOCK
    }
}
