# Warren: the two set-up commands are `make run` and `make test`.
SHELL := /bin/bash
GO ?= go
BIN := bin
PROTOC_GEN_GO := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_CONNECT := connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
OAPI_CODEGEN := github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.4.1
KUBECONFORM := github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0
KUSTOMIZE := sigs.k8s.io/kustomize/kustomize/v5@v5.8.2

.PHONY: all build generate check test test-go test-e2e test-fuzz test-deploy fuzz deps setup bench bench-scale chaos run clean vet

all: build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/envd ./cmd/envd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o $(BIN)/mcp-gateway ./cmd/mcp-gateway
	$(GO) build -o $(BIN)/warren ./cmd/warren

# Regenerates the committed code: Connect/protobuf from proto/, the
# platform API's types and server interface from api/openapi.yml.
generate:
	@command -v protoc >/dev/null || apt-get install -y protobuf-compiler
	GOBIN=$(CURDIR)/$(BIN)/tools $(GO) install $(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/$(BIN)/tools $(GO) install $(PROTOC_GEN_CONNECT)
	PATH=$(CURDIR)/$(BIN)/tools:$$PATH protoc -I proto \
	  --go_out=. --go_opt=module=github.com/warren-sandbox/warren \
	  --connect-go_out=. --connect-go_opt=module=github.com/warren-sandbox/warren \
	  envd/filesystem.proto envd/process.proto node/v1/node.proto
	cd api && $(GO) run $(OAPI_CODEGEN) -config codegen.yml openapi.yml

# Installs what the tests need on a fresh Debian box.
deps:
	scripts/install-deps.sh

# Installs the runtimes (runsc, runc) and the base template; idempotent.
setup: build
	$(BIN)/warren setup

vet:
	$(GO) vet ./...

# The edit-test loop: vet and the tests that start no sandboxes or
# servers of Warren's (-short skips those; make test runs everything).
check: vet
	$(GO) test -short -count=1 ./...

# The fuzz targets run beside the SDK suite, which mostly waits on
# sandboxes: one fuzz worker leaves it a core, and the two together take
# the SDK suite's time instead of the sum. Each one's output comes whole
# when it ends (--output-sync). The Go packages run before them: run
# beside the SDK suite (-j3) they took 8.5 minutes instead of about 11,
# but three of their tests failed from it (test/security's probe of every
# host address met other servers' interfaces; a volume remount lost a
# file; a proxy test under load), so that waits until those are made to
# share the host.
test: deps build setup vet test-deploy test-go
	$(MAKE) --no-print-directory -j2 --output-sync=target test-fuzz FUZZ_PARALLEL=1 test-e2e

# deploy/: the kustomize manifests render and validate against the vendored
# Kubernetes schemas, the systemd units verify, and broken copies of both
# are refused (scripts/test-deploy.sh).
test-deploy:
	KUBECONFORM=$(KUBECONFORM) KUSTOMIZE=$(KUSTOMIZE) GO=$(GO) scripts/test-deploy.sh

# Test servers of an earlier run that was killed leave data dirs behind
# whose names block the next run's servers: sweep-test-leftovers removes
# those of servers that are gone. The slowest packages (test/security,
# internal/node, internal/template: ~95 s each) mostly wait on sandboxes
# that boot, so four packages at a time (-p 4, not one per core) overlap
# that waiting; each package's servers have their own ranges and dirs.
test-go:
	scripts/sweep-test-leftovers.sh
	$(GO) test -count=1 -timeout 30m -p 4 ./...

# Every fuzz target for a few seconds (make fuzz: longer, FUZZTIME=10m).
FUZZTIME ?= 2m
test-fuzz:
	FUZZ_PARALLEL=$(FUZZ_PARALLEL) scripts/fuzz.sh 5s

fuzz:
	scripts/fuzz.sh $(FUZZTIME)

# The SDK suite, once per distinct SDK version of the matrix (test/e2e/
# sdk-matrix.mjs: the pinned e2b and its e2b-sdk-* aliases).
test-e2e: build
	scripts/sweep-test-leftovers.sh
	cd test/e2e && npm ci --no-audit --no-fund --loglevel=error && node sdk-matrix.mjs --run

bench: deps build setup
	scripts/bench.sh

# The control plane at 100 simulated nodes, 10,000 running and 50,000
# paused sandbox records (test/scale, docs/scale.md): about 10 minutes.
# SCALE_NODES, SCALE_RUNNING, SCALE_PAUSED, SCALE_CREATES resize it.
bench-scale: deps
	$(GO) test -run '^$$' -bench ControlPlane -benchtime 1x -timeout 40m ./test/scale/

# The chaos run (test/e2e/chaos, docs/chaos.md): a cluster on this machine
# under the SDK's mixed load, a fault every CHAOS_EVERY seconds for
# CHAOS_DURATION seconds, the invariants checked after each. make test
# runs a short one (test/e2e/platform/chaos.test.mjs).
CHAOS_DURATION ?= 600
CHAOS_EVERY ?= 30
CHAOS_FAULTS ?= kill-node,cut-link,kill-api,kill-runsc,fill-disk,skew-clock,kill-postgres
# The run's processes start from a copy of bin/ taken at its start: a
# rebuild meanwhile must not change the binary a restarted node runs.
chaos: deps build setup
	scripts/sweep-test-leftovers.sh
	cd test/e2e && npm ci --no-audit --no-fund --loglevel=error
	bin=$$(mktemp -d /tmp/warren-chaos-bin-XXXXXX) && cp bin/warren bin/envd bin/mcp-gateway $$bin/ && \
	  (cd test/e2e && WARREN_BINARY=$$bin/warren node chaos/chaos.mjs --duration $(CHAOS_DURATION) --every $(CHAOS_EVERY) --faults $(CHAOS_FAULTS)); \
	  rc=$$?; rm -rf $$bin; exit $$rc

# Starts the platform on 127.0.0.1 (API :3000, sandbox proxy :3002 and,
# with TLS, :443) and prints the exports the E2B SDK needs. Ctrl-C stops
# it; sandboxes keep running and the next start adopts them.
# PROXY_TLS_ADDR= (empty) runs without the HTTPS proxy.
# It serves as soon as the runtimes and base are there: the server builds
# code-interpreter-v1 in the background (its creates get 503 until then;
# docs/operating.md).
PROXY_TLS_ADDR ?= 127.0.0.1:443
run: deps build
	$(BIN)/warren setup --code-interpreter=false
	$(BIN)/warren serve --build-code-interpreter $(if $(PROXY_TLS_ADDR),--proxy-tls-addr $(PROXY_TLS_ADDR))

clean:
	rm -rf $(BIN)
