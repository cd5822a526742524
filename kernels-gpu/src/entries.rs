//! The table of kernel entry points: one row per (kernel, format) instantiation; a row with
//! `<Wrapper>` after its body instantiates it for `policies::Wrapper<P>` instead of the policy
//! `P` (the GEMM's deep k-stages, `policies::DeepK`; the short-prompt tile,
//! `policies::ShortTile`; the grouped expert GEMM's token tile, `policies::MoeTile`).
//!
//! On the GPU each row becomes a `#[no_mangle] extern "ptx-kernel"` entry instantiated for the
//! policy this module is built for (`--cfg kiln_target=...`, set by the build script). On the host
//! each row becomes a name constant in [`names`], which the CUDA runtime uses to look entries up:
//! the names and the entries come from the same row, so they cannot drift apart.
#[allow(unused_imports)]
use crate::kernels::{
    attention, elementwise as ew, flash, formats, matvec, mma, moe, norm, residual_norm,
};

/// A kernel argument as a launch passes it: a device address or a scalar, by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(u64),
    U32(u32),
    F32(f32),
}

/// How one parameter type of an entry is taken from an [`Arg`] on the host executor.
#[cfg(not(target_arch = "nvptx64"))]
pub trait FromArg: Sized {
    /// What crosses into the executor's threads (`Sync`; pointers travel as addresses).
    type Raw: Copy + Send + Sync;
    fn raw(a: Arg) -> Option<Self::Raw>;
    fn get(r: Self::Raw) -> Self;
}

#[cfg(not(target_arch = "nvptx64"))]
mod from_arg {
    use super::{Arg, FromArg};
    impl<T> FromArg for *const T {
        type Raw = u64;
        fn raw(a: Arg) -> Option<u64> {
            if let Arg::Ptr(p) = a { Some(p) } else { None }
        }
        fn get(r: u64) -> Self {
            r as *const T
        }
    }
    impl<T> FromArg for *mut T {
        type Raw = u64;
        fn raw(a: Arg) -> Option<u64> {
            if let Arg::Ptr(p) = a { Some(p) } else { None }
        }
        fn get(r: u64) -> Self {
            r as *mut T
        }
    }
    impl FromArg for u32 {
        type Raw = u32;
        fn raw(a: Arg) -> Option<u32> {
            if let Arg::U32(v) = a { Some(v) } else { None }
        }
        fn get(r: u32) -> Self {
            r
        }
    }
    impl FromArg for f32 {
        type Raw = f32;
        fn raw(a: Arg) -> Option<f32> {
            if let Arg::F32(v) = a { Some(v) } else { None }
        }
        fn get(r: f32) -> Self {
            r
        }
    }
}

#[cfg(all(target_arch = "nvptx64", kiln_target = "sm_80"))]
type P = policies::Ampere;
#[cfg(all(target_arch = "nvptx64", kiln_target = "sm_90"))]
type P = policies::Hopper;
#[cfg(all(target_arch = "nvptx64", kiln_target = "sm_121"))]
type P = policies::SparkGb10;

macro_rules! kernel_table {
    (@waits_itself) => { false };
    (@waits_itself waits_itself) => { true };
    (@policy $pol:ty) => { $pol };
    (@policy $pol:ty, $wrap:ident) => { policies::$wrap<$pol> };
    ($( $name:ident = $($body:ident)::+ $(<$wrap:ident>)? [$($fmt:ty),*] ( $($arg:ident : $ty:ty),* ) $($own:ident)?; )*) => {
        /// Entry names, one per row of the table.
        #[allow(non_upper_case_globals)]
        pub mod names {
            $( pub const $name: &str = stringify!($name); )*
            /// Every entry a module must export.
            pub const ALL: &[&str] = &[$( stringify!($name) ),*];
            /// Parameters of entry `name` (a launch passes exactly these).
            pub fn param_count(name: &str) -> Option<usize> {
                $( if name == stringify!($name) { return Some([$(stringify!($arg)),*].len()); } )*
                None
            }
        }
        /// Runs entry `name` on the host grid executor, instantiated for policy `Pol`, with the
        /// argument list checked against the entry's parameters: the host twin of a GPU launch,
        /// generated from the same table row as the PTX entry.
        ///
        /// # Safety
        /// Pointer arguments must be host addresses valid for what the kernel reads and writes.
        #[cfg(not(target_arch = "nvptx64"))]
        pub unsafe fn run_on_host<Pol: policies::TargetPolicy>(
            name: &str,
            dims: crate::kernels::launch::Dims,
            args: &[Arg],
        ) -> Result<(), &'static str> {
            $(
                if name == stringify!($name) {
                    if args.len() != [$(stringify!($arg)),*].len() {
                        return Err(concat!(stringify!($name), ": wrong number of arguments"));
                    }
                    let mut it = args.iter();
                    $(
                        let $arg = <$ty as FromArg>::raw(*it.next().ok_or("argument count")?)
                            .ok_or(concat!(stringify!($name), ": argument ", stringify!($arg), " has the wrong kind"))?;
                    )*
                    crate::device::host::launch(dims, || unsafe {
                        $($body)::+::<kernel_table!(@policy Pol $(, $wrap)?) $(, $fmt)*>($(<$ty as FromArg>::get($arg)),*)
                    });
                    return Ok(());
                }
            )*
            Err("unknown kernel entry")
        }
        $(
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) {
                // Programmatic dependent launch: the host may start this grid while the
                // previous one still runs. Wait for it before touching memory, then let the
                // next grid begin launching (it waits in turn), so launches overlap execution.
                // Rows marked `waits_itself` first prefetch what does not depend on the
                // previous grid (their weights), then call `pdl_wait` themselves.
                if !kernel_table!(@waits_itself $($own)?) {
                    crate::device::pdl_wait::<P>();
                }
                unsafe { $($body)::+::<kernel_table!(@policy P $(, $wrap)?) $(, $fmt)*>($($arg),*) }
            }
        )*
    };
}

