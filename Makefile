# The two commands: `make run` (a local 3-node cluster) and `make test` (every test).
CARGO ?= cargo
RELEASE := target/release
# End-to-end tests start whole clusters and mounts: on 2 cores, a few at a time.
TEST_THREADS ?= 2

.PHONY: all build run test deps guest deb check sim fuzz bench bench-quick soak clean

all: build

build:
	./scripts/install-deps.sh build
	$(CARGO) build --release --workspace --bins

## run: build, start 3 sheep on 127.0.0.1:7000-7002 under ./run, format, create VDI demo.
## CLUSTER=etcd make run: the same on the etcd driver, with a local etcd under ./run/etcd.
run:
	./scripts/install-deps.sh run
	$(MAKE) build
	./scripts/run-cluster.sh

## deps: install the system packages the tests need (apt-get when root).
deps:
	./scripts/install-deps.sh

## guest: the VM the live-migration tests boot (scripts/fetch-guest.sh: qemu-system-x86, a
## kernel and busybox from Debian's packages, unpacked once, about 40 MB) into target/guest,
## or $TESTKIT_GUEST_DIR where the tests look for it.
guest:
	./scripts/fetch-guest.sh $(TESTKIT_GUEST_DIR)

## deb: the Debian package target/debian/sheepstore_VERSION_ARCH.deb (scripts/build-deb.sh:
## release binaries, sheep@.service, /etc/sheep/1.conf, mount.fuse.sheepfs, man pages and
## completions generated from the command lines), built with dpkg-deb.
deb:
	./scripts/install-deps.sh build
	CARGO=$(CARGO) ./scripts/build-deb.sh

## test: install what is missing, fetch the guest, build the package (its test installs it),
## then run unit and end-to-end tests, and the scale harness's (objstore/node/tests/scale.rs,
## objstore/sim/tests/scale.rs) in a release build.
test: deps guest deb
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --lib --bins --tests -- --test-threads=$(TEST_THREADS)
	$(CARGO) test --release -p objstore-node -p objstore-sim --test scale -- --test-threads=1

## check: formatting, clippy with warnings denied, docs with broken links denied, quick (unit)
## tests, every relative link of docs/ and README.md (scripts/check-links.sh), and docs/reference
## against the debug binaries' --help (scripts/gen-reference.sh --check; after changing a help
## text: make build, scripts/gen-reference.sh, commit the pages).
check:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps
	$(CARGO) test --workspace --lib --bins
	./scripts/check-links.sh
	$(CARGO) build --workspace --bins
	BIN_DIR=$${CARGO_TARGET_DIR:-target}/debug ./scripts/gen-reference.sh --check

## sim: the deterministic fault simulator over SEEDS seeds from SEED_BASE (release build;
## `cargo test` runs 1000). It fails on every rule of the checker (SIM_STRICT=0: only the
## lenient ones). Replay one seed: SEED=N cargo test -p objstore-sim
## --test seeds seeds -- --nocapture
SEEDS ?= 10000
SEED_BASE ?= 0
sim:
	SIM_SEEDS=$(SEEDS) SIM_SEED_BASE=$(SEED_BASE) $(CARGO) test --release -p objstore-sim --test seeds seeds -- --exact --nocapture

## fuzz: every fuzz target with FUZZ_CASES inputs each (default 100000; `make test` runs 256,
## 200 for the live ones): the decoders of tests/fuzz (frames, payloads, admin bodies, control
## lines, backup deltas), the cache's meta files, a running node (objstore/node/tests/fuzz_requests.rs) and a
## running mount's control socket. docs/fuzzing.md says how to keep a failing input.
FUZZ_CASES ?= 100000
fuzz: deps
	$(CARGO) build --workspace --bins
	FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --release -p fuzz-targets
	FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --release -p objcache --lib meta_file
	FUZZ_CASES=$$(( $(FUZZ_CASES) / 20 )) $(CARGO) test -p objstore-node --test fuzz_requests
	FUZZ_CASES=$$(( $(FUZZ_CASES) / 20 )) $(CARGO) test -p sheepfs --test fuzz_control

## bench: every figure (bench run --profile full, about 45 min) into docs/bench/bench.json, its
## tables in docs/bench/report.md with charts (SVG, PNG) in docs/bench, and the placement cost.
## Only the bench targets build bench with its charts feature (plotters): test and check don't.
bench: build
	$(CARGO) build --release -p bench --features charts
	$(RELEASE)/bench run --profile full --out docs/bench/bench.json
	$(RELEASE)/bench report docs/bench/bench.json --markdown docs/bench/report.md --charts docs/bench
	$(CARGO) bench -p objstore-proto --bench placement

## bench-quick: a subset at small sizes (under 3 minutes) into target/bench/quick.json, charts in
## target/bench/charts (docs/bench keeps the full run's).
bench-quick: build
	$(CARGO) build --release -p bench --features charts
	$(RELEASE)/bench run --profile quick --out target/bench/quick.json
	$(RELEASE)/bench report target/bench/quick.json --markdown target/bench/quick.md --charts target/bench/charts

## soak: SOAK_MIN minutes (default 5) of fio verify and a random-write exerciser on a sheepfs
## mount over 4 nodes (3 copies) while one node at a time is killed and restarted or stopped
## and continued (bench soak, docs/operations.md); not part of test. Prints verify errors,
## EIOs, stale reads and the time back to full copies; exit status 1 if any count is not zero.
SOAK_MIN ?= 5
soak: deps build
	$(RELEASE)/bench soak --minutes $(SOAK_MIN)

clean:
	$(CARGO) clean
	rm -rf run
