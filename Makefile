# gpufence — two entry points that do all the set-up on a fresh Debian 12 / Ubuntu machine (as root):
#   make demo   build, simulate a 4-GPU node, print inventory + CDI spec, run a podman container on GPU 1,
#               two containers sharing GPU 2 at 30 % and 70 %
#   make test   the whole test suite (unit, property, fuzz-bounded, end-to-end with runc/podman/containerd)
#   make fuzz   coverage-guided fuzzing (cargo-fuzz) of every untrusted-input parser, FUZZ_SECONDS each
#   make image  the installer OCI image (umoci, from scratch) in $(IMAGE_DIR)/oci, tagged with the version
#   make package  the .deb (cargo-deb) and .rpm (cargo-generate-rpm) in target/debian, target/generate-rpm

SHELL := /bin/bash
CARGO ?= cargo
DEMO_DIR ?= /tmp/gpufence-demo
# Debian packages the build, the demo and the end-to-end tests need.
APT_PACKAGES := runc podman containerd busybox-static gcc libc6-dev make umoci skopeo bpftool docker.io rpm \
                python3-venv python3-pip iproute2 uidmap binutils
PY_VENV := $(CURDIR)/target/venv

.PHONY: engines all deps rust package-tools build build-debug shim-compat demo test fuzz lint fmt bench clean-demo image package

all: build

# Install what is missing; idempotent and quiet when everything is there.
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo ">> installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (apt-get install$$missing)"; exit 1; fi; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	fi
	@$(MAKE) --no-print-directory rust package-tools
	@if [ ! -x $(PY_VENV)/bin/python ] || ! $(PY_VENV)/bin/python -c 'import cri_api, grpc, prometheus_client' 2>/dev/null; then \
	  echo ">> python venv for the CRI client and the Prometheus text parser"; mkdir -p target; python3 -m venv $(PY_VENV) && \
	  $(PY_VENV)/bin/python -m pip install -q 'container-runtime-interface-api==2.0.1' grpcio protobuf 'prometheus-client>=0.20'; \
	fi

rust:
	@command -v $(CARGO) >/dev/null 2>&1 || { \
	  echo ">> installing the Rust toolchain (rustup)"; \
	  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal && . $$HOME/.cargo/env; }

# cargo-deb and cargo-generate-rpm (make package; the package test): installed once into
# ~/.cargo/bin, which later runs (and CI on the same machine) reuse.
package-tools:
	@for t in cargo-deb cargo-generate-rpm; do \
	  command -v $$t >/dev/null 2>&1 || { echo ">> installing $$t"; $(CARGO) install --locked -q $$t; }; done

build: deps
	$(CARGO) build --release --workspace
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
	bash scripts/image.sh target/release $(IMAGE_DIR)

package: build
	$(CARGO) deb --no-build
	$(CARGO) generate-rpm
	@ls target/debian/*.deb target/generate-rpm/*.rpm

build-debug:
	$(CARGO) build --workspace

demo: build
	@bash scripts/demo.sh "$(DEMO_DIR)" target/release

# Container engines without known escapes for the end-to-end tests (runc 1.5.1, containerd 2.3.4):
# the project's shared build beside the checkout where present, else fetched into target/engines
# by scripts/engines.sh (official release binaries, sha256-checked). First on PATH for the tests,
# so containerd finds its shim and the shim its runc.
ENGINES_DIR ?= $(abspath $(firstword $(wildcard ../shared/engines/bin ../../shared/engines/bin) target/engines))
export ENGINES_DIR

engines:
	@bash scripts/engines.sh "$(ENGINES_DIR)" >/dev/null

test: deps engines
	$(CARGO) build --workspace --all-targets
	@mkdir -p target
	@echo ">> end-to-end tests on $$($(ENGINES_DIR)/runc --version | head -1), $$($(ENGINES_DIR)/containerd --version | cut -d' ' -f3) ($(ENGINES_DIR))"
	set -o pipefail; PATH="$(ENGINES_DIR):$$PATH" $(CARGO) test --workspace -- --test-threads=2 2>&1 | tee target/test.log
	@awk '/^test result:/ { p += $$4; f += $$6 } END { printf "%d passed, %d failed\n", p, f }' target/test.log

# Coverage-guided fuzzing, not part of `make test`: installs cargo-fuzz if missing, runs every
# target in fuzz/ for FUZZ_SECONDS (default 60) on the stable toolchain (RUSTC_BOOTSTRAP=1).
FUZZ_SECONDS ?= 60
fuzz: rust
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

lint:
	python3 scripts/layers.py
	python3 scripts/fn_length.py
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml

bench: build
	@for b in benches/*.sh; do echo ">> $$b"; bash $$b; done

clean-demo:
	@bash scripts/demo.sh --clean "$(DEMO_DIR)"
