# kvcache — the two commands a new user needs:  make run  |  make test
# Every target first installs missing Debian packages (scripts/install_deps.sh).
BUILD_DIR ?= build
ASAN_DIR  ?= build-asan
FUZZ_DIR  ?= build-fuzz
TSAN_DIR  ?= build-tsan
JOBS      ?= $(shell nproc)
RUN_ARGS  ?=
# make fuzz: seconds per target, and which targets (empty: all; see tests/fuzz/README.md).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=

.PHONY: all deps configure build run test asan tsan fuzz bench format format-check clean

all: build

deps:
	@bash scripts/install_deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	@./$(BUILD_DIR)/kvcache run $(RUN_ARGS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer build of the library, the CLI and every test
# (not the benchmarks), then the whole suite.
asan: deps
	@cmake -S . -B $(ASAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVCACHE_SANITIZE=address -DKVCACHE_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS)
	@cd $(ASAN_DIR) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS)

# libFuzzer targets of every parser of outside bytes (tests/fuzz/README.md), built with clang,
# ASan and UBSan in $(FUZZ_DIR), each run for FUZZ_SECONDS from its checked-in corpus; findings
# land in $(FUZZ_DIR)/fuzz-out/<target>/. Not part of `make test` (which replays the corpora).
fuzz:
	@bash scripts/install_deps.sh --fuzz
	@cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
		-DKVCACHE_FUZZ=ON -DKVCACHE_NATIVE=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS)
	@bash scripts/fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# ThreadSanitizer build (-O1: TSan at -O0 is several times slower) of the library, the CLI and
# the test binaries of the layers whose tests run threads (TSAN_LAYERS): core (the thread pool),
# kernels (loops split over 1-3 threads), runtime (the engine; every forward runs on the pool),
# server (handler threads + the engine's driver thread), tools (`kvcache serve` under signals,
# `batch`), cache (the offloaded container's and the disk tier's copier threads, core/tier.h);
# model runs none. Then their tests matching TSAN_TESTS (a ctest -R regex,
# all by default; e.g. TSAN_TESTS='Server|Engine' for a quick pass). OpenBLAS's own threads are
# not instrumented: OPENBLAS_NUM_THREADS=1. Suppressions (uninstrumented libraries only):
# tests/tsan.supp.
TSAN_LAYERS ?= core;kernels;cache;runtime;server;tools
TSAN_TESTS  ?= .
# TSAN_EXCLUDE: a ctest -E regex of tests to leave out under TSan only (none by default).
TSAN_EXCLUDE ?=
tsan: deps
	@cmake -S . -B $(TSAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
		-DKVCACHE_SANITIZE=thread -DKVCACHE_TEST_LAYERS="$(TSAN_LAYERS)" -DKVCACHE_BENCH=OFF >/dev/null
	@cmake --build $(TSAN_DIR) -j $(JOBS)
	@cd $(TSAN_DIR) && OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
		ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)' $(if $(TSAN_EXCLUDE),-E '$(TSAN_EXCLUDE)')

bench: build
	@for b in $(BUILD_DIR)/bench/*; do echo "== $$b"; $$b; done

# The tree's C++ in .clang-format's style: `make format` rewrites it; `make format-check` (a CI
# stage) lists every file that differs and fails.
format: deps
	@find src tests bench \( -name '*.h' -o -name '*.cc' \) -print0 | xargs -0 clang-format -i

format-check: deps
	@bash scripts/format_check.sh

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(FUZZ_DIR)
