#!/bin/bash
# run_h200.sh: everything one call on a GPU machine does, in the repository root: build
# lathe and its CUDA targets for sm_90 (warnings as errors), run the gpu-labelled tests,
# run each conformance group on its own when the whole test fails (a crashed CUDA context
# fails everything after it), then the matmul benchmarks against cuBLAS and torch.
# Logs go to $OUT (the device tool's folder) or /tmp/lathe-h200. Prints a short summary.
# Usage: tests/gpu/run_h200.sh [--no-bench]
set -o pipefail
out=${OUT:-/tmp/lathe-h200}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$(date +%s)
# Warnings are errors; if a file fails only that way on this machine's compiler (another
# system's headers), it is named and the build is retried without -Werror.
build() {
    cmake -S . -B build-h200 -DCMAKE_CUDA_ARCHITECTURES=90 -DLATHE_WERROR=$1 \
        >"$out/configure.log" 2>&1 &&
        cmake --build build-h200 -j16 --target gpu_test_cuda_conformance bench_matmul \
            >"$out/build.log" 2>&1
}
if ! build ON; then
    echo "build with -Werror failed:"
    grep -E "error" "$out/build.log" | grep -v "Error [0-9]" | head -8
    if ! build OFF; then
        grep -E -B2 -A3 "error" "$out/build.log" | head -60
        exit 1
    fi
    echo "built without -Werror"
fi
echo "built in $(($(date +%s) - t0)) s"

t1=$(date +%s)
ctest --test-dir build-h200 -L gpu --output-on-failure >"$out/ctest.log" 2>&1
rc=$?
echo "ctest -L gpu: rc $rc in $(($(date +%s) - t1)) s"
grep -E "tests passed|tests failed|Passed|Failed|\*\*\*" "$out/ctest.log" | head -10
# the table, the refusals and the first failed checks
sed -n '/^op  /,/^$/p' "$out/ctest.log"
grep -E "^  no: " "$out/ctest.log" | head -20
grep -E "check failed|first mismatch|failed:|computing|placing|allocating" "$out/ctest.log" \
    | head -40
grep -E "passed, .* failed" "$out/ctest.log"

if [ $rc -ne 0 ]; then
    for g in errors copies matmul elementwise nn recurrent disabled; do
        timeout 120 ./build-h200/tests/gpu_test_cuda_conformance $g >/tmp/group.log 2>&1
        echo "group $g: rc $? $(grep -E 'passed, .* failed' /tmp/group.log)"
        { echo "==== group $g"; cat /tmp/group.log; } >>"$out/groups.log"
    done
    if command -v compute-sanitizer >/dev/null; then
        timeout 120 compute-sanitizer --tool memcheck --print-limit 5 \
            ./build-h200/tests/gpu_test_cuda_conformance copies elementwise nn recurrent \
            >"$out/memcheck.log" 2>&1
        grep -E "ERROR SUMMARY|Invalid|at 0x|by thread" "$out/memcheck.log" | head -12
    fi
fi

if [ "$1" != "--no-bench" ]; then
    ./build-h200/bench/bench_matmul 20 2>&1 | tee "$out/bench_matmul.txt"
    PYTHONUNBUFFERED=1 timeout 120 python3 bench/bench_matmul_torch.py 20 2>&1 \
        | tee "$out/bench_matmul_torch.txt"
fi
exit $rc
