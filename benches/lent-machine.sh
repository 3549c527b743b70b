#!/usr/bin/env bash
# The checks for a machine with more cores and a real GPU but no Rust toolchain and no
# network (how docs/bench/lent-16-cores.md was measured): build here, carry the folder there,
# run there.
#
#   bash benches/lent-machine.sh build DIR      # here: the binaries and Debian's Vulkan loader
#                                             # and validation layers, into DIR (about 15 MB)
#   bash DIR/lent-machine.sh run OUT          # there, as root: every check, results into OUT
#
# `run` unpacks the Vulkan loader into / (the validation layers into /tmp), points the loader
# at NVIDIA's driver when it finds its manifest, and runs, each under its own time limit:
# the Vulkan tests (validation on), the runtime end to end at 1-16 threads (host weights, then
# --gpu), the Vulkan upload bench, and compare's mixes, curves and churn at 1-16 threads. About
# seven minutes on 16 cores. Binaries built on Debian 12 run on any x86-64 Linux with glibc
# 2.36 or newer.
set -euo pipefail

build() {
    local dir=$1
    mkdir -p "$dir"
    cargo build --release -p runcache-runtime --features vulkan
    cargo build --release -p runcache-bench --bin compare
    local tests bench
    tests=$(cargo test --release --features vulkan --test vulkan --no-run 2>&1 |
        grep -o 'target/release/deps/vulkan-[0-9a-f]*' | head -1)
    bench=$(cargo bench -p runcache-bench --features vulkan --bench vulkan --no-run 2>&1 |
        grep -o 'target/release/deps/vulkan-[0-9a-f]*' | head -1)
    cp target/release/runcache-runtime target/release/compare "$dir/"
    cp "$tests" "$dir/vulkan-tests"
    cp "$bench" "$dir/vulkan-bench"
    strip "$dir"/runcache-runtime "$dir"/compare "$dir"/vulkan-tests "$dir"/vulkan-bench
    cp "$0" "$dir/lent-machine.sh"
    # Debian's packages, unpacked there without apt (the machine may have no network).
    local apt="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/apt-amd64"
    mkdir -p /tmp/apt-amd64/partial
    # shellcheck disable=SC2086
    apt-get $apt update -qq
    # shellcheck disable=SC2086
    (cd "$dir" && apt-get $apt download -qq libvulkan1 vulkan-validationlayers \
        libglvnd0 libgl1 libglx0 libegl1 libgles2 libopengl0)
    echo "built into $dir: carry it to the other machine and run: bash $dir/lent-machine.sh run OUT"
}

run() {
    local out=$1 dir
    dir=$(cd "$(dirname "$0")" && pwd)
    mkdir -p "$out"
    for deb in "$dir"/*.deb; do
        case $deb in
            *validationlayers*) mkdir -p /tmp/vvl && dpkg -x "$deb" /tmp/vvl ;;
            *) dpkg -x "$deb" / ;;
        esac
    done
    ldconfig
    export VK_LAYER_PATH=/tmp/vvl/usr/share/vulkan/explicit_layer.d
    export LD_LIBRARY_PATH=/tmp/vvl/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    local icd
    for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
        /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
        if [ -f "$icd" ]; then
            export VK_DRIVER_FILES=$icd
            break
        fi
    done
    export RUNCACHE_REQUIRE_VULKAN=1
    set +e
    { date; nproc; nvidia-smi -L 2>&1; echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"; } | tee "$out/machine.txt"
    timeout 120 "$dir/vulkan-tests" --test-threads 2 > "$out/vulkan-tests.txt" 2>&1
    timeout 150 "$dir/runcache-runtime" --threads 1,2,4,8,16 --requests 4000 --markdown \
        > "$out/runtime.md" 2> "$out/runtime.log"
    timeout 90 "$dir/runcache-runtime" --gpu --threads 1,4,16 --requests 4000 --markdown \
        >> "$out/runtime.md" 2>> "$out/runtime.log"
    timeout 120 "$dir/vulkan-bench" --bench > "$out/vulkan-bench.txt" 2>&1
    timeout 300 "$dir/compare" --only=mixes,threads,churn --plots="$out/plots" \
        > "$out/compare.txt" 2> "$out/compare.log"
    grep -h 'test result\|took' "$out"/*.txt "$out"/*.log
}

case ${1:-} in
    build) build "${2:?build DIR}" ;;
    run) run "${2:?run OUT}" ;;
    *)
        sed -n '2,15p' "$0"
        exit 2
        ;;
esac
