//! What the tests on the real model share.

use std::path::PathBuf;

/// `models/SmolLM2-135M-Instruct.Q4_1.gguf`, or `None` with a SKIPPED line on stderr when it is
/// not there (`scripts/fetch-model.sh` fetches it; `scripts/test.sh` does so first).
pub fn smollm2_path() -> Option<PathBuf> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} not found (run scripts/fetch-model.sh)",
            p.display()
        );
        None
    }
}
