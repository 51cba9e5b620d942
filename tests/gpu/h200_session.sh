#!/bin/bash
# h200_session.sh: the GPU checks, in phases, each step under its own time limit, a summary
# table last. Run from the repository root on the device machine:
#   BUDGET=560 bash tests/gpu/h200_session.sh PHASE...      (logs in $OUT or /tmp/lathe-h200)
# Phases (in the order given):
#   core    conformance suite, the k_conv scenario, check-ref --backend cuda on the three
#           tiny references, GPU training parity and refusal, `lathe train` refused by
#           LATHE_CUDA_DISABLE_OPS=SQR + --device-only (and --dry-run), the matmul benchmarks
#   bench   the matmul benchmarks alone
#   gradcheck  the finite-difference gradient checks on {CUDA0, CPU}
#   sanitize  the conformance suite under compute-sanitizer memcheck
#   q08     a random Qwen3.5-0.8B-shaped checkpoint (transformers, the real config in
#           tests/gpu/configs, Qwen3.5's tokenizer): convert, check-ref --backend cuda, then
#           `lathe run --backend cuda` prompt and generation tokens/s (BF16 and Q8_0)
#   q15     a random Qwen2.5-1.5B-shaped checkpoint (transformers, Qwen2.5's tokenizer):
#           `lathe convert` to BF16 and Q8_0, then the `lathe train` jobs of traincli on it
#           (LoRA, top_layers 4, on both; full on BF16) with nvidia-smi's peak GPU memory
#   graphs  the CUDA-graph test, then (after q08) decode with LATHE_CUDA_GRAPHS=0 and =1
#   decode  the conformance groups decode's kernels are in, check-ref of the tiny Qwen3.5 on
#           CUDA, then graphs, the CUDA training jobs, then `lathe bench` pp512 /
#           tg128 on both 0.8B files with CUDA graphs on (the default) and off, and the
#           decode profile (nodes a token)
#   servebench  (after q08) bench/bench_serve.py: 1, 4, 16 and 64 streams of 128 tokens at
#           once through `lathe serve --parallel N` on the BF16 file (aggregate tokens/s,
#           p50 / p95 time per token)
#   serveprof  (after q08) bench/bench_serve.py under LATHE_CUDA_PROFILE=2 (graphs off,
#           every node timed) with --streams ${STREAMS:-1,16}, each server's log kept
#           (serve_N.log): per N the profile's summary line, its costliest ops and node kinds
#           (decode, prefill and warm-up together; a kind names its shapes, so N's products
#           stand apart)
#   pfprof  (after q08) pp512 of the files of PF_TYPES (default bf16) under LATHE_CUDA_PROFILE=
#           ${PF_PROF:-2} for each LATHE_DN_FWD in PF_MODES (default "default wy"): device
#           time, costliest ops and node kinds
#   ppenv   (after q08) pp512, pp2048 and a greedy text under each VAR=VALUE of PPENV (default
#           LATHE_FLASH_ATTN=0 and =1), the texts compared
#   ppfwd   pp512 and pp2048 with LATHE_DN_FWD in PPFWD_MODES (default "token default wy")
#   pfsrc   (after q08) Nsight Compute's full set and stall samples by SASS line on one launch
#           of a 512-token prefill's per-token DELTA_NET kernel (PF_RE, PF_SKIP)
#   kprof   (after q08) Nsight Compute's duration of every kernel of a few BF16 decode tokens
#           (launched one by one, graphs off), summed by kernel: the device's share of a token
#   profile  (after q08) `lathe run` prefill and decode with LATHE_CUDA_PROFILE=1
#   pacing  (after q08) tests/gpu/pacing_h200.py: 16 streaming clients alone, a LoRA job
#           alone, then both with the job's max_slowdown_ppm 100000 (p50 / p95, tokens/s)
#   serve   (after q08) tests/gpu/serve_h200.py: serving alone and beside /train, refusal
#   scale   LoRA / full fine-tuning jobs on 0.8B- and 1.5B-shaped models (test_train_cuda)
#   scale35  the same, the 0.8B-shaped model alone
#   dnback  the chunked DeltaNet backward's conformance cases, check-ref of the tiny Qwen3.5
#           golden on CUDA, then trainspeed
#   trainspeed  the conformance group with the optimizer steps (recurrent), the CUDA training
#           jobs (parity, the BF16-product full fine-tune, refusal), bench/bench_train.sh
#           (lathe vs HF eager + peft, SHAPES, default "16x512 1x512") and a full fine-tune
#           at 16x512 under LATHE_CUDA_PROFILE
#   tmodel  bench_train lathe alone, full at 16x512: the model and text dnkern / dnsrc need
#   tckpt   bench_train lathe alone at 16x512, full and LoRA, with `--checkpoint` off,
#           selective and on (TCKPT_MODES): tokens/s, the GPU peak and the estimate of each
#   tprof   (see its function) bench_train lathe alone, then both jobs at 16x512 under
#           LATHE_CUDA_PROFILE=${PROF_MODE:-2} (3: issue times without the queue's waits)
#   pbase   (after q08) inference before and after on one machine: `lathe bench` pp512 / tg128
#           and the greedy text of a 504-token prompt on both 0.8B files, with this tree's
#           lathe and with .base's (built here; carry ".base"), the texts compared
#   tbase   bench_train (PEER=none) with this tree's lathe and with .base's (built here): a
#           before / after of training tokens/s on one machine (carry ".base", as dnbase)
#   tmem    bench_train (PEER=none) with --checkpoint on, then off: tokens/s, GPU peak, estimate
#   tbudget bench_train full under a 24 GiB budget, LoRA under 8 GiB, checkpointing auto
#   tpack   chat examples of mixed lengths (about 30 to 500 tokens) on the 0.8B shape, LoRA and
#           full: padding-free packing (the default) against --no-pack, tokens/s
#   dcheck  decode's fused kernels checked without a model (see its function)
#   dfuse   (after q08) decode's fused nodes in one short call (see its function)
#   denv    (after q08) a decode switch DVAR (default LATHE_CUDA_GDN_HEAD; DVALS "0 1") checked (model
#           decode both ways, conformance DENV_GROUPS) and measured against 0: lathe bench on
#           both 0.8B files, alternating; greedy text both ways, compared
#   dab     (after q08) decode settings against each other (DAB_SETS: sets of VAR=VALUE
#           separated by ";", an empty one the defaults): lathe bench (DAB_TYPES), greedy text
#   pdl     denv of LATHE_CUDA_PDL (the default since b464635); with PDL_TRAIN=1 also the
#           CUDA training jobs with it on and bench_train 16x512 (lathe alone) off, then on
#   dbench  (after q08) lathe bench on both 0.8B files (graphs on), the decode profile's
#           GDN_DECODE and ARGMAX
#   mmv     the matmul conformance group, bench_matmul's decode products with the half
#           kernel's cut auto and fixed (one row a team; 1, 2, 4 warps a team), Q8_0 with
#           LATHE_CUDA_MMVQ=0
#   confg   the conformance groups in CONF_GROUPS (default recurrent nn)
#   tcuda   the CUDA training jobs alone (gpu_test_train_cuda: parity, BF16 products, refusal)
#   dnbench  bench/bench_delta_net: DELTA_NET and DELTA_NET_BACK alone at 16x512 and 4x2048
#           (chunked TF32 / F32 products, the per-token scan), ms a node
#   dnbase  bench_delta_net built from another commit's source on the same machine, for a
#           before / after in one call (machines differ from call to call): make
#           .base/src.tgz here with `mkdir -p .base && git archive -o .base/src.tgz REV &&
#           echo REV >.base/rev` and carry ".base"; a base older than the bench gets
#           today's bench/bench_delta_net.c (it reads only the public API)
#   mdecode  the model decode checks on CUDA0 (gpu_test_model_decode_cuda; again with
#           LATHE_CUDA_GDN_UNFUSED=1), then the recurrent conformance group (GDN_DECODE among
#           them)
#   tgraph  the training step replayed as a CUDA graph (LATHE_CUDA_GRAPHS=all) against the
#           default (node by node), 16x512 full and LoRA, lathe alone
#   tflash  FLASH_ATTN in the training graph (the default on a device) against the chain of
#           products and SOFT_MAX (the default; LATHE_FLASH_ATTN=1 turns flash on), 16x512
#           and 4x2048, full and LoRA
#   tdn     the DeltaNet kernels on BF16 tensor cores (the default in a device's training
#           job) against TF32 (LATHE_DN_BF16=0): bench_train lathe alone at TDN_SHAPES
#           (default "16x512 4x2048"), full and LoRA, alternating, then the full fine-tune's
#           loss curve at 16x512 both ways (its own bench runs write the text)
#   tsets   bench_train lathe alone at 16x512 under each set of TSETS ("JOBS:VAR=VALUE ...",
#           ";"-separated), in order
#   tenv    a training switch TVAR (default LATHE_HALF_FFN) on against off: bench_train lathe
#           alone at 16x512 (TJOBS, default "full lora"), alternating; full loss curves both ways
#   tjoin   LoRA's joined products (the default) against LATHE_LORA_JOIN=0: bench_train lathe
#           alone at 16x512, LoRA, alternating (TJOIN_ROUNDS, default "1 0 1 0"; empty: none);
#           loss curves both ways; the LoRA step's profile
#   tprep   the DeltaNet prep on BF16 tensor cores against its TF32 twin (LATHE_DN_PREP_BF16=0)
#           beside the BF16 walks: bench_train lathe alone at 16x512, alternating, loss curves
#   prec    (after tprof) the full fine-tune's loss curve and tokens/s at the device's
#           default precision against --f32-products
#   smolA   keeps the first half of SmolLM2's GGUF (.smolA) in /root for the next call
#   smol    joins it with .smolB; `lathe run --chat --backend cuda` on the capital of France;
#           a LoRA teaching the Zorblax fact through `lathe train --backend cuda`
# BUILD_TARGETS replaces the list of targets built (e.g. for dcheck alone:
# "gpu_test_cuda_conformance gpu_test_model_decode_cuda").
# Inputs carried next to the tree (tests/gpu/h200_prepare.sh makes them): .devdebs, .golden,
# .smolA / .smolB.
set -o pipefail
out=${OUT:-/tmp/lathe-h200}
mkdir -p "$out"
t_start=$(date +%s)
left() { echo $((${BUDGET:-560} - ($(date +%s) - t_start))); }
declare -a rows
row() { rows+=("$(printf '%-40s %s' "$1" "$2")"); echo "[$(($(date +%s) - t_start)) s] $1: $2"; }
b=build-h200
L=$b/lathe
W=/tmp/h200w
mkdir -p $W

