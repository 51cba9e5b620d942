#!/bin/bash
# h200_prepare.sh: run HERE (not on the GPU machine) before tests/gpu/h200_session.sh. The
# H200 image lacks PCRE2 and jansson and can reach no registry, and ../shared does not travel,
# so this fills two ignored folders to carry with the device call: .devdebs (Debian packages
# of the two libraries, unpacked there into .devlibs) and .golden (the transformers references).
# Then: device run, carry [".devdebs", ".golden"], command `bash tests/gpu/h200_session.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devdebs .golden
(cd .devdebs && apt-get download libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
    libpcre2-posix3 libjansson-dev libjansson4 >/dev/null)
cp -r ../shared/golden/qwen35-tiny-a ../shared/golden/qwen2-tiny-a tests/data/llama-tiny-a .golden/
du -sh .devdebs .golden
