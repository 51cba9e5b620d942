#!/bin/bash
# run_h200.sh: everything one call on a GPU machine does, in the repository root: build
# lathe and its CUDA targets for sm_90 (warnings as errors), run the gpu-labelled tests,
# run each conformance group on its own when the whole test fails (a crashed CUDA context
# fails everything after it), then the matmul benchmarks against cuBLAS and torch.
# Logs go to $OUT (the device tool's folder) or /tmp/lathe-h200. Prints a short summary.
# Other gpu tests (tests/gpu/test_*.c) are built too, each on its own so that one that does
# not build stops nothing else, and run by ctest with a 150 s limit each.
# Usage: tests/gpu/run_h200.sh [--no-bench] [--no-torch]
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
for t in tests/gpu/test_*.c; do
    name=gpu_$(basename "$t" .c)
    [ "$name" = gpu_test_cuda_conformance ] && continue
    cmake --build build-h200 -j16 --target "$name" >>"$out/build.log" 2>&1 ||
        echo "$name does not build: $(grep -m1 -E 'error' "$out/build.log")"
done
echo "built in $(($(date +%s) - t0)) s"

t1=$(date +%s)
./build-h200/tests/gpu_test_cuda_conformance >"$out/conformance.log" 2>&1
crc=$?
echo "conformance: rc $crc in $(($(date +%s) - t1)) s"
sed -n '/^op  /,/^$/p' "$out/conformance.log" | cut -c1-110
grep -E "^  no: |check failed|first mismatch|failed:|computing|placing|allocating" \
    "$out/conformance.log" | head -40
grep -E "free of|refused as expected|fallback|LATHE_CUDA_DISABLE|passed, .* failed" \
    "$out/conformance.log"

t1=$(date +%s)
ctest --test-dir build-h200 -L gpu --timeout 150 --output-on-failure >"$out/ctest.log" 2>&1
rc=$?
echo "ctest -L gpu: rc $rc in $(($(date +%s) - t1)) s"
grep -E "Test +#|tests passed|tests failed" "$out/ctest.log"
grep -E "check failed|passed, .* failed|Timeout|Exception" "$out/ctest.log" | head -30

if [ $crc -ne 0 ]; then
    for g in errors copies matmul elementwise nn recurrent disabled; do
        timeout 120 ./build-h200/tests/gpu_test_cuda_conformance $g >/tmp/group.log 2>&1
        echo "group $g: rc $? $(grep -E 'passed, .* failed' /tmp/group.log)"
        { echo "==== group $g"; cat /tmp/group.log; } >>"$out/groups.log"
    done
    if command -v compute-sanitizer >/dev/null; then
        timeout 120 compute-sanitizer --tool memcheck --print-limit 5 \
            ./build-h200/tests/gpu_test_cuda_conformance copies matmul elementwise nn recurrent \
            >"$out/memcheck.log" 2>&1
        grep -E "ERROR SUMMARY|Invalid|at 0x|by thread" "$out/memcheck.log" | head -12
    fi
fi

case " $* " in *" --no-bench "*) ;; *)
    ./build-h200/bench/bench_matmul 20 2>&1 | tee "$out/bench_matmul.txt"
    case " $* " in *" --no-torch "*) ;; *)
        PYTHONUNBUFFERED=1 timeout 120 python3 bench/bench_matmul_torch.py 20 2>&1 |
            tee "$out/bench_matmul_torch.txt"
    esac
esac
exit $rc
