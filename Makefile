# Thin front for CMake. `make test` and `make demo` install what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench asan clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: deps
	$(MAKE) build
	bash scripts/demo.sh $(BUILD)

bench: deps
	$(MAKE) build
	bash bench/run_layer.sh $(BUILD)
	bash bench/run_exec.sh $(BUILD)
	bash bench/run_optimizer.sh $(BUILD)
	bash bench/run_tokenizer.sh $(BUILD)

# Debug build with AddressSanitizer and UBSan; runs the C++ tests.
asan: deps
	$(MAKE) build BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DLT_SANITIZE=ON -DLT_BUILD_BENCH=OFF"
	cd build-asan && ctest --output-on-failure -j $(JOBS) -E model_vs_torch

clean:
	rm -rf $(BUILD)
