#!/usr/bin/env bash
# Idempotent set-up: Debian packages, .venv, the pinned TensorFlow stack, and Horovod 0.28.1
# built against it (TensorFlow + Gloo, no MPI) with the built wheel cached outside the repo.
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=3

repo=$(cd "$(dirname "$0")/.." && pwd)
venv="$repo/.venv"
python=${GLOBALDL_PYTHON:-python3}
cache=${GLOBALDL_CACHE:-$HOME/.cache/globaldl}
horovod_version=0.28.1
# vde2: user-space links with delay, jitter and loss for the fleet (this kernel has no netem).
apt_packages=(build-essential cmake git openssh-server openssh-client iproute2 prometheus prometheus-node-exporter vde2)

log() { printf '[setup] %s\n' "$*" >&2; }
# pip warns once per package about this machine's optional local indexes; hide only that line.
pip_quiet() { "$venv/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

install_apt_packages() {
  local missing=()
  for package in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) -ne 0 ]]; then
    log "missing Debian packages: ${missing[*]}; run as root or install them yourself"; exit 1
  fi
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's prometheus packages start their services on install; globaldl runs its own
  # Prometheus on loopback, so keep the packaged ones from starting.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
}

# Horovod 0.28.1 is the last release; two source edits make it build and run here:
# 1. horovod/tensorflow/xla_mpi_ops.cc holds XLA GPU custom-call ops whose headers moved in
#    TensorFlow 2.16+; it is dropped from the build (no GPU here, nothing uses it).
# 2. GlooContext::InitializeForProcessSet never copies gloo_iface_ from the global context, so
#    process-set contexts fall back to the hostname, which on edge devices often resolves to
#    127.0.1.1; the one-line fix copies the interface.
build_horovod_wheel() {
  local wheel_dir=$1 work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  log "building Horovod $horovod_version against TensorFlow $tf_version (about 4 minutes on 2 cores)"
  pip_quiet download -q --no-deps --no-binary :all: "horovod==$horovod_version" -d "$work"
  tar -xzf "$work"/horovod-"$horovod_version".tar.gz -C "$work"
  local src="$work/horovod-$horovod_version"
  sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  grep -q 'xla_mpi_ops' "$src/horovod/tensorflow/CMakeLists.txt" && { log "could not drop xla_mpi_ops.cc"; exit 1; }
  perl -0pi -e 's/(GlooContext::InitializeForProcessSet.*?)(\n([ \t]*)device_attr\.iface = gloo_iface_;)/$1\n$3gloo_iface_ = global_context.gloo_iface_;$2/s' \
    "$src/horovod/common/gloo/gloo_context.cc"
  [[ $(grep -c 'gloo_iface_ = global_context.gloo_iface_;' "$src/horovod/common/gloo/gloo_context.cc") == 1 ]] \
    || { log "could not apply the Gloo interface fix"; exit 1; }
  (
    cd "$src"
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
      HOROVOD_CMAKE=/usr/bin/cmake MAKEFLAGS="-j$(nproc)"
    "$venv/bin/pip" wheel -q --no-build-isolation --no-deps . -w "$work/dist" >"$work/build.log" 2>&1 \
      || { tail -40 "$work/build.log" >&2; exit 1; }
  )
  mkdir -p "$wheel_dir"
  # Copy then rename so a killed set-up never leaves a half-written wheel in the cache.
  local wheel
  wheel=$(ls "$work"/dist/horovod-*.whl)
  cp "$wheel" "$wheel_dir/.partial.whl"
  mv "$wheel_dir/.partial.whl" "$wheel_dir/$(basename "$wheel")"
}

install_apt_packages

stamp="$venv/.globaldl-setup"
fingerprint=$(cat "$repo/pyproject.toml" "$repo/scripts/setup.sh" | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$fingerprint" && -x $venv/bin/horovodrun ]]; then
  log "up to date ($venv)"; exit 0
fi

[[ -x $venv/bin/python ]] || { log "creating $venv with $($python --version)"; "$python" -m venv "$venv"; }
pip_quiet install -q --upgrade "pip>=24" "setuptools>=77,<81" wheel
log "installing globaldl and its pinned dependencies"
pip_quiet install -q -e "$repo[dev]"

tf_version=$("$venv/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)
py_tag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheel_dir="$cache/horovod-$horovod_version-tf$tf_version-$py_tag"
if ! "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
  ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1 || build_horovod_wheel "$wheel_dir"
  log "installing Horovod from $wheel_dir"
  pip_quiet install -q --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
  pip_quiet install -q "cloudpickle" "psutil" "pyyaml" "packaging"
fi
check_build=$("$venv/bin/horovodrun" --check-build 2>/dev/null)
grep -q '\[X\] TensorFlow' <<<"$check_build" || { log "Horovod lacks TensorFlow: $check_build"; exit 1; }
grep -q '\[X\] Gloo' <<<"$check_build" || { log "Horovod lacks Gloo: $check_build"; exit 1; }
echo "$fingerprint" > "$stamp"
log "ready: $($venv/bin/python -c 'import tensorflow as tf, horovod; print("TensorFlow", tf.__version__, "Horovod", horovod.__version__)' 2>/dev/null)"