kernel_table! {
    kiln_quantize_q8_1 = matvec::quantize_q8_1 [] (x: *const f32, xq: *mut i8, xds: *mut f32, cols: u32);
    kiln_matvec_q4_0 = matvec::matvec_split [formats::Q4_0] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_q4_1 = matvec::matvec_split [formats::Q4_1] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_q8_0 = matvec::matvec_split [formats::Q8_0] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_q6k = matvec::matvec_split [formats::Q6K] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_q5k = matvec::matvec_split [formats::Q5K] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_q4k = matvec::matvec_split [formats::Q4K] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_wide_q4_0 = matvec::matvec_split_wide [formats::Q4_0] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_wide_q4_1 = matvec::matvec_split_wide [formats::Q4_1] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_wide_q8_0 = matvec::matvec_split_wide [formats::Q8_0] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_wide_q6k = matvec::matvec_split_wide [formats::Q6K] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_wide_q5k = matvec::matvec_split_wide [formats::Q5K] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec_wide_q4k = matvec::matvec_split_wide [formats::Q4K] (qs: *const u32, scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, acc: u32) waits_itself;
    kiln_matvec3_q4_0 = matvec::matvec3_split [formats::Q4_0, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_q4_1 = matvec::matvec3_split [formats::Q4_1, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_q8_0 = matvec::matvec3_split [formats::Q8_0, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_q6k = matvec::matvec3_split [formats::Q6K, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_q5k = matvec::matvec3_split [formats::Q5K, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_q4k = matvec::matvec3_split [formats::Q4K, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_q4_0 = matvec::matvec3_split_wide [formats::Q4_0, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_q4_1 = matvec::matvec3_split_wide [formats::Q4_1, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_q8_0 = matvec::matvec3_split_wide [formats::Q8_0, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_q6k = matvec::matvec3_split_wide [formats::Q6K, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_q5k = matvec::matvec3_split_wide [formats::Q5K, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_q4k = matvec::matvec3_split_wide [formats::Q4K, residual_norm::Finished] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q4_0 = matvec::matvec_swiglu_split [formats::Q4_0, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q4_1 = matvec::matvec_swiglu_split [formats::Q4_1, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_0 = matvec::matvec_swiglu_split [formats::Q8_0, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q6k = matvec::matvec_swiglu_split [formats::Q6K, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q5k = matvec::matvec_swiglu_split [formats::Q5K, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q4k = matvec::matvec_swiglu_split [formats::Q4K, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_q4_0 = matvec::matvec_swiglu_q8 [formats::Q4_0, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_q4_1 = matvec::matvec_swiglu_q8 [formats::Q4_1, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_q8_0 = matvec::matvec_swiglu_q8 [formats::Q8_0, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_q6k = matvec::matvec_swiglu_q8 [formats::Q6K, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_q5k = matvec::matvec_swiglu_q8 [formats::Q5K, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_q4k = matvec::matvec_swiglu_q8 [formats::Q4K, residual_norm::Finished] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_norm_q4_0 = matvec::matvec3_split [formats::Q4_0, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_norm_q4_1 = matvec::matvec3_split [formats::Q4_1, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_norm_q8_0 = matvec::matvec3_split [formats::Q8_0, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_norm_q6k = matvec::matvec3_split [formats::Q6K, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_norm_q5k = matvec::matvec3_split [formats::Q5K, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_norm_q4k = matvec::matvec3_split [formats::Q4K, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_norm_q4_0 = matvec::matvec3_split_wide [formats::Q4_0, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_norm_q4_1 = matvec::matvec3_split_wide [formats::Q4_1, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_norm_q8_0 = matvec::matvec3_split_wide [formats::Q8_0, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_norm_q6k = matvec::matvec3_split_wide [formats::Q6K, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_norm_q5k = matvec::matvec3_split_wide [formats::Q5K, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec3_wide_norm_q4k = matvec::matvec3_split_wide [formats::Q4K, residual_norm::Deferred] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, xq: *const u32, xds: *const f32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_norm_q4_0 = matvec::matvec_swiglu_split [formats::Q4_0, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_norm_q4_1 = matvec::matvec_swiglu_split [formats::Q4_1, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_norm_q8_0 = matvec::matvec_swiglu_split [formats::Q8_0, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_norm_q6k = matvec::matvec_swiglu_split [formats::Q6K, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_norm_q5k = matvec::matvec_swiglu_split [formats::Q5K, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_norm_q4k = matvec::matvec_swiglu_split [formats::Q4K, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_norm_q4_0 = matvec::matvec_swiglu_q8 [formats::Q4_0, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_norm_q4_1 = matvec::matvec_swiglu_q8 [formats::Q4_1, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_norm_q8_0 = matvec::matvec_swiglu_q8 [formats::Q8_0, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_norm_q6k = matvec::matvec_swiglu_q8 [formats::Q6K, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_norm_q5k = matvec::matvec_swiglu_q8 [formats::Q5K, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_swiglu_q8_norm_q4k = matvec::matvec_swiglu_q8 [formats::Q4K, residual_norm::Deferred] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, y: *mut f32, yq: *mut i8, yds: *mut f32, rows: u32, cols: u32, ss: *const f64, ss_parts: u32, eps: f32) waits_itself;
    kiln_matvec_add_norm_q8_q4_0 = residual_norm::matvec_add_norm_q8 [formats::Q4_0] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, x: *mut f32, g: *const f32, h: *mut f32, hq: *mut i8, hds: *mut f32, ss: *mut f64, rows: u32, cols: u32) waits_itself;
    kiln_matvec_add_norm_q8_q4_1 = residual_norm::matvec_add_norm_q8 [formats::Q4_1] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, x: *mut f32, g: *const f32, h: *mut f32, hq: *mut i8, hds: *mut f32, ss: *mut f64, rows: u32, cols: u32) waits_itself;
    kiln_matvec_add_norm_q8_q8_0 = residual_norm::matvec_add_norm_q8 [formats::Q8_0] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, x: *mut f32, g: *const f32, h: *mut f32, hq: *mut i8, hds: *mut f32, ss: *mut f64, rows: u32, cols: u32) waits_itself;
    kiln_matvec_add_norm_q8_q6k = residual_norm::matvec_add_norm_q8 [formats::Q6K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, x: *mut f32, g: *const f32, h: *mut f32, hq: *mut i8, hds: *mut f32, ss: *mut f64, rows: u32, cols: u32) waits_itself;
    kiln_matvec_add_norm_q8_q5k = residual_norm::matvec_add_norm_q8 [formats::Q5K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, x: *mut f32, g: *const f32, h: *mut f32, hq: *mut i8, hds: *mut f32, ss: *mut f64, rows: u32, cols: u32) waits_itself;
    kiln_matvec_add_norm_q8_q4k = residual_norm::matvec_add_norm_q8 [formats::Q4K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, x: *mut f32, g: *const f32, h: *mut f32, hq: *mut i8, hds: *mut f32, ss: *mut f64, rows: u32, cols: u32) waits_itself;
    kiln_norm_settle_q8 = residual_norm::norm_settle_q8 [] (h: *const f32, ss: *const f64, parts: u32, out: *mut f32, oq: *mut i8, ods: *mut f32, cols: u32, eps: f32);
    kiln_matvec_f32x_q4_0 = matvec::matvec_split_f32x [formats::Q4_0] (qs: *const u32, scales: *const u8, x: *const f32, y: *mut f32, rows: u32, cols: u32);
    kiln_matvec_f32x_q4_1 = matvec::matvec_split_f32x [formats::Q4_1] (qs: *const u32, scales: *const u8, x: *const f32, y: *mut f32, rows: u32, cols: u32);
    kiln_matvec_f32x_q8_0 = matvec::matvec_split_f32x [formats::Q8_0] (qs: *const u32, scales: *const u8, x: *const f32, y: *mut f32, rows: u32, cols: u32);
    kiln_matvec_f32x_q6k = matvec::matvec_split_f32x [formats::Q6K] (qs: *const u32, scales: *const u8, x: *const f32, y: *mut f32, rows: u32, cols: u32);
    kiln_matvec_f32x_q5k = matvec::matvec_split_f32x [formats::Q5K] (qs: *const u32, scales: *const u8, x: *const f32, y: *mut f32, rows: u32, cols: u32);
    kiln_matvec_f32x_q4k = matvec::matvec_split_f32x [formats::Q4K] (qs: *const u32, scales: *const u8, x: *const f32, y: *mut f32, rows: u32, cols: u32);
    kiln_mma_q4_0 = mma::mma_split [formats::Q4_0] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_q4_1 = mma::mma_split [formats::Q4_1] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_q8_0 = mma::mma_split [formats::Q8_0] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_q6k = mma::mma_split [formats::Q6K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_q5k = mma::mma_split [formats::Q5K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_q4k = mma::mma_split [formats::Q4K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_swiglu_q4_0 = mma::mma_swiglu_split [formats::Q4_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_q4_1 = mma::mma_swiglu_split [formats::Q4_1] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_q8_0 = mma::mma_swiglu_split [formats::Q8_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_q6k = mma::mma_swiglu_split [formats::Q6K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_q5k = mma::mma_swiglu_split [formats::Q5K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_q4k = mma::mma_swiglu_split [formats::Q4K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_deep_q4_0 = mma::mma_split <DeepK> [formats::Q4_0] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_deep_q4_1 = mma::mma_split <DeepK> [formats::Q4_1] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_deep_q8_0 = mma::mma_split <DeepK> [formats::Q8_0] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_deep_q6k = mma::mma_split <DeepK> [formats::Q6K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_deep_q5k = mma::mma_split <DeepK> [formats::Q5K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_deep_q4k = mma::mma_split <DeepK> [formats::Q4K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_short_q4_0 = mma::mma_split <ShortTile> [formats::Q4_0] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_short_q4_1 = mma::mma_split <ShortTile> [formats::Q4_1] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_short_q8_0 = mma::mma_split <ShortTile> [formats::Q8_0] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_short_q6k = mma::mma_split <ShortTile> [formats::Q6K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_short_q5k = mma::mma_split <ShortTile> [formats::Q5K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_short_q4k = mma::mma_split <ShortTile> [formats::Q4K] (w0: *const u32, s0: *const u8, y0: *mut f32, rows0: u32, w1: *const u32, s1: *const u8, y1: *mut f32, rows1: u32, w2: *const u32, s2: *const u8, y2: *mut f32, rows2: u32, x: *const u32, cols: u32, n: u32, acc: u32, splits: u32, parts: *mut f32, counters: *mut u32);
    kiln_mma_swiglu_short_q4_0 = mma::mma_swiglu_split <ShortTile> [formats::Q4_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_short_q4_1 = mma::mma_swiglu_split <ShortTile> [formats::Q4_1] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_short_q8_0 = mma::mma_swiglu_split <ShortTile> [formats::Q8_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_short_q6k = mma::mma_swiglu_split <ShortTile> [formats::Q6K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_short_q5k = mma::mma_swiglu_split <ShortTile> [formats::Q5K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_mma_swiglu_short_q4k = mma::mma_swiglu_split <ShortTile> [formats::Q4K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, y: *mut f32, yh: *mut u16, rows: u32, x: *const u32, cols: u32, n: u32);
    kiln_moe_swiglu_q4_0 = moe::moe_swiglu_split [formats::Q4_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_q4_1 = moe::moe_swiglu_split [formats::Q4_1] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_q8_0 = moe::moe_swiglu_split [formats::Q8_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_q6k = moe::moe_swiglu_split [formats::Q6K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_q5k = moe::moe_swiglu_split [formats::Q5K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_q4k = moe::moe_swiglu_split [formats::Q4K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_add_q4_0 = moe::moe_down_add_split [formats::Q4_0] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, x: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_add_q4_1 = moe::moe_down_add_split [formats::Q4_1] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, x: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_add_q8_0 = moe::moe_down_add_split [formats::Q8_0] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, x: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_add_q6k = moe::moe_down_add_split [formats::Q6K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, x: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_add_q5k = moe::moe_down_add_split [formats::Q5K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, x: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_add_q4k = moe::moe_down_add_split [formats::Q4K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, x: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_matvec_f32 = moe::matvec_f32 [] (w: *const f32, x: *const f32, y: *mut f32, rows: u32, cols: u32) waits_itself;
    kiln_moe_route = moe::moe_route [] (logits: *const f32, route: *mut f32, n_expert: u32, k: u32, norm: u32, n: u32);
    kiln_moe_swiglu_sorted_q4_0 = moe::moe_swiglu_sorted [formats::Q4_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, order: *const u32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_sorted_q4_1 = moe::moe_swiglu_sorted [formats::Q4_1] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, order: *const u32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_sorted_q8_0 = moe::moe_swiglu_sorted [formats::Q8_0] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, order: *const u32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_sorted_q6k = moe::moe_swiglu_sorted [formats::Q6K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, order: *const u32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_sorted_q5k = moe::moe_swiglu_sorted [formats::Q5K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, order: *const u32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_swiglu_sorted_q4k = moe::moe_swiglu_sorted [formats::Q4K] (gate_qs: *const u32, gate_scales: *const u8, up_qs: *const u32, up_scales: *const u8, xq: *const u32, xds: *const f32, route: *const f32, order: *const u32, act: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_sorted_q4_0 = moe::moe_down_sorted [formats::Q4_0] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, order: *const u32, y: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_sorted_q4_1 = moe::moe_down_sorted [formats::Q4_1] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, order: *const u32, y: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_sorted_q8_0 = moe::moe_down_sorted [formats::Q8_0] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, order: *const u32, y: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_sorted_q6k = moe::moe_down_sorted [formats::Q6K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, order: *const u32, y: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_sorted_q5k = moe::moe_down_sorted [formats::Q5K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, order: *const u32, y: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_down_sorted_q4k = moe::moe_down_sorted [formats::Q4K] (qs: *const u32, scales: *const u8, aq: *const u32, ads: *const f32, route: *const f32, order: *const u32, y: *mut f32, rows: u32, cols: u32, k: u32);
    kiln_moe_sort = moe::moe_sort [] (route: *const f32, order: *mut u32, tiles: *mut u32, n_slots: u32, k: u32, n_expert: u32, tile_n: u32, max_tiles: u32);
    kiln_moe_mma_q4_0 = mma::moe_mma_split <MoeTile> [formats::Q4_0] (w0: *const u32, s0: *const u8, y0: *mut f32, w1: *const u32, s1: *const u8, y1: *mut f32, n_mats: u32, rows: u32, x: *const u32, cols: u32, order: *const u32, order_div: u32, tiles: *const u32);
    kiln_moe_mma_q4_1 = mma::moe_mma_split <MoeTile> [formats::Q4_1] (w0: *const u32, s0: *const u8, y0: *mut f32, w1: *const u32, s1: *const u8, y1: *mut f32, n_mats: u32, rows: u32, x: *const u32, cols: u32, order: *const u32, order_div: u32, tiles: *const u32);
    kiln_moe_mma_q8_0 = mma::moe_mma_split <MoeTile> [formats::Q8_0] (w0: *const u32, s0: *const u8, y0: *mut f32, w1: *const u32, s1: *const u8, y1: *mut f32, n_mats: u32, rows: u32, x: *const u32, cols: u32, order: *const u32, order_div: u32, tiles: *const u32);
    kiln_moe_mma_q6k = mma::moe_mma_split <MoeTile> [formats::Q6K] (w0: *const u32, s0: *const u8, y0: *mut f32, w1: *const u32, s1: *const u8, y1: *mut f32, n_mats: u32, rows: u32, x: *const u32, cols: u32, order: *const u32, order_div: u32, tiles: *const u32);
    kiln_moe_mma_q5k = mma::moe_mma_split <MoeTile> [formats::Q5K] (w0: *const u32, s0: *const u8, y0: *mut f32, w1: *const u32, s1: *const u8, y1: *mut f32, n_mats: u32, rows: u32, x: *const u32, cols: u32, order: *const u32, order_div: u32, tiles: *const u32);
    kiln_moe_mma_q4k = mma::moe_mma_split <MoeTile> [formats::Q4K] (w0: *const u32, s0: *const u8, y0: *mut f32, w1: *const u32, s1: *const u8, y1: *mut f32, n_mats: u32, rows: u32, x: *const u32, cols: u32, order: *const u32, order_div: u32, tiles: *const u32);
    kiln_moe_matvec_f32x_q4_0 = moe::moe_matvec_f32x [formats::Q4_0] (qs: *const u32, scales: *const u8, x: *const f32, route: *const f32, y: *mut f32, rows: u32, cols: u32, k: u32, div: u32);
    kiln_moe_matvec_f32x_q4_1 = moe::moe_matvec_f32x [formats::Q4_1] (qs: *const u32, scales: *const u8, x: *const f32, route: *const f32, y: *mut f32, rows: u32, cols: u32, k: u32, div: u32);
    kiln_moe_matvec_f32x_q8_0 = moe::moe_matvec_f32x [formats::Q8_0] (qs: *const u32, scales: *const u8, x: *const f32, route: *const f32, y: *mut f32, rows: u32, cols: u32, k: u32, div: u32);
    kiln_moe_matvec_f32x_q6k = moe::moe_matvec_f32x [formats::Q6K] (qs: *const u32, scales: *const u8, x: *const f32, route: *const f32, y: *mut f32, rows: u32, cols: u32, k: u32, div: u32);
    kiln_moe_matvec_f32x_q5k = moe::moe_matvec_f32x [formats::Q5K] (qs: *const u32, scales: *const u8, x: *const f32, route: *const f32, y: *mut f32, rows: u32, cols: u32, k: u32, div: u32);
    kiln_moe_matvec_f32x_q4k = moe::moe_matvec_f32x [formats::Q4K] (qs: *const u32, scales: *const u8, x: *const f32, route: *const f32, y: *mut f32, rows: u32, cols: u32, k: u32, div: u32);
    kiln_moe_mix = moe::moe_mix [] (y: *const f32, route: *const f32, x: *mut f32, cols: u32, k: u32, len: u32);
    kiln_matvec_f16 = matvec::matvec_f16 [] (w: *const u16, x: *const f32, y: *mut f32, rows: u32, cols: u32);
    kiln_rms_norm = norm::rms_norm [] (x: *const f32, w: *const f32, out: *mut f32, cols: u32, eps: f32);
    kiln_rms_norm_q8 = norm::rms_norm_q8 [] (x: *const f32, w: *const f32, out: *mut f32, xq: *mut i8, xds: *mut f32, cols: u32, eps: f32);
    kiln_rms_norm_rope = norm::rms_norm_rope [] (x: *const f32, w: *const f32, out: *mut f32, heads: u32, head_dim: u32, rot_dim: u32, pos: *const u32, log2_base: f32, factors: *const f32, neox: u32, eps: f32);
    kiln_rope_store = norm::rope_store [] (q: *const f32, k: *const f32, v: *const f32, q_norm: *const f32, k_norm: *const f32, q_out: *mut f32, k_cache: *mut u16, v_cache: *mut u16, heads: u32, kv_heads: u32, head_dim: u32, rot_dim: u32, max_ctx: u32, pos: *const u32, log2_base: f32, factors: *const f32, neox: u32, norm: u32, eps: f32);
    kiln_argmax_blocks = norm::argmax_blocks [] (x: *const f32, part: *mut u32, cols: u32);
    kiln_argmax_merge = norm::argmax_merge [] (part: *const u32, out: *mut u32, parts: u32);
    kiln_softmax = norm::softmax [] (x: *const f32, out: *mut f32, cols: u32);
    kiln_row_nll = norm::row_nll [] (x: *const f32, targets: *const u32, out: *mut f64, cols: u32);
    kiln_rope = ew::rope [] (x: *mut f32, heads: u32, head_dim: u32, rot_dim: u32, pos: *const u32, log2_base: f32, factors: *const f32, neox: u32, threads: u32);
    kiln_swiglu = ew::swiglu [] (gate: *const f32, up: *const f32, out: *mut f32, len: u32);
    kiln_to_f16 = ew::to_f16 [] (x: *const f32, h: *mut u32, pairs: u32);
    kiln_add_assign = ew::add_assign [] (acc: *mut f32, x: *const f32, len: u32);
    kiln_add_row = ew::add_row [] (acc: *mut f32, row: *const f32, cols: u32, len: u32);
    kiln_embed_q4_0 = ew::embed_split [formats::Q4_0] (qs: *const u8, scales: *const u8, ids: *const u32, out: *mut f32, cols: u32, threads: u32);
    kiln_embed_q4_1 = ew::embed_split [formats::Q4_1] (qs: *const u8, scales: *const u8, ids: *const u32, out: *mut f32, cols: u32, threads: u32);
    kiln_embed_q8_0 = ew::embed_split [formats::Q8_0] (qs: *const u8, scales: *const u8, ids: *const u32, out: *mut f32, cols: u32, threads: u32);
    kiln_embed_q6k = ew::embed_split [formats::Q6K] (qs: *const u8, scales: *const u8, ids: *const u32, out: *mut f32, cols: u32, threads: u32);
    kiln_embed_q5k = ew::embed_split [formats::Q5K] (qs: *const u8, scales: *const u8, ids: *const u32, out: *mut f32, cols: u32, threads: u32);
    kiln_embed_q4k = ew::embed_split [formats::Q4K] (qs: *const u8, scales: *const u8, ids: *const u32, out: *mut f32, cols: u32, threads: u32);
    kiln_embed_f16 = ew::embed_f16 [] (table: *const u16, ids: *const u32, out: *mut f32, cols: u32, threads: u32);
    kiln_kv_store = ew::kv_store [] (k: *const f32, v: *const f32, k_cache: *mut u16, v_cache: *mut u16, kv_heads: u32, head_dim: u32, max_ctx: u32, pos: *const u32, threads: u32);
    kiln_attention_chunks = attention::attention_chunks [] (q: *const f32, k: *const u16, v: *const u16, part: *mut f32, pos: *const u32, heads: u32, kv_heads: u32, head_dim: u32, max_ctx: u32, scale: f32);
    kiln_attention_chunks_mma = flash::attention_chunks_mma [] (q: *const f32, k: *const u16, v: *const u16, part: *mut f32, pos: *const u32, heads: u32, kv_heads: u32, head_dim: u32, max_ctx: u32, scale: f32);
    kiln_attention_short_mma = flash::attention_short_mma [] (q: *const f32, k: *const u16, v: *const u16, out: *mut f32, xq: *mut i8, xds: *mut f32, pos: *const u32, heads: u32, kv_heads: u32, head_dim: u32, max_ctx: u32, scale: f32);
    kiln_attention_short_rope_mma = flash::attention_short_rope_mma [] (q: *const f32, k: *const f32, v: *const f32, q_norm: *const f32, k_norm: *const f32, k_cache: *mut u16, v_cache: *mut u16, out: *mut f32, xq: *mut i8, xds: *mut f32, pos: *const u32, heads: u32, kv_heads: u32, head_dim: u32, rot_dim: u32, max_ctx: u32, log2_base: f32, factors: *const f32, neox: u32, norm: u32, eps: f32, scale: f32) waits_itself;
    kiln_attention_combine = attention::attention_combine [] (part: *const f32, out: *mut f32, xq: *mut i8, xds: *mut f32, pos: *const u32, heads: u32, head_dim: u32, max_ctx: u32);
    kiln_flash_prefill = flash::flash_prefill [] (q: *const f32, k: *const u16, v: *const u16, out: *mut f32, pos: *const u32, n: u32, heads: u32, kv_heads: u32, head_dim: u32, max_ctx: u32, scale: f32);
}

/// The kernel families instantiated for every split format: the host picks an entry by the
/// weight's format, the tests by the reference's, from the same tables.
pub mod families {
    use super::names;

    /// One kernel's entries for the split formats, in this order: Q4_0, Q4_1, Q8_0, Q6K, Q5K,
    /// Q4K.
    pub type FormatEntries = [&'static str; 6];
    pub const MATVEC: FormatEntries = [
        names::kiln_matvec_q4_0,
        names::kiln_matvec_q4_1,
        names::kiln_matvec_q8_0,
        names::kiln_matvec_q6k,
        names::kiln_matvec_q5k,
        names::kiln_matvec_q4k,
    ];
    pub const MATVEC_WIDE: FormatEntries = [
        names::kiln_matvec_wide_q4_0,
        names::kiln_matvec_wide_q4_1,
        names::kiln_matvec_wide_q8_0,
        names::kiln_matvec_wide_q6k,
        names::kiln_matvec_wide_q5k,
        names::kiln_matvec_wide_q4k,
    ];
    pub const MATVEC3: FormatEntries = [
        names::kiln_matvec3_q4_0,
        names::kiln_matvec3_q4_1,
        names::kiln_matvec3_q8_0,
        names::kiln_matvec3_q6k,
        names::kiln_matvec3_q5k,
        names::kiln_matvec3_q4k,
    ];
    pub const MATVEC_F32X: FormatEntries = [
        names::kiln_matvec_f32x_q4_0,
        names::kiln_matvec_f32x_q4_1,
        names::kiln_matvec_f32x_q8_0,
        names::kiln_matvec_f32x_q6k,
        names::kiln_matvec_f32x_q5k,
        names::kiln_matvec_f32x_q4k,
    ];
    pub const MATVEC_SWIGLU: FormatEntries = [
        names::kiln_matvec_swiglu_q4_0,
        names::kiln_matvec_swiglu_q4_1,
        names::kiln_matvec_swiglu_q8_0,
        names::kiln_matvec_swiglu_q6k,
        names::kiln_matvec_swiglu_q5k,
        names::kiln_matvec_swiglu_q4k,
    ];
    pub const MATVEC_SWIGLU_Q8: FormatEntries = [
        names::kiln_matvec_swiglu_q8_q4_0,
        names::kiln_matvec_swiglu_q8_q4_1,
        names::kiln_matvec_swiglu_q8_q8_0,
        names::kiln_matvec_swiglu_q8_q6k,
        names::kiln_matvec_swiglu_q8_q5k,
        names::kiln_matvec_swiglu_q8_q4k,
    ];
    /// The consumers of a deferred norm (`residual_norm::Deferred` instantiations of
    /// `MATVEC3`, `MATVEC3_WIDE`, `MATVEC_SWIGLU`, `MATVEC_SWIGLU_Q8`).
    pub const MATVEC3_NORM: FormatEntries = [
        names::kiln_matvec3_norm_q4_0,
        names::kiln_matvec3_norm_q4_1,
        names::kiln_matvec3_norm_q8_0,
        names::kiln_matvec3_norm_q6k,
        names::kiln_matvec3_norm_q5k,
        names::kiln_matvec3_norm_q4k,
    ];
    pub const MATVEC3_WIDE_NORM: FormatEntries = [
        names::kiln_matvec3_wide_norm_q4_0,
        names::kiln_matvec3_wide_norm_q4_1,
        names::kiln_matvec3_wide_norm_q8_0,
        names::kiln_matvec3_wide_norm_q6k,
        names::kiln_matvec3_wide_norm_q5k,
        names::kiln_matvec3_wide_norm_q4k,
    ];
    pub const MATVEC_SWIGLU_NORM: FormatEntries = [
        names::kiln_matvec_swiglu_norm_q4_0,
        names::kiln_matvec_swiglu_norm_q4_1,
        names::kiln_matvec_swiglu_norm_q8_0,
        names::kiln_matvec_swiglu_norm_q6k,
        names::kiln_matvec_swiglu_norm_q5k,
        names::kiln_matvec_swiglu_norm_q4k,
    ];
    pub const MATVEC_SWIGLU_Q8_NORM: FormatEntries = [
        names::kiln_matvec_swiglu_q8_norm_q4_0,
        names::kiln_matvec_swiglu_q8_norm_q4_1,
        names::kiln_matvec_swiglu_q8_norm_q8_0,
        names::kiln_matvec_swiglu_q8_norm_q6k,
        names::kiln_matvec_swiglu_q8_norm_q5k,
        names::kiln_matvec_swiglu_q8_norm_q4k,
    ];
    pub const MATVEC_ADD_NORM_Q8: FormatEntries = [
        names::kiln_matvec_add_norm_q8_q4_0,
        names::kiln_matvec_add_norm_q8_q4_1,
        names::kiln_matvec_add_norm_q8_q8_0,
        names::kiln_matvec_add_norm_q8_q6k,
        names::kiln_matvec_add_norm_q8_q5k,
        names::kiln_matvec_add_norm_q8_q4k,
    ];
    pub const EMBED: FormatEntries = [
        names::kiln_embed_q4_0,
        names::kiln_embed_q4_1,
        names::kiln_embed_q8_0,
        names::kiln_embed_q6k,
        names::kiln_embed_q5k,
        names::kiln_embed_q4k,
    ];
    pub const MATVEC3_WIDE: FormatEntries = [
        names::kiln_matvec3_wide_q4_0,
        names::kiln_matvec3_wide_q4_1,
        names::kiln_matvec3_wide_q8_0,
        names::kiln_matvec3_wide_q6k,
        names::kiln_matvec3_wide_q5k,
        names::kiln_matvec3_wide_q4k,
    ];
    pub const MOE_SWIGLU: FormatEntries = [
        names::kiln_moe_swiglu_q4_0,
        names::kiln_moe_swiglu_q4_1,
        names::kiln_moe_swiglu_q8_0,
        names::kiln_moe_swiglu_q6k,
        names::kiln_moe_swiglu_q5k,
        names::kiln_moe_swiglu_q4k,
    ];
    pub const MOE_DOWN_ADD: FormatEntries = [
        names::kiln_moe_down_add_q4_0,
        names::kiln_moe_down_add_q4_1,
        names::kiln_moe_down_add_q8_0,
        names::kiln_moe_down_add_q6k,
        names::kiln_moe_down_add_q5k,
        names::kiln_moe_down_add_q4k,
    ];
    pub const MOE_SWIGLU_SORTED: FormatEntries = [
        names::kiln_moe_swiglu_sorted_q4_0,
        names::kiln_moe_swiglu_sorted_q4_1,
        names::kiln_moe_swiglu_sorted_q8_0,
        names::kiln_moe_swiglu_sorted_q6k,
        names::kiln_moe_swiglu_sorted_q5k,
        names::kiln_moe_swiglu_sorted_q4k,
    ];
    pub const MOE_MATVEC_F32X: FormatEntries = [
        names::kiln_moe_matvec_f32x_q4_0,
        names::kiln_moe_matvec_f32x_q4_1,
        names::kiln_moe_matvec_f32x_q8_0,
        names::kiln_moe_matvec_f32x_q6k,
        names::kiln_moe_matvec_f32x_q5k,
        names::kiln_moe_matvec_f32x_q4k,
    ];
    pub const MOE_MMA: FormatEntries = [
        names::kiln_moe_mma_q4_0,
        names::kiln_moe_mma_q4_1,
        names::kiln_moe_mma_q8_0,
        names::kiln_moe_mma_q6k,
        names::kiln_moe_mma_q5k,
        names::kiln_moe_mma_q4k,
    ];
    pub const MOE_DOWN_SORTED: FormatEntries = [
        names::kiln_moe_down_sorted_q4_0,
        names::kiln_moe_down_sorted_q4_1,
        names::kiln_moe_down_sorted_q8_0,
        names::kiln_moe_down_sorted_q6k,
        names::kiln_moe_down_sorted_q5k,
        names::kiln_moe_down_sorted_q4k,
    ];
}
