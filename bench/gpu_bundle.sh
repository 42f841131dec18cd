#!/usr/bin/env bash
# Packs what `make test-gpu`'s CUDA test and bench/gpu.sh run, for a GPU host without a Rust
# toolchain: ../shared/gpu/build-bundle.sh (the binaries + the named integration tests, against
# the host's libtorch), plus the bench_gpu example, which that script does not pack.
#
# usage: bash bench/gpu_bundle.sh [TEST_NAME...]   (default: gpu)
# then on the host, from the project root with .gpu-bundle/ carried:
#   bash .gpu-bundle/run.sh target-gpu/release/deps/gpu-<hash> --test-threads=1 --nocapture
#   bash bench/gpu.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
shared=$(cd "$root/../shared/gpu" && pwd)
# CUDA graphs for the decode loop (ml/build.rs): the shim compiles against the CUDA runtime
# headers of the project venv's NVIDIA wheels plus `crt/`, which PyPI nvidia-cuda-crt ships
# (CUDA 13.0, the host's). RREDCOT_CUDA_GRAPHS=0 builds without them.
export RREDCOT_CUDA_GRAPHS=${RREDCOT_CUDA_GRAPHS:-1}
if [ "$RREDCOT_CUDA_GRAPHS" = 1 ]; then
  crt=${GPU_CACHE:-$HOME/.cache/rredcot-gpu}/cuda-crt-13.0.88
  if [ ! -f "$crt/nvidia/cu13/include/crt/host_config.h" ]; then
    mkdir -p "$crt"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux2014_x86_64 nvidia-cuda-crt==13.0.88 -d "$crt"
    unzip -q -o "$crt"/nvidia_cuda_crt-*.whl 'nvidia/*' -d "$crt"
  fi
  runtime=$(.venv/bin/python -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__))+"/nvidia/cu13/include")')
  export CUDA_INCLUDE="$runtime:$crt/nvidia/cu13/include"
fi
bash "$shared/build-bundle.sh" "${@:-gpu}"

# The same toolchain settings as build-bundle.sh, for the example.
V=${TORCH_VERSION:-2.11.0}
target=${GPU_TARGET_DIR:-$root/target-gpu}
cache=${GPU_CACHE:-$HOME/.cache/rredcot-gpu}/torch-$V
tsv=$(grep -A1 '^name = "torch-sys"' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
export LIBTORCH=$cache/torch LIBTORCH_BYPASS_VERSION_CHECK=1 LIBTORCH_CXX11_ABI=1
unset LIBTORCH_USE_PYTORCH
export CARGO_TARGET_DIR=$target RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined"
cp Cargo.lock "$cache/Cargo.lock.example"; trap 'cp "$cache/Cargo.lock.example" "$root/Cargo.lock"' EXIT
cargo build --release --config "patch.crates-io.torch-sys.path=\"$cache/torch-sys-$tsv\"" \
  -p rredcot-ml --example bench_gpu
example=${target#$root/}/release/examples/bench_gpu
strip "$example"
files=$(tar tJf .gpu-bundle/bin.tar.xz)
# shellcheck disable=SC2086 # the packed paths have no spaces
tar cJf .gpu-bundle/bin.tar.xz $files "$example"
# The Qwen3 tokenizer of the Table 2 step (bench/table2_step.sh), compressed.
mkdir -p .gpu-bundle/qwen3-tokenizer
for f in tokenizer.json tokenizer_config.json; do
  xz -9 -c ".venv/share/qwen3-tokenizer/$f" > ".gpu-bundle/qwen3-tokenizer/$f.xz"
done
# Test binaries name the worker and the repository by this path (CARGO_BIN_EXE_*, CARGO_MANIFEST_DIR).
echo "$root" > .gpu-bundle/root
echo "bundle with bench_gpu: $(du -sh .gpu-bundle | cut -f1)"
