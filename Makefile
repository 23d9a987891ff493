# Thin front for CMake. `make test` and `make demo` install what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench asan fuzz soak fresh-check srun-check gpu-check clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The build first, then the check that it used no file from a package install-deps.sh would not install
# on a fresh Debian 12, then the suite natively, capped at AVX2 and (kernels) at plain.
test: deps
	$(MAKE) build
	bash scripts/check-build-deps.sh $(BUILD)
	bash scripts/run-tests.sh $(BUILD) $(JOBS)

demo: deps
	$(MAKE) build
	bash scripts/demo.sh $(BUILD)

bench: deps
	$(MAKE) build
	bash bench/run_layer.sh $(BUILD)
	$(BUILD)/bench/bench_moe_layer 3
	bash bench/run_exec.sh $(BUILD)
	bash bench/run_optimizer.sh $(BUILD)
	bash bench/run_tokenizer.sh $(BUILD)

# On a machine with an NVIDIA GPU: the CUDA backend's native tests and layer benchmark, one JSON line at the
# end (scripts/gpu-check.sh, docs/cuda.md). Within 10 minutes on a 16-core GPU host.
gpu-check: deps
	bash scripts/gpu-check.sh

# Debug build with AddressSanitizer and UBSan; runs the C++ tests.
asan: deps
	$(MAKE) build BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DLT_SANITIZE=ON -DLT_BUILD_BENCH=OFF"
	cd build-asan && ctest --output-on-failure -j $(JOBS) -E model_vs_torch

# libFuzzer with ASan and UBSan on every input a user hands us (fuzz/fuzz_*.cpp), FUZZ_SECONDS each (default
# 60), in build-fuzz with clang: fails on a crash, leak, hang or out-of-memory (scripts/fuzz.sh, docs/robustness.md).
fuzz: deps
	bash scripts/fuzz.sh

# Training killed with SIGKILL 20 times (half inside checkpoint writes) and stopped with SIGTERM 5 times over 200
# steps, each resumed: the final checkpoint byte for byte the uninterrupted run's (tests/train/soak.py, docs/robustness.md).
soak: deps
	$(MAKE) build
	/usr/bin/python3 tests/train/soak.py --lazytrain $(BUILD)/lazytrain

# The README's two commands on a minimal Debian 12 made by debootstrap (cached), in a chroot, from a clean
# clone of HEAD: proves the install step is complete. Slow (~30 min); run before resolving an issue that
# touches dependencies.
fresh-check:
	bash scripts/fresh-check.sh

# Data-parallel training launched by srun on a private one-node Slurm (root; installs Slurm and munge when
# missing): 2 x 3 and 3 x 2 ranks byte-identical to one process (scripts/srun-check.sh, docs/distributed.md).
srun-check:
	bash scripts/srun-check.sh

clean:
	rm -rf $(BUILD)
