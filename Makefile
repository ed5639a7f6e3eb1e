GO ?= go

# The tests start real servers and goroutines: all run under the race
# detector, uncached, since the servers they start are not inputs go test sees.
# The simulator's tests run after the others: they keep both cores busy, and
# the others wait on real time. Its parallel machinery (places, the worker
# pool) runs under the race detector in the tests that drive it with several
# workers; its scenarios, each the same single code path run for longer,
# without it (under it they took six of CI's twenty minutes). Allocation counts need the race detector off
# (it makes sync.Pool drop what it holds). Last, the end-to-end suite: real
# deployments of regiond and globalsync processes, broken under load. The
# daemons are built with -tags vtprotobuf (transport.Codec): the gRPC tests of
# transport run again so built.
.PHONY: test
test:
	$(GO) test -race -count=1 -timeout 15m $$($(GO) list ./... | grep -v 'geoquota/sim$$')
	$(GO) test -race -count=1 -tags vtprotobuf -run 'Codec|RLS|EnvoyRateLimit|EnvoyLimit|Unlimited' ./transport
	$(GO) test -race -count=1 -timeout 10m -run 'TestSameSeedSameOutput|TestScenarios/million/' ./sim
	$(GO) test -count=1 -timeout 10m ./sim
	$(GO) test -count=1 -run AllocatesNothing ./regional
	$(MAKE) fuzz-brief
	$(MAKE) e2e

# The end-to-end fault suite (build tag e2e): a few minutes.
.PHONY: e2e
e2e:
	$(GO) test -tags e2e -count=1 -timeout 15m -v ./deploy/local/e2e

.PHONY: lint
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./deploy/local/e2e

# Regenerates the Go code of every .proto under transport/ with Debian's
# protoc and the plugins pinned by go.mod's tool directives.
PROTOS := $(shell find transport -name '*.proto' 2>/dev/null)
.PHONY: proto
proto:
ifneq ($(PROTOS),)
	protoc --plugin=protoc-gen-go=$$($(GO) tool -n protoc-gen-go) \
	       --plugin=protoc-gen-go-grpc=$$($(GO) tool -n protoc-gen-go-grpc) \
	       --go_out=. --go_opt=paths=source_relative \
	       --go-grpc_out=. --go-grpc_opt=paths=source_relative \
	       $(PROTOS)
endif

.PHONY: bench
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# Every decoder of network input, fuzzed: make fuzz runs each for
# FUZZTIME; make fuzz-brief, in make test, for 10,000 inputs each (a few
# seconds). A count, not a duration: a duration can end the run with a bare
# "context deadline exceeded" and no failing input (go.dev/issue/75804).
FUZZ_TARGETS := crdt:FuzzDecode transport/gossip:FuzzStep budget:FuzzDecodeDocument \
	regional:FuzzParse transport:FuzzParseCheck transport:FuzzRLS
FUZZTIME ?= 60s
.PHONY: fuzz fuzz-brief
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t"; $(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) ./$${t%%:*}; \
	done
fuzz-brief:
	$(MAKE) fuzz FUZZTIME=10000x
