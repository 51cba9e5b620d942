#!/bin/bash
# bench_infer.sh: inference speed of `lathe bench --backend cuda` against llama.cpp's own
# llama-bench on the same GGUF files (the random Qwen3.5-0.8B-shaped checkpoint of
# tests/gpu/h200_session.sh's phase q08, converted by lathe to BF16 and Q8_0), one GPU, plus
# llama-batched-bench's table (several sequences decoding at once) on the BF16 file. A
# markdown table last: file, test, lathe t/s, llama.cpp t/s, lathe/llama.cpp.
#
# The tests mean the same on both sides (llama-bench's definitions, which `lathe bench`
# copies): ppN = a prompt of N random token ids in one prefill from an empty context, tokens/s
# = N / its time; tgN = N single-token decode steps from an empty context, tokens/s = N / their
# time; one warm-up run first, then the mean ± sample sd of -r runs.
#
# llama.cpp: the source vendored in the sdist of llama-cpp-python 0.3.36 (the version the CPU
# tests here already use as a judge; its src/llama-arch.cpp knows "qwen35", the architecture
# name lathe writes, and on the CPU it loads lathe's qwen35 GGUFs and matches transformers'
# logits). The sdist (77 MB) is more than a device call may carry (64 MiB in all), so it is
# repacked here, on a machine with network, into .llamacpp/llama.cpp-0.3.36.tar.xz (about
# 5.5 MB: vendor/llama.cpp less docs, models, media, tests, examples, pocs, gguf-py, conversion,
# benches, scripts, skills, ci and tools/ui, none of which the build below needs) by
#     bash bench/bench_infer.sh pack          (SDIST=path/to/the.tar.gz: no download)
# .llamacpp/ is ignored by git; carry it.
#
# Run on the H200 machine from the repository root:
#   device call 1: BUDGET=300 bash tests/gpu/h200_session.sh q08
#                  carry [".devdebs", ".golden"]      (builds build-h200, makes the two files)
#   device call 2: bash bench/bench_infer.sh
#                  carry [".devdebs", ".golden", ".llamacpp"]
# Alone on a fresh machine it also builds lathe_cli and makes the files itself (slower; it may
# then run out of time before llama.cpp is built: see below).
#
# How it runs (BUDGET=570 s for the whole script, every step under `timeout`):
#   1. starts the llama.cpp build in the background, in its own process session (setsid), so a
#      build the call's end interrupts goes on while the machine stays warm (30 s after a call)
#      and the next call of this script waits for it instead of starting over; sources and
#      build in /tmp/h200w/llama.cpp (kept while the machine is warm). Only the targets
#      llama-bench and llama-batched-bench, -j16, with -DGGML_CUDA=ON
#      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DGGML_CUDA_NCCL=OFF
#      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
#      -DLLAMA_OPENSSL=OFF (LLAMA_BUILD_TOOLS stays ON, its default: both programs are under
#      tools/ in this version; nothing else is fetched). With taskset there it is pinned to
#      cores 2.., so the lathe runs meanwhile (pinned to cores 0-1, -t 2) do not share cores
#      with the compilers: lathe's host side (a graph built per step) is single-threaded. The
#      build runs under `nice -n 19`: started with BUILD_ONLY=1 ahead of h200_session.sh in one
#      call (2026-12-07), it took the cores lathe's own build (100 s against 70) and the
#      checkpoint (123 s against 35) needed, and was only half done when the call ended.
#   2. rebuilds build-h200/lathe (incremental; a fresh configure as h200_session.sh does when
#      there is none), makes the checkpoint and the GGUFs when /tmp/h200w lacks them
#      (as bench/bench_train.sh does), and runs
#      `lathe bench -m FILE --backend cuda -p 512 -n 128 -r 3` on each file.
#   3. waits for the build (while more than 150 s are left), then runs
#      `llama-bench -m FILE -p 512 -n 128 -r 3 -ngl 99` on each file and
#      `llama-batched-bench -m BF16 -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,4,16,64
#      -ngl 99` (-c 16384, not 8192: batched-bench silently skips a row whose npl x (npp + ntg)
#      exceeds the context, and 64 x 256 = 16384).
# When the build has not finished in time the llama.cpp cells say so and the script exits 3;
# call it again at once (within 30 s) and it waits for the build that went on meanwhile.
#
# Environment: BUILD_ONLY=1 (start the llama.cpp build and exit), BUDGET=570, LATHE=build-h200/lathe, TYPES="bf16 q8_0", P=512, N=128, R=3,
# NPL=1,4,16,64 (none: no llama-batched-bench; with it a fresh machine gets the same-run
# ratio in one call: NPL=none BUDGET=580 bash bench/bench_infer.sh), LLAMA_TGZ=.llamacpp/llama.cpp-0.3.36.tar.xz, OUT=/tmp/bench_infer
# (bench_infer.log: everything; bench_infer.md: the tables; llama_build.log).
set -o pipefail
export LC_ALL=C PYTHONUNBUFFERED=1
LLAMA_VERSION=0.3.36
LLAMA_TGZ=${LLAMA_TGZ:-.llamacpp/llama.cpp-$LLAMA_VERSION.tar.xz}

