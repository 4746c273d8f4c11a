#!/usr/bin/env bash
# Installs the Debian packages that building, testing and benchmarking Tessera need.
# Idempotent: packages already present are skipped; `apt-get update` runs at most once.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN's CMake config requires the OpenCL headers
  libtomlplusplus-dev
  nlohmann-json3-dev
  libsentencepiece-dev libxxhash-dev libzstd-dev
  libfmt-dev
  libgloo-dev  # CPU collectives (comm/gloo)
  libcurl4-openssl-dev  # the etcd store speaks to etcd's v3 JSON gateway over HTTP
  libssl-dev  # libcrypto: the stores' HMAC proofs of the job token
  etcd-server  # /usr/bin/etcd for the etcd store's tests (they start their own on free ports)
  python3 python3-torch python3-numpy python3-yaml  # python3-yaml: tests/deploy_test.py
  libopenblas0-pthread  # the BLAS the PyTorch peer is measured with (Debian defaults to the slow reference BLAS)
  libtcmalloc-minimal4
  clang libclang-rt-14-dev libomp-dev  # the fuzz preset: clang, its libFuzzer/sanitizer runtimes, its OpenMP
  libcpp-httplib-dev  # the Prometheus endpoint
  prometheus  # promtool and a real Prometheus server for the endpoint's tests
  chromium fonts-dejavu-core  # the run report page's test (headless screenshot and DOM)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
