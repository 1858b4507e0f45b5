#!/usr/bin/env bash
# Installs what Warren's tests need on a fresh Debian/Ubuntu box, as root.
# Idempotent and quiet: each step checks first and only acts when needed.
set -euo pipefail

apt_updated=0
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated -eq 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
  echo "install-deps: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (the tests switch users and create namespaces)" >&2
  exit 1
fi

# Tools the tests call: bash for the SDK's `bash -l -c`, coreutils' sha256sum
# and stat, procps, iproute2 for namespace checks, nftables' nft for the
# chaos run's link cuts (test/e2e/chaos).
apt_install bash coreutils procps iproute2 ca-certificates nftables

# OCI runtimes: runc from Debian (runsc is built by the runtime tests and by
# `warren setup`), and busybox for the runtime tests' minimal root filesystem.
apt_install runc busybox-static
# internal/codeinterp's tests run real Jupyter kernels with Debian's Python
# and R, and TypeScript cells with Debian's tsc (the code-interpreter-v1
# template has the same packages).
apt_install python3-ipykernel python3-jupyter-client node-typescript r-base-core r-cran-irkernel

# The dashboard's browser test (test/e2e/platform/dashboard.test.mjs)
# drives Debian's headless Chromium with puppeteer-core.
apt_install chromium

# The SDK tests need Node ^20.19 or >= 22.12 (the engines of e2b 2.51.0 and
# vite 7) with npm. Debian 12's own nodejs is 18, too old, so this only checks.
node_ok=$(node -e '
  const [a, b] = process.versions.node.split(".").map(Number)
  console.log((a === 20 && b >= 19) || (a === 22 && b >= 12) || a > 22 ? 1 : 0)' 2>/dev/null || echo 0)
if [ "$node_ok" != 1 ] || ! command -v npm >/dev/null; then
  echo "install-deps: the SDK tests need Node ^20.19 or >= 22.12 with npm (found: $(node --version 2>/dev/null || echo none));" \
    "install it e.g. from https://deb.nodesource.com" >&2
  exit 1
fi

# The SDK's default user inside a sandbox is `user`; envd runs directly on
# this host in the SDK tests (debug mode), so the account must exist here.
if ! id -u user >/dev/null 2>&1; then
  echo "install-deps: creating the account 'user'"
  useradd --create-home --shell /bin/bash user
fi

# PostgreSQL for the store tests (internal/store runs against SQLite and
# PostgreSQL): Debian's server, a running cluster, and a superuser role for
# root so tests connect over the local socket with peer authentication.
apt_install postgresql
if ! pg_lsclusters -h 2>/dev/null | grep -q online; then
  cluster=$(pg_lsclusters -h | awk 'NR==1 {print $1" "$2}')
  if [ -z "$cluster" ]; then
    version=$(ls /usr/lib/postgresql | sort -V | tail -1)
    pg_createcluster "$version" main >/dev/null
    cluster="$version main"
  fi
  # The server outlives this script: it must not inherit its descriptors
  # (a caller's flock, e.g. `flock /tmp/warren-test.lock make test`, would
  # stay held for as long as PostgreSQL runs).
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null
    done
    exec pg_ctlcluster $cluster start
  )
fi
if ! runuser -u postgres -- psql -tAc "SELECT 1 FROM pg_roles WHERE rolname='root'" | grep -q 1; then
  runuser -u postgres -- psql -qc "CREATE ROLE root SUPERUSER LOGIN" >/dev/null
fi

# The blob store tests (internal/blobstore, test/security/blobstore) run a
# real S3-compatible server on loopback: SeaweedFS (Apache-2.0; MinIO's
# server is AGPL), built once from its Go module into a path named after
# its version (internal/blobstore/s3test.WeedVersion), so that `make test`
# never rebuilds it. The build takes several minutes on 2 cores.
weed_version=v0.0.0-20261109003541-7506e5f91cd6
weed_bin=/usr/local/lib/warren-test/weed-$weed_version
if [ ! -x "$weed_bin" ]; then
  echo "install-deps: building SeaweedFS $weed_version for the blob store tests (once; minutes)"
  go_bin=${GO:-go}
  weed_src=$(cd / && GOFLAGS= GO111MODULE=on "$go_bin" mod download -json "github.com/seaweedfs/seaweedfs@$weed_version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  mkdir -p /usr/local/lib/warren-test
  (cd "$weed_src" && GOFLAGS=-buildvcs=false "$go_bin" build -o "$weed_bin.tmp" ./weed)
  mv "$weed_bin.tmp" "$weed_bin"
fi
