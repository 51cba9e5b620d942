#!/bin/bash
# bench_train.sh: training throughput of `lathe train --backend cuda` against HF transformers
# eager (+ peft for LoRA, bench/bench_train_hf.py) on the same random Qwen3.5-0.8B-shaped
# checkpoint, one GPU: tokens/s, GPU peak memory and the lathe/HF ratio per shape and job,
# a markdown table last.
#
# Run on the H200 machine from the repository root after build-h200/lathe is built (a call
# of tests/gpu/h200_session.sh builds it; `q08` there also makes the checkpoint, which this
# script otherwise makes itself, reusing it from /tmp/h200w while the machine stays warm):
#   device call 1: BUDGET=300 bash tests/gpu/h200_session.sh q08     carry [".devdebs", ".golden"]
#   device call 2: bash bench/bench_train.sh                         carry [".devdebs", ".golden"]
# Environment: SHAPES="1x512 16x512 4x2048" (SEQSxLEN), JOBS="full lora", STEPS=3 timed steps
# after WARMUP=1 (at least 1), TIMEOUT=90 s per job, BUDGET=480 s for the whole script
# (jobs past it are skipped), LATHE=build-h200/lathe, OUT=/tmp/bench_train (bench_train.log:
# everything; bench_train.md: the table), HF_TARGETS (HF LoRA modules; "all" = every
# nn.Linear of the decoder layers), PEER=hf (PEER=none skips the HF jobs: a quick look at
# lathe alone, never a figure for a note).
#
# Jobs: full fine-tune (AdamW, lr 1e-5) and LoRA r 16, alpha 32 (lr 1e-4) on every linear
# projection lathe adapts in Qwen3.5: attention q/k/v/output, DeltaNet qkv/gate(z)/out and the
# FFN. HF gets the same modules by default (its in_proj_a / in_proj_b, 1024 -> 16, lathe has no
# LoRA target for; HF_TARGETS=all adds them).
# How it is measured:
#   lathe  `lathe train --text` on a text cut to (WARMUP + STEPS) x SEQS windows of LEN tokens
#          (LATHE_TRAIN_EXTRA: more options, e.g. "--checkpoint on"),
#          --batch-tokens SEQS x LEN (SEQS windows per step, one step per optimizer update).
#          Its per-step progress lines are time-stamped as they arrive; tokens/s = SEQS x LEN
#          x STEPS / (time of step WARMUP + STEPS - time of step WARMUP). lathe's own end-of-run
#          figure (every step, the first included) is in the log.
#   HF     random ids [SEQS, LEN], F32 master weights, autocast bf16, fused AdamW; WARMUP steps
#          then STEPS timed between torch.cuda.synchronize calls.
#   GPU peak  nvidia-smi's memory.used sampled every 100 ms while the job runs (the whole
#          device: CUDA context, cached blocks); for HF also torch.cuda.max_memory_allocated.
set -o pipefail
export LC_ALL=C PYTHONUNBUFFERED=1
L=${LATHE:-build-h200/lathe}
W=/tmp/h200w
Q=$W/qwen35-0.8b
M=$W/q08-bf16.gguf
SHAPES=${SHAPES:-"1x512 16x512 4x2048"}
JOBS=${JOBS:-"full lora"}
STEPS=${STEPS:-3}
WARMUP=${WARMUP:-1}
[ "$WARMUP" -ge 1 ] || WARMUP=1
TIMEOUT=${TIMEOUT:-90}
LORA_TARGETS=attn_q,attn_k,attn_v,attn_output,attn_qkv,attn_gate,ssm_out,ffn_gate,ffn_up,ffn_down
HF_TARGETS=${HF_TARGETS:-q_proj,k_proj,v_proj,o_proj,in_proj_qkv,in_proj_z,out_proj,gate_proj,up_proj,down_proj}
out=${OUT:-/tmp/bench_train}
log=$out/bench_train.log
mkdir -p "$out" $W
: >"$log"
t_start=$(date +%s)
left() { echo $((${BUDGET:-480} - ($(date +%s) - t_start))); }
say() { echo "$*" | tee -a "$log"; }
# the libraries h200_session.sh unpacks when the image lacks them
[ -d .devlibs/usr/lib/x86_64-linux-gnu ] &&
    export LD_LIBRARY_PATH=$PWD/.devlibs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -x "$L" ] || { say "bench_train: $L is not built (run tests/gpu/h200_session.sh first)"; exit 1; }

say "# bench_train $(date -u '+%F %T') UTC: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "shapes $SHAPES; jobs $JOBS; warm-up $WARMUP + $STEPS timed steps; $TIMEOUT s a job"

# gpu_peak FILE CMD...: as in tests/gpu/h200_session.sh: runs CMD with nvidia-smi sampling
# the GPU's used memory every 100 ms into FILE; CMD's status is returned, the highest sample
# (MiB, the whole device) is in $peak
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
gib() { awk -v m="$1" 'BEGIN { if (m == "") print "?"; else printf "%.1f", m / 1024 }'; }

