#!/bin/bash
# prefill_prof.sh: the 0.8B models (h200_session.sh q08), lathe bench on both, then pp512 of
# the BF16 file under LATHE_CUDA_PROFILE=2 (graphs off): device time by op and by node kind.
# Run from the repository root on the device machine (logs in $OUT).
out=${OUT:-/tmp/lathe-h200}
BUDGET=${BUDGET:-300} bash tests/gpu/h200_session.sh q08 dbench 2>&1 | tail -8
L=build-h200/lathe W=/tmp/h200w
LATHE_CUDA_GRAPHS=0 LATHE_CUDA_PROFILE=2 timeout 60 $L bench -m $W/q08-bf16.gguf -p 512 -n 0 -r 3 \
    --backend cuda >"$out/pp_prof.txt" 2>&1
grep -E 'profile:' "$out/pp_prof.txt"
grep -E '^[A-Z_]+ +[0-9]' "$out/pp_prof.txt" | sort -k3 -n -r | head -16
sed -n '/by node kind/,$p' "$out/pp_prof.txt" | head -40 | cut -c1-180
