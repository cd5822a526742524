//! The `kiln` package: the CLI binary, plus the PTX modules `build.rs` embeds.
