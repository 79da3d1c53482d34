# The two commands: `make run` (a local 3-node cluster) and `make test` (every test).
CARGO ?= cargo
RELEASE := target/release
# End-to-end tests start whole clusters and mounts: on 2 cores, a few at a time.
TEST_THREADS ?= 2

.PHONY: all build run test deps check bench bench-quick clean

all: build

build:
	$(CARGO) build --release --workspace --bins

## run: build, start 3 sheep on 127.0.0.1:7000-7002 under ./run, format, create VDI demo.
run: build
	./scripts/run-cluster.sh

## deps: install the system packages the tests need (apt-get when root).
deps:
	./scripts/install-deps.sh

## test: install what is missing, then run unit and end-to-end tests.
test: deps
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --lib --bins --tests -- --test-threads=$(TEST_THREADS)

## check: formatting, clippy with warnings denied, quick (unit) tests.
check:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace --lib --bins

## bench: dog vs cp, sheepfs and the cache vs raw/bindfs, placement cost (docs/benchmarks.md).
bench: build
	./scripts/bench.sh
	./scripts/bench-sheepfs.sh
	./scripts/bench-cache.sh
	$(CARGO) bench -p objstore --bench placement

## bench-quick: the same with small sizes.
bench-quick: build
	BENCH_SIZE_MIB=128 BENCH_ROUNDS=1 ./scripts/bench.sh
	BENCH_FILE_MIB=256 BENCH_RUNTIME=3 ./scripts/bench-sheepfs.sh
	BENCH_FILE_MIB=256 BENCH_RUNTIME=3 BENCH_FLUSH_MIB=256 ./scripts/bench-cache.sh

clean:
	$(CARGO) clean
	rm -rf run
