//! The `kiln` package: the CLI binary, plus every target's PTX module, built from `kernels-gpu`
//! by `build.rs` and embedded here so the binary needs no CUDA toolkit at run time.
pub use kiln_host::cuda::PtxModule;

include!(concat!(env!("OUT_DIR"), "/ptx_modules.rs"));
