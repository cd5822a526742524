//! Builds `kernels-gpu` once per GPU target policy with rustc's nvptx backend and embeds each
//! PTX module in the binary (`OUT_DIR/ptx_modules.rs`, included by `src/lib.rs`).
//!
//! The nested cargo runs in a clean environment (the variables cargo sets for this outer build
//! would otherwise leak into it) and in its own target directory, so the two builds never wait
//! on each other's lock. Linking uses `kernels-gpu/link-ptx.sh` (see its header for why).
use policies::{Ampere, Hopper, SparkGb10, TargetPolicy};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Target {
    name: &'static str,
    cpu: &'static str,
    ptx_isa: u32,
    min_cc: u32,
}

fn target<P: TargetPolicy>() -> Target {
    Target {
        name: P::NAME,
        cpu: P::PTX_TARGET,
        ptx_isa: P::PTX_ISA,
        min_cc: P::MIN_CC,
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for p in [
        "kernels-gpu/src",
        "kernels-gpu/Cargo.toml",
        "kernels-gpu/link-ptx.sh",
        "policies/src",
        "rust-toolchain.toml",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(p).display());
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("ptx");

    let mut table = String::from(
        "/// Every target's PTX module, built by build.rs from kernels-gpu.\npub static PTX_MODULES: &[PtxModule] = &[\n",
    );
    for t in [
        target::<Ampere>(),
        target::<Hopper>(),
        target::<SparkGb10>(),
    ] {
        let ptx = build_module(&root, &target_dir, &t);
        let dst = out_dir.join(format!("{}.ptx", t.name));
        std::fs::copy(&ptx, &dst)
            .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", ptx.display(), dst.display()));
        table += &format!(
            "    PtxModule {{ name: {:?}, min_cc: {}, ptx: include_str!(concat!(env!(\"OUT_DIR\"), \"/{}.ptx\")) }},\n",
            t.name, t.min_cc, t.name
        );
    }
    table += "];\n";
    std::fs::write(out_dir.join("ptx_modules.rs"), table).unwrap();
}

fn build_module(root: &Path, target_dir: &Path, t: &Target) -> PathBuf {
    let flags = [
        format!("-Ctarget-cpu={}", t.cpu),
        format!("-Ctarget-feature=+ptx{}", t.ptx_isa),
        format!(
            "-Clinker={}",
            root.join("kernels-gpu/link-ptx.sh").display()
        ),
        "--cfg".into(),
        format!("kiln_target=\"{}\"", t.name),
    ];
    let dir = target_dir.join(t.name);
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let outer = [
            "RUSTC",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTDOC",
            "RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_MAKEFLAGS",
            "OUT_DIR",
            "TARGET",
            "HOST",
            "PROFILE",
            "OPT_LEVEL",
            "DEBUG",
            "NUM_JOBS",
            "RUSTC_LINKER",
            "CARGO_ENCODED_RUSTFLAGS",
        ];
        if outer.contains(&k.as_str())
            || k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
        {
            cmd.env_remove(&k);
        }
    }
    cmd.current_dir(root.join("kernels-gpu"))
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"))
        .args([
            "rustc",
            "--profile",
            "ptx",
            "--lib",
            "--crate-type",
            "cdylib",
            "--target",
            "nvptx64-nvidia-cuda",
            "-Zbuild-std=core",
            "--quiet",
        ])
        .arg("--target-dir")
        .arg(&dir);
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "kiln: could not run cargo for the {} kernel build: {e}",
            t.name
        )
    });
    if !out.status.success() {
        panic!(
            "kiln: building GPU kernels for {} failed (rustc nvptx64-nvidia-cuda + kernels-gpu/link-ptx.sh):\n{}{}",
            t.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ptx = dir.join("nvptx64-nvidia-cuda/ptx/kernels_gpu.ptx");
    if !ptx.exists() {
        panic!(
            "kiln: the {} kernel build succeeded but {} is missing",
            t.name,
            ptx.display()
        );
    }
    ptx
}