# ---- here, with network: make the carried tarball
if [ "$1" = pack ]; then
    set -e
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    sdist=${SDIST:-}
    if [ -z "$sdist" ]; then
        python3 -m pip download --no-deps --no-binary=:all: "llama-cpp-python==$LLAMA_VERSION" -d "$tmp"
        sdist=$(ls "$tmp"/llama_cpp_python-*.tar.gz)
    fi
    tar -xzf "$sdist" -C "$tmp"
    v=$tmp/llama_cpp_python-$LLAMA_VERSION/vendor
    grep -q '"qwen35"' "$v/llama.cpp/src/llama-arch.cpp" ||
        echo "bench_infer pack: warning: this llama.cpp does not know the qwen35 architecture" >&2
    mkdir -p "$(dirname "$LLAMA_TGZ")"
    ex=()
    for d in .git docs models media tests examples pocs gguf-py conversion benches scripts skills \
        ci tools/ui; do
        ex+=(--exclude="llama.cpp/$d")
    done
    tar -C "$v" "${ex[@]}" -cJf "$LLAMA_TGZ.tmp" llama.cpp
    mv "$LLAMA_TGZ.tmp" "$LLAMA_TGZ"
    echo "wrote $LLAMA_TGZ ($(du -h "$LLAMA_TGZ" | cut -f1)) from $(basename "$sdist")"
    exit 0
fi

# ---- on the GPU machine
L=${LATHE:-build-h200/lathe}
b=$(dirname "$L")
W=/tmp/h200w
Q=$W/qwen35-0.8b
LW=$W/llama.cpp
TYPES=${TYPES:-"bf16 q8_0"}
P=${P:-512}
N=${N:-128}
R=${R:-3}
NPL=${NPL:-1,4,16,64}
out=${OUT:-/tmp/bench_infer}
log=$out/bench_infer.log
mkdir -p "$out" $W $LW
: >"$log"
t_start=$(date +%s)
left() { echo $((${BUDGET:-570} - ($(date +%s) - t_start))); }
say() { echo "[$(($(date +%s) - t_start)) s] $*" | tee -a "$log"; }
# cap T: T, or what the budget leaves (less a margin), whichever is smaller (at least 10)
cap() { local l=$(($(left) - 15)); [ $l -lt $1 ] || l=$1; [ $l -ge 10 ] || l=10; echo $l; }

