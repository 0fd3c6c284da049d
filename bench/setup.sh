#!/bin/sh
# Installs the tools the benchmarks need (run once, as root): nginx (the baseline server),
# wrk (the HTTP load generator for small requests) and curl (the single-stream client).
# py-spy (optional, for profiling) goes into the project's venv.
set -eu
cd "$(dirname "$0")/.."
need=""
command -v nginx >/dev/null 2>&1 || need="$need nginx-light"
command -v wrk >/dev/null 2>&1 || need="$need wrk"
command -v curl >/dev/null 2>&1 || need="$need curl"
if [ -n "$need" ]; then
    apt-get update
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need
fi
if [ "${WITH_PY_SPY:-0}" = 1 ]; then
    .venv/bin/pip install py-spy
fi
echo "bench tools ready: $(command -v nginx) $(command -v wrk) $(command -v curl)"
