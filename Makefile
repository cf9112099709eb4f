# grasp-sync — build, run and test. `make run` and `make test` are the two
# commands a fresh machine needs; tools are installed into ./bin at pinned
# versions.

GO      ?= go
BIN     := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
export GOBIN := $(BIN)

BUF_VERSION           := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12

# Every Go module of the workspace.
MODULES := pkg proto $(wildcard services/*) deploy/validate e2e

# Version and commit stamped into every binary and image (-ldflags -X). The
# variables live in VERSION_PKG; an -X for a variable that does not exist is
# ignored by the linker, so stamping never breaks a build.
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT      ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
VERSION_PKG := github.com/grasp-sync/grasp-sync/pkg/obs
LDFLAGS     := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Commit=$(COMMIT)

# Container images: $(IMAGE_REPO)/grasp-<binary>:$(VERSION), one per binary.
# k8s/ and deploy/compose use these names (deploy/validate checks it).
IMAGE_REPO ?= ghcr.io/grasp-sync
IMAGES     := $(notdir $(wildcard services/*))
DOCKER     ?= docker

# go test flags; `make test TESTFLAGS=-short` for a quick run.
TESTFLAGS ?=

# Signature verification: with cgo and a C compiler, every binary and test
# is built with the tag libsecp256k1 (go-nostr compiles libsecp256k1's C
# sources, ~4x faster than pure Go); otherwise, or with CGO_ENABLED=0, the
# pure-Go fallback. Each binary logs which one it runs ("verifier").
# docs/decisions/0027-signature-verification-libsecp256k1.md. GOTAGS= (empty) forces the fallback.
CGO_ON := $(shell $(GO) env CGO_ENABLED 2>/dev/null)
CGO_CC := $(shell $(GO) env CC 2>/dev/null)
ifeq ($(CGO_ON),1)
ifneq ($(shell command -v $(firstword $(CGO_CC)) 2>/dev/null),)
GOTAGS ?= libsecp256k1
endif
endif
TAGFLAGS := $(if $(GOTAGS),-tags '$(GOTAGS)')
# -race needs cgo; the fallback's tests run without it.
RACE := $(if $(filter 1,$(CGO_ON)),-race)

.PHONY: docs run build test test-fallback vet fmt-check proto proto-lint tools clean images print-images

## run: build graspd and run it on the embedded defaults
run: build
	$(BIN)/graspd

## build: build every binary into ./bin
build:
	@for m in $(wildcard services/*); do \
		(cd $$m && $(GO) build $(TAGFLAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...) || exit 1; \
	done

## test: formatting, vet, generated-code check, every test with -race (and the
## libsecp256k1 tag where cgo allows), the pure-Go fallback's tests, then the interop suite
test: tools fmt-check vet proto-lint
	@set -e; for m in $(MODULES); do \
		echo "== go test $(RACE) $(TAGFLAGS) $$m"; \
		(cd $$m && $(GO) test $(RACE) $(TAGFLAGS) -count=1 -timeout 30m $(TESTFLAGS) ./...); \
	done
	@$(MAKE) --no-print-directory test-fallback
	@$(MAKE) --no-print-directory interop

# The packages whose behaviour depends on the verifier (graspd's start-up log
# is tested both ways by its own test), built the other way:
# pure Go (CGO_ENABLED=0, so without -race). Nothing to do when the run
# above was already pure Go.
FALLBACK_TESTS := pkg:./policy/... pkg:./verify/... services/ingester:./... services/relay:./...

## test-fallback: the verifier-dependent tests on the pure-Go fallback (CGO_ENABLED=0)
test-fallback:
	@set -e; if [ -z "$(GOTAGS)" ]; then echo "== test-fallback: the main run was pure Go already"; exit 0; fi; \
	for t in $(FALLBACK_TESTS); do \
		m=$${t%%:*}; p=$${t#*:}; \
		echo "== CGO_ENABLED=0 go test $$m $$p"; \
		(cd $$m && CGO_ENABLED=0 $(GO) test -count=1 $(TESTFLAGS) $$p); \
	done

vet:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

fmt-check:
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## docs: regenerate docs/configuration.md from the configuration structs
docs:
	$(GO) run ./services/graspd/cmd/configdoc . > docs/configuration.md.tmp && mv docs/configuration.md.tmp docs/configuration.md

## proto: regenerate the Go code of the contracts
proto: tools
	cd proto && buf lint && buf generate

proto-lint: tools
	cd proto && buf lint

tools: $(BIN)/buf $(BIN)/protoc-gen-go

$(BIN)/buf:
	$(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(BIN)/protoc-gen-go:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

## images: build every container image (needs a running Docker engine)
# Exits non-zero when no engine is reachable: an operator's pipeline must not
# go on to deploy images that were never built.
images:
	@if ! command -v $(DOCKER) >/dev/null 2>&1; then \
		echo "make images: '$(DOCKER)' not found; install Docker (or set DOCKER=podman). No image was built."; exit 1; \
	fi; \
	if ! $(DOCKER) info >/dev/null 2>&1; then \
		echo "make images: no Docker engine is reachable ('$(DOCKER) info' failed: is the daemon running, is DOCKER_HOST right?). No image was built."; exit 1; \
	fi; \
	set -e; for s in $(IMAGES); do \
		echo "== $(IMAGE_REPO)/grasp-$$s:$(VERSION)"; \
		DOCKER_BUILDKIT=1 $(DOCKER) build -f deploy/docker/Dockerfile \
			--build-arg SERVICE=$$s --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) \
			-t $(IMAGE_REPO)/grasp-$$s:$(VERSION) .; \
	done

## print-images: the image names (without tag) `make images` builds
print-images:
	@for s in $(IMAGES); do echo $(IMAGE_REPO)/grasp-$$s; done

clean:
	rm -rf $(BIN) $(DIST_DIR)

.PHONY: dist dist-tools dist-repro test-dist

# Release archives and .deb packages (docs/deploy.md, "On one host"). Every
# file time is the commit's time, the builds are -trimpath, the archives
# sorted with owner 0/0 and a gzip header without time: one commit gives the
# same bytes (`make dist-repro` checks it).
DIST_DIR   ?= $(CURDIR)/dist
DIST_ARCHS ?= amd64 arm64
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
export SOURCE_DATE_EPOCH
# The Debian version: tag vX.Y.Z gives X.Y.Z; otherwise 0.0.0+git<commit
# time>.<commit>, which sorts by commit time, so a later commit's package
# upgrades an earlier one's.
DEB_VERSION ?= $(shell v='$(VERSION)'; if expr "$$v" : 'v[0-9]' >/dev/null; then echo "$${v#v}" | tr - '~'; else echo "0.0.0+git$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y%m%d%H%M%S).$(COMMIT)"; fi)
DIST_LDFLAGS := -s -w $(LDFLAGS)
# The C cross compiler per architecture: with it, the libsecp256k1 verifier
# (cgo); without it, the pure-Go fallback (CGO_ENABLED=0). graspd --version
# names the one built.
DIST_CC_amd64 ?= $(firstword $(CGO_CC))
DIST_CC_arm64 ?= aarch64-linux-gnu-gcc
DIST_SERVICES := $(notdir $(wildcard services/*))
# deploy/dist is its own module outside go.work: nfpm's dependencies must not
# change the versions the workspace's binaries are built with.
DIST_GO := cd deploy/dist && GOWORK=off $(GO)

## dist: release archives and .deb packages for linux/amd64 and linux/arm64 into dist/
dist: dist-tools
	@set -e; rm -rf $(DIST_DIR); mkdir -p $(DIST_DIR)/build; \
	$(GO) run ./services/graspd/cmd/configdoc -env -set GRASP_DATA_DIR=/var/lib/grasp-sync . > $(DIST_DIR)/build/graspd.env; \
	for arch in $(DIST_ARCHS); do \
		case $$arch in amd64) cc='$(DIST_CC_amd64)';; arm64) cc='$(DIST_CC_arm64)';; *) echo "make dist: no C compiler known for $$arch"; cc=;; esac; \
		if [ '$(CGO_ON)' = 1 ] && [ -n "$$cc" ] && command -v "$$cc" >/dev/null 2>&1; then \
			cgo=1; tags='-tags libsecp256k1'; verifier=libsecp256k1; \
		else \
			cgo=0; tags=; verifier='pure Go'; echo "== make dist: no C compiler for $$arch ($$cc): the pure-Go verifier"; \
		fi; \
		name=grasp-sync_$(DEB_VERSION)_linux_$$arch; stage=$(DIST_DIR)/build/$$name; \
		echo "== $$name (verifier: $$verifier)"; \
		mkdir -p $$stage/bin $$stage/docs $$stage/systemd; \
		for s in $(DIST_SERVICES); do \
			(cd services/$$s && GOOS=linux GOARCH=$$arch CGO_ENABLED=$$cgo CC="$$cc" \
				$(GO) build -trimpath -buildvcs=false $$tags -ldflags '$(DIST_LDFLAGS)' -o $$stage/bin/ ./cmd/$$s); \
		done; \
		cp docs/*.md $$stage/docs/; cp README.md $$stage/; \
		cp deploy/dist/graspd.service $(DIST_DIR)/build/graspd.env $$stage/systemd/; \
		$(DIST_BIN)/mktar -C $$stage -o $(DIST_DIR)/$$name.tar.gz; \
		$(DIST_BIN)/mkdeb -arch $$arch -version $(DEB_VERSION) -bin $$stage/bin -env $(DIST_DIR)/build/graspd.env \
			-unit deploy/dist/graspd.service -scripts deploy/dist/debian -docs docs -readme README.md \
			-o $(DIST_DIR)/grasp-sync_$(DEB_VERSION)_$$arch.deb; \
	done; \
	cd $(DIST_DIR) && sha256sum *.tar.gz *.deb > SHA256SUMS && cat SHA256SUMS

# The previous version the upgrade test starts from: the latest tag before
# HEAD, else the last commit before the package existed.
DIST_OLD_REF ?= $(shell git describe --tags --abbrev=0 HEAD^ 2>/dev/null || echo 8db4570)

## test-dist: make dist, then test it: the unit (systemd-analyze, hardening), reproducibility, the .deb's contents, the packaged graspd syncing, an upgrade keeping data
test-dist: dist
	GO='$(GO)' DIST_DIR='$(DIST_DIR)' DIST_ARCHS='$(DIST_ARCHS)' DIST_OLD_REF='$(DIST_OLD_REF)' GOTAGS='$(GOTAGS)' RACE='$(RACE)' \
		bash deploy/dist/test-dist.sh

DIST_BIN := $(BIN)/dist
# The packaging programs, and on a Debian machine where we are root the C
# cross compiler for arm64 (gcc-aarch64-linux-gnu), so arm64 gets the
# libsecp256k1 verifier too.
dist-tools:
	@mkdir -p $(DIST_BIN)
	$(DIST_GO) build -o $(DIST_BIN)/ ./cmd/mkdeb ./cmd/mktar
	@if echo ' $(DIST_ARCHS) ' | grep -q ' arm64 ' && ! command -v $(DIST_CC_arm64) >/dev/null 2>&1 \
		&& [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "== installing the arm64 C cross compiler (apt-get install gcc-aarch64-linux-gnu)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null; } || \
		echo "== could not install gcc-aarch64-linux-gnu: arm64 gets the pure-Go verifier"; \
	fi

.PHONY: e2e e2e-long demo bench bench-scale

## e2e: the end-to-end scenarios (graspd against real remote relays), -race
e2e:
	cd e2e && $(GO) test $(RACE) $(TAGFLAGS) -count=1 $(TESTFLAGS) ./...

## e2e-long: e2e plus the long scenarios (GRASP_E2E_LONG=1)
e2e-long:
	cd e2e && GRASP_E2E_LONG=1 $(GO) test $(RACE) $(TAGFLAGS) -count=1 -timeout 30m $(TESTFLAGS) ./...

## demo: three seeded local relays + graspd, status until Connected, summary
demo:
	cd e2e && $(GO) run ./cmd/demo

## bench: end-to-end benchmark; writes its sections of docs/performance.md
# GRASP_BENCH_REPOS / GRASP_BENCH_EVENTS_PER_REPO scale it down (default 1,000 × 50). Every target of issue 24
# is printed as a "bench row:" line (ingest per core count, initial sync and CPU per event with the relays in
# their own process, relay reads); the in-process rows are kept for continuity.
# The ingester benchmark runs first: events/s on 1 and 2 cores beside raw
# signature verification (docs/performance.md, "Ingest").
bench: build
	cd services/ingester && $(GO) test $(TAGFLAGS) -run '^$$' -bench . -benchtime 3x -cpu 1,2 .
	cd e2e && GRASP_BENCH=1 $(GO) test $(TAGFLAGS) -count=1 -timeout 30m -run TestBenchEndToEnd -v .
	# graspd's own peak RSS in the same initial sync, graspd in its own process (docs/performance.md, "Memory").
	cd e2e && GRASP_BENCH=1 $(GO) test $(TAGFLAGS) -count=1 -timeout 30m -run TestBenchGraspdMemory -v .
	# The planner at stretch scale (25 M relay × root pairs): steady-state background work at one discovery
	# batch per second, target ≤ 10 % of one core (docs/performance.md, "Planner"; issue 17 §4).
	cd services/planner && GRASP_BENCH_STRETCH=1 $(GO) test $(TAGFLAGS) -run '^$$' -bench 'Incremental/stretch/100-repos/1root/deferred$$' -benchtime 100x -timeout 30m .
	# Issue 17's other rows ("bench row:" lines): the initial sync against plain khatru relays too (§3), the
	# wait from an announcement to its history (§3), and the default store importing 1 M events, then its steady
	# state in a fresh process (§2).
	cd e2e && GRASP_BENCH=1 GRASP_BENCH_INITIAL_ONLY=1 GRASP_BENCH_KHATRU_QUIRK=1 $(GO) test $(TAGFLAGS) -count=1 -timeout 30m -run 'TestBenchEndToEnd$$' -v .
	cd services/graspd && $(GO) test $(TAGFLAGS) -count=1 -run TestAnnouncementToHistoryLatency -v .
	# Issue 24 §3: the initial sync with the remote relays in their own process (a relay farm: NIP-77 relays, then
	# plain khatru ones), graspd (bin/graspd, its defaults) and the baseline (e2e/cmd/syncbaseline) each in a process
	# of its own: events/s and CPU-s per 1,000 events of each, read from /proc (docs/measurements/2026-12-04-relays-in-own-process.md). GRASP_BENCH_REPOS / GRASP_BENCH_EVENTS_PER_REPO scale it too.
	cd e2e && $(GO) build $(TAGFLAGS) -o $(BIN)/ ./cmd/relayfarm ./cmd/syncbaseline
	cd e2e && GRASP_BENCH=1 GRASP_BENCH_REMOTE_GRASPD=$(BIN)/graspd GRASP_BENCH_REMOTE_FARM=$(BIN)/relayfarm \
		GRASP_BENCH_REMOTE_BASELINE=$(BIN)/syncbaseline $(GO) test $(TAGFLAGS) -count=1 -timeout 30m -run '^TestBenchRemote$$' -v .
	# Issue 24 §4: the own relay's reads against plain khatru on eventstore's badger, each relay in its own
	# process, the clients in the test's, alternating rounds (docs/performance.md, "The own relay's reads").
	cd services/relay && GRASP_BENCH=1 $(GO) test $(TAGFLAGS) -count=1 -timeout 30m -run '^TestBenchReads$$' -v .
	rm -rf $(CURDIR)/bin/bench-kv1m
	cd pkg && GRASP_STORE_BENCH_1M=1 GRASP_STORE_BENCH_DIR=$(CURDIR)/bin/bench-kv1m $(GO) test $(TAGFLAGS) -run '^$$' -bench 'BenchmarkStore1M/kv\+pebble$$' -benchtime 1x -timeout 1h ./store/
	cd pkg && GRASP_STORE_BENCH_DIR=$(CURDIR)/bin/bench-kv1m $(GO) test $(TAGFLAGS) -run '^$$' -bench BenchmarkStoreSteady -benchtime 1x -timeout 1h ./store/
	rm -rf $(CURDIR)/bin/bench-kv1m

## bench-scale: graspd (make build, its defaults) at the design's scale against a relay farm in its own process (issue 23)
# Every world by default (about an hour and a half on 2 cores); GRASP_BENCH_SCALE_WORLDS=target,upper,g1000x100,…
# or RxN:roots:comments picks some, GRASP_BENCH_SCALE_IDLE=10s shortens the idle window, GRASP_BENCH_SCALE_MULTIPROC=0
# skips the multi-process rows (PostgreSQL at GRASP_TEST_POSTGRES_URL; GRASP_BENCH_SCALE_MULTIPROC_ROWS=single-node,replicas,cluster,faults
# picks some: one NATS node; the same with 2 fetchers and 2 ingesters; 3 NATS nodes with 2 fetchers and 2 ingesters; the same with a NATS node and a fetcher
# killed mid-sync), GRASP_BENCH_SCALE_LIMITS=1 runs each world again
# against relays enforcing strfry's limits (issue 30; e.g. GRASP_BENCH_SCALE_WORLDS=target,upper). Prints "bench row:"
# lines; the growth table and each world's results and logs go to bin/bench-scale (docs/performance.md, "Design scale").
GRASP_TEST_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
bench-scale: build
	cd e2e && $(GO) build $(TAGFLAGS) -o $(BIN)/ ./cmd/relayfarm
	cd e2e && GRASP_BENCH_SCALE=1 GRASP_BENCH_SCALE_GRASPD=$(BIN)/graspd GRASP_BENCH_SCALE_FARM=$(BIN)/relayfarm \
		GRASP_BENCH_SCALE_OUT=$(BIN)/bench-scale GRASP_TEST_POSTGRES_URL='$(GRASP_TEST_POSTGRES_URL)' \
		$(GO) test $(TAGFLAGS) -count=1 -timeout 6h -run '^TestBenchScale$$' -v .

.PHONY: interop

# The interop suite's clients are pinned npm packages (interop/package-lock.json),
# installed by `npm ci`; Node >= 20.
NODE         ?= node
NPM          ?= npm
INTEROP_RUNS ?= 1

## interop: graspd driven by clients we did not write (nostr-tools, rust-nostr SDK); INTEROP_RUNS=10 repeats it
interop: build interop/node_modules/.package-lock.json
	@echo "== interop (INTEROP_RUNS=$(INTEROP_RUNS))"
	cd interop && GRASPD=$(BIN)/graspd INTEROP_RUNS=$(INTEROP_RUNS) $(NODE) run.mjs

interop/node_modules/.package-lock.json: interop/package.json interop/package-lock.json
	@command -v $(NODE) >/dev/null && command -v $(NPM) >/dev/null || { \
		echo "make interop: node and npm (Node >= 20) are needed for the interop suite; install them (apt-get install nodejs npm)."; exit 1; }
	cd interop && $(NPM) ci --no-audit --no-fund
	@touch $@
