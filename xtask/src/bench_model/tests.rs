use std::path::PathBuf;

use serde_json::Value;

use super::kiln_runner::KilnSample;
use super::llama_bench::{self, LlamaBench, LlamaModelInfo};
use super::*;
use crate::measure::percentile;

const PP512: TestSpec = TestSpec {
    kind: TestKind::Pp,
    n: 512,
    depth: 0,
};
const TG128: TestSpec = TestSpec {
    kind: TestKind::Tg,
    n: 128,
    depth: 0,
};
const TG128_D4096: TestSpec = TestSpec {
    kind: TestKind::Tg,
    n: 128,
    depth: 4096,
};

/// Shaped like llama-bench's `-o json` (fields trimmed, values invented): a prefill result and
/// a decode-at-depth result in one array.
const SAMPLE: &str = r#"[
  {
    "build_commit": "1a2b3c4",
    "build_number": 7001,
    "cpu_info": "Example CPU",
    "gpu_info": "NVIDIA H200",
    "backends": "CUDA",
    "model_filename": "/models/qwen3-8b-q4_0.gguf",
    "model_type": "qwen3 8B Q4_0",
    "model_size": 4677120000,
    "model_n_params": 8190735360,
    "n_gpu_layers": 99,
    "flash_attn": 1,
    "n_prompt": 512,
    "n_gen": 0,
    "n_depth": 0,
    "test_time": "2026-12-01T10:00:00Z",
    "avg_ns": 47400000,
    "stddev_ns": 120000,
    "avg_ts": 10801.25,
    "stddev_ts": 27.5,
    "samples_ns": [ 47400000 ],
    "samples_ts": [ 10801.25 ]
  },
  {
    "build_commit": "1a2b3c4",
    "gpu_info": "NVIDIA H200",
    "model_type": "qwen3 8B Q4_0",
    "model_size": 4677120000,
    "n_prompt": 0,
    "n_gen": 128,
    "n_depth": 4096,
    "avg_ts": 295.5,
    "stddev_ts": 1.25,
    "samples_ts": [ 294.25, 296.75 ]
  }
]"#;

#[test]
fn parses_llama_bench_json() {
    let (s, info) = llama_bench::parse(SAMPLE, &PP512).unwrap();
    assert_eq!(
        s,
        llama_bench::Sample {
            avg_ts: 10801.25,
            stddev_ts: 27.5,
            samples_ts: vec![10801.25]
        }
    );
    assert_eq!(
        info,
        LlamaModelInfo {
            build_commit: "1a2b3c4".into(),
            gpu_info: "NVIDIA H200".into(),
            model_type: "qwen3 8B Q4_0".into(),
            model_size: 4_677_120_000,
            vram_process_bytes: None,
        }
    );
    let (s, _) = llama_bench::parse(SAMPLE, &TG128_D4096).unwrap();
    assert_eq!(s.samples_ts, vec![294.25, 296.75]);
    assert_eq!(s.avg_ts, 295.5);
}

