#!/usr/bin/awk -f
# Turns `go test -bench` lines whose metrics are STEP-p50-ms and
# STEP-p99-ms (internal/node's step benchmarks) into a table with one row
# per step, in the order the steps happen.
BEGIN {
  n = split("slot rootfs-mount root-files runtime-bundle runtime-start envd-health total rpc-stat true-start-event true-end-event bash-l-start-event bash-l-end-event dd-10k-syscalls-end-event envd-user-lookup envd-prepare envd-stdio envd-exec", order, " ")
  print "| benchmark | step | p50 ms | p99 ms |"
  print "|---|---|---|---|"
}
/^Benchmark/ {
  name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
  delete p50; delete p99; delete seen
  for (i = 5; i + 1 <= NF; i += 2) {
    m = $(i+1)
    if (m ~ /-p50-ms$/) { s = m; sub(/-p50-ms$/, "", s); p50[s] = $i }
    if (m ~ /-p99-ms$/) { s = m; sub(/-p99-ms$/, "", s); p99[s] = $i }
  }
  for (k = 1; k <= n; k++) if (order[k] in p50) { printf "| %s | %s | %s | %s |\n", name, order[k], p50[order[k]], p99[order[k]]; seen[order[k]] = 1 }
  for (s in p50) if (!(s in seen)) printf "| %s | %s | %s | %s |\n", name, s, p50[s], p99[s]
}
