#!/usr/bin/env bash
# Measures runsc's own options (issue 16, deliverable 3) on a create and on
# a command: internal/node's step benchmarks (a create to envd's health,
# commands straight to envd) run once per variant per round, the variants
# rotated each round so that the box's drift falls on all alike, and the
# table gives, per variant, the median over the rounds of each run's p50,
# and its difference from the first variant (Warren's flags as they are).
#
# Usage (root, after `make build` and `make setup`):
#   scripts/runsc-options.sh                 # ROUNDS=5 N=20
#   ROUNDS=3 scripts/runsc-options.sh "--directfs=false" "--file-access=shared"
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
N=${N:-20}
if [ $# -gt 0 ]; then
  variants=("" "$@")
else
  variants=(
    ""                                      # Warren's flags as they are
    "--debug-log="                          # no per-command runsc log files
    "--host-settings=ignore"                # no check of the host's settings
    "--file-access=shared"
    "--directfs=false"
    "--cpu-num-from-quota=false"
    "--buffer-pooling=false"
    "--systrap-disable-syscall-patching"
    "--platform=ptrace"
    "--network=host"                        # measured only: no netstack isolation
    "--overlay2=root:memory"                # measured only: no disk quota, no snapshots
  )
fi
steps="runtime-start envd-health total true-end-event bash-l-end-event dd-10k-syscalls-end-event"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

go test -c -o "$out/node.test" ./internal/node/
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#variants[@]}; k++)); do
    i=$(((k + r) % ${#variants[@]}))
    # One line per run: variant index, then "step p50" pairs.
    (cd internal/node && WARREN_BENCH_RUNSC_FLAGS="${variants[$i]}" "$out/node.test" \
      -test.run '^$' -test.bench 'CreateSteps|CommandSteps' -test.benchtime "${N}x" 2>&1) |
      awk -v i="$i" '/^Benchmark/ { for (f = 5; f + 1 <= NF; f += 2) if ($(f+1) ~ /-p50-ms$/) { s = $(f+1); sub(/-p50-ms$/, "", s); line = line " " s " " $f } }
        /^(FAIL|panic)/ { failed = 1 }
        END { if (failed) { print "variant " i " failed" > "/dev/stderr"; exit 1 } print i line }' >>"$out/runs" ||
      echo "variant '${variants[$i]}' failed in round $r; its runs are left out" >&2
  done
done

# The median of each step's p50 over the rounds, per variant.
awk -v steps="$steps" -v names="$(printf '%s\n' "${variants[@]}" | sed 's/^$/(as they are)/' | paste -sd'|')" '
  BEGIN { ns = split(steps, st, " "); nv = split(names, vn, "|") }
  { for (f = 2; f + 1 <= NF; f += 2) { v[$1, $f, ++c[$1, $f]] = $(f+1) } }
  function median(i, s,   n, a, j, k, t) {
    n = c[i, s]; if (n == 0) return ""
    for (j = 1; j <= n; j++) a[j] = v[i, s, j]
    for (j = 1; j <= n; j++) for (k = j + 1; k <= n; k++) if (a[k] < a[j]) { t = a[j]; a[j] = a[k]; a[k] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    printf "| runsc flags | runs |"; for (j = 1; j <= ns; j++) printf " %s p50 ms |", st[j]; print ""
    printf "|---|---|"; for (j = 1; j <= ns; j++) printf "---|"; print ""
    for (i = 0; i < nv; i++) {
      printf "| `%s` | %d |", vn[i + 1], c[i, "total"]
      for (j = 1; j <= ns; j++) {
        m = median(i, st[j]); b = median(0, st[j])
        if (m == "") printf " – |"
        else if (i == 0 || b == "") printf " %.1f |", m
        else printf " %.1f (%+.1f) |", m, m - b
      }
      print ""
    }
  }' "$out/runs"
