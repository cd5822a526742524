//! `bench model` output: `bench.json` (the [`Report`] as is), `bench.md` (one table row per
//! model and test) and `bench.svg` (grouped bars of tokens/s, kiln beside llama.cpp).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::Report;

/// Writes the three files under `dir` (created if missing) and returns the markdown.
pub fn write_all(r: &Report, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let md = markdown(r);
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))
    };
    write("bench.json", &serde_json::to_string_pretty(r)?)?;
    write("bench.md", &md)?;
    write("bench.svg", &svg(r))?;
    Ok(md)
}

/// A model's short name in tables and charts: the file name without directory or extension.
fn short_name(file: &str) -> &str {
    let base = file.rsplit('/').next().unwrap_or(file);
    base.strip_suffix(".gguf").unwrap_or(base)
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "—".to_string(), f)
}

pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# kiln vs llama.cpp: {}\n", r.device);
    let _ = writeln!(
        s,
        "kiln {}, {}; {} reps after {} warm-up.",
        r.kiln_commit, r.date, r.protocol.reps, r.protocol.warmup
    );
    if !r.reference.note.is_empty() {
        let _ = writeln!(s, "Reference: {}", r.reference.note);
    }
    s.push('\n');
    s.push_str("| model | test | kiln t/s | llama.cpp t/s | kiln/llama.cpp | p95 ms/token | TTFT ms | VRAM MiB kiln / llama.cpp | load s |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for m in &r.models {
        // Per process, CUDA context included, where both figures exist; else kiln's memory
        // over its pre-load baseline.
        let mib = |b: Option<u64>| {
            opt(b.map(|b| b as f64), |b| {
                format!("{:.0}", b / (1u64 << 20) as f64)
            })
        };
        let llama_vram = m.llama_cpp.as_ref().and_then(|l| l.vram_process_bytes);
        let vram = match m.kiln.vram_process_bytes {
            Some(k) => format!("{} / {}", mib(Some(k)), mib(llama_vram)),
            None => mib(m.kiln.vram_peak_over_baseline_bytes),
        };
        for t in &m.tests {
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} | {} | {} | {} | {} | {vram} | {:.2} |",
                short_name(&m.file),
                t.name,
                t.kiln.tps_median,
                opt(t.llama_cpp.as_ref().map(|l| l.tps_median), |v| format!(
                    "{v:.1}"
                )),
                opt(t.ratio, |v| format!("{v:.2}")),
                opt(t.kiln.latency_ms_p95, |v| format!("{v:.2}")),
                opt(t.kiln.ttft_ms_median, |v| format!("{v:.1}")),
                m.kiln.load_s,
            );
        }
    }
    // After the table: a line between rows would end it.
    for m in &r.models {
        for n in &m.notes {
            let _ = write!(s, "\nNote ({}): {n}\n", short_name(&m.file));
        }
    }
    s
}

const KILN_COLOR: &str = "#d9622b";
const LLAMA_COLOR: &str = "#4a72b0";

/// Grouped bars on a log scale (prefill and decode rates are orders of magnitude apart), one
/// group per model and test, each bar labelled with its tokens/s.
pub fn svg(r: &Report) -> String {
    let groups: Vec<(String, f64, Option<f64>)> = r
        .models
        .iter()
        .flat_map(|m| {
            let prefix = if r.models.len() > 1 {
                format!("{} ", short_name(&m.file))
            } else {
                String::new()
            };
            m.tests.iter().map(move |t| {
                (
                    format!("{prefix}{}", t.name),
                    t.kiln.tps_median,
                    t.llama_cpp.as_ref().map(|l| l.tps_median),
                )
            })
        })
        .collect();
    let values = groups
        .iter()
        .flat_map(|g| [Some(g.1), g.2])
        .flatten()
        .filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi {
        (0.0, 1.0)
    } else {
        (
            lo.log10().floor(),
            hi.log10().ceil().max(lo.log10().floor() + 1.0),
        )
    };
    let (left, top, plot_h, group_w, bar_w) = (60.0, 40.0, 240.0, 120.0, 40.0);
    let width = (left + group_w * groups.len().max(1) as f64 + 20.0).max(480.0);
    let y = |v: f64| top + plot_h * (1.0 - ((v.max(10f64.powf(lo))).log10() - lo) / (hi - lo));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{}" font-family="sans-serif" font-size="11">"#,
        top + plot_h + 50.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="20" font-size="13">tokens/s (log scale): kiln vs llama.cpp, {}</text>"#,
        xml(&r.device)
    );
    for d in lo as i32..=hi as i32 {
        let yy = y(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">1e{d}</text>"##,
            width - 20.0,
            left - 6.0,
            yy + 4.0
        );
    }
    for (i, (name, kiln, llama)) in groups.iter().enumerate() {
        let x0 = left + group_w * i as f64 + (group_w - 2.0 * bar_w) / 2.0;
        for (j, (v, color)) in [(Some(*kiln), KILN_COLOR), (*llama, LLAMA_COLOR)]
            .into_iter()
            .enumerate()
        {
            let Some(v) = v else { continue };
            let (x, yy) = (x0 + bar_w * j as f64, y(v));
            let _ = writeln!(
                s,
                r#"<rect x="{x}" y="{yy:.1}" width="{}" height="{:.1}" fill="{color}"/>"#,
                bar_w - 4.0,
                top + plot_h - yy
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="middle">{v:.0}</text>"#,
                x + bar_w / 2.0 - 2.0,
                yy - 3.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            x0 + bar_w,
            top + plot_h + 16.0,
            xml(name)
        );
    }
    let ly = top + plot_h + 38.0;
    let _ = writeln!(
        s,
        r#"<rect x="{left}" y="{}" width="10" height="10" fill="{KILN_COLOR}"/><text x="{}" y="{ly}">kiln</text>"#,
        ly - 9.0,
        left + 14.0
    );
    let _ = writeln!(
        s,
        r#"<rect x="{}" y="{}" width="10" height="10" fill="{LLAMA_COLOR}"/><text x="{}" y="{ly}">llama.cpp</text>"#,
        left + 60.0,
        ly - 9.0,
        left + 74.0
    );
    s.push_str("</svg>\n");
    s
}

/// Escapes text for SVG.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
