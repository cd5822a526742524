//! kiln's GPU kernels, in `no_std` Rust.
//!
//! Built twice: by rustc's `nvptx64-nvidia-cuda` backend into one PTX module per target policy
//! (see `build.rs` and `link-ptx.sh`), and for the host, where [`device`] runs the same kernel
//! bodies on a thread-per-GPU-thread grid executor so CI can property-test them without a GPU.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx, asm_experimental_arch))]
#![feature(f16)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod quant;
