#!/bin/bash
# h200_session.sh: the whole GPU check in one device call, most important first, each step
# under its own time limit, a summary table last. Run from the repository root:
#   bash tests/gpu/h200_session.sh            (logs in $OUT or /tmp/lathe-h200)
# Optional inputs carried next to the tree: .devdebs/*.deb (Debian's pcre2 and jansson
# packages, unpacked into .devlibs when the machine lacks them) and .golden/<ref>/ (the
# transformers references of ../shared/golden, plus tests/data/llama-tiny-a).
set -o pipefail
out=${OUT:-/tmp/lathe-h200}
mkdir -p "$out"
t_start=$(date +%s)
left() { echo $((${BUDGET:-540} - ($(date +%s) - t_start))); }
declare -a rows
row() { rows+=("$(printf '%-34s %s' "$1" "$2")"); }

if ls .devdebs/*.deb >/dev/null 2>&1; then
    D=$PWD/.devlibs
    mkdir -p "$D"
    for f in .devdebs/*.deb; do dpkg -x "$f" "$D"; done
    sed -i "s|^prefix=/usr|prefix=$D/usr|" "$D"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
    export PKG_CONFIG_PATH=$D/usr/lib/x86_64-linux-gnu/pkgconfig
    export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

b=build-h200
if ! { cmake -S . -B $b -DCMAKE_CUDA_ARCHITECTURES=90 -DLATHE_WERROR=ON >"$out/configure.log" 2>&1 &&
       cmake --build $b -j16 --target lathe_cli gpu_test_cuda_conformance gpu_test_cuda_scenario \
           gpu_test_train_cuda bench_matmul >"$out/build.log" 2>&1; }; then
    grep -E "error|Could not|not found" "$out/configure.log" "$out/build.log" | head -20
    exit 1
fi
grep -E "lathe: CUDA backend|PCRE2|jansson" "$out/configure.log" | head -3
row "build (sm_90, -Werror)" "ok in $(($(date +%s) - t_start)) s"

timeout 120 $b/tests/gpu_test_cuda_conformance >"$out/conformance.log" 2>&1
row "conformance (every op x layout)" "rc $? $(grep -E 'passed, .* failed' "$out/conformance.log" | tail -1)"

timeout 90 $b/tests/gpu_test_cuda_scenario >"$out/scenario.log" 2>&1
row "k_conv scenario on CUDA0" "rc $? $(grep -E 'passed, .* failed' "$out/scenario.log" | tail -1)"

for r in qwen35-tiny-a qwen2-tiny-a llama-tiny-a; do
    [ -d .golden/$r ] || continue
    # F32, as tests/py/test_check_ref.py converts: convert's default (f16 matrices) is
    # ~3e-4 off transformers' F32 logits on any backend, over check-ref's 1e-4
    $b/lathe convert .golden/$r -o /tmp/$r.gguf --outtype f32 >"$out/convert-$r.log" 2>&1 &&
        timeout 60 $b/lathe check-ref /tmp/$r.gguf .golden/$r/reference.safetensors --backend cuda \
            >"$out/checkref-$r.log" 2>&1
    row "check-ref --backend cuda $r" "rc $?"
done

timeout 60 $b/tests/gpu_test_train_cuda >"$out/train_cuda.log" 2>&1
row "train jobs on CUDA (parity, refusal)" "rc $? $(grep -E 'passed, .* failed' "$out/train_cuda.log" | tail -1)"

timeout 60 $b/bench/bench_matmul 20 >"$out/bench_matmul.log" 2>&1
row "bench_matmul (lathe vs cuBLAS)" "rc $?"
timeout 60 python3 bench/bench_matmul_torch.py >"$out/bench_torch.log" 2>&1
row "bench_matmul_torch" "rc $?"

t=$(left)
if [ "$t" -gt 60 ]; then
    LATHE_TRAIN_CUDA_SCALE=1 timeout $((t - 15)) $b/tests/gpu_test_train_cuda >"$out/train_scale.log" 2>&1
    row "0.8B / 1.5B-shaped training" "rc $? ($((t - 15)) s allowed)"
fi

echo "==== details"
grep -E "^op |^[A-Z_]+ +[0-9]" "$out/conformance.log" | head -70
grep -E "placement|fallback|loss|refusal" "$out/scenario.log" | head -8
for r in qwen35-tiny-a qwen2-tiny-a llama-tiny-a; do
    grep -E "logits|loss|greedy|worst|PASS|FAIL|ok" "$out/checkref-$r.log" 2>/dev/null | head -4
done
grep -vE "^$" "$out/bench_matmul.log" | tail -14
tail -8 "$out/bench_torch.log"
grep -E "tok|MiB|loss|refus|check failed" "$out/train_cuda.log" | head -12
grep -E "tok|MiB|loss|check failed|passed" "$out/train_scale.log" 2>/dev/null | head -24
echo "==== summary ($(($(date +%s) - t_start)) s)"
printf '%s\n' "${rows[@]}"
