#!/usr/bin/env bash
# Checks deploy/ (make test-deploy):
# - kubernetes: every kustomization (base, overlays/*) renders with kustomize
#   and every resource it renders validates against the Kubernetes JSON
#   schemas vendored in deploy/kubernetes/schemas (kubeconform -strict: an
#   unknown field, a wrong type or a kind without a schema fails);
# - systemd: the units pass `systemd-analyze verify` with nothing to say.
# Then it shows that these checks can fail: deliberately broken copies (in
# a temporary directory, never the repo's files) must each be refused.
#
# Tools are Go modules at pinned versions (KUBECONFORM, KUSTOMIZE, set by
# the Makefile), installed once into bin/tools/; nothing else is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBECONFORM=${KUBECONFORM:-github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0}
KUSTOMIZE=${KUSTOMIZE:-sigs.k8s.io/kustomize/kustomize/v5@v5.8.2}
GO=${GO:-go}

# tool NAME MODULE@VERSION installs the module's command into
# bin/tools/NAME-VERSION (once) and prints the binary's path.
tool() {
  local name=$1 mod=$2
  local dir=$PWD/bin/tools/$name-${mod##*@}
  if [ ! -x "$dir/$name" ]; then
    echo "test-deploy: installing $mod" >&2
    GOBIN=$dir GOFLAGS=-mod=mod $GO install "$mod" >&2
  fi
  echo "$dir/$name"
}
kubeconform=$(tool kubeconform "$KUBECONFORM")
kustomize=$(tool kustomize "$KUSTOMIZE")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# check_kubernetes DIR renders each kustomization below DIR and validates
# what it renders; the schemas are DIR/schemas/vX.Y.Z-standalone-strict.
check_kubernetes() {
  local dir=$1 schemas version k out
  schemas=$(echo "$dir"/schemas/v*-standalone-strict)
  [ -d "$schemas" ] || { echo "test-deploy: no schemas in $dir/schemas" >&2; return 1; }
  version=${schemas##*/v}
  version=${version%-standalone-strict}
  for k in "$dir"/base "$dir"/overlays/*; do
    out=$tmp/rendered-$(basename "$k").yaml
    "$kustomize" build "$k" >"$out" || { echo "test-deploy: kustomize build $k failed" >&2; return 1; }
    "$kubeconform" -strict -summary -kubernetes-version "$version" \
      -schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" "$out" \
      || { echo "test-deploy: $k renders invalid resources" >&2; return 1; }
  done
}

# check_systemd DIR verifies each unit in DIR; any complaint fails. The
# units' /usr/local/bin/warren is pointed at an executable that exists here
# (verify checks the command is executable, not what it is).
check_systemd() {
  local dir=$1 units=$tmp/units-$RANDOM out
  mkdir -p "$units"
  for u in "$dir"/*.service; do
    sed "s#/usr/local/bin/warren#$(command -v true)#g" "$u" >"$units/$(basename "$u")"
  done
  out=$(systemd-analyze verify "$units"/*.service 2>&1) && [ -z "$out" ] && return 0
  echo "test-deploy: systemd-analyze verify $dir: ${out:-failed}" >&2
  return 1
}

# refused WHAT WHY CHECK DIR: CHECK must fail on the broken copy DIR, with
# a complaint that matches the regular expression WHY (so that a copy
# refused for another reason does not count).
refused() {
  local what=$1 why=$2; shift 2
  if "$@" >"$tmp/refused.log" 2>&1; then
    echo "test-deploy: FAIL: a broken copy passed ($what):" >&2
    cat "$tmp/refused.log" >&2
    exit 1
  fi
  if ! grep -Eq "$why" "$tmp/refused.log"; then
    echo "test-deploy: FAIL: a broken copy ($what) was refused, but not for /$why/:" >&2
    cat "$tmp/refused.log" >&2
    exit 1
  fi
  echo "test-deploy: refused, as it must be: $what"
}

# broken_kubernetes NAME makes a fresh copy of deploy/kubernetes to break.
broken_kubernetes() {
  rm -rf "$tmp/$1"
  cp -r deploy/kubernetes "$tmp/$1"
  echo "$tmp/$1"
}

echo "test-deploy: deploy/kubernetes"
check_kubernetes deploy/kubernetes

d=$(broken_kubernetes unknown-field)
sed -i 's/^  replicas: 2$/  replicaCount: 2/' "$d/base/api.yaml"
refused "an unknown field (replicaCount)" "additional properties .replicaCount" check_kubernetes "$d"

d=$(broken_kubernetes wrong-type)
sed -i '0,/containerPort: 3000/s//containerPort: three-thousand/' "$d/base/api.yaml"
refused "a port that is not a number" "containerPort" check_kubernetes "$d"

d=$(broken_kubernetes missing-required)
sed -i 's/^        - name: api$/        -/' "$d/base/api.yaml"
refused "a container without its name" "missing property .name" check_kubernetes "$d"

d=$(broken_kubernetes unknown-kind)
printf -- '---\napiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: x\n' >>"$d/base/api.yaml"
refused "a kind without a schema" "could not find schema for Gadget" check_kubernetes "$d"

d=$(broken_kubernetes missing-file)
rm "$d/base/node.yaml"
refused "a kustomization naming a missing file" "node.yaml.*no such file" check_kubernetes "$d"

if command -v systemd-analyze >/dev/null; then
  echo "test-deploy: deploy/systemd"
  check_systemd deploy/systemd
  rm -rf "$tmp/systemd" && cp -r deploy/systemd "$tmp/systemd"
  sed -i 's/^Restart=on-failure$/Restrat=on-failure/' "$tmp/systemd/warren-api.service"
  refused "a misspelt directive (Restrat=)" "Unknown key .Restrat" check_systemd "$tmp/systemd"
  rm -rf "$tmp/systemd" && cp -r deploy/systemd "$tmp/systemd"
  sed -i 's/^KillMode=process$/KillMode=sometimes/' "$tmp/systemd/warren-node.service"
  refused "an invalid value (KillMode=sometimes)" "kill mode.*sometimes" check_systemd "$tmp/systemd"
else
  echo "test-deploy: skipping the systemd units: systemd-analyze is not installed (Debian: apt-get install systemd)"
fi
echo "test-deploy: ok"
