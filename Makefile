# gpufence — two entry points that do all the set-up on a fresh Debian 12 / Ubuntu machine (as root):
#   make demo   build, simulate a 4-GPU node, print inventory + CDI spec, run a podman container on GPU 1,
#               two containers sharing GPU 2 at 30 % and 70 %
#   make test   the whole test suite (unit, property, fuzz-bounded, end-to-end with runc/podman/containerd)
#   make fuzz   coverage-guided fuzzing (cargo-fuzz) of every untrusted-input parser, FUZZ_SECONDS each
#   make image  the installer OCI image (umoci, from scratch) in $(IMAGE_DIR)/oci, tagged with the version
#   make package  the .deb (cargo-deb) and .rpm (cargo-generate-rpm) in target/debian, target/generate-rpm
# Each target installs only what it needs (scripts/deps.sh lists the sets): the demo neither the
# test engines nor the packaging tools; `make test` the packaging tools and docker.io only in the
# set-up of the tests that use them (`make package-deps`, `make docker-deps`).

SHELL := /bin/bash
CARGO ?= cargo
# rustup installs into ~/.cargo/bin: later recipes of the same run find cargo there
export PATH := $(HOME)/.cargo/bin:$(PATH)
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
DEMO_DIR ?= /tmp/gpufence-demo
# The demo runs the debug build (the one `make test` builds too): the release profile's fat LTO
# and single codegen unit cost minutes on a fresh 2-core machine and change nothing the demo
# shows. `make demo DEMO_PROFILE=release` runs it on `make build`'s artifacts instead.
DEMO_PROFILE ?= dev
PY_VENV := $(CURDIR)/target/venv
export PY_VENV

.PHONY: test-frameworks gpu-proof-bundle engines all deps demo-deps lint-deps build-deps test-deps package-deps docker-deps rust build build-debug shim-compat \
        demo test fuzz lint fmt bench clean-demo image package

all: build

# Install what is missing; idempotent and quiet when everything is there (scripts/deps.sh).
deps: test-deps
demo-deps rust:
	@bash scripts/deps.sh demo
lint-deps:
	@bash scripts/deps.sh lint
build-deps:
	@bash scripts/deps.sh build
test-deps:
	@bash scripts/deps.sh test
# rpm, cargo-deb and cargo-generate-rpm (make package; tests/deploy_package.rs runs this itself):
# cargo-deb and cargo-generate-rpm are compiled once into ~/.cargo/bin, which later runs reuse.
package-deps:
	@bash scripts/deps.sh package
# docker.io (tests/deploy_docker.rs runs this itself)
docker-deps:
	@bash scripts/deps.sh docker

build: build-deps
	$(CARGO) build --release --workspace
	@# gpufence-runtime, started for every runc call, linked static — that binary alone (the flag
	@# is the final crate's link): no dynamic loader on a pass-through call (docs/performance.md).
	$(CARGO) rustc --release -p gpufence --bin gpufence-runtime -- -C target-feature=+crt-static
	@$(MAKE) --no-print-directory shim-compat

# The shim is preloaded into every container process, whatever the image's glibc: build it
# against glibc 2.17 with cargo-zigbuild (zig from PyPI) and put it where the package expects it.
# Falls back to the host-glibc build (with a warning) when zig cannot be installed.
shim-compat:
	@if [ ! -x $(PY_VENV)/bin/cargo-zigbuild ]; then $(PY_VENV)/bin/pip install -q cargo-zigbuild ziglang || true; fi
	@if [ -x $(PY_VENV)/bin/cargo-zigbuild ]; then \
	  PATH=$(PY_VENV)/bin:$$PATH cargo-zigbuild zigbuild --release -p gpufence-shim --target x86_64-unknown-linux-gnu.2.17 -q && \
	  cp target/x86_64-unknown-linux-gnu/release/libgpufence.so target/release/libgpufence.so && \
	  echo ">> libgpufence.so built for glibc >= 2.17 (max symbol: $$(objdump -T target/release/libgpufence.so | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1))"; \
	else echo "warning: cargo-zigbuild unavailable; libgpufence.so needs the build machine's glibc"; fi

# The installer image: gpufence, gpufence-runtime, the glibc 2.17 shim, the libraries the binaries
# load, hooks, manifests; entrypoint `gpufence install`. Push: skopeo copy oci:$(IMAGE_DIR)/oci:<version>
# docker://REGISTRY/gpufence:<version> (the tag packaging/k8s/kustomization.yaml names).
IMAGE_DIR ?= target/image
image: build
	@bash scripts/deps.sh image
	bash scripts/image.sh target/release $(IMAGE_DIR)

