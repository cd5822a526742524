//! kiln's GPU kernels, in `no_std` Rust.
//!
//! Built twice: by rustc's `nvptx64-nvidia-cuda` backend into one PTX module per target policy
//! (the workspace `build.rs` drives it; `link-ptx.sh` links it), and for the host, where
//! [`device::host`] runs the very same kernel bodies on a grid executor so CI property-tests them
//! without a GPU.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        stdarch_nvptx,
        asm_experimental_arch,
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem
    ),
    allow(internal_features)
)]
#![feature(f16)]
#![allow(clippy::missing_safety_doc)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod device;
pub mod entries;
pub mod kernels;
pub mod quant;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    unsafe { core::arch::nvptx::trap() }
}
