#!/bin/sh
# The link step for rustc's nvptx64-nvidia-cuda target.
#
# rustc links nvptx crates with `llvm-bitcode-linker`, which rustup does not ship for x86_64
# hosts. This script takes its place (build.rs passes it as `-C linker=`): rustc hands us LLVM
# bitcode objects and rlibs plus `--export-symbol NAME` for every kernel entry, and we
#   1. llvm-link the objects, pulling from the rlibs only what is referenced (--only-needed),
#   2. internalize everything except the kernel entries and drop what is then dead,
#   3. optimize the whole module once more at -O3,
#   4. lower it to PTX with llc for the target CPU and PTX ISA rustc was given.
# The LLVM tools come from the pinned toolchain's `llvm-tools-preview` component.
set -eu

bin=${KILN_LLVM_BIN:-$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin}
out="" cpu="" feats="" exports="" inputs=""
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift ;;
    --export-symbol) exports="$exports,$2"; shift ;;
    --target-cpu) cpu=$2; shift ;;
    --target-feature=*) feats=${1#--target-feature=} ;;
    --target | -L) shift ;;
    *.o) inputs="$inputs $1" ;;
    *.rlib)
      dir="$work/$(basename "$1")"
      mkdir -p "$dir"
      (cd "$dir" && "$bin/llvm-ar" x "$1")
      for m in "$dir"/*.o; do [ -e "$m" ] && inputs="$inputs --only-needed $m"; done
      ;;
  esac
  shift
done

[ -n "$out" ] && [ -n "$cpu" ] || { echo "link-ptx.sh: missing -o or --target-cpu" >&2; exit 2; }
# shellcheck disable=SC2086 # word splitting of the input list is intended
"$bin/llvm-link" $inputs -o "$work/linked.bc"
"$bin/opt" -passes=internalize,globaldce -internalize-public-api-list="${exports#,}" "$work/linked.bc" -o "$work/kept.bc"
"$bin/opt" -O3 "$work/kept.bc" -o "$work/opt.bc"
"$bin/llc" -O3 -mtriple=nvptx64-nvidia-cuda -mcpu="$cpu" -mattr="$feats" "$work/opt.bc" -o "$out"
