//! Helpers the measurement protocols share: percentiles and the commit a figure belongs to.

/// The `p`-quantile (0..=1) of `v` by nearest rank on the sorted samples (sorts `v` in place).
/// Nearest rank rather than interpolation: every reported figure is one that was measured.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    assert!(!v.is_empty(), "percentile of no samples");
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The median of `v`, leaving `v` untouched.
pub fn median(v: &[f64]) -> f64 {
    percentile(&mut v.to_vec(), 0.5)
}

/// The kiln commit measured: `KILN_COMMIT` (set where the binary was built, since the GPU
/// machine may have no git checkout), else `git rev-parse HEAD`, else "unknown".
pub fn commit() -> String {
    if let Ok(c) = std::env::var("KILN_COMMIT") {
        return c;
    }
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
