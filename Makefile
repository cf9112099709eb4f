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
MODULES := pkg proto $(wildcard services/*)

# go test flags; `make test TESTFLAGS=-short` for a quick run.
TESTFLAGS ?=

.PHONY: run build test vet fmt-check proto proto-lint tools clean

## run: build graspd and run it on the embedded defaults
run: build
	$(BIN)/graspd

## build: build every binary into ./bin
build:
	@for m in $(wildcard services/*); do \
		(cd $$m && $(GO) build -o $(BIN)/ ./cmd/...) || exit 1; \
	done

## test: formatting, vet, generated-code check and every test with -race
test: tools fmt-check vet proto-lint
	@set -e; for m in $(MODULES); do \
		echo "== go test -race $$m"; \
		(cd $$m && $(GO) test -race -count=1 $(TESTFLAGS) ./...); \
	done

vet:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

fmt-check:
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

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

clean:
	rm -rf $(BIN)
