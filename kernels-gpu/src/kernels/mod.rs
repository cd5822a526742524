//! Kernel bodies, generic over the target policy `P`. Each is an `unsafe fn` taking raw device
//! pointers; the GPU entry points (`crate::entries`) and the host grid executor both call them.
//!
//! Contract shared by all: pointers are valid for the sizes the doc comment states, and the
//! launch shape is the one the kernel's `*_launch` helper in [`launch`] computes from `P`.

pub mod attention;
pub mod elementwise;
pub mod flash;
pub mod formats;
pub mod launch;
pub mod matvec;
pub mod mma;
pub mod moe;
pub mod norm;
pub mod residual_norm;