# the libraries h200_session.sh unpacks when the image lacks them (PCRE2, jansson, microhttpd)
if [ ! -d .devlibs/usr/lib/x86_64-linux-gnu ] && ls .devdebs/*.deb >/dev/null 2>&1; then
    mkdir -p .devlibs
    for f in .devdebs/*.deb; do dpkg -x "$f" .devlibs; done
    if ! ldconfig -p | grep -q 'libgnutls.so.30 '; then
        for f in .devdebs/gnutls/*.deb; do dpkg -x "$f" .devlibs; done
    fi
    sed -i "s|^prefix=/usr|prefix=$PWD/.devlibs/usr|" .devlibs/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
    sed -i '/^Requires.private/d' .devlibs/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc
fi
if [ -d .devlibs/usr/lib/x86_64-linux-gnu ]; then
    export PKG_CONFIG_PATH=$PWD/.devlibs/usr/lib/x86_64-linux-gnu/pkgconfig
    export LD_LIBRARY_PATH=$PWD/.devlibs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

say "# bench_infer $(date -u '+%F %T') UTC: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
say "files: $TYPES; tests pp$P tg$N, $R runs; llama-batched-bench -npl $NPL"

# cores: the llama.cpp build on 2.., lathe's runs on 0-1 (when there are enough and taskset)
ncpu=$(nproc)
pin_build=() pin_lathe=() lathe_t=()
if command -v taskset >/dev/null && [ "$ncpu" -ge 6 ]; then
    pin_build=(taskset -c 2-$((ncpu - 1)))
    pin_lathe=(taskset -c 0-1)
    lathe_t=(-t 2)
fi

# ---- 1. llama.cpp, built in the background (its own process session: it outlives this call)
LB=$LW/build/bin/llama-bench
LBB=$LW/build/bin/llama-batched-bench
build_alive() { [ -f $LW/build.pid ] && kill -0 "$(cat $LW/build.pid)" 2>/dev/null; }
if [ -x $LB ] && [ -x $LBB ] && [ "$(cat $LW/build.rc 2>/dev/null)" = 0 ]; then
    say "llama.cpp: built by an earlier call ($LW/build)"
elif build_alive; then
    say "llama.cpp: the build an earlier call started is still running; waiting for it later"
elif ! [ -f "$LLAMA_TGZ" ] && ! [ -f $LW/src/CMakeLists.txt ]; then
    say "llama.cpp: no $LLAMA_TGZ (make it with 'bash bench/bench_infer.sh pack' and carry .llamacpp)"
    echo "no source" >$LW/build.rc
else
    rm -f $LW/build.rc
    cat >$LW/build.sh <<EOF
#!/bin/bash
# started by bench/bench_infer.sh
set -o pipefail
{
    if ! [ -f $LW/src/CMakeLists.txt ]; then
        rm -rf $LW/src $LW/llama.cpp && tar -xJf "$(realpath "$LLAMA_TGZ" 2>/dev/null)" -C $LW &&
            mv $LW/llama.cpp $LW/src
    fi &&
    timeout 120 cmake -S $LW/src -B $LW/build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \\
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DGGML_CUDA_NCCL=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \\
        -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF &&
    timeout 1500 nice -n 19 ${pin_build[*]} cmake --build $LW/build -j16 --target llama-bench llama-batched-bench
} >$LW/build.log 2>&1
echo \$? >$LW/build.rc
EOF
    setsid bash $LW/build.sh </dev/null >/dev/null 2>&1 &
    echo $! >$LW/build.pid
    say "llama.cpp $LLAMA_VERSION: build started in the background (pid $(cat $LW/build.pid), log $LW/build.log)"
fi

# BUILD_ONLY=1: only start that build (a call before the one that measures)
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0

# ---- 2. lathe: the binary, the files, the runs
if [ -f $b/CMakeCache.txt ]; then
    timeout "$(cap 300)" cmake --build $b -j16 --target lathe_cli >>"$log" 2>&1
    say "lathe_cli (incremental build): rc $?"
else
    { timeout "$(cap 120)" cmake -S . -B $b -DCMAKE_CUDA_ARCHITECTURES=90 -DLATHE_WERROR=ON &&
        timeout "$(cap 400)" cmake --build $b -j16 --target lathe_cli; } >>"$log" 2>&1
    say "lathe_cli (configure and build, sm_90): rc $?"
fi
[ -x "$L" ] || { say "bench_infer: $L is not built"; grep -E "error" "$log" | head -10; exit 1; }

need_files=0
for ty in $TYPES; do [ -f $W/q08-$ty.gguf ] || need_files=1; done
if [ $need_files = 1 ]; then
    if ! [ -f $Q/config.json ] || ! ls $Q/model*.safetensors >/dev/null 2>&1; then
        t0=$(date +%s)
        timeout "$(cap 240)" python3 .golden/hf_reference.py make tests/gpu/configs/qwen35-0.8b.json $Q \
            --batch 1 --seqlen 16 >>"$log" 2>&1
        say "random 0.8B checkpoint (transformers): rc $? in $(($(date +%s) - t0)) s"
    fi
    if ! [ -f $Q/tokenizer.json ]; then
        cp .golden/qwen35-tok/tokenizer_config.json $Q/
        xz -dc .golden/qwen35-tok/tokenizer.json.xz >$Q/tokenizer.json
    fi
    for ty in $TYPES; do
        [ -f $W/q08-$ty.gguf ] && continue
        timeout "$(cap 120)" $L convert $Q -o $W/q08-$ty.gguf --outtype $ty >>"$log" 2>&1
        say "lathe convert --outtype $ty: rc $?"
    done
fi

# md_rows FILE: "test mean cell" for each row of the markdown table in FILE (columns found by
# their names "test" and "t/s"; the cell is "mean ± sd")
md_rows() {
    awk -F'|' '
        /^\|/ && !hdr {
            for (i = 2; i < NF; i++) { h = $i; gsub(/^ +| +$/, "", h); if (h == "test") ct = i; if (h == "t/s") cs = i }
            if (ct && cs) hdr = 1
            next
        }
        hdr && /^\|/ && !/---/ {
            t = $ct; s = $cs; gsub(/^ +| +$/, "", t); gsub(/^ +| +$/, "", s); split(s, a, " ")
            printf "%s\t%s\t%s\n", t, a[1], s
        }' "$1" 2>/dev/null
}
cell() { md_rows "$1" | awk -F'\t' -v t="$2" '$1 == t { print $3; exit }'; }
mean() { md_rows "$1" | awk -F'\t' -v t="$2" '$1 == t { print $2; exit }'; }

for ty in $TYPES; do
    f=$W/q08-$ty.gguf
    r=$W/bi_lathe_$ty.md
    rm -f "$r"
    if ! [ -f "$f" ]; then
        say "lathe bench $ty: no $f"
        continue
    fi
    cmd=("${pin_lathe[@]}" "$L" bench -m "$f" --backend cuda -p "$P" -n "$N" -r "$R" "${lathe_t[@]}")
    echo "\$ ${cmd[*]}" >>"$log"
    timeout "$(cap 180)" "${cmd[@]}" >"$r" 2>$W/bi_err.txt
    rc=$?
    cat "$r" $W/bi_err.txt | tee -a "$log"
    say "lathe bench $ty: rc $rc"
done

# ---- 3. llama.cpp's runs, once it is built
if build_alive && ! [ -f $LW/build.rc ]; then
    say "waiting for the llama.cpp build (until 150 s are left)"
    while build_alive && ! [ -f $LW/build.rc ] && [ "$(left)" -gt 150 ]; do sleep 5; done
fi
brc=$(cat $LW/build.rc 2>/dev/null)
cp $LW/build.log "$out/llama_build.log" 2>/dev/null
llama_ok=0
if [ "$brc" = 0 ] && [ -x $LB ] && [ -x $LBB ]; then
    llama_ok=1
    say "llama.cpp: built"
elif [ -z "$brc" ] && build_alive; then
    llama_note="still building"
    say "llama.cpp: still building ($(grep -oE '^\[ *[0-9]+%\]' $LW/build.log | tail -1)); call this script again within 30 s to wait for it"
else
    llama_note="build failed (rc $brc)"
    say "llama.cpp: build failed (rc $brc):"
    grep -E "error|Error|not found|Could not" $LW/build.log 2>/dev/null | head -20 | tee -a "$log"
fi

if [ $llama_ok = 1 ]; then
    for ty in $TYPES; do
        f=$W/q08-$ty.gguf
        r=$W/bi_llama_$ty.md
        rm -f "$r"
        [ -f "$f" ] || continue
        cmd=("$LB" -m "$f" -p "$P" -n "$N" -r "$R" -ngl 99)
        echo "\$ ${cmd[*]}" >>"$log"
        timeout "$(cap 180)" "${cmd[@]}" >"$r" 2>$W/bi_err.txt
        rc=$?
        cat "$r" | tee -a "$log"
        [ $rc = 0 ] || tail -5 $W/bi_err.txt | tee -a "$log"
        cat $W/bi_err.txt >>"$log"
        say "llama-bench $ty: rc $rc"
    done
    f=$W/q08-bf16.gguf
    if [ -f "$f" ] && [ "$NPL" != none ]; then
        cmd=("$LBB" -m "$f" -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$NPL" -ngl 99)
        echo "\$ ${cmd[*]}" >>"$log"
        timeout "$(cap 240)" "${cmd[@]}" >$W/bi_batched.txt 2>&1
        rc=$?
        cat $W/bi_batched.txt >>"$log"
        say "llama-batched-bench bf16: rc $rc"
    fi
fi

# ---- the tables
{
    echo
    echo "## lathe bench vs llama-bench (llama.cpp of llama-cpp-python $LLAMA_VERSION), random Qwen3.5-0.8B shape, CUDA ($(($(date +%s) - t_start)) s)"
    echo
    echo "tokens/s, mean ± sd of $R runs after a warm-up; ppN: one prefill of N tokens, tgN: N decode steps, both from an empty context"
    echo
    echo "| file | test | lathe t/s | llama.cpp t/s | lathe/llama.cpp |"
    echo "| --- | --- | ---: | ---: | ---: |"
    for ty in $TYPES; do
        for t in pp$P tg$N; do
            [ "$t" = pp0 ] || [ "$t" = tg0 ] && continue
            lc=$(cell $W/bi_lathe_$ty.md $t)
            if [ $llama_ok = 1 ]; then gc=$(cell $W/bi_llama_$ty.md $t); else gc=$llama_note; fi
            ratio=$(awk -v a="$(mean $W/bi_lathe_$ty.md $t)" -v b="$(mean $W/bi_llama_$ty.md $t)" \
                'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }')
            echo "| q08-$ty.gguf | $t | ${lc:-failed} | ${gc:-failed} | $ratio |"
        done
    done
    if [ $llama_ok = 1 ] && [ "$NPL" != none ]; then
        echo
        echo "## llama-batched-bench, q08-bf16.gguf (-c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl $NPL)"
        echo
        grep -E '^\|' $W/bi_batched.txt
        grep -E '^main: ' $W/bi_batched.txt
    fi
} | tee "$out/bench_infer.md" | tee -a "$log"
[ $llama_ok = 1 ] || exit 3
