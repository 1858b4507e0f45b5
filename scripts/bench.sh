#!/usr/bin/env bash
# Prints Warren's benchmark tables. Called by `make bench` after deps and build.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "## envd through the E2B SDK (debug mode, localhost)"
(cd test/e2e && npm ci --no-audit --no-fund --loglevel=error >/dev/null && node bench/envd.mjs)

echo
echo "## envd internals (go test -bench)"
go test -run '^$' -bench 'StartTrue' -benchtime 200x ./internal/envd/process/ | grep '^Benchmark'
go test -run '^$' -bench '50MiB' -benchtime 5x ./internal/envd/files/ | grep '^Benchmark'