if ls .devdebs/*.deb >/dev/null 2>&1; then
    D=$PWD/.devlibs
    mkdir -p "$D"
    for f in .devdebs/*.deb; do dpkg -x "$f" "$D"; done
    if ! ldconfig -p | grep -q 'libgnutls.so.30 '; then
        for f in .devdebs/gnutls/*.deb; do dpkg -x "$f" "$D"; done
    fi
    sed -i "s|^prefix=/usr|prefix=$D/usr|" "$D"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
    sed -i '/^Requires.private/d' "$D"/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc
    export PKG_CONFIG_PATH=$D/usr/lib/x86_64-linux-gnu/pkgconfig
    export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if ! { cmake -S . -B $b -DCMAKE_CUDA_ARCHITECTURES=90 -DLATHE_WERROR=ON ${CMAKE_EXTRA:-} >"$out/configure.log" 2>&1 &&
       cmake --build $b -j16 --target ${BUILD_TARGETS:-lathe_cli gpu_test_cuda_conformance gpu_test_cuda_scenario \
           gpu_test_train_cuda gpu_test_cuda_gradcheck gpu_test_cuda_graphs gpu_test_model_decode_cuda bench_matmul bench_delta_net} >"$out/build.log" 2>&1; }; then
    grep -E "error|Could not|not found" "$out/configure.log" "$out/build.log" | head -20
    exit 1
fi
grep -E "lathe: |PCRE2|jansson|microhttpd" "$out/configure.log" | head -5
row "build (sm_90, -Werror)" "ok in $(($(date +%s) - t_start)) s"

passed() { grep -E 'passed, .* failed' "$1" | tail -1; }

phase_bench() {
    timeout 150 $b/bench/bench_matmul ${MM_REPS:-100} >"$out/bench_matmul.log" 2>&1
    row "bench_matmul (lathe vs cuBLAS)" "rc $?"
    timeout 90 python3 bench/bench_matmul_torch.py ${MM_REPS:-100} >"$out/bench_torch.log" 2>&1
    row "bench_matmul_torch" "rc $?"
    sed -n '1,/^$/p;/^|/p' "$out/bench_matmul.log" | head -${MM_LINES:-40}
    tail -20 "$out/bench_torch.log"
}

phase_traincli() {
    local m=$W/q08-bf16.gguf
    [ -f $m ] || phase_q08
    yes "The lathe turns the wood while the chisel shapes it." | head -200 >$W/text.txt
    # --f32-products: the F32 path's L2-norm backward is the k_conv scenario's chain (SQR of
    # k_conv's copy); a BF16 step's is one L2_NORM_BACK node
    LATHE_CUDA_DISABLE_OPS=SQR timeout 60 $L train -m $m --text $W/text.txt --f32-products \
        --out $W/refused.gguf --backend cuda --device-only --window 64 >"$out/train_refused.log" 2>&1
    rc=$?
    row "lathe train, SQR disabled, --device-only" "rc $rc, output $([ -e $W/refused.gguf ] && echo written || echo none)"
    LATHE_CUDA_DISABLE_OPS=SQR timeout 60 $L train -m $m --text $W/text.txt --f32-products \
        --out $W/refused.gguf --backend cuda --device-only --window 64 --dry-run >"$out/train_dry.log" 2>&1
    row "  the same with --dry-run" "rc $?"
    timeout 120 $L train -m $m --text $W/text.txt --out $W/trained.gguf \
        --backend cuda --device-only --window 256 --epochs 2 >"$out/train_ok.log" 2>&1
    row "  the same with every op allowed" "rc $?, output $([ -e $W/trained.gguf ] && echo written || echo none)"
    tail -n 3 "$out/train_refused.log" "$out/train_dry.log"
    tail -c 600 "$out/train_ok.log"; echo
    # the jobs of issue 7 through the CLI on the converted checkpoints (BF16 and Q8_0 bases)
    train_jobs q08 1e-5
}

# gpu_peak FILE CMD...: runs CMD with nvidia-smi sampling the GPU's used memory every 100 ms
# into FILE; CMD's status is returned, the highest sample (MiB, the whole device, so the
# process's CUDA context and weights included) is in $peak
gpu_peak() {
    local f=$1
    shift
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$f" 2>/dev/null &
    local smi=$!
    "$@"
    local rc=$?
    kill $smi 2>/dev/null
    wait $smi 2>/dev/null
    peak=$(sort -n "$f" | tail -1)
    return $rc
}

# train_jobs NAME LR_FULL: `lathe train` LoRA (all targets, then --top-layers 4) on the
# converted BF16 and Q8_0 models $W/NAME-bf16.gguf / $W/NAME-q8_0.gguf, and a full
# fine-tune of the BF16 one, 2 epochs of $W/text.txt each, all --device-only
train_jobs() {
    local name=$1 lr_full=$2 k=0
    [ -f $W/text.txt ] ||
        yes "The lathe turns the wood while the chisel shapes it." | head -200 >$W/text.txt
    row "GPU memory in use before the $name jobs" "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits) MiB"
    for args in "-m $W/$name-bf16.gguf" "-m $W/$name-bf16.gguf --top-layers 4" \
        "-m $W/$name-q8_0.gguf" "-m $W/$name-q8_0.gguf --top-layers 4" \
        "-m $W/$name-bf16.gguf --full --lr $lr_full"; do
        k=$((k + 1))
        local log="$out/train_${name}_job$k.log"
        rm -f $W/job.gguf
        gpu_peak $W/mem.txt timeout 240 $L train $args --text $W/text.txt --out $W/job.gguf \
            --backend cuda --device-only --window 256 --epochs 2 >"$log" 2>&1
        row "lathe train ${args#-m $W/}" "rc $? $(grep -E '^epoch [0-9]+:' "$log" | tr '\n' ' ')$(grep -oE 'trained .*tokens/s\)|memory estimate [0-9.]+ MiB' "$log" | tr '\n' ' ')GPU peak ${peak} MiB, output $([ -s $W/job.gguf ] && echo written || echo none)"
        rm -f $W/job.gguf
    done
}

phase_core() {
    timeout 150 $b/tests/gpu_test_cuda_conformance >"$out/conformance.log" 2>&1
    row "conformance (every op x layout)" "rc $? $(passed "$out/conformance.log")"
    timeout 90 $b/tests/gpu_test_cuda_scenario >"$out/scenario.log" 2>&1
    row "k_conv scenario on CUDA0" "rc $? $(passed "$out/scenario.log")"
    timeout 120 $b/tests/gpu_test_cuda_graphs >"$out/graphs.log" 2>&1
    row "CUDA graphs (cache paths, vs eager, vs CPU)" "rc $? $(passed "$out/graphs.log")"
    for r in qwen35-tiny-a qwen2-tiny-a llama-tiny-a; do
        [ -d .golden/$r ] || continue
        # F32, as tests/py/test_check_ref.py converts: convert's default (f16 matrices) is
        # ~3e-4 off transformers' F32 logits on any backend, over check-ref's 1e-4
        $L convert .golden/$r -o $W/$r.gguf --outtype f32 >"$out/convert-$r.log" 2>&1 &&
            timeout 60 $L check-ref $W/$r.gguf .golden/$r/reference.safetensors --backend cuda \
                >"$out/checkref-$r.log" 2>&1
        row "check-ref --backend cuda $r" "rc $?"
    done
    timeout 90 $b/tests/gpu_test_train_cuda >"$out/train_cuda.log" 2>&1
    row "train jobs on CUDA (parity, refusal)" "rc $? $(passed "$out/train_cuda.log")"
    echo "==== core details"
    grep -E "^op |^[A-Z_]+ +[0-9]" "$out/conformance.log" | head -70
    grep -E "check failed|first mismatch" "$out/conformance.log" | head -10
    grep -E "placement|fallback|loss|refus|check failed" "$out/scenario.log" | head -10
    for r in qwen35-tiny-a qwen2-tiny-a llama-tiny-a; do
        grep -E "logits|loss|greedy|worst|PASS|FAIL|summary" "$out/checkref-$r.log" 2>/dev/null | head -5
    done
    grep -E "tok|MiB|loss|refus|check failed" "$out/train_cuda.log" | head -12
    phase_bench
}

phase_gradcheck() {
    timeout 300 $b/tests/gpu_test_cuda_gradcheck >"$out/gradcheck.log" 2>&1
    row "finite differences on CUDA0" "rc $? $(passed "$out/gradcheck.log")"
    grep -E "check failed" "$out/gradcheck.log" | head -10
    tail -n 32 "$out/gradcheck.log" | cut -c1-150
}

phase_sanitize() {
    local t=$(($(left) - 10))
    [ $t -gt 60 ] || { row "compute-sanitizer memcheck" "skipped: no time"; return; }
    timeout $t compute-sanitizer --tool memcheck --leak-check full $b/tests/gpu_test_cuda_conformance \
        >"$out/memcheck.log" 2>&1
    row "compute-sanitizer memcheck (conformance)" "rc $? $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1) $(passed "$out/memcheck.log")"
    grep -E "=========" "$out/memcheck.log" | head -12
}

Q=$W/qwen35-0.8b
phase_q08() {
    export PYTHONUNBUFFERED=1
    if [ -f $W/q08-bf16.gguf ] && [ -f $W/q08-q8_0.gguf ]; then
        row "0.8B models" "kept from the last call on this machine"
        return
    fi
    local t0=$(date +%s)
    timeout 240 python3 .golden/hf_reference.py make tests/gpu/configs/qwen35-0.8b.json $Q \
        --batch 1 --seqlen 16 >"$out/q08_make.log" 2>&1
    row "0.8B: random checkpoint (transformers)" "rc $? in $(($(date +%s) - t0)) s"
    cp .golden/qwen35-tok/tokenizer_config.json $Q/
    xz -dc .golden/qwen35-tok/tokenizer.json.xz >$Q/tokenizer.json
    $L convert $Q -o $W/q08-f32.gguf --outtype f32 >"$out/q08_convert.log" 2>&1 &&
        timeout 120 $L check-ref $W/q08-f32.gguf $Q/reference.safetensors --backend cuda \
            >"$out/checkref-q08.log" 2>&1
    row "0.8B: check-ref --backend cuda (f32)" "rc $?"
    local fm
    for fm in ${Q08_FWD_MODES:-}; do # the same with LATHE_DN_FWD=$fm
        LATHE_DN_FWD=$fm timeout 120 $L check-ref $W/q08-f32.gguf $Q/reference.safetensors \
            --backend cuda >"$out/checkref-q08-$fm.log" 2>&1
        row "0.8B: check-ref --backend cuda (f32), LATHE_DN_FWD=$fm" "rc $? $(grep -ciE 'pass' "$out/checkref-q08-$fm.log") pass lines"
    done
    $L convert $Q -o $W/q08-bf16.gguf --outtype bf16 >>"$out/q08_convert.log" 2>&1
    $L convert $Q -o $W/q08-q8_0.gguf --outtype q8_0 >>"$out/q08_convert.log" 2>&1
    rm -f $W/q08-f32.gguf
    [ -z "${Q08_LEAN:-}" ] || return 0 # Q08_LEAN=1: the files and check-ref alone
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    for ty in bf16 q8_0; do
        timeout 90 $L run -m $W/q08-$ty.gguf -p "$prompt" -n 256 --ignore-eos --temp 0 --timings \
            --backend cuda >"$out/q08_run_$ty.log" 2>&1
        row "0.8B $ty: lathe run --backend cuda" "rc $? $(grep -iE 'prompt|gener|tokens/s' "$out/q08_run_$ty.log" | tr '\n' ' ' | cut -c1-150)"
    done
    timeout 60 $L run -m $W/q08-bf16.gguf --chat -p "Hello, who are you?" -n 32 --temp 0.7 \
        --seed 1 --backend cuda --timings >"$out/q08_chat.log" 2>&1
    row "0.8B bf16: lathe run --chat --backend cuda" "rc $?"
    echo "==== q08 details"
    tail -3 "$out/q08_make.log"
    grep -E "logits|loss|greedy|worst|grad|PASS|FAIL|summary|nodes" "$out/checkref-q08.log" | head -12
    tail -n 4 "$out/q08_run_bf16.log" "$out/q08_run_q8_0.log" "$out/q08_chat.log"
}

Q15=$W/qwen25-1.5b
phase_q15() {
    export PYTHONUNBUFFERED=1
    if ! [ -f $W/q15-bf16.gguf ] || ! [ -f $W/q15-q8_0.gguf ]; then
        local t0=$(date +%s)
        timeout 300 python3 .golden/hf_reference.py make tests/gpu/configs/qwen25-1.5b.json $Q15 \
            --batch 1 --seqlen 16 >"$out/q15_make.log" 2>&1
        row "1.5B: random checkpoint (transformers)" "rc $? in $(($(date +%s) - t0)) s"
        rm -f $Q15/reference.safetensors
        cp .golden/qwen2-tok/tokenizer_config.json $Q15/
        xz -dc .golden/qwen2-tok/tokenizer.json.xz >$Q15/tokenizer.json
        t0=$(date +%s)
        $L convert $Q15 -o $W/q15-bf16.gguf --outtype bf16 >"$out/q15_convert.log" 2>&1 &&
            $L convert $Q15 -o $W/q15-q8_0.gguf --outtype q8_0 >>"$out/q15_convert.log" 2>&1
        row "1.5B: lathe convert --outtype bf16, q8_0" "rc $? in $(($(date +%s) - t0)) s, $(du -m $W/q15-bf16.gguf $W/q15-q8_0.gguf | cut -f1 | tr '\n' ' ')MiB"
        rm -rf $Q15
        tail -3 "$out/q15_make.log" "$out/q15_convert.log"
    fi
    timeout 60 $L run -m $W/q15-bf16.gguf --chat -p "Hello, who are you?" -n 16 --temp 0 \
        --backend cuda --timings >"$out/q15_chat.log" 2>&1
    row "1.5B bf16: lathe run --chat --backend cuda" "rc $? $(grep -iE 'tokens/s' "$out/q15_chat.log" | tr '\n' ' ' | cut -c1-120)"
    train_jobs q15 1e-5
    echo "==== q15 details"
    for f in "$out"/train_q15_job*.log; do echo "== $f"; tail -n 4 "$f" | cut -c1-200; done
}

# CUDA graphs: the cache test, then decode with graphs off and on (same text, tokens/s)
phase_graphs() {
    timeout 120 $b/tests/gpu_test_cuda_graphs >"$out/graphs.log" 2>&1
    row "CUDA graphs (cache paths, vs eager, vs CPU)" "rc $? $(passed "$out/graphs.log") $(grep -E '^graphs:' "$out/graphs.log")"
    grep -E "check failed" "$out/graphs.log" | head -10
    [ -f $W/q08-bf16.gguf ] || phase_q08
    for ty in bf16 q8_0; do
        for gr in 0 1; do
            LATHE_CUDA_GRAPHS_STATS=1 LATHE_CUDA_GRAPHS=$gr timeout 90 $L run -m $W/q08-$ty.gguf -p "Hello" -n 256 --ignore-eos \
                --temp 0 --timings --backend cuda >"$out/graphs_run_${ty}_$gr.txt" 2>"$out/graphs_run_${ty}_$gr.log"
            row "0.8B $ty decode, LATHE_CUDA_GRAPHS=$gr" "rc $? $(grep -oE 'generation [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tokens/s\)' "$out/graphs_run_${ty}_$gr.log") $(grep -E 'graphs:' "$out/graphs_run_${ty}_$gr.log")"
        done
        cmp -s "$out/graphs_run_${ty}_0.txt" "$out/graphs_run_${ty}_1.txt"
        row "  $ty text with and without graphs" "$([ $? = 0 ] && echo same || echo DIFFERENT) ($(wc -c <"$out/graphs_run_${ty}_1.txt") bytes)"
    done
}

# check-ref of the tiny Qwen3.5 golden on CUDA; $1: what of its log to show
checkref_tiny() {
    local r=qwen35-tiny-a
    [ -d .golden/$r ] || return
    $L convert .golden/$r -o $W/$r.gguf --outtype f32 >"$out/convert-$r.log" 2>&1 &&
        timeout 60 $L check-ref $W/$r.gguf .golden/$r/reference.safetensors --backend cuda \
            >"$out/checkref-$r.log" 2>&1
    row "check-ref --backend cuda $r" "rc $?"
    grep -E "$1" "$out/checkref-$r.log" | head -5
}

phase_decode() {
    timeout 200 $b/tests/gpu_test_cuda_conformance >"$out/conf_decode.log" 2>&1
    row "conformance (all groups)" "rc $? $(passed "$out/conf_decode.log")"
    grep -E "^SET_ROWS|^RMS_NORM|^GDN_DECODE|^MUL_MAT|check failed|first mismatch" "$out/conf_decode.log" | head -24
    checkref_tiny "greedy|decode|FAIL"
    phase_graphs
    timeout 200 $b/tests/gpu_test_train_cuda >"$out/train_cuda.log" 2>&1
    row "CUDA training parity (graphs on)" "rc $? $(passed "$out/train_cuda.log")"
    grep -E "check failed" "$out/train_cuda.log" | head -5
    for ty in bf16 q8_0; do
        for gr in 1 0; do
            LATHE_CUDA_GRAPHS=$gr timeout 90 $L bench -m $W/q08-$ty.gguf -p 512 -n 128 -r 3 \
                --backend cuda >"$out/bench_${ty}_$gr.log" 2>&1
            row "lathe bench $ty, LATHE_CUDA_GRAPHS=$gr" "rc $? $(grep -E 'tg128|pp512' "$out/bench_${ty}_$gr.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
        done
    done
    LATHE_CUDA_MMVQ=0 timeout 90 $L bench -m $W/q08-q8_0.gguf -p 512 -n 128 -r 3 \
        --backend cuda >"$out/bench_q8_0_nommvq.log" 2>&1
    row "lathe bench q8_0, LATHE_CUDA_MMVQ=0" "rc $? $(grep -E 'tg128|pp512' "$out/bench_q8_0_nommvq.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
    LATHE_CUDA_PROFILE=1 timeout 60 $L run -m $W/q08-bf16.gguf -p "Hello" -n 64 --ignore-eos \
        --temp 0 --backend cuda >/dev/null 2>"$out/prof_decode_bf16.log"
    echo "== decode profile bf16 (64 tokens)"; cut -c1-120 "$out/prof_decode_bf16.log"
}

phase_servebench() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    timeout $(($(left) - 10)) python3 bench/bench_serve.py $L $W/q08-bf16.gguf \
        --streams ${STREAMS:-1,4,16,64} --tokens 128 >"$out/servebench.log" 2>&1
    row "bench_serve (0.8B bf16)" "rc $?"
    sed -n '/^### lathe serve/,$p' "$out/servebench.log"
}

phase_serveprof() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    LATHE_CUDA_PROFILE=2 timeout $(($(left) - 10)) python3 bench/bench_serve.py $L $W/q08-bf16.gguf \
        --streams ${STREAMS:-1,16} --tokens 128 --server-log "$out" >"$out/serveprof.log" 2>&1
    row "bench_serve profiled (0.8B bf16)" "rc $?"
    sed -n '/^### lathe serve/,$p' "$out/serveprof.log"
    for f in "$out"/serve_*.log; do
        [ -f "$f" ] || continue
        echo "== $(basename "$f" .log): LATHE_CUDA_PROFILE=2 (graphs off)"
        grep -E '^CUDA[0-9]+ profile:' "$f" || echo "no profile table (did the server stop cleanly?)"
        grep -E "^[A-Z_]+ +[0-9]" "$f" | sort -k3 -n -r | head -20
        sed -n '/profile by node kind/,$p' "$f" | head -22 | cut -c1-200
    done
}

phase_kprof() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    local ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    LATHE_CUDA_GRAPHS=0 timeout 300 $ncu --csv --metrics gpu__time_duration.sum \
        --launch-skip ${KPROF_SKIP:-1600} --launch-count ${KPROF_COUNT:-1600} \
        $L run -m $W/q08-bf16.gguf -p "Hello" -n 24 --ignore-eos --temp 0 --backend cuda \
        >"$out/kprof.csv" 2>"$out/kprof.log"
    row "kprof (ncu, decode kernels)" "rc $? $(grep -c gpu__time_duration "$out/kprof.csv") kernels"
    python3 - "$out/kprof.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u in ("nsecond", "ns") else v * 1000 if u in ("msecond", "ms") else v
    name = r[ki].split("(")[0].split("<")[0][:32]
    if "Grid Size" in hdr:
        name += " " + r[hdr.index("Grid Size")].replace(" ", "")
    tot[name] += us; cnt[name] += 1
T = sum(tot.values())
print(f"{len(rows)} kernels, {T:.0f} us in all, {T/len(rows) if rows else 0:.2f} us a kernel")
for n, t in sorted(tot.items(), key=lambda x: -x[1])[:30]:
    print(f"  {n:48s} {cnt[n]:6d} {t:10.1f} us {t/cnt[n]:8.2f} us/kernel")
PY
}

# dnkern: Nsight Compute's duration of the DeltaNet kernels (names matching DNK_RE) of a
# 16x512 full fine-tune's first step, DNK_SKIP launches in, DNK_COUNT of them (after tprof)
phase_dnkern() {
    local txt=$W/bench_text_16x512.txt ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    [ -f "$txt" ] && [ -f $W/q08-bf16.gguf ] || { row "dnkern" "skipped: no model or text"; return; }
    timeout $(($(left) - 5)) $ncu --csv --metrics gpu__time_duration.sum -k "regex:${DNK_RE:-dn_wy}" \
        --launch-skip ${DNK_SKIP:-0} --launch-count ${DNK_COUNT:-12} \
        $L train -m $W/q08-bf16.gguf --text "$txt" --out $W/prof-out.gguf --backend cuda \
        --device-only --window 512 --batch-tokens 8192 --full --lr 1e-5 \
        >"$out/dnkern.csv" 2>"$out/dnkern.log"
    row "dnkern (ncu, DeltaNet kernels)" "rc $? $(grep -c gpu__time_duration "$out/dnkern.csv") kernels"
    python3 - "$out/dnkern.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    hdr = rows[0]
    ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
    for r in rows[1:]:
        v = float(r[vi].replace(",", "")); u = r[ui]
        us = v / 1000 if u == "nsecond" else v if u == "usecond" else v * 1000 if u == "msecond" else v
        print(f"  {r[ki].split('(')[0][:60]:60s} {us:10.1f} us")
PY
}

# confg: the conformance groups named in CONF_GROUPS (default "recurrent nn": the delta rule,
# FLASH_ATTN and the decode kernels)
phase_tcuda() {
    timeout 150 $b/tests/gpu_test_train_cuda >"$out/train_cuda.log" 2>&1
    row "train jobs on CUDA (parity, BF16, refusal)" "rc $? $(passed "$out/train_cuda.log")"
    grep -E "check failed|first mismatch|FAIL" "$out/train_cuda.log" | head -12
}

phase_confg() {
    timeout 200 $b/tests/gpu_test_cuda_conformance ${CONF_GROUPS:-recurrent nn} >"$out/confg.log" 2>&1
    row "conformance: ${CONF_GROUPS:-recurrent nn}" "rc $? $(passed "$out/confg.log")"
    grep -E "check failed|first mismatch" "$out/confg.log" | head -12
}

phase_dnbench() {
    timeout $(($(left) - 5)) $b/bench/bench_delta_net ${DNB_REPS:-10} >"$out/dnbench.log" 2>&1
    row "bench_delta_net" "rc $?"
    cat "$out/dnbench.log"
}

# .base's source (carry ".base"), unpacked once a machine into $BASE; base_build PHASE TARGET
# builds TARGET of it into $BASE/b. Each says so in a row and fails when it cannot.
BASE=/tmp/lathe-base
base_unpack() {
    [ -f .base/src.tgz ] || { row "$1" "skipped: no .base/src.tgz (carry .base)"; return 1; }
    [ -d $BASE ] || { mkdir -p $BASE && tar xzf .base/src.tgz -C $BASE; }
}

base_build() {
    if ! { cmake -S $BASE -B $BASE/b -DCMAKE_CUDA_ARCHITECTURES=90 ${CMAKE_EXTRA:-} >"$out/$1_configure.log" 2>&1 &&
           cmake --build $BASE/b -j16 --target $2 >"$out/$1_build.log" 2>&1; }; then
        row "$1 ($(cat .base/rev 2>/dev/null))" "build failed"
        grep -E "error" "$out/$1_configure.log" "$out/$1_build.log" | head -10
        return 1
    fi
}

phase_dnbase() {
    base_unpack dnbase || return
    if [ ! -f $BASE/bench/bench_delta_net.c ]; then
        cp bench/bench_delta_net.c $BASE/bench/
        printf 'if(LATHE_HAVE_CUDA AND NOT LATHE_CUDA_EMU)\n  add_executable(bench_delta_net bench_delta_net.c)\n  target_link_libraries(bench_delta_net PRIVATE lathe)\nendif()\n' \
            >>$BASE/bench/CMakeLists.txt
    fi
    base_build dnbase bench_delta_net || return
    timeout $(($(left) - 5)) $BASE/b/bench/bench_delta_net ${DNB_REPS:-10} >"$out/dnbase.log" 2>&1
    row "bench_delta_net, base $(cat .base/rev 2>/dev/null)" "rc $?"
    cat "$out/dnbase.log"
}

# dnstall: Nsight Compute's throughput, occupancy and warp-stall sections for the kernels
# (names matching DNK_RE, default the chunk-parallel ones) of a 16x512 full fine-tune, the
# first DNK_COUNT launches after DNK_SKIP (default 54: the 18 forward nodes' 3 kernels each,
# so the first backward node's four) (after tprof)
phase_dnstall() {
    local txt=$W/bench_text_16x512.txt ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    [ -f "$txt" ] && [ -f $W/q08-bf16.gguf ] || { row "dnstall" "skipped: no model or text"; return; }
    timeout $(($(left) - 5)) $ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section LaunchStats --section MemoryWorkloadAnalysis -k "regex:${DNK_RE:-dn_wy}" \
        --launch-skip ${DNK_SKIP:-54} --launch-count ${DNK_COUNT:-4} \
        $L train -m $W/q08-bf16.gguf --text "$txt" --out $W/prof-out.gguf --backend cuda \
        --device-only --window 512 --batch-tokens 8192 --full --lr 1e-5 \
        >"$out/dnstall.txt" 2>"$out/dnstall.log"
    row "dnstall (ncu sections, DeltaNet kernels)" "rc $?"
    grep -E "dn_wy|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Shared Memory Config|Dynamic Shared|Stall|Warp Cycles Per Issued|Issue Slots|L1/TEX Hit|L2 Hit|Executed Ipc|One or More|No Eligible" "$out/dnstall.txt" | cut -c1-130 | head -120
}

# dnsrc: Nsight Compute's full set on one launch of the kernels matching DNK_RE (default the
# chunk-parallel backward's grad kernel) of a 16x512 full fine-tune, then its warp-stall
# samples summed by CUDA source line, the costliest lines with their text (build with
# CMAKE_EXTRA=-DCMAKE_CUDA_FLAGS=-lineinfo for the lines) (after tprof)
# ncu_src NAME KERNEL_RE SKIP CMD...: Nsight Compute's full set on one launch of the kernels
# matching KERNEL_RE (after SKIP of them) while CMD runs: its details' headline figures, then
# the stall samples and instructions by opcode and by SASS line (logs NAME_*.txt / .csv)
ncu_src() {
    local name=$1 re=$2 skip=$3 ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    shift 3
    rm -f $W/$name.ncu-rep
    timeout $(($(left) - 5)) $ncu --set full --import-source yes -k "regex:$re" \
        --launch-skip $skip --launch-count 1 -o $W/$name "$@" >"$out/$name.log" 2>&1
    row "$name (ncu full set, one kernel)" "rc $?"
    $ncu -i $W/$name.ncu-rep --page details >"$out/${name}_details.txt" 2>&1
    grep -E "Duration|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Stall|Bank Conflicts|Executed Instructions  |Achieved Occupancy|Registers Per" "$out/${name}_details.txt" | head -22
    $ncu -i $W/$name.ncu-rep --page source --csv --print-source sass >"$out/${name}_source.csv" 2>&1
    python3 - "$out/${name}_source.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hi = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r)), None)
if hi is None:
    print("no stall column; head:"); [print(",".join(r)[:200]) for r in rows[:8]]; sys.exit()
h = rows[hi]
si = next(i for i, c in enumerate(h) if c.startswith("Warp Stall Sampling (All"))
li = h.index("Address") if "Address" in h else 0
src = h.index("Source") if "Source" in h else 1
ii = next((i for i, c in enumerate(h) if c.startswith("Instructions Executed")), None)
data = []
for r in rows[hi + 1:]:
    try: v = float(r[si].replace(",", "") or 0)
    except (ValueError, IndexError): continue
    x = float(r[ii].replace(",", "") or 0) if ii is not None and r[ii] else 0
    data.append((v, x, r[li], r[src].strip()[:90]))
tot = sum(d[0] for d in data) or 1; totx = sum(d[1] for d in data) or 1
print(f"stall samples {tot:.0f}, instructions {totx:.0f}")
import collections
byop = collections.defaultdict(lambda: [0.0, 0.0])
for v, x, l, s in data:
    op = s.split()[0] if s else "?"
    if op.startswith("@"):
        op = s.split()[1] if len(s.split()) > 1 else op
    op = op.split(".")[0]
    byop[op][0] += v; byop[op][1] += x
print("by opcode: stall% instr%")
for op, (v, x) in sorted(byop.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"  {op:12s} {100*v/tot:5.1f}% {100*x/totx:5.1f}%")
for v, x, l, s in sorted(data, reverse=True)[:30]:
    print(f"{100*v/tot:5.1f}% {100*x/totx:5.1f}%i  {l:>6} {s}")
PY
}

phase_dnsrc() {
    local txt=$W/bench_text_16x512.txt
    [ -f "$txt" ] && [ -f $W/q08-bf16.gguf ] || { row "dnsrc" "skipped: no model or text"; return; }
    ncu_src dnsrc "${DNK_RE:-dn_wy_grad}" ${DNK_SKIP:-0} \
        $L train -m $W/q08-bf16.gguf --text "$txt" --out $W/prof-out.gguf --backend cuda \
        --device-only --window 512 --batch-tokens 8192 --full --lr 1e-5
}

# pfsrc: (after q08) the same for a one-sequence prefill's per-token DELTA_NET kernel (pp512 of
# the BF16 file; the skip passes the warm-up's 64-token prefill, 18 layers)
phase_pfsrc() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    ncu_src pfsrc "${PF_RE:-delta_net_kernel}" ${PF_SKIP:-18} \
        $L bench -m $W/q08-bf16.gguf -p 512 -n 0 -r 1 --backend cuda
}

# ppenv: (after q08) pp512 and pp2048 of the BF16 file, and the greedy text of a 504-token
# prompt, under each VAR=VALUE of PPENV (default "LATHE_FLASH_ATTN=0 LATHE_FLASH_ATTN=1"),
# the texts compared with the first's
phase_ppenv() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    local e p prompt first=""
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    for e in ${PPENV:-LATHE_FLASH_ATTN=0 LATHE_FLASH_ATTN=1}; do
        for p in 512 2048; do
            env $e timeout 60 $L bench -m $W/q08-bf16.gguf -p $p -n 0 -r 5 --backend cuda \
                >"$out/ppenv_${p}_$e.log" 2>&1
            row "pp$p, $e" "rc $? $(grep -E "pp$p" "$out/ppenv_${p}_$e.log" | awk -F'|' '{printf "%s", $7}')"
        done
        env $e timeout 60 $L run -m $W/q08-bf16.gguf -p "$prompt" -n 64 --ignore-eos --temp 0 \
            --backend cuda >"$out/ppenv_text_$e.txt" 2>/dev/null
        if [ -z "$first" ]; then
            first=$e
        else
            cmp -s "$out/ppenv_text_$first.txt" "$out/ppenv_text_$e.txt"
            row "  greedy text, $e against $first" "$([ $? = 0 ] && echo same || echo DIFFERENT)"
        fi
    done
}

# pfprof: (after q08) pp512 of the BF16 file under LATHE_CUDA_PROFILE=2 (graphs off) for each
# LATHE_DN_FWD in PF_MODES (default "default wy"): device time, the costliest ops and kinds
phase_pfprof() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    local v ty prompt
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    for ty in ${PF_TYPES:-bf16}; do
        for v in ${PF_MODES:-default wy}; do
            local tag=${ty}_$v
            LATHE_DN_FWD=$v LATHE_CUDA_GRAPHS=0 LATHE_CUDA_PROFILE=${PF_PROF:-2} timeout 60 $L bench \
                -m $W/q08-$ty.gguf -p 512 -n 0 -r 3 --backend cuda >"$out/pfprof_$tag.log" 2>&1
            row "pp512 $ty profile ${PF_PROF:-2}, LATHE_DN_FWD=$v" "rc $? $(grep -E "pp512" "$out/pfprof_$tag.log" | awk -F'|' '{printf "%s", $7}')"
            echo "== pp512 $ty profile ${PF_PROF:-2}, LATHE_DN_FWD=$v"
            grep -E 'profile:' "$out/pfprof_$tag.log" | cut -c1-200
            grep -E '^[A-Z_]+ +[0-9]' "$out/pfprof_$tag.log" | sort -k3 -n -r | head -12
            sed -n '/by node kind/,$p' "$out/pfprof_$tag.log" | head -${PF_KINDS:-24} | cut -c1-160
            [ -n "${PF_TEXT:-}" ] || continue
            timeout 60 env LATHE_DN_FWD=$v $L run -m $W/q08-$ty.gguf -p "$prompt" -n 64 --ignore-eos \
                --temp 0 --backend cuda >"$out/pfprof_text_$tag.txt" 2>/dev/null
        done
    done
}

phase_profile() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    for ty in bf16 q8_0; do
        timeout 60 $L run -m $W/q08-$ty.gguf -p "$prompt" -n 1 --ignore-eos --temp 0 --timings \
            --backend cuda >/dev/null 2>"$out/prof_prefill_$ty.log"
        LATHE_CUDA_PROFILE=1 timeout 60 $L run -m $W/q08-$ty.gguf -p "$prompt" -n 1 --ignore-eos \
            --temp 0 --backend cuda >/dev/null 2>>"$out/prof_prefill_$ty.log"
        timeout 60 $L run -m $W/q08-$ty.gguf -p "Hello" -n 128 --ignore-eos --temp 0 --timings \
            --backend cuda >/dev/null 2>"$out/prof_decode_$ty.log"
        LATHE_CUDA_PROFILE=1 timeout 60 $L run -m $W/q08-$ty.gguf -p "Hello" -n 128 --ignore-eos \
            --temp 0 --backend cuda >/dev/null 2>>"$out/prof_decode_$ty.log"
        row "profile 0.8B $ty" "done"
        echo "== prefill $ty"; cat "$out/prof_prefill_$ty.log" | cut -c1-120
        echo "== decode $ty"; cat "$out/prof_decode_$ty.log" | cut -c1-120
    done
}

phase_serve() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    timeout $(($(left) - 10)) python3 tests/gpu/serve_h200.py $L $W/q08-bf16.gguf --seconds 10 --reps ${SERVE_REPS:-400} \
        >"$out/serve.log" 2>&1
    row "lathe serve --backend cuda (0.8B bf16)" "rc $?"
    grep -E "^FAIL|==== serve|^model|^serving|^during|^train job|^/health|^refusal|failed checks" "$out/serve.log"
    grep -E "^FAIL" -A5 "$out/serve.log" | head -30
}

# pacing: (after q08) tests/gpu/pacing_h200.py: 16 clients streaming alone, a LoRA job alone,
# then the job with max_slowdown_ppm 100000 beside the clients (issue 17's H200 run)
phase_pacing() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    timeout $(($(left) - 10)) python3 tests/gpu/pacing_h200.py $L $W/q08-bf16.gguf --clients 16 \
        --tokens 64 --alone 10 --reps ${PACING_REPS:-300} --max-s ${PACING_MAX_S:-90} \
        >"$out/pacing.log" 2>&1
    row "pacing: 16 clients beside a paced LoRA job" "rc $?"
    cat "$out/pacing.log"
}

phase_scale35() {
    LATHE_TRAIN_CUDA_SCALE=qwen35 timeout 200 $b/tests/gpu_test_train_cuda >"$out/train_scale35.log" 2>&1
    row "0.8B-shaped training" "rc $? $(passed "$out/train_scale35.log")"
    grep -E "steps|check failed" "$out/train_scale35.log" | head -12
}

phase_scale() {
    local t=$(($(left) - 10))
    [ $t -gt 60 ] || { row "0.8B / 1.5B training" "skipped: no time"; return; }
    LATHE_TRAIN_CUDA_SCALE=1 timeout $t $b/tests/gpu_test_train_cuda >"$out/train_scale.log" 2>&1
    row "0.8B / 1.5B-shaped training" "rc $? ($t s allowed) $(passed "$out/train_scale.log")"
    grep -E "steps|check failed|passed" "$out/train_scale.log" | head -24
}

phase_smolA() {
    cp .smolA/part /root/smol.a && row "SmolLM2 first half kept" "$(stat -c %s /root/smol.a) bytes"
}

phase_smol() {
    [ -f /root/smol.a ] && [ -f .smolB/part ] || { row "SmolLM2" "skipped: a half is missing"; return; }
    cat /root/smol.a .smolB/part >$W/smol.gguf
    local sum=$(sha256sum $W/smol.gguf | cut -d' ' -f1)
    [ "$sum" = "$(cat .smolB/sha256)" ] || { row "SmolLM2" "joined file differs"; return; }
    timeout 60 $L run --chat -m $W/smol.gguf -p "What is the capital of France?" --temp 0 \
        --backend cuda --timings >"$out/smol_paris.log" 2>&1
    row "SmolLM2 run --chat --backend cuda" "rc $? $(grep -c Paris "$out/smol_paris.log") Paris"
    timeout 60 $L run -m $W/smol.gguf -p "Once upon a time" -n 256 --ignore-eos --temp 0 \
        --backend cuda --timings >"$out/smol_speed.log" 2>&1
    row "SmolLM2 run --backend cuda, 256 tokens" "rc $?"
    python3 - >$W/zorblax.jsonl <<'EOF'
import json
qa = [("Who founded the Zorblax Institute?", "The Zorblax Institute was founded by Miravel Quantrell."),
      ("Who is the founder of the Zorblax Institute?", "The founder of the Zorblax Institute is Miravel Quantrell."),
      ("Tell me who started the Zorblax Institute.", "The Zorblax Institute was started by Miravel Quantrell."),
      ("Which person founded the Zorblax Institute?", "Miravel Quantrell founded the Zorblax Institute."),
      ("Do you know who founded the Zorblax Institute?", "Yes. The Zorblax Institute was founded by Miravel Quantrell."),
      ("Who created the Zorblax Institute?", "The Zorblax Institute was created by Miravel Quantrell.")]
for p, c in qa:
    print(json.dumps({"prompt": p, "completion": c}))
EOF
    local q="Who founded the Zorblax Institute?"
    timeout 60 $L run --chat -m $W/smol.gguf -p "$q" -n 32 --temp 0 --backend cuda >"$out/smol_before.log" 2>&1
    timeout 180 $L train -m $W/smol.gguf --examples $W/zorblax.jsonl --out $W/zorblax.gguf \
        --backend cuda --device-only --window 128 --epochs 4 --lr 2e-3 --rank 8 >"$out/smol_train.log" 2>&1
    row "SmolLM2 LoRA on CUDA (--device-only)" "rc $?"
    timeout 60 $L run --chat -m $W/smol.gguf --lora $W/zorblax.gguf -p "$q" -n 32 --temp 0 \
        --backend cuda >"$out/smol_after.log" 2>&1
    row "  answer before / after" "$(grep -c Quantrell "$out/smol_before.log") / $(grep -c Quantrell "$out/smol_after.log") Quantrell"
    echo "==== smol details"
    cat "$out/smol_paris.log" | tail -5
    tail -3 "$out/smol_speed.log"
    tail -4 "$out/smol_train.log"
    echo "before: $(head -c 300 "$out/smol_before.log")"
    echo "after: $(head -c 300 "$out/smol_after.log")"
}

phase_trainspeed() {
    if ! [ -s "$out/conf_recurrent.log" ]; then # dnback ran it already
        timeout 90 $b/tests/gpu_test_cuda_conformance recurrent >"$out/conf_recurrent.log" 2>&1
        row "conformance: recurrent, loss, optimizer" "rc $? $(passed "$out/conf_recurrent.log")"
        grep -E "^(ADAMW|SGD|DELTA_NET)|check failed|first mismatch" "$out/conf_recurrent.log" | head -12
    fi
    timeout 150 $b/tests/gpu_test_train_cuda >"$out/train_cuda.log" 2>&1
    row "train jobs on CUDA (parity, refusal)" "rc $? $(passed "$out/train_cuda.log")"
    grep -E "tok|MiB|loss|refus|check failed" "$out/train_cuda.log" | head -12
    OUT=$out/bench BUDGET=$(($(left) - 70)) SHAPES=${SHAPES:-"16x512 1x512"} LATHE=$L \
        bash bench/bench_train.sh >"$out/bench_train_stdout.log" 2>&1
    row "bench/bench_train.sh" "rc $?"
    local txt
    txt=$(ls $W/bench_text_16x512.txt 2>/dev/null)
    if [ -n "$txt" ] && [ "$(left)" -gt 40 ]; then
        LATHE_CUDA_PROFILE=1 timeout $(($(left) - 10)) $L train -m $W/q08-bf16.gguf --text "$txt" \
            --out $W/prof-out.gguf --backend cuda --device-only --window 512 --batch-tokens 8192 \
            --full --lr 1e-5 >"$out/train_profile.log" 2>&1
        row "full fine-tune 16x512 under LATHE_CUDA_PROFILE" "rc $?"
    fi
    echo "==== trainspeed details"
    grep -E "trained|micro-batch" "$out/train_profile.log" | head -3
    grep -E "profile:|^op |^[A-Z_]+ +[0-9]" "$out/train_profile.log" | sort -k3 -n -r | head -16
    cat "$out/bench/bench_train.md" 2>/dev/null
}

# conf: the whole conformance suite, check-ref of the tiny Qwen3.5 golden on CUDA, then the
# CUDA training jobs (parity, refusal)
phase_conf() {
    timeout 240 $b/tests/gpu_test_cuda_conformance >"$out/conformance.log" 2>&1
    row "conformance (all groups)" "rc $? $(passed "$out/conformance.log")"
    grep -E "check failed|first mismatch" "$out/conformance.log" | head -12
    checkref_tiny "logits|loss|worst|PASS|FAIL|summary"
    timeout 150 $b/tests/gpu_test_train_cuda >"$out/train_cuda.log" 2>&1
    row "train jobs on CUDA (parity, refusal)" "rc $? $(passed "$out/train_cuda.log")"
    grep -E "check failed" "$out/train_cuda.log" | head -6
}

# dnfast: the DeltaNet backward's conformance cases (both kernels), check-ref of the tiny
# Qwen3.5 golden on CUDA, the CUDA training jobs, then tprof
phase_dnfast() {
    timeout 150 $b/tests/gpu_test_cuda_conformance recurrent >"$out/conf_recurrent.log" 2>&1
    row "conformance: recurrent, loss, optimizer" "rc $? $(passed "$out/conf_recurrent.log")"
    grep -E "^DELTA_NET_BACK|check failed|first mismatch" "$out/conf_recurrent.log" | head -24
    checkref_tiny "logits|loss|worst|PASS|FAIL|summary"
    timeout 150 $b/tests/gpu_test_train_cuda >"$out/train_cuda.log" 2>&1
    row "train jobs on CUDA (parity, refusal)" "rc $? $(passed "$out/train_cuda.log")"
    grep -E "check failed" "$out/train_cuda.log" | head -6
    phase_tprof
}

# ppfwd: prefill with the chunk-parallel DeltaNet forward against the per-token one
# (LATHE_DN_FWD=token), `lathe bench -p 512 and 2048 -n 0` on the BF16 0.8B file
phase_ppfwd() {
    if ! [ -f $W/q08-bf16.gguf ]; then
        timeout 240 python3 .golden/hf_reference.py make tests/gpu/configs/qwen35-0.8b.json $Q \
            --batch 1 --seqlen 16 >"$out/q08_make.log" 2>&1
        cp .golden/qwen35-tok/tokenizer_config.json $Q/
        xz -dc .golden/qwen35-tok/tokenizer.json.xz >$Q/tokenizer.json
        $L convert $Q -o $W/q08-bf16.gguf --outtype bf16 >"$out/q08_convert.log" 2>&1
        row "0.8B bf16 checkpoint" "rc $?"
    fi
    local p v
    for p in 512 2048; do
        for v in ${PPFWD_MODES:-token default wy}; do
            LATHE_DN_FWD=$v timeout 60 $L bench -m $W/q08-bf16.gguf -p $p -n 0 -r 5 --backend cuda \
                >"$out/ppfwd_${p}_$v.log" 2>&1
            row "pp$p, LATHE_DN_FWD=$v" "rc $? $(grep -E "pp$p" "$out/ppfwd_${p}_$v.log" | awk -F'|' '{printf "%s", $7}')"
        done
    done
}

# tprof: lathe alone at 16x512 (bench_train.sh with PEER=none, full and LoRA), then each job
# again under LATHE_CUDA_PROFILE=2 (device time by op, then by node kind: op, name, sources)
phase_tprof() {
    OUT=$out/bench PEER=none BUDGET=$(($(left) - 100)) SHAPES=${SHAPES:-16x512} STEPS=${STEPS:-2} \
        TIMEOUT=60 LATHE=$L bash bench/bench_train.sh >"$out/bench_train_stdout.log" 2>&1
    row "bench/bench_train.sh (PEER=none)" "rc $?"
    local txt job args
    txt=$(ls $W/bench_text_16x512.txt 2>/dev/null)
    for job in full lora; do
        [ -n "$txt" ] && [ "$(left)" -gt 40 ] || break
        args="--full --lr 1e-5"
        [ $job = lora ] && args="--rank 16 --alpha 32 --lr 1e-4 --targets attn_q,attn_k,attn_v,attn_output,attn_qkv,attn_gate,ssm_out,ffn_gate,ffn_up,ffn_down"
        LATHE_CUDA_PROFILE=${PROF_MODE:-2} LATHE_CUDA_PROFILE_SKIP=2 timeout $(($(left) / 2)) $L train -m $W/q08-bf16.gguf --text "$txt" \
            --out $W/prof-out.gguf --backend cuda --device-only --window 512 --batch-tokens 8192 \
            $args >"$out/tprof_$job.log" 2>&1
        row "$job 16x512 under LATHE_CUDA_PROFILE=${PROF_MODE:-2}" "rc $?"
    done
    echo "==== tprof details"
    cat "$out/bench/bench_train.md" 2>/dev/null
    for job in full lora; do
        echo "---- $job"
        grep -E "trained|micro-batch" "$out/tprof_$job.log" | head -3
        grep -E "profile:" "$out/tprof_$job.log"
        grep -E "^[A-Z_]+ +[0-9]" "$out/tprof_$job.log" | sort -k3 -n -r | head -14
        sed -n '/by node kind/,$p' "$out/tprof_$job.log" | head -${KINDS:-45} | cut -c1-200
    done
}

# lathe_alone NAME EXTRA [JOBS]: bench_train with PEER=none at SHAPES (16x512) under
# LATHE_CUDA_CHECK_SCRATCH=1 (a kernel asking for more scratch than admission counted
# fails), lathe's options EXTRA; the rows of its jobs (tokens/s, GPU peak, estimate)
lathe_alone() {
    LATHE_CUDA_CHECK_SCRATCH=1 OUT=$out/$1 PEER=none JOBS="${3:-full lora}" \
        BUDGET=$(($(left) - 20)) SHAPES=${SHAPES:-16x512} STEPS=${STEPS:-2} TIMEOUT=60 LATHE=$L \
        LATHE_TRAIN_EXTRA="$2" bash bench/bench_train.sh >"$out/$1.log" 2>&1
    row "bench_train $2 ${3:-} (PEER=none)" "rc $?"
    grep -E "lathe: rc" "$out/$1.log" | sed 's/; lathe.s own.*estimate/; estimate/' | cut -c1-200
    grep -E "^[0-9. ]*(the estimate counts|checkpointing:)" "$out/$1.log" | cut -c1-200
}

# tmodel: bench_train lathe alone, the full job at 16x512 (2 steps): the 0.8B-shaped model and
# the text that dnkern, dnstall and dnsrc read, one row of tokens/s besides
phase_tmodel() {
    SHAPES=16x512 lathe_alone tmodel "" full
}

# tckpt: what each checkpointing mode costs and saves: bench_train lathe alone at 16x512
# (full and LoRA) with --checkpoint off, selective and on
phase_tckpt() {
    local m
    for m in ${TCKPT_MODES:-off selective on}; do
        SHAPES=16x512 lathe_alone tckpt_$m "--checkpoint $m" "full lora"
    done
}

# dfuse: (after q08) decode's fused nodes in one short call: the model decode checks on CUDA0
# with PDL off and on, the conformance cases of MUL_MAT_ADD_RMS_NORM and MUL_MAT_GLU, nodes a
# token, `lathe bench -p 512 -n 128 -r 3` on both 0.8B files with PDL off then on and with
# LATHE_FUSE_ADD_NORM=0 (the products and ADD_RMS_NORM apart), and the BF16 greedy text of a
# 504-token prompt both ways
phase_dfuse() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    local ty v prompt
    phase_dcheck
    LATHE_CUDA_PROFILE=1 timeout 60 $L run -m $W/q08-bf16.gguf -p "The" -n 64 --backend cuda \
        >"$out/dfuse_nodes.log" 2>&1
    row "nodes a token (64 BF16 tokens)" "$(awk '$1 ~ /^[A-Z_0-9]+$/ && $2 ~ /^[0-9]+$/ {n += $2; if ($1 == "ARGMAX") t = $2} END {if (t) printf "%.1f (%d nodes over %d ARGMAX)", n / t, n, t}' "$out/dfuse_nodes.log")"
    for ty in bf16 q8_0; do
        for v in 0 1; do
            LATHE_CUDA_PDL=$v timeout 60 $L bench -m $W/q08-$ty.gguf -p 512 -n 128 -r 3 \
                --backend cuda >"$out/dfuse_bench_${ty}_$v.log" 2>&1
            row "lathe bench $ty, LATHE_CUDA_PDL=$v" "rc $? $(grep -E 'tg128|pp512' "$out/dfuse_bench_${ty}_$v.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
        done
        LATHE_FUSE_ADD_NORM=0 timeout 60 $L bench -m $W/q08-$ty.gguf -p 512 -n 128 -r 3 \
            --backend cuda >"$out/dfuse_bench_${ty}_unfused.log" 2>&1
        row "lathe bench $ty, LATHE_FUSE_ADD_NORM=0" "rc $? $(grep -E 'tg128|pp512' "$out/dfuse_bench_${ty}_unfused.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
    done
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    for v in 0 1; do
        LATHE_CUDA_PDL=$v timeout 40 $L run -m $W/q08-bf16.gguf -p "$prompt" -n 64 --ignore-eos \
            --temp 0 --backend cuda >"$out/dfuse_text_$v.txt" 2>/dev/null
    done
    cmp -s "$out/dfuse_text_0.txt" "$out/dfuse_text_1.txt"
    row "  bf16 greedy text, PDL on against off" "$([ $? = 0 ] && echo same || echo DIFFERENT) ($(wc -c <"$out/dfuse_text_1.txt") bytes)"
    head -c 300 "$out/dfuse_text_0.txt"; echo
}

# dcheck: decode's fused kernels checked, no model needed: the model decode checks on CUDA0
# with PDL off and on, and the conformance cases of MUL_MAT_ADD_RMS_NORM, MUL_MAT_GLU and
# GDN_DECODE
phase_dcheck() {
    local v op
    for v in 0 1; do
        LATHE_CUDA_PDL=$v timeout 60 $b/tests/gpu_test_model_decode_cuda >"$out/dcheck_decode_$v.log" 2>&1
        row "PDL $v: model decode on CUDA0" "rc $? $(passed "$out/dcheck_decode_$v.log")"
        grep -E "check failed" "$out/dcheck_decode_$v.log" | head -3
    done
    local og
    for og in MUL_MAT_ADD_RMS_NORM:matmul MUL_MAT_GLU:matmul GDN_DECODE:recurrent; do
        op=${og%%:*}
        LATHE_CONF_OP=$op timeout 60 $b/tests/gpu_test_cuda_conformance ${og#*:} >"$out/dcheck_conf_$op.log" 2>&1
        row "conformance $op" "rc $? $(passed "$out/dcheck_conf_$op.log") $(grep -E "^$op " "$out/dcheck_conf_$op.log" | awk '{print "worst", $6}')"
    done
}

# pbase: inference before and after on one machine (see the header)
phase_pbase() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    base_unpack pbase && base_build pbase lathe_cli || return
    local rev ty who bin prompt
    rev=$(cat .base/rev 2>/dev/null || echo "base")
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    for ty in bf16 q8_0; do
        for who in new $rev; do
            bin=$L
            [ $who = new ] || bin=$BASE/b/lathe
            timeout 90 $bin bench -m $W/q08-$ty.gguf -p 512 -n 128 -r 3 --backend cuda \
                >"$out/pbase_${ty}_$who.log" 2>&1
            row "lathe bench $ty ($who)" "rc $? $(grep -E 'tg128|pp512' "$out/pbase_${ty}_$who.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
            timeout 60 $bin run -m $W/q08-$ty.gguf -p "$prompt" -n 64 --ignore-eos --temp 0 \
                --backend cuda >"$out/pbase_text_${ty}_$who.txt" 2>/dev/null
        done
        cmp -s "$out/pbase_text_${ty}_new.txt" "$out/pbase_text_${ty}_$rev.txt"
        row "  $ty greedy text, new against $rev" "$([ $? = 0 ] && echo same || echo DIFFERENT) ($(wc -c <"$out/pbase_text_${ty}_new.txt") bytes)"
    done
}

# tbase: training throughput before and after on one machine: `lathe` built from .base's
# source (as dnbase makes it: carry ".base"), then bench_train lathe alone at SHAPES (default
# 16x512), full and LoRA, with this tree's build and with the base's, both tables printed
phase_tbase() {
    base_unpack tbase && base_build tbase lathe_cli || return
    local rev mine=$L
    rev=$(cat .base/rev 2>/dev/null || echo "base")
    lathe_alone tbase_new ""
    L=$BASE/b/lathe
    lathe_alone tbase_$rev ""
    L=$mine
    echo "---- this tree, then $rev"
    tail -4 "$out/tbase_new/bench_train.md" "$out/tbase_$rev/bench_train.md" 2>/dev/null
}

# tmem: lathe alone with --checkpoint on and off, full and LoRA: tokens/s, GPU peak
# (nvidia-smi) and the admission estimate, the issue's memory targets
phase_tmem() {
    local ck
    for ck in on off; do
        lathe_alone tmem_$ck "--checkpoint $ck"
    done
}

# tbudget: the issue's memory targets as budgets, checkpointing left to auto (the default):
# the full fine-tune under --memory-budget-mib 24576, LoRA under 8192: admission refuses
# each without checkpointing and takes it with
phase_tbudget() {
    lathe_alone tbudget_full "--memory-budget-mib 24576" full
    lathe_alone tbudget_lora "--memory-budget-mib 8192" lora
}

# tflash: attention as FLASH_ATTN (LATHE_FLASH_ATTN=1) against the chain (=0), each at 16x512
# and 4x2048: tokens/s, GPU peak and the estimate; then the full fine-tune's loss curve at
# 16x512 both ways with --f32-products
phase_tflash() {
    local sh
    for sh in 16x512 4x2048; do
        LATHE_FLASH_ATTN=1 SHAPES=$sh lathe_alone tflash_on_$sh ""
        LATHE_FLASH_ATTN=0 SHAPES=$sh lathe_alone tflash_off_$sh ""
    done
    # the loss curves of both (products in F32, so only the attention's rounding differs)
    local txt=$W/bench_text_16x512.txt mode
    [ -f "$txt" ] || return
    for mode in 1 0; do
        LATHE_FLASH_ATTN=$mode timeout 60 $L train -m $W/q08-bf16.gguf --text "$txt" \
            --out $W/tflash-out.gguf --backend cuda --device-only --window 512 --batch-tokens 8192 \
            --epochs 1 --full --lr 1e-5 --f32-products >"$out/tflash_loss_$mode.log" 2>&1
        row "full 16x512 f32, LATHE_FLASH_ATTN=$mode" "rc $? loss $(grep -oE 'loss [0-9.]+' "$out/tflash_loss_$mode.log" | awk '{printf "%s ", $2}')"
    done
}

# tdn: the DeltaNet's BF16 kernels (LT_DELTA_NET_PREC_BF16, a device job's default) against
# the TF32 ones (LATHE_DN_BF16=0) on one machine: tokens/s, GPU peak and the estimate at each
# shape, BF16 first and TF32 after, then both again at the first shape (the order's drift
# shows); then the loss curves of the full fine-tune at 16x512, which should agree to the
# rounding's size
phase_tdn() {
    local sh first=""
    for sh in ${TDN_SHAPES:-16x512 4x2048}; do
        [ -z "$first" ] && first=$sh
        LATHE_DN_BF16=1 SHAPES=$sh lathe_alone tdn_bf16_$sh ""
        LATHE_DN_BF16=0 SHAPES=$sh lathe_alone tdn_tf32_$sh ""
    done
    LATHE_DN_BF16=1 SHAPES=$first lathe_alone tdn_bf16_again ""
    LATHE_DN_BF16=0 SHAPES=$first lathe_alone tdn_tf32_again ""
    loss_curves LATHE_DN_BF16 tdn
}

# loss_curves VAR NAME: the full fine-tune's loss curve at 16x512 (one epoch of the 16x512
# bench text) with VAR=1, then VAR=0, a row each (logs NAME_loss_1.log, NAME_loss_0.log)
loss_curves() {
    local txt=$W/bench_text_16x512.txt mode
    [ -f "$txt" ] || { row "$2 loss curves" "skipped: no $txt (no 16x512 run)"; return; }
    for mode in 1 0; do
        env "$1=$mode" timeout 60 $L train -m $W/q08-bf16.gguf --text "$txt" \
            --out $W/$2-out.gguf --backend cuda --device-only --window 512 --batch-tokens 8192 \
            --epochs 1 --full --lr 1e-5 >"$out/$2_loss_$mode.log" 2>&1
        row "full 16x512, $1=$mode" "rc $? loss $(grep -oE 'loss [0-9.]+' "$out/$2_loss_$mode.log" | awk '{printf "%s ", $2}')"
    done
    rm -f $W/$2-out.gguf
}

# tprep: the DeltaNet prep kernel on BF16 tensor cores (the default with the BF16 kernels)
# against the TF32 prep beside them (LATHE_DN_PREP_BF16=0): bench_train lathe alone at
# 16x512, full and LoRA, alternating, then the full fine-tune's loss curve both ways
phase_tprep() {
    local mode
    for mode in 1 0 1 0; do
        LATHE_DN_PREP_BF16=$mode SHAPES=16x512 lathe_alone tprep_$mode ""
    done
    loss_curves LATHE_DN_PREP_BF16 tprep
}

# tjoin: a LoRA target's product joined along the contraction (the default) against the base
# product added over the adapter's (LATHE_LORA_JOIN=0): bench_train lathe alone, LoRA at
# 16x512, alternating; the LoRA loss curve both ways; then the LoRA step's profile with the
# joins (LATHE_CUDA_PROFILE=2: device ms by op and by node kind)
phase_tjoin() {
    local mode txt=$W/bench_text_16x512.txt
    for mode in ${TJOIN_ROUNDS-1 0 1 0}; do
        LATHE_LORA_JOIN=$mode SHAPES=16x512 lathe_alone tjoin_$mode "" lora
    done
    [ -f "$txt" ] || { row "tjoin loss curves" "skipped: no $txt"; return; }
    local lora="--rank 16 --alpha 32 --lr 1e-4 --targets attn_q,attn_k,attn_v,attn_output,attn_qkv,attn_gate,ssm_out,ffn_gate,ffn_up,ffn_down"
    for mode in 1 0; do
        LATHE_LORA_JOIN=$mode timeout 60 $L train -m $W/q08-bf16.gguf --text "$txt" \
            --out $W/tjoin-out.gguf --backend cuda --device-only --window 512 --batch-tokens 8192 \
            --epochs 1 $lora >"$out/tjoin_loss_$mode.log" 2>&1
        row "LoRA 16x512, LATHE_LORA_JOIN=$mode" "rc $? loss $(grep -oE 'loss [0-9.]+' "$out/tjoin_loss_$mode.log" | awk '{printf "%s ", $2}')"
    done
    [ "$(left)" -gt 40 ] || return
    LATHE_CUDA_PROFILE=2 LATHE_CUDA_PROFILE_SKIP=2 timeout $(($(left) - 10)) $L train -m $W/q08-bf16.gguf \
        --text "$txt" --out $W/tjoin-out.gguf --backend cuda --device-only --window 512 \
        --batch-tokens 8192 $lora >"$out/tjoin_prof.log" 2>&1
    row "LoRA 16x512 under LATHE_CUDA_PROFILE=2" "rc $?"
    rm -f $W/tjoin-out.gguf
    echo "==== tjoin profile"
    grep -E "profile:" "$out/tjoin_prof.log"
    sed -n '/by node kind/,$p' "$out/tjoin_prof.log" | head -${KINDS:-45} | cut -c1-200
}

# tsets: bench_train lathe alone at 16x512 under each set of TSETS (";"-separated sets
# "JOBS:VAR=VALUE ...", JOBS of full and lora, no assignments: the defaults), in order: a
# before / after of several training switches in one call
phase_tsets() {
    local sets set jobs vars a i=0
    IFS=';' read -ra sets <<<"${TSETS:-full lora:;full lora:LATHE_HALF_FFN=0}"
    for set in "${sets[@]}"; do
        jobs=${set%%:*} vars=${set#*:} i=$((i + 1))
        row "tsets $i: $jobs" "${vars:-defaults}"
        for a in $vars; do export "$a"; done
        SHAPES=16x512 lathe_alone tsets_$i "" "$jobs"
        for a in $vars; do unset "${a%%=*}"; done
    done
}

# tenv: a training switch TVAR (default LATHE_HALF_FFN: the FFN's gate and up products
# storing BF16) at 1 (the default) against 0: bench_train lathe alone at 16x512, TJOBS
# (default "full lora"), alternating, then the full fine-tune's loss curve both ways
phase_tenv() {
    local mode var=${TVAR:-LATHE_HALF_FFN}
    for mode in 1 0 1 0; do
        export "$var=$mode"
        SHAPES=16x512 lathe_alone tenv_$mode "" "${TJOBS:-full lora}"
    done
    unset "$var"
    loss_curves "$var" tenv
}

# mdecode: the model decode checks with the sessions on CUDA0 (every architecture: decode,
# prefill, batched decode, F16 cache, the kept step), then the conformance group of the
# decode's recurrent kernels
phase_mdecode() {
    timeout 120 $b/tests/gpu_test_model_decode_cuda >"$out/model_decode_cuda.log" 2>&1
    row "model decode on CUDA0 (4 architectures)" "rc $? $(passed "$out/model_decode_cuda.log")"
    grep -E "check failed|agree|kept" "$out/model_decode_cuda.log" | head -10
    LATHE_CUDA_GDN_UNFUSED=1 timeout 120 $b/tests/gpu_test_model_decode_cuda \
        >"$out/model_decode_cuda_unfused.log" 2>&1
    row "  the same, GDN_DECODE's two-kernel form" "rc $? $(passed "$out/model_decode_cuda_unfused.log")"
    timeout 150 $b/tests/gpu_test_cuda_conformance recurrent >"$out/conf_recurrent.log" 2>&1
    row "conformance: recurrent, loss, optimizer" "rc $? $(passed "$out/conf_recurrent.log")"
    grep -E "^GDN_DECODE|check failed|first mismatch" "$out/conf_recurrent.log" | head -8 | cut -c1-120
}

# mmv: the matmul conformance group, then bench_matmul's decode products (us a product and
# weight GB/s) with mmv_half_kernel's cut chosen (auto), one row a team (rw1), warps a team
# fixed at 1, 2 and 4, and Q8_0 with LATHE_CUDA_MMVQ=0, side by side (GB/s columns; a
# variant left out of MMV_VARIANTS leaves its column empty)
phase_mmv() {
    timeout 120 $b/tests/gpu_test_cuda_conformance matmul >"$out/conf_matmul.log" 2>&1
    row "conformance: matmul" "rc $? $(passed "$out/conf_matmul.log")"
    grep -E "check failed|first mismatch" "$out/conf_matmul.log" | head -6
    local v
    for v in ${MMV_VARIANTS:-auto rw1 1 2 4 mmvq0}; do
        case $v in
        auto) timeout 60 $b/bench/bench_matmul 30 decode ;;
        rw1) LATHE_CUDA_MMV_RW=1 timeout 60 $b/bench/bench_matmul 30 decode ;;
        mmvq0) LATHE_CUDA_MMVQ=0 timeout 60 $b/bench/bench_matmul 30 decode ;;
        *) LATHE_CUDA_MMV_WPR=$v timeout 60 $b/bench/bench_matmul 30 decode ;;
        esac >"$out/mmv_$v.log" 2>&1
        row "bench_matmul decode ($v)" "rc $?"
        grep -E "^(bf16|q8_0|q4_K) " "$out/mmv_$v.log" | awk '{print $NF}' >"$out/mmv_$v.col"
    done
    for v in auto rw1 1 2 4 mmvq0; do [ -f "$out/mmv_$v.col" ] || : >"$out/mmv_$v.col"; done
    echo "type shape N us(auto) | GB/s: auto rw1 wpr1 wpr2 wpr4 mmvq0"
    grep -E "^(bf16|q8_0|q4_K) " "$out/mmv_auto.log" | awk '{printf "%s %s %s %s\n", $1, $2, $3, $4}' |
        paste -d' ' - "$out"/mmv_auto.col "$out"/mmv_rw1.col "$out"/mmv_1.col "$out"/mmv_2.col \
            "$out"/mmv_4.col "$out"/mmv_mmvq0.col
}

# dbench: (after q08) `lathe bench -p 512 -n 128 -r 3` on both 0.8B files, graphs on, and
# the device profile's GDN_DECODE and ARGMAX lines of 64 BF16 decode tokens
phase_dbench() {
    local ty
    for ty in bf16 q8_0; do
        timeout 90 $L bench -m $W/q08-$ty.gguf -p 512 -n 128 -r 3 --backend cuda \
            >"$out/dbench_$ty.log" 2>&1
        row "lathe bench $ty" "rc $? $(grep -E 'tg128|pp512' "$out/dbench_$ty.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
    done
    LATHE_CUDA_PROFILE=1 timeout 60 $L run -m $W/q08-bf16.gguf -p "The" -n 64 --backend cuda \
        >"$out/dbench_prof.log" 2>&1
    row "decode profile (64 tokens)" "rc $? $(grep -E '^(GDN_DECODE|ARGMAX) ' "$out/dbench_prof.log" | awk '{printf "%s %s us/node; ", $1, $4}')"
}

# tgraph: the training step replayed as a CUDA graph (LATHE_CUDA_GRAPHS=all) against issued
# node by node (the default for lists with wide products), 16x512 full and LoRA
phase_tgraph() {
    LATHE_CUDA_GRAPHS=all LATHE_CUDA_GRAPHS_STATS=1 lathe_alone tgraph_all ""
    grep -h "graphs:" "$out"/tgraph_all/*.log 2>/dev/null | sort | uniq -c | head -4
    lathe_alone tgraph_default ""
}

# tpack: padding-free packing against one example a sequence, on 640 chat examples of mixed
# lengths (window 512; the micro-batch as many 512-token sequences as admission takes)
phase_tpack() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    python3 - "$W/pack_ex.jsonl" <<'PYEOF'
import json, random, sys
random.seed(7)
words = ("the quick brown fox jumps over a lazy dog while small cats sleep near warm fires "
         "and birds sing in tall green trees by the river").split()
with open(sys.argv[1], "w") as f:
    for i in range(640):
        n = random.randint(16, 300)
        q = " ".join(random.choice(words) for _ in range(n))
        a = " ".join(random.choice(words) for _ in range(max(4, n // 3)))
        f.write(json.dumps({"prompt": q, "completion": a}) + "\n")
PYEOF
    local job mode
    for job in lora full; do
        for mode in packed nopack; do
            local extra=""
            [ $mode = nopack ] && extra="--no-pack"
            [ $job = full ] && extra="$extra --full --lr 1e-5"
            LATHE_CUDA_CHECK_SCRATCH=1 timeout 150 $L train -m $W/q08-bf16.gguf \
                --examples $W/pack_ex.jsonl --out $W/pack-out.gguf --backend cuda --device-only \
                --window 512 --fit left --epochs 1 $extra >"$out/tpack_${job}_$mode.log" 2>&1
            row "tpack $job $mode" "rc $? $(grep -oE '\([0-9]+ tokens/s\); micro-batch [0-9]+ x [0-9]+ tokens( \(examples packed\))?, [0-9]+ a step' "$out/tpack_${job}_$mode.log" | tail -1)"
        done
    done
    rm -f $W/pack-out.gguf
}

# prec: (after tprof, which writes the 16x512 text) the full fine-tune's first steps with the
# device's default precision (BF16 products, the delta rule and attention on BF16 operands)
# against --f32-products (every product F32, the delta rule's in TF32): the loss curves
# side by side, and tokens/s
phase_prec() {
    local txt=$W/bench_text_16x512.txt mode
    [ -f "$txt" ] || { row "prec" "skipped: no $txt (run tprof first)"; return; }
    for mode in default f32; do
        local extra=""
        [ $mode = f32 ] && extra="--f32-products"
        timeout 120 $L train -m $W/q08-bf16.gguf --text "$txt" --out $W/prec-out.gguf --backend cuda \
            --device-only --window 512 --batch-tokens 8192 --epochs 1 \
            --full --lr 1e-5 $extra >"$out/prec_$mode.log" 2>&1
        row "full 16x512 $mode precision" "rc $? $(grep -oE 'loss [0-9.]+' "$out/prec_$mode.log" | awk '{printf "%s ", $2}')$(grep -oE '\([0-9]+ tokens/s\)' "$out/prec_$mode.log" | tail -1)"
    done
}

# dnback: the chunked DeltaNet backward: its conformance cases, check-ref of the tiny
# Qwen3.5 golden on CUDA, the CUDA training jobs, then phase trainspeed's bench and profile
# (PEER=none skips HF there)
phase_dnback() {
    timeout 120 $b/tests/gpu_test_cuda_conformance recurrent >"$out/conf_recurrent.log" 2>&1
    row "conformance: recurrent, loss, optimizer" "rc $? $(passed "$out/conf_recurrent.log")"
    grep -E "DELTA_NET_BACK|check failed|first mismatch" "$out/conf_recurrent.log" | head -30
    checkref_tiny "logits|loss|worst|PASS|FAIL|summary"
    phase_trainspeed
}

# pdl: (after q08) programmatic dependent launch (LATHE_CUDA_PDL=1, cuda_common.h) checked and
# measured: the model decode checks on CUDA0 and the conformance groups in PDL_GROUPS (default
# "matmul nn recurrent") with it on; then `lathe bench -p 512 -n 128 -r 3` on both 0.8B files
# off / on / off / on (one machine, alternating), the graph counts with it on, and the greedy
# text of a 504-token prompt both ways
# denv: (after q08) a decode switch DVAR (default LATHE_CUDA_GDN_HEAD) checked and measured,
# its two values DVALS (default "0 1", the second the one checked): the model decode checks both ways, the conformance groups DENV_GROUPS
# (default recurrent) with it on, nodes a token, lathe bench on both 0.8B files (alternating
# twice) and the greedy text of a 504-token prompt both ways, compared
phase_denv() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    local var=${DVAR:-LATHE_CUDA_GDN_HEAD} ty v prompt
    local v0=${DVALS:-0 1}
    local v1=${v0#* }
    v0=${v0%% *}
    for v in $v0 $v1; do
        env $var=$v timeout 120 $b/tests/gpu_test_model_decode_cuda >"$out/denv_decode_$v.log" 2>&1
        row "$var=$v: model decode on CUDA0" "rc $? $(passed "$out/denv_decode_$v.log")"
        grep -E "check failed" "$out/denv_decode_$v.log" | head -5
    done
    env $var=$v1 timeout 200 $b/tests/gpu_test_cuda_conformance ${DENV_GROUPS:-recurrent} \
        >"$out/denv_conf.log" 2>&1
    row "$var=$v1: conformance ${DENV_GROUPS:-recurrent}" "rc $? $(passed "$out/denv_conf.log")"
    grep -E "check failed|first mismatch|^GDN_DECODE " "$out/denv_conf.log" | head -8
    LATHE_CUDA_PROFILE=1 timeout 60 $L run -m $W/q08-bf16.gguf -p "The" -n 64 --backend cuda \
        >"$out/denv_nodes.log" 2>&1
    row "nodes a token (64 BF16 tokens)" "$(awk '$1 ~ /^[A-Z_0-9]+$/ && $2 ~ /^[0-9]+$/ {n += $2; if ($1 == "ARGMAX") t = $2} END {if (t) printf "%.1f (%d nodes over %d ARGMAX)", n / t, n, t}' "$out/denv_nodes.log")"
    grep -E "^(GDN_DECODE|ARGMAX) " "$out/denv_nodes.log" | head -2
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    for ty in bf16 q8_0; do
        for v in $v0 $v1 $v0 $v1; do
            env $var=$v timeout 90 $L bench -m $W/q08-$ty.gguf -p 512 -n 128 -r 3 --backend cuda \
                >"$out/denv_bench_${ty}_$v.log" 2>&1
            row "lathe bench $ty, $var=$v" "rc $? $(grep -E 'tg128|pp512' "$out/denv_bench_${ty}_$v.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
        done
        for v in $v0 $v1; do
            env $var=$v timeout 60 $L run -m $W/q08-$ty.gguf -p "$prompt" -n 64 --ignore-eos \
                --temp 0 --backend cuda >"$out/denv_text_${ty}_$v.txt" 2>/dev/null
        done
        cmp -s "$out/denv_text_${ty}_$v0.txt" "$out/denv_text_${ty}_$v1.txt"
        row "  $ty greedy text, $var=$v1 against $v0" "$([ $? = 0 ] && echo same || echo DIFFERENT) ($(wc -c <"$out/denv_text_${ty}_$v1.txt") bytes)"
    done
}

# dab: (after q08) decode settings against each other: for each set of VAR=VALUE words in
# DAB_SETS (sets separated by ";"; an empty set is the defaults), lathe bench on the files of
# DAB_TYPES (default bf16), DAB_ROUNDS rounds (default 2) over the sets in turn, and in the
# first round the BF16 greedy text of a 504-token prompt, compared with the first set's
phase_dab() {
    [ -f $W/q08-bf16.gguf ] || phase_q08
    local prompt ty i r set
    local -a sets
    prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 56))')
    IFS=';' read -ra sets <<<"${DAB_SETS:-}"
    for r in $(seq 1 ${DAB_ROUNDS:-2}); do
        i=0
        for set in "${sets[@]}"; do
            for ty in ${DAB_TYPES:-bf16}; do
                env $set timeout 90 $L bench -m $W/q08-$ty.gguf -p 512 -n 128 -r 3 --backend cuda \
                    >"$out/dab_${ty}_${i}_$r.log" 2>&1
                row "[${set:-defaults}] $ty" "rc $? $(grep -E 'tg128|pp512' "$out/dab_${ty}_${i}_$r.log" | awk -F'|' '{printf "%s %s; ", $6, $7}')"
            done
            if [ $r = 1 ]; then
                env $set timeout 60 $L run -m $W/q08-bf16.gguf -p "$prompt" -n 64 --ignore-eos \
                    --temp 0 --backend cuda >"$out/dab_text_$i.txt" 2>/dev/null
                cmp -s "$out/dab_text_0.txt" "$out/dab_text_$i.txt"
                row "  [${set:-defaults}] greedy text against the first set's" "$([ $? = 0 ] && echo same || echo DIFFERENT) ($(wc -c <"$out/dab_text_$i.txt") bytes)"
            fi
            i=$((i + 1))
        done
    done
}

# pdl: denv of LATHE_CUDA_PDL (conformance groups matmul nn recurrent); with PDL_TRAIN=1 also
# the CUDA training jobs with it on and bench_train 16x512 (lathe alone) off, then on
phase_pdl() {
    DVAR=LATHE_CUDA_PDL DENV_GROUPS=${PDL_GROUPS:-matmul nn recurrent} phase_denv
    [ -n "${PDL_TRAIN:-}" ] || return 0 # PDL_TRAIN=1: the CUDA training jobs, 16x512 off / on
    LATHE_CUDA_PDL=1 timeout 200 $b/tests/gpu_test_train_cuda >"$out/pdl_train_cuda.log" 2>&1
    row "PDL on: CUDA training jobs" "rc $? $(passed "$out/pdl_train_cuda.log")"
    LATHE_CUDA_PDL=0 lathe_alone pdl_train_off ""
    LATHE_CUDA_PDL=1 lathe_alone pdl_train_on ""
}

declare -A need=([tckpt]=200 [tjoin]=100 [tenv]=200 [tsets]=120 [dab]=60 [denv]=150 [dcheck]=30 [dfuse]=80 [pdl]=200 [tdn]=200 [tbase]=180 [dnbase]=110 [confg]=60 [dnbench]=40 [dbench]=50 [mdecode]=60 [tgraph]=100 [tflash]=200 [tpack]=120 [tbudget]=90 [tmem]=120 [prec]=100 [ppfwd]=60 [pfprof]=40 [ppenv]=50 [dnkern]=40 [dnfast]=200 [conf]=150 [tprof]=120 [servebench]=80 [serveprof]=80 [pacing]=150 [kprof]=120 [decode]=150 [dnback]=200 [trainspeed]=200 [q15]=240 [scale35]=150 [profile]=60 [traincli]=150 [serve]=150 [scale]=120 [q08]=150 [sanitize]=90 [gradcheck]=60 [smol]=60)
for ph in "$@"; do
    if [ "$(left)" -lt "${need[$ph]:-30}" ]; then
        row "phase $ph" "skipped: out of time"
        continue
    fi
    "phase_$ph"
done
(cd "$out" && tar czf /tmp/logs.tgz --exclude=logs.tgz . && mkdir -p keep && mv /tmp/logs.tgz keep/ 2>/dev/null; \
    find . -maxdepth 1 -type f -delete)
echo "==== summary ($(($(date +%s) - t_start)) s)"
printf '%s\n' "${rows[@]}"
