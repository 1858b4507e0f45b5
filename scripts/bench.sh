#!/usr/bin/env bash
# Prints Warren's benchmark tables. Called by `make bench` after deps and build.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "## envd through the E2B SDK (debug mode, localhost)"
(cd test/e2e && npm ci --no-audit --no-fund --loglevel=error >/dev/null && node bench/envd.mjs)

echo
echo "## the platform through the E2B SDK (real warren serve, loopback)"
(cd test/e2e && node bench/platform.mjs)

echo
echo "## performance baseline: create and command, end to end and step by step (docs/performance.md; SDK, real warren serve, runsc)"
(cd test/e2e && node bench/steps.mjs)
echo
echo "### node.Create and a command straight to envd, step by step (go test -bench ./internal/node, root; ms)"
bin/warren setup >/dev/null
go test -run '^$' -bench 'CreateSteps|CommandSteps' -benchtime 30x -timeout 10m ./internal/node/ | scripts/bench-steps.awk

echo
echo "## adaptive warm pool: a steady ${POOL_RATE:-5} creates/s for ${POOL_SECONDS:-60} s, each killed after its first command (SDK, real warren serve, runsc, --pool-size 2)"
(cd test/e2e && node bench/pool.mjs)

echo
echo "## runsc's options: a create and commands per variant, rotated over ${ROUNDS:-3} rounds (internal/node step benchmarks; median of the rounds' p50, and the difference from Warren's flags)"
ROUNDS=${ROUNDS:-3} scripts/runsc-options.sh

echo
echo "## density: idle sandboxes on this node (SDK, real warren serve, runsc; DENSITY_MAX=${DENSITY_MAX:-1000})"
(cd test/e2e && node bench/density.mjs)

echo
echo "## templates through the E2B SDK (builds and the sandboxes they start; real warren serve, pool 0)"
(cd test/e2e && node bench/templates.mjs)

echo
echo "## a template with a start command: create → first command, restored cold vs claimed from its warm pool (SDK, real warren serve, runsc)"
(cd test/e2e && node bench/startpool.mjs)

echo
echo "## pause/resume, snapshots and fork through the E2B SDK (real warren serve, runsc, pool 0)"
(cd test/e2e && node bench/lifecycle.mjs)

echo
echo "## egress policies through the E2B SDK (sandbox → a test host in its own netns; real warren serve)"
(cd test/e2e && node bench/egress.mjs)
echo "### the egress proxy's own cost on loopback: a new connection's request and response, direct vs proxied (go test -bench)"
go test -run '^$' -bench 'ProxyConnection' -benchtime 2000x ./internal/egress/ | grep '^Benchmark'

echo
echo "## team volumes through the E2B SDK (real warren serve, runsc, pool 0)"
(cd test/e2e && node bench/volumes.mjs)

echo
echo "## volumes on this node (go test -bench ./internal/volume, root; ms per operation)"
go test -run '^$' -bench . -benchtime 20x ./internal/volume/ | awk '
  /^Benchmark/ {
    name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
    for (i = 5; i + 1 <= NF; i += 2) printf "| %-36s | %-10s | %10s |\n", name, $(i+1), $i
  }'

echo
echo "## a cluster on this box: an api and two nodes on PostgreSQL, against one --role all server (SDK, runsc)"
(cd test/e2e && node bench/cluster.mjs)
echo "### the hop's own cost on loopback: a small request through a node's proxy, direct vs through an api's forwarder (go test -bench)"
go test -run '^$' -bench 'ProxyHop' -benchtime 3000x ./internal/noderpc/ | grep '^Benchmark'

echo
echo "## envd internals (go test -bench)"
go test -run '^$' -bench 'StartTrue' -benchtime 200x ./internal/envd/process/ | grep '^Benchmark'
go test -run '^$' -bench '50MiB' -benchtime 5x ./internal/envd/files/ | grep '^Benchmark'

echo
echo "## sandbox proxy internals (go test -bench): TLS leaves and handshakes, signed-URL routing on a full node"
go test -run '^$' -bench . -benchtime 2000x ./internal/ingress/ | grep '^Benchmark'
go test -run '^$' -bench 'SignedBy' -benchtime 2000x ./internal/sandbox/ | grep '^Benchmark'

echo
echo "## a snapshot's or fork's copy of the writable layer (go test -bench ./internal/rootfs, root)"
go test -run '^$' -bench 'CopyDisk' -benchtime 3x ./internal/rootfs/ | grep '^Benchmark'

echo
echo "## sandboxes on this node (go test -bench ./internal/node, root; medians and p99 in ms)"
bin/warren setup >/dev/null
go test -run '^$' -bench 'CreateToHealthy|PauseResume|CheckpointRestore' -benchtime 20x -timeout 30m ./internal/node/ | awk '
  /^Benchmark/ {
    name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
    for (i = 5; i + 1 <= NF; i += 2) printf "| %-36s | %-22s | %10s |\n", name, $(i+1), $i
  }'

echo
echo "## the code interpreter through @e2b/code-interpreter (code-interpreter-v1, real warren serve, runsc, pool 2)"
(cd test/e2e && node bench/codeinterp.mjs)

echo
echo "## the web dashboard in headless Chromium: first load, the list of 1,000 sandboxes, server CPU of 10 open dashboards (real warren serve)"
(cd test/e2e && node bench/dashboard.mjs)

echo
echo "## lifecycle event → webhook delivery: ${WEBHOOK_RATE:-1000} events/min for ${WEBHOOK_SECONDS:-30} s to a loopback receiver, alone and beside a 10 s endpoint (SDK, real warren serve)"
(cd test/e2e && node bench/webhooks.mjs)

echo
echo "### paused to the blob store (SeaweedFS on loopback) and resumed on another node, vs local pause and resume, and a plain S3 client copying the same blob: 50 and 500 MiB resident, 10 rounds each (go test -bench; ms, MB/s)"
go test -run '^$' -bench 'PauseResumeAcrossNodes' -benchtime 1x -timeout 40m ./test/security/blobstore/ | grep 'bench_test.go' | sed 's/^ *bench_test.go:[0-9]*: /    /'
