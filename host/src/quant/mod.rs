//! CPU quant formats (in progress)