# ---- the checkpoint: what h200_session.sh's phase q08 makes, reused when it is there
if ! [ -f $Q/config.json ] || ! ls $Q/model*.safetensors >/dev/null 2>&1; then
    t0=$(date +%s)
    timeout 240 python3 .golden/hf_reference.py make tests/gpu/configs/qwen35-0.8b.json $Q \
        --batch 1 --seqlen 16 >>"$log" 2>&1
    say "random 0.8B checkpoint (transformers): rc $? in $(($(date +%s) - t0)) s"
    rm -f $M
fi
if ! [ -f $Q/tokenizer.json ]; then
    cp .golden/qwen35-tok/tokenizer_config.json $Q/
    xz -dc .golden/qwen35-tok/tokenizer.json.xz >$Q/tokenizer.json
fi
if ! [ -f $M ]; then
    $L convert $Q -o $M --outtype bf16 >>"$log" 2>&1
    say "lathe convert --outtype bf16: rc $?"
fi
[ -f $M ] || { say "bench_train: no $M"; exit 1; }
say "checkpoint $Q, $M ($(du -m $M | cut -f1) MiB)"

# ---- the text: a varied paragraph repeated, tokenized once; each shape's file is cut at the
# byte offset of the token that gives (WARMUP + STEPS) x SEQS full windows of LEN tokens
# (windows start every LEN / 2 tokens: n windows need (n + 1) x LEN / 2 + 1 tokens)
need_tokens() { echo $((((WARMUP + STEPS) * $1 + 1) * $2 / 2 + 1)); }
max_need=0
for sh in $SHAPES; do
    n=$(need_tokens ${sh%x*} ${sh#*x})
    [ $n -gt $max_need ] && max_need=$n
done
python3 - $W/bench_base.txt $((max_need * 8)) <<'EOF'
import sys
path, size = sys.argv[1], int(sys.argv[2])
s = ["The lathe turns the wood while the chisel shapes it into a bowl.",
     "Every morning the carpenter sharpens her tools and sweeps the shavings from the floor.",
     "A steady hand and a sharp edge matter more than a fast spindle.",
     "Walnut cuts cleanly, but oak tears unless the gouge meets the grain at the right angle.",
     "Apprentices learn to listen: a clean cut hisses, a rough one chatters.",
     "When the piece is finished, oil brings out the colour hidden in the grain."]
out, i = [], 0
while sum(len(p) for p in out) < size:
    r = i % len(s)
    out.append(f"Lesson {i + 1}. " + " ".join(s[r:] + s[:r]) + "\n")
    i += 1
open(path, "w").write("".join(out))
EOF
$L tokenize $M --offsets <$W/bench_base.txt >$W/bench_offsets.txt 2>>"$log"
say "text: $(wc -c <$W/bench_base.txt) bytes, $(wc -l <$W/bench_offsets.txt) tokens (needed at most $max_need)"
make_text() { # SEQS LEN FILE
    local n off
    n=$(need_tokens $1 $2)
    off=$(sed -n "$((n + 1))p" $W/bench_offsets.txt | cut -d' ' -f2)
    if [ -n "$off" ]; then head -c "$off" $W/bench_base.txt >"$3"; else cp $W/bench_base.txt "$3"; fi
}

# stamp: each line prefixed with the time it arrived (s)
stamp() { while IFS= read -r line; do printf '%s %s\n' "${EPOCHREALTIME:-$(date +%s.%N)}" "$line"; done; }

lathe_train() { # SEQS LEN JOB TEXT TIMEOUT
    local args="--rank 16 --alpha 32 --lr 1e-4 --targets $LORA_TARGETS"
    [ $3 = full ] && args="--full --lr 1e-5"
    local cmd="$L train -m $M --text $4 --out $W/bench-out.gguf --backend cuda --device-only --window $2 --batch-tokens $(($1 * $2)) --epochs 1 $args ${LATHE_TRAIN_EXTRA:-}"
    echo "\$ $cmd" >$W/job.log
    timeout $5 $cmd 2>&1 | stamp >>$W/job.log
}

# lathe_rate SEQS LEN: tokens/s over steps WARMUP+1 .. WARMUP+STEPS of $W/job.log, and the
# steps used ("NA" when there are not two step lines)
lathe_rate() {
    awk -v w=$WARMUP -v s=$STEPS -v tok=$(($1 * $2)) '
        $2 == "epoch" && $4 == "step" { split($5, a, "/"); t[a[1] + 0] = $1; if (a[1] + 0 > last) last = a[1] + 0 }
        END {
            b = w + s < last ? w + s : last
            if (b > w && (w in t) && t[b] > t[w]) printf "%.0f (steps %d-%d of %d)\n", tok * (b - w) / (t[b] - t[w]), w + 1, b, last
            else print "NA"
        }' $W/job.log
}

hf_train() { # SEQS LEN JOB TIMEOUT
    timeout $4 python3 bench/bench_train_hf.py --model $Q --seqs $1 --len $2 --mode $3 \
        --steps $STEPS --warmup $WARMUP --targets $HF_TARGETS >$W/job.log 2>&1
}

# hf_fields: tokens_per_s peak_gib error warnings loss from the JSON line of $W/job.log
hf_fields() {
    python3 -c '
import json, sys
r = {}
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("{"):
        try: r = json.loads(line)
        except ValueError: pass
g = lambda k, d="NA": d if r.get(k) is None else r[k]
print(g("tokens_per_s"), g("peak_gib"), g("error", "-" if r else "no-result"), g("warnings"), g("loss"))
' $W/job.log
}

declare -a table
smi_base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)
say "GPU memory in use before the jobs: $smi_base MiB"
for sh in $SHAPES; do
    S=${sh%x*} T=${sh#*x}
    txt=$W/bench_text_$sh.txt
    make_text $S $T $txt
    for job in $JOBS; do
        # lathe
        lt_tps=NA lt_peak=NA
        to=$(($(left) - 5)); [ $to -gt $TIMEOUT ] && to=$TIMEOUT
        if [ $to -lt 20 ]; then
            say "$sh $job lathe: skipped, out of time"
        else
            rm -f $W/bench-out.gguf $W/bench-out.loss.svg
            gpu_peak $W/mem.txt lathe_train $S $T $job $txt $to
            rc=$?
            r=$(lathe_rate $S $T)
            lt_tps=${r%% *}
            lt_peak=$(gib "$peak")
            est=$(grep -oE 'memory estimate [0-9.]+' $W/job.log | tail -1 | awk '{ printf "%.1f", $3 / 1024 }')
            [ -n "$est" ] && lt_peak="$lt_peak ($est)"
            own=$(grep -oE 'trained .*fallback nodes' $W/job.log)
            mb=$(grep -oE 'micro-batch [0-9]+ x [0-9]+' $W/job.log | head -1)
            note=""
            [ -n "$mb" ] && [ "$mb" != "micro-batch $S x $T" ] && note=" (NOT $S x $T)"
            say "$sh $job lathe: rc $rc, $lt_tps tokens/s${r#"$lt_tps"}, GPU peak $lt_peak GiB; lathe's own: ${own:-none}$note"
            [ "$lt_tps" = NA ] && [ $rc != 0 ] && lt_tps="rc $rc"
            [ $rc = 0 ] || grep -vE '^(\$ |[0-9.]+ epoch [0-9]+/)' $W/job.log | tail -3 | tee -a "$log"
            echo "---- lathe $sh $job" >>"$log"
            cat $W/job.log >>"$log"
            rm -f $W/bench-out.gguf $W/bench-out.loss.svg
        fi
        # HF transformers
        hf_tps=NA hf_cell=NA
        to=$(($(left) - 5)); [ $to -gt $TIMEOUT ] && to=$TIMEOUT
        if [ "${PEER:-hf}" = none ]; then
            :
        elif [ $to -lt 20 ]; then
            say "$sh $job HF: skipped, out of time"
        else
            gpu_peak $W/mem.txt hf_train $S $T $job $to
            rc=$?
            read -r hf_tps hf_alloc hf_err hf_warn hf_loss <<<"$(hf_fields)"
            [ "$hf_err" = - ] || hf_tps="rc $rc"
            [ "$hf_err" = OOM ] && hf_tps=OOM
            hf_cell="$(gib "$peak") (torch $hf_alloc)"
            say "$sh $job HF: rc $rc, $hf_tps tokens/s, GPU peak $(gib "$peak") GiB, torch max allocated $hf_alloc GiB, loss $hf_loss, $hf_warn warnings, error $hf_err"
            grep -E '^(LoRA targets|decoder nn.Linear|warning:)' $W/job.log | cut -c1-200 | tee -a "$log"
            [ $rc = 0 ] || grep -vE '^(LoRA targets|decoder nn.Linear|warning:|\{)' $W/job.log | tail -3 | tee -a "$log"
            echo "---- HF $sh $job" >>"$log"
            cat $W/job.log >>"$log"
        fi
        ratio=$(awk -v a="$lt_tps" -v b="$hf_tps" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }')
        table+=("| $sh | $job | $lt_tps | $lt_peak | $hf_tps | $hf_cell | $ratio |")
    done
done

{
    echo
    echo "## lathe train vs HF transformers eager, random Qwen3.5-0.8B shape ($(($(date +%s) - t_start)) s)"
    echo
    echo "tokens/s over $STEPS steps after $WARMUP warm-up; GPU peak: nvidia-smi, whole device (lathe: its admission estimate in brackets; HF: torch max allocated); GiB"
    echo
    echo "| shape | job | lathe tokens/s | lathe GPU peak GiB | HF tokens/s | HF peak GiB | lathe/HF |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    printf '%s\n' "${table[@]}"
} | tee "$out/bench_train.md" | tee -a "$log"
