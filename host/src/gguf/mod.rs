//! GGUF reader (zero-copy over a memory map) and writer.
//!
//! Format (v2/v3, little-endian): magic `GGUF`, version u32, tensor_count u64, kv_count u64,
//! then kv_count metadata pairs (string key, u32 value type, value), then tensor_count tensor
//! infos (string name, u32 n_dims, n_dims × u64 dims, u32 ggml type, u64 offset relative to the
//! data section), then padding to `general.alignment` (default 32), then the tensor data.
//! Strings are a u64 byte length followed by UTF-8 bytes; arrays are a u32 element type, a u64
//! length and the elements.
//!
//! This module is self-contained (no `crate::` paths) so the fuzz crate can compile it alone.
mod read;
mod types;
mod write;

pub use read::{GgufFile, TensorInfo};
pub use types::{GgmlType, Value};
pub use write::{GgufStream, GgufWriter};

/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// Deepest array nesting accepted (arrays of arrays of ...). Real files use at most 1; the
/// limit keeps hostile input from recursing the parser off the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Everything that can go wrong reading or writing GGUF. `file` is the path, or `<memory>` for
/// [`GgufFile::from_bytes`], or `<writer>`; offsets are absolute byte offsets in the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not a GGUF file: magic at offset 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic { file: String, found: Vec<u8> },
    #[error("{file}: GGUF version {version} is not supported (kiln reads v2 and v3){hint}")]
    UnsupportedVersion {
        file: String,
        version: u32,
        hint: &'static str,
    },
    #[error("{file}: truncated: {what} at offset {offset} needs {need} bytes, file is {len} bytes")]
    Truncated {
        file: String,
        what: String,
        offset: u64,
        need: u64,
        len: u64,
    },
    #[error(
        "{file}: {what} at offset {offset} is {count}, more than the {remaining} bytes left in the \
         file can hold (corrupt or truncated)"
    )]
    CountTooLarge {
        file: String,
        what: String,
        offset: u64,
        count: u64,
        remaining: u64,
    },
    #[error("{file}: metadata {key:?} at offset {offset}: unknown value type id {id}")]
    UnknownValueType {
        file: String,
        key: String,
        offset: u64,
        id: u32,
    },
    #[error("{file}: metadata {key:?} at offset {offset}: bool byte is {byte}, expected 0 or 1")]
    InvalidBool {
        file: String,
        key: String,
        offset: u64,
        byte: u8,
    },
    #[error("{file}: metadata {key:?} at offset {offset}: arrays nested deeper than {max}")]
    NestingTooDeep {
        file: String,
        key: String,
        offset: u64,
        max: usize,
    },
    #[error("{file}: {what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        file: String,
        what: String,
        offset: u64,
    },
    #[error("{file}: duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey {
        file: String,
        key: String,
        offset: u64,
    },
    #[error("{file}: duplicate tensor name {tensor:?} at offset {offset}")]
    DuplicateTensor {
        file: String,
        tensor: String,
        offset: u64,
    },
    #[error(
        "{file}: general.alignment = {value} is invalid (must be a power of two that fits u32)"
    )]
    BadAlignment { file: String, value: String },
    #[error("{file}: tensor {tensor:?} at offset {offset}: unknown ggml type id {id}")]
    UnknownTensorType {
        file: String,
        tensor: String,
        offset: u64,
        id: u32,
    },
    #[error("{file}: tensor {tensor:?} at offset {offset}: {reason}")]
    BadShape {
        file: String,
        tensor: String,
        offset: u64,
        reason: String,
    },
    #[error(
        "{file}: tensor {tensor:?} data at offset {offset} (relative to the data section) is not \
         a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        file: String,
        tensor: String,
        offset: u64,
        alignment: u32,
    },
    #[error(
        "{file}: tensor {tensor:?} data [{start}, {end}) runs past the end of the file ({len} bytes)"
    )]
    TensorOutOfBounds {
        file: String,
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error(
        "{file}: tensors {first:?} and {second:?} overlap: {second:?} starts at offset {offset}, inside {first:?}"
    )]
    OverlappingTensors {
        file: String,
        first: String,
        second: String,
        offset: u64,
    },
    #[error("{file}: metadata key {key:?} is missing")]
    MissingKey { file: String, key: String },
    #[error("{file}: metadata key {key:?} is {found}, expected {expected}")]
    WrongType {
        file: String,
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("{file}: no tensor named {tensor:?}")]
    MissingTensor { file: String, tensor: String },
    /// The writer was given something it cannot encode (or bytes out of order).
    #[error("GGUF writer: {0}")]
    InvalidWrite(String),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// Rounds `x` up to a multiple of `align` (a power of two); `None` on overflow.
pub(crate) fn align_up(x: u64, align: u32) -> Option<u64> {
    let a = u64::from(align);
    Some(x.checked_add(a - 1)? & !(a - 1))
}

/// Checks a tensor shape and returns (n_elements, size in bytes), or why it is invalid.
/// Shared by reader and writer so both accept exactly the same shapes.
pub(crate) fn shape_size(dims: &[u64], ty: GgmlType) -> Result<(u64, u64), String> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(format!(
            "{} dimensions (must be 1..={MAX_DIMS})",
            dims.len()
        ));
    }
    let mut n: u64 = 1;
    for &d in dims {
        n = n
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("dims {dims:?} overflow the element count"))?;
    }
    let (block, _) = ty.block();
    if !dims[0].is_multiple_of(block as u64) {
        return Err(format!(
            "row length {} is not a multiple of the {} block size {block}",
            dims[0],
            ty.name()
        ));
    }
    let size = ty
        .bytes_for(n)
        .ok_or_else(|| format!("dims {dims:?} overflow the byte size"))?;
    Ok((n, size))
}