package: build package-deps
	$(CARGO) deb --no-build
	$(CARGO) generate-rpm
	@ls target/debian/*.deb target/generate-rpm/*.rpm

build-debug:
	$(CARGO) build --workspace

# On a fresh machine deps.sh starts the debug build as soon as the compiler is in, while apt-get
# still installs podman and the rest; the `cargo build` after it then only checks.
demo:
ifeq ($(DEMO_PROFILE),release)
	@bash scripts/deps.sh demo
	@$(MAKE) --no-print-directory build
	@bash scripts/demo.sh "$(DEMO_DIR)" $(TARGET_DIR)/release
else
	@bash scripts/deps.sh demo --build
	$(CARGO) build --workspace
	@bash scripts/demo.sh "$(DEMO_DIR)" $(TARGET_DIR)/debug
endif

# Container engines without known escapes for the end-to-end tests (runc 1.5.1, containerd 2.3.4):
# the project's shared build beside the checkout where present, else fetched into target/engines
# by scripts/engines.sh (official release binaries, sha256-checked). First on PATH for the tests,
# so containerd finds its shim and the shim its runc.
ENGINES_DIR ?= $(abspath $(firstword $(wildcard ../shared/engines/bin ../../shared/engines/bin) target/engines))
export ENGINES_DIR

engines:
	@bash scripts/engines.sh "$(ENGINES_DIR)" >/dev/null

test: test-deps engines
	$(CARGO) build --workspace --all-targets
	@mkdir -p target
	@echo ">> end-to-end tests on $$($(ENGINES_DIR)/runc --version | head -1), $$($(ENGINES_DIR)/containerd --version | cut -d' ' -f3) ($(ENGINES_DIR))"
	set -o pipefail; PATH="$(ENGINES_DIR):$$PATH" $(CARGO) test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee target/test.log
	@awk '/^test result:/ { p += $$4; f += $$6 } END { printf "%d passed, %d failed\n", p, f }' target/test.log

# NVIDIA's CUDA runtime with unmodified PyTorch, CuPy and JAX wheels over the simulated node, held
# to their slice inside a gpufence-runtime container (docs/frameworks.md). Not part of `make test`:
# the first run downloads the wheels (about 5.5 GiB for PyTorch + CuPy, 4.4 GiB for JAX in a venv
# of its own) into /var/cache/gpufence/frameworks (scripts/frameworks.sh); later runs download
# nothing. Then the rehearsal of the real-GPU proof over the simulated node (tests/gpu_proof.rs).
test-frameworks: test-deps engines
	$(CARGO) build --workspace
	bash scripts/frameworks.sh
	bash scripts/frameworks.sh jax
	PATH="$(ENGINES_DIR):$$PATH" $(CARGO) test --test frameworks_container -- --ignored --nocapture
	PATH="$(ENGINES_DIR):$$PATH" $(CARGO) test --test gpu_proof -- --ignored --nocapture

# The proof prepared for a machine with a real GPU (docs/frameworks.md, "On a real GPU: the
# prepared proof"): release binaries, a static runc and the C CUDA client in ./gpu-proof (ignored
# by git), carried to that machine, where `bash scripts/gpu-proof.sh run` is the one command.
gpu-proof-bundle: build-deps engines
	bash scripts/gpu-proof.sh prepare

# Coverage-guided fuzzing, not part of `make test`: installs cargo-fuzz if missing, runs every
# target in fuzz/ for FUZZ_SECONDS (default 60) on the stable toolchain (RUSTC_BOOTSTRAP=1).
FUZZ_SECONDS ?= 60
fuzz: demo-deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

# No two files import each other in a loop (scripts/import_cycles.py): every crate of the
# repository by default; IMPORT_CYCLES_IN=PATH… checks the crates whose root lies under PATH only.
IMPORT_CYCLES_IN ?=

lint: lint-deps
	python3 scripts/layers.py
	python3 scripts/import_cycles.py $(IMPORT_CYCLES_IN)
	python3 scripts/doc_links.py
	python3 scripts/fn_length.py
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@echo ">> the fuzz targets still build against the crate (cargo check; make fuzz runs them)"
	RUSTC_BOOTSTRAP=1 $(CARGO) check -q --manifest-path fuzz/Cargo.toml --bins

fmt:
	$(CARGO) fmt --all
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml

# the benches drive containerd through CRI (the tests' engines and venv) on the release build
bench: test-deps build
	@for b in benches/*.sh; do echo ">> $$b"; bash $$b; done

clean-demo:
	@bash scripts/demo.sh --clean "$(DEMO_DIR)"
