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
# python3-apt, python3-venv, python3-dev: what deploy/ansible needs on a device (the emulated
# devices share this machine); wireguard-tools, wireguard-go: the overlay test (this kernel has
# no WireGuard module, wireguard-go is the userspace implementation); vde2: the fleet's
# links with delay, jitter and loss (vde_switch, wirefilter; this kernel has no netem);
# python3-simgrid: SimGrid 3.32, the engine behind `globaldl simulate`, loaded by file path.
apt_packages=(build-essential cmake git openssh-server openssh-client iproute2 prometheus prometheus-node-exporter
  python3-apt python3-venv python3-dev wireguard-tools wireguard-go vde2 python3-simgrid)

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

install_apt_packages

stamp="$venv/.globaldl-setup"
fingerprint=$(cat "$repo/pyproject.toml" "$repo/scripts/setup.sh" "$repo/scripts/build-horovod.sh" | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$fingerprint" && -x $venv/bin/horovodrun ]]; then
  log "up to date ($venv)"; exit 0
fi

[[ -x $venv/bin/python ]] || { log "creating $venv with $($python --version)"; "$python" -m venv "$venv"; }
pip_quiet install -q --upgrade "pip>=24" "setuptools>=77,<81" wheel
log "installing globaldl and its pinned dependencies"
# deploy: ansible-core, for deploy/ansible (provisioning real devices).
# setuptools' notice about editable installs is advice for src-less layouts, printed on every
# set-up; the tests guard the real risk (pytest runs as a console script, see the Makefile).
PYTHONWARNINGS="ignore:Editable installation" pip_quiet install -q -e "$repo[dev,deploy]"

tf_version=$("$venv/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)
py_tag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# "patched6": wheels from scripts/build-horovod.sh, which marks its six source edits in
# horovod.globaldl_patches (deploy/ansible looks the wheel up here under the same name). A
# Horovod without the newest edit (an older set-up's wheel) is replaced.
wheel_dir="$cache/horovod-$horovod_version-patched6-tf$tf_version-$py_tag"
if ! "$venv/bin/python" -c 'import horovod.tensorflow, horovod.globaldl_patches as p
assert "gloo-allgather-receive-first" in p.APPLIED' 2>/dev/null; then
  ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1 || bash "$repo/scripts/build-horovod.sh" "$venv" "$wheel_dir"
  log "installing Horovod from $wheel_dir"
  pip_quiet install -q --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
  pip_quiet install -q "cloudpickle" "psutil" "pyyaml" "packaging"
fi
check_build=$("$venv/bin/horovodrun" --check-build 2>/dev/null)
grep -q '\[X\] TensorFlow' <<<"$check_build" || { log "Horovod lacks TensorFlow: $check_build"; exit 1; }
grep -q '\[X\] Gloo' <<<"$check_build" || { log "Horovod lacks Gloo: $check_build"; exit 1; }
echo "$fingerprint" > "$stamp"
log "ready: $($venv/bin/python -c 'import tensorflow as tf, horovod; print("TensorFlow", tf.__version__, "Horovod", horovod.__version__)' 2>/dev/null)"