#[test]
fn llama_bench_json_errors_name_the_problem() {
    let err =
        |json: &str, spec: &TestSpec| format!("{:#}", llama_bench::parse(json, spec).unwrap_err());
    let e = err(SAMPLE, &TG128);
    assert!(e.contains("no tg128 result (2 results)"), "{e}");
    let e = err("main: error: failed to load model", &PP512);
    assert!(
        e.contains("not JSON") && e.contains("failed to load model"),
        "{e}"
    );
    let e = err(r#"{"avg_ts": 1}"#, &PP512);
    assert!(e.contains("not an array"), "{e}");
    let no_avg = SAMPLE.replace(r#""avg_ts": 10801.25,"#, "");
    let e = err(&no_avg, &PP512);
    assert!(e.contains("no field avg_ts"), "{e}");
    let bad_commit = SAMPLE.replace(r#""build_commit": "1a2b3c4","#, r#""build_commit": 5,"#);
    let e = err(&bad_commit, &PP512);
    assert!(e.contains("build_commit is not a string"), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn old_llama_bench_without_n_depth_is_depth_zero() {
    let old = r#"[{"build_commit": "x", "gpu_info": "", "model_type": "m", "model_size": 1,
        "n_prompt": 0, "n_gen": 128, "avg_ts": 300.0, "stddev_ts": 0.0, "samples_ts": [300.0]}]"#;
    assert_eq!(llama_bench::parse(old, &TG128).unwrap().0.avg_ts, 300.0);
    assert!(llama_bench::parse(old, &TG128_D4096).is_err());
}

#[test]
fn statistics_on_known_data() {
    let mut v: Vec<f64> = (1..=20).rev().map(f64::from).collect();
    assert_eq!(percentile(&mut v, 0.95), 19.0); // nearest rank: index round(19 × 0.95) = 18
    assert_eq!(percentile(&mut v, 0.0), 1.0);
    assert_eq!(percentile(&mut v, 1.0), 20.0);
    assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
    assert_eq!(median(&[7.0]), 7.0);

    let s = |tps: f64, ttft: Option<f64>, steps: &[f64]| KilnSample {
        tps,
        ttft_ms: ttft,
        step_ms: steps.to_vec(),
    };
    let t = KilnTest::from_samples(&[
        s(10.0, None, &[1.0, 2.0]),
        s(30.0, None, &[3.0, 4.0]),
        s(20.0, None, &[5.0, 100.0]),
    ]);
    assert_eq!(t.tps_median, 20.0);
    assert_eq!(t.tps_reps, vec![10.0, 30.0, 20.0]);
    assert_eq!(t.latency_ms_p95, Some(100.0));
    assert_eq!(t.latency_ms_p50, Some(4.0)); // pooled steps 1 2 3 4 5 100: index round(2.5) = 3
    assert_eq!(t.ttft_ms_median, None);
    let p = KilnTest::from_samples(&[s(1000.0, Some(50.0), &[]), s(900.0, Some(60.0), &[])]);
    assert_eq!(p.ttft_ms_median, Some(60.0));
    assert_eq!(p.latency_ms_p95, None);
}

#[test]
fn test_names_and_selection() {
    let names: Vec<String> = tests(512, 128, 4096).iter().map(TestSpec::name).collect();
    assert_eq!(names, ["pp512", "tg128", "tg128@d4096"]);
    assert_eq!(tests(0, 128, 0), vec![TG128]);
    assert_eq!(tests(512, 0, 4096), vec![PP512]); // depth applies to decode tests only
}

#[test]
fn schedule_alternates_who_goes_first() {
    use Engine::{Kiln as K, LlamaCpp as L};
    let order: Vec<(usize, usize, Engine)> = schedule(3, 2, true)
        .iter()
        .map(|s| (s.rep, s.test, s.engine))
        .collect();
    assert_eq!(
        order,
        [
            (0, 0, K),
            (0, 0, L),
            (0, 1, K),
            (0, 1, L),
            (1, 0, L),
            (1, 0, K),
            (1, 1, L),
            (1, 1, K),
            (2, 0, K),
            (2, 0, L),
            (2, 1, K),
            (2, 1, L),
        ]
    );
    let kiln_only = schedule(2, 1, false);
    assert_eq!(
        kiln_only,
        [
            Step {
                rep: 0,
                test: 0,
                engine: K
            },
            Step {
                rep: 1,
                test: 0,
                engine: K
            }
        ]
    );
}

#[test]
fn date_is_rfc3339_utc() {
    let d = utc_now();
    let b = d.as_bytes();
    assert_eq!(b.len(), 20, "{d}");
    assert!(
        d.ends_with('Z') && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':',
        "{d}"
    );
    assert!(d.starts_with("20"), "{d}");
}

fn sample_report() -> Report {
    let kiln = |tps: f64, ttft: Option<f64>, p95: Option<f64>| KilnTest {
        tps_median: tps,
        tps_reps: vec![tps],
        ttft_ms_median: ttft,
        ttft_ms_reps: ttft.into_iter().collect(),
        latency_ms_p50: p95,
        latency_ms_p95: p95,
    };
    let llama = |tps: f64| {
        Some(LlamaTest {
            tps_median: tps,
            tps_reps: vec![tps],
            stddev_ts_reps: vec![0.0],
        })
    };
    Report {
        schema: "kiln-bench-model/1",
        date: "2026-12-02T12:00:00Z".into(),
        kiln_commit: "abc".into(),
        device: "NVIDIA H200".into(),
        protocol: Protocol {
            reps: 1,
            warmup: 1,
            pp: 512,
            tg: 128,
            depth: 0,
            order: "x",
            llama_bench_args: vec![],
        },
        reference: Reference {
            ran: true,
            path: Some("/x/llama-bench".into()),
            note: String::new(),
        },
        models: vec![ModelReport {
            file: "/models/qwen3-8b-q4_0.gguf".into(),
            sha256: "00".into(),
            size_bytes: 1,
            kiln: KilnModel {
                load_s: 1.5,
                vram_baseline_bytes: Some(1 << 30),
                vram_peak_bytes: Some(6 << 30),
                vram_peak_over_baseline_bytes: Some(5 << 30),
                vram_process_bytes: None,
            },
            llama_cpp: None,
            tests: vec![
                TestReport {
                    name: "pp512".into(),
                    kind: TestKind::Pp,
                    n_tokens: 512,
                    depth: 0,
                    kiln: kiln(9000.0, Some(57.25), None),
                    llama_cpp: llama(10800.0),
                    ratio: Some(9000.0 / 10800.0),
                },
                TestReport {
                    name: "tg128".into(),
                    kind: TestKind::Tg,
                    n_tokens: 128,
                    depth: 0,
                    kiln: kiln(330.0, None, Some(3.125)),
                    llama_cpp: None,
                    ratio: None,
                },
            ],
            notes: vec![],
        }],
    }
}

#[test]
fn markdown_rows() {
    let md = report::markdown(&sample_report());
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| qwen3")).collect();
    assert_eq!(
        rows,
        [
            "| qwen3-8b-q4_0 | pp512 | 9000.0 | 10800.0 | 0.83 | — | 57.2 | 5120 | 1.50 |",
            "| qwen3-8b-q4_0 | tg128 | 330.0 | — | — | 3.12 | — | 5120 | 1.50 |",
        ]
    );
    assert!(md.contains("| model | test | kiln t/s | llama.cpp t/s | kiln/llama.cpp | p95 ms/token | TTFT ms | VRAM MiB kiln / llama.cpp | load s |"));
}

#[test]
fn markdown_vram_per_process_when_both_are_measured() {
    let mut r = sample_report();
    let m = &mut r.models[0];
    m.kiln.vram_process_bytes = Some(5632 << 20);
    m.llama_cpp = Some(LlamaModelInfo {
        build_commit: "x".into(),
        gpu_info: "NVIDIA H200".into(),
        model_type: "qwen3 8B Q4_0".into(),
        model_size: 1,
        vram_process_bytes: Some(6144 << 20),
    });
    let md = report::markdown(&r);
    let row = md
        .lines()
        .find(|l| l.starts_with("| qwen3-8b-q4_0 | pp512"))
        .unwrap();
    assert!(row.ends_with("| 5632 / 6144 | 1.50 |"), "{row}");
}

#[test]
fn svg_bars() {
    let svg = report::svg(&sample_report());
    assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
    // Three bars (pp512 both engines, tg128 kiln only) plus two legend swatches.
    assert_eq!(svg.matches("<rect ").count(), 5);
    for label in [
        ">9000<", ">10800<", ">330<", ">pp512<", ">tg128<", ">1e2<", ">1e5<",
    ] {
        assert!(svg.contains(label), "{label} missing from\n{svg}");
    }
}

/// A directory in the temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let p = std::env::temp_dir().join(format!("kiln-bench-model-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A stand-in llama-bench: answers `--help`, logs each run's arguments next to itself and
/// prints one result for the test it was asked for.
const FAKE_LLAMA_BENCH: &str = r#"#!/bin/sh
for a in "$@"; do [ "$a" = --help ] && { echo "-p, --n-prompt <n>"; echo "-d, --n-depth <n>"; exit 0; }; done
echo "$*" >> "$0.log"
p=0; n=0; d=0
while [ $# -gt 0 ]; do case "$1" in -p) p=$2; shift;; -n) n=$2; shift;; -d) d=$2; shift;; esac; shift; done
echo "[{\"build_commit\": \"fake\", \"gpu_info\": \"none\", \"model_type\": \"qwen3 tiny\", \"model_size\": 1,
 \"n_prompt\": $p, \"n_gen\": $n, \"n_depth\": $d, \"avg_ts\": 100.0, \"stddev_ts\": 0.0, \"samples_ts\": [100.0]}]"
"#;

fn write_script(path: &Path, body: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn args(model: &Path, out: &Path, depth: usize, reps: usize, llama: Option<&Path>) -> Args {
    Args {
        models: vec![model.to_path_buf()],
        device: DeviceKind::Cpu,
        reps,
        warmup: 1,
        pp: 16,
        tg: 4,
        depth,
        llama_bench: llama.map(Path::to_path_buf),
        llama_args: String::new(),
        out: out.to_path_buf(),
    }
}

fn json_at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => v
            .get(k)
            .unwrap_or_else(|| panic!("bench.json has no {path} (at {k})")),
    })
}

/// The whole command on the CPU on a generated tiny model: once without the reference, once
/// against the stand-in llama-bench; then the error paths. One test, because it writes
/// executables and spawns processes (a fork while another test holds a script open for writing
/// would make exec fail with ETXTBSY).
#[test]
fn end_to_end_on_cpu() {
    let dir = TempDir::new();
    let model = dir.0.join("tiny-qwen3.gguf");
    let tok = crate::vocab::Qwen3Tokenizer::load().unwrap();
    let preset = crate::presets::find("tiny-qwen3").unwrap();
    crate::gen_model::generate(
        preset,
        crate::gen_model::Quant::Q4_0,
        1,
        &model,
        &tok,
        false,
    )
    .unwrap();
    let fake = dir.0.join("llama-bench");
    write_script(&fake, FAKE_LLAMA_BENCH, 0o755);
    let not_exec = dir.0.join("not-executable");
    write_script(&not_exec, FAKE_LLAMA_BENCH, 0o644);
    let not_llama = dir.0.join("not-llama-bench");
    write_script(&not_llama, "#!/bin/sh\necho hello\n", 0o755);
    let help = "[ \"$1\" = --help ] && { echo --n-prompt; exit 0; }\n";
    let broken = dir.0.join("broken-llama-bench");
    write_script(
        &broken,
        &format!("#!/bin/sh\n{help}echo 'main: error: failed to load model' >&2\nexit 1\n"),
        0o755,
    );
    let garbage = dir.0.join("garbage-llama-bench");
    write_script(
        &garbage,
        &format!("#!/bin/sh\n{help}echo '| model | size |'\n"),
        0o755,
    );
    let no_depth_memory = dir.0.join("oom-at-depth-llama-bench");
    let fail_at_depth = "for a in \"$@\"; do [ \"$a\" = -d ] && { echo 'CUDA error: out of memory' >&2; exit 1; }; done\n";
    write_script(
        &no_depth_memory,
        &format!("#!/bin/sh\n{fail_at_depth}exec {} \"$@\"\n", fake.display()),
        0o755,
    );

    // Kiln alone, no depth test.
    let out = dir.0.join("alone");
    run(args(&model, &out, 0, 1, None)).unwrap();
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    assert_eq!(v["reference"]["ran"], false);
    assert_eq!(json_at(&v, "models.0.tests").as_array().unwrap().len(), 2);
    assert!(json_at(&v, "models.0.tests.1.llama_cpp").is_null());

    // Against the stand-in, with a depth test and two reps.
    let out = dir.0.join("vs");
    run(args(&model, &out, 32, 2, Some(&fake))).unwrap();
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    for key in [
        "schema",
        "date",
        "kiln_commit",
        "device",
        "protocol.reps",
        "protocol.warmup",
        "protocol.pp",
        "protocol.tg",
        "protocol.depth",
        "protocol.order",
        "protocol.llama_bench_args",
        "reference.ran",
        "reference.path",
        "reference.note",
        "models.0.file",
        "models.0.sha256",
        "models.0.size_bytes",
        "models.0.kiln.load_s",
        "models.0.kiln.vram_baseline_bytes",
        "models.0.kiln.vram_peak_bytes",
        "models.0.kiln.vram_peak_over_baseline_bytes",
        "models.0.llama_cpp.build_commit",
        "models.0.llama_cpp.gpu_info",
        "models.0.llama_cpp.model_type",
        "models.0.llama_cpp.model_size",
        "models.0.notes",
    ] {
        json_at(&v, key);
    }
    assert_eq!(v["schema"], "kiln-bench-model/1");
    assert_eq!(json_at(&v, "models.0.sha256").as_str().unwrap().len(), 64);
    assert_eq!(
        json_at(&v, "models.0.size_bytes").as_u64(),
        Some(std::fs::metadata(&model).unwrap().len())
    );
    assert!(json_at(&v, "models.0.kiln.load_s").as_f64().unwrap() > 0.0);
    assert!(json_at(&v, "models.0.kiln.vram_peak_bytes").is_null()); // no device memory on the CPU
    let tests = json_at(&v, "models.0.tests").as_array().unwrap();
    let names: Vec<&str> = tests.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp16", "tg4", "tg4@d32"]);
    for t in tests {
        for key in [
            "kind",
            "n_tokens",
            "depth",
            "ratio",
            "kiln.tps_median",
            "kiln.tps_reps",
            "kiln.ttft_ms_median",
            "kiln.ttft_ms_reps",
            "kiln.latency_ms_p50",
            "kiln.latency_ms_p95",
            "llama_cpp.tps_median",
            "llama_cpp.tps_reps",
            "llama_cpp.stddev_ts_reps",
        ] {
            json_at(t, key);
        }
        assert_eq!(t["kiln"]["tps_reps"].as_array().unwrap().len(), 2);
        assert!(t["kiln"]["tps_median"].as_f64().unwrap() > 0.0);
        assert_eq!(t["llama_cpp"]["tps_median"], 100.0);
        let is_pp = t["kind"] == "pp";
        assert_eq!(t["kiln"]["ttft_ms_median"].is_number(), is_pp);
        assert_eq!(t["kiln"]["latency_ms_p95"].is_number(), !is_pp);
    }
    // Two reps of three tests, one llama-bench run each, one test at a time.
    let log = std::fs::read_to_string(dir.0.join("llama-bench.log")).unwrap();
    let runs: Vec<&str> = log.lines().collect();
    assert_eq!(runs.len(), 6);
    // On the CPU llama-bench keeps every layer on the CPU and gets kiln's thread count.
    let threads = rayon::current_num_threads();
    assert!(
        runs[0].contains(&format!(
            "-p 16 -n 0 -fa 1 -ngl 0 -t {threads} -r 1 -o json"
        )),
        "{}",
        runs[0]
    );
    assert!(runs[2].contains("-p 0 -n 4 -d 32"), "{}", runs[2]);
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| tiny-qwen3 |"))
            .count(),
        3
    );
    assert!(
        std::fs::read_to_string(out.join("bench.svg"))
            .unwrap()
            .contains("tg4@d32")
    );

    // A failure after llama-bench has worked once costs only that test its reference.
    let out = dir.0.join("oom");
    run(args(&model, &out, 32, 1, Some(&no_depth_memory))).unwrap();
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    assert!(json_at(&v, "models.0.tests.1.llama_cpp").is_object());
    assert!(json_at(&v, "models.0.tests.2.llama_cpp").is_null());
    let note = json_at(&v, "models.0.notes.0").as_str().unwrap();
    assert!(
        note.contains("tg4@d32") && note.contains("out of memory"),
        "{note}"
    );

    // Bad input: one line naming the problem.
    let fails = |a: Args| format!("{:#}", run(a).unwrap_err());
    let missing = dir.0.join("missing.gguf");
    let e = fails(args(&missing, &out, 0, 1, None));
    assert!(e.contains("missing.gguf does not exist"), "{e}");
    let e = fails(args(&model, &out, 0, 1, Some(&not_exec)));
    assert!(e.contains("is not an executable file"), "{e}");
    let e = fails(args(&model, &out, 0, 1, Some(&dir.0.join("nowhere"))));
    assert!(e.contains("nowhere") && e.contains("No such file"), "{e}");
    let e = fails(args(&model, &out, 0, 1, Some(&not_llama)));
    assert!(e.contains("does not look like llama-bench"), "{e}");
    let e = fails(args(&model, &out, 0, 1, Some(&broken)));
    assert!(
        e.contains("failed (exit status: 1): main: error: failed to load model"),
        "{e}"
    );
    let e = fails(args(&model, &out, 0, 1, Some(&garbage)));
    assert!(
        e.contains("llama-bench output is not JSON") && e.contains("| model | size |"),
        "{e}"
    );
    let base = |extra: &str, cpu: Option<usize>| {
        LlamaBench::new(&fake, extra, cpu)
            .unwrap()
            .base_args()
            .join(" ")
    };
    assert_eq!(base("", None), "-fa 1 -ngl 99 -r 1 -o json");
    assert_eq!(base("", Some(3)), "-fa 1 -ngl 0 -t 3 -r 1 -o json");
    assert_eq!(
        base("--threads 4 -fa 0", Some(3)),
        "-ngl 0 -r 1 -o json --threads 4 -fa 0"
    );
    let e = format!(
        "{:#}",
        LlamaBench::new(&fake, "-t 4 -r 3", None).err().unwrap()
    );
    assert!(e.contains("must not set -r"), "{e}");
    let e = fails(args(&model, &out, 5000, 1, None));
    assert!(
        e.contains("more than the model's 4096-token context"),
        "{e}"
    );
}
