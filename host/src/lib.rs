//! kiln host side: everything that runs on the CPU. GGUF loading, quant formats, tokenizer,
//! sampling, the two backends (CPU reference and CUDA) and the model executors written once
//! against the [`backend::Backend`] ops interface.

pub mod backend;
pub mod chat;
pub mod cuda;
pub mod engine;
pub mod gguf;
pub mod models;
pub mod numerics;
pub mod perplexity;
pub mod quant;
pub mod reference;
pub mod sampling;
pub mod steering;
pub mod tokenizer;
