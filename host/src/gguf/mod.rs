//! GGUF reader (zero-copy over a memory map) and writer.
mod types;
pub use types::{GgmlType, Value};
