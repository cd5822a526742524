//! The CUDA runtime layer (cudarc, dynamic loading): device discovery, PTX module choice,
//! buffers, launches.

/// One embedded PTX module: built for policy `name`, runs on compute capability ≥ `min_cc`.
#[derive(Clone, Copy, Debug)]
pub struct PtxModule {
    pub name: &'static str,
    /// major·10 + minor.
    pub min_cc: u32,
    pub ptx: &'static str,
}
