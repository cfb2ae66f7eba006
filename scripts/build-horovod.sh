#!/usr/bin/env bash
# Build the patched Horovod wheel against a virtualenv's TensorFlow (TensorFlow + Gloo, no MPI).
# Used by scripts/setup.sh on this machine and by deploy/ansible on one device per architecture.
#   build-horovod.sh VENV OUT_DIR [SDIST]
# VENV holds the pinned TensorFlow stack; the wheel lands in OUT_DIR (copied, then renamed, so a
# killed build never leaves half a wheel); SDIST is Horovod's source archive when the machine
# has no index to download it from (devices provisioned offline).
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=3

horovod_version=0.28.1
venv=${1:?usage: build-horovod.sh VENV OUT_DIR [SDIST]}
out_dir=${2:?usage: build-horovod.sh VENV OUT_DIR [SDIST]}
sdist=${3:-}

log() { printf '[build-horovod] %s\n' "$*" >&2; }
# pip warns once per package about this machine's optional local indexes; hide only that line.
pip_quiet() { "$venv/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tf_version=$("$venv/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)
log "building Horovod $horovod_version against TensorFlow $tf_version (about 4 minutes on 2 cores)"
if [[ -z $sdist ]]; then
  pip_quiet download -q --no-deps --no-binary :all: "horovod==$horovod_version" -d "$work"
  sdist="$work/horovod-$horovod_version.tar.gz"
fi
tar -xzf "$sdist" -C "$work"
src="$work/horovod-$horovod_version"

# Horovod 0.28.1 is the last release; six source edits make it build and run here:
# 1. horovod/tensorflow/xla_mpi_ops.cc holds XLA GPU custom-call ops whose headers moved in
#    TensorFlow 2.16+; it is dropped from the build (no GPU here, nothing uses it).
# 2. GlooContext::InitializeForProcessSet never copies gloo_iface_ from the global context, so
#    process-set contexts fall back to the hostname, which on edge devices often resolves to
#    127.0.1.1; the one-line fix copies the interface.
# 3. One Gloo timeout (HOROVOD_GLOO_TIMEOUT_SECONDS) bounds both the rendezvous of a new ring and
#    every collective of a formed one; an elastic run needs a long wait for a joining device
#    that is still starting TensorFlow and a short one to notice a dead peer. Rendezvous()
#    waits for its peers under GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS when it is set, then hands the
#    formed context back its usual timeout, which every later collective takes.
# 4. The elastic driver tells rank 0's worker about host changes while it holds the lock that
#    every re-formation waits for, over a connect without a timeout: when rank 0's device has
#    vanished, three connects to it (~127 s of SYN retries each) stalled every survivor for
#    ~400 s on the fleet. The notification now runs in its own thread, outside the lock.
# 5. Before it starts, horovodrun checks ssh to every host with a fixed ConnectTimeout of 10 s
#    (SSH_CONNECT_TIMEOUT_S in runner/launch.py). An NB-IoT device is ~12 s of round trip from
#    the launcher, so not even TCP can connect in time, and horovodrun stopped with "could not
#    connect to some hosts via ssh" (on the fleet, 2026-11-27). The check now waits
#    GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS when that is set (10 otherwise); `fleet run` sets it.
# 6. Gloo's allgatherv (every Horovod allgather over Gloo) posts each ring hop's send before its
#    receive, unlike Gloo's ring allreduce. When the next rank's "ready to receive" is already
#    in, the message's bytes enter the device's uplink queue first and the rank's own "ready to
#    receive" waits behind all of them, so its upstream neighbour starts late and the ring's
#    hops take turns instead of overlapping: on 4 devices at 5 / 20 Mbit/s, gathers of 31-124 kB
#    took 1.48-1.83x their link time, allreduces of the same bytes 1.05-1.13x
#    (results/projection/gather-probe.jsonl). The receive is now posted first.
sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
grep -q 'xla_mpi_ops' "$src/horovod/tensorflow/CMakeLists.txt" && { log "could not drop xla_mpi_ops.cc"; exit 1; }
perl -0pi -e 's/(GlooContext::InitializeForProcessSet.*?)(\n([ \t]*)device_attr\.iface = gloo_iface_;)/$1\n$3gloo_iface_ = global_context.gloo_iface_;$2/s' \
  "$src/horovod/common/gloo/gloo_context.cc"
[[ $(grep -c 'gloo_iface_ = global_context.gloo_iface_;' "$src/horovod/common/gloo/gloo_context.cc") == 1 ]] \
  || { log "could not apply the Gloo interface fix"; exit 1; }
perl -0pi -e 's/(\n([ \t]*)context->setTimeout\(timeout\);\n[ \t]*context->connectFullMesh\(\*store, dev\);\n.*?opts\.setTimeout\(timeout\);\n.*?store->Finalize\(\);)/$1\n$2context->setTimeout(timeout);/s; s/(\n[ \t]*)(context->setTimeout\(timeout\);)(\n[ \t]*context->connectFullMesh)/$1auto join_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(\n      std::chrono::seconds(GetIntEnvOrDefault("GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS",\n          (int) std::chrono::duration_cast<std::chrono::seconds>(timeout).count())));$1context->setTimeout(join_timeout);$3/s; s/(gloo::BarrierOptions opts\(context\);\n[ \t]*)opts\.setTimeout\(timeout\);/$1opts.setTimeout(join_timeout);/s' \
  "$src/horovod/common/gloo/gloo_context.cc"
[[ $(grep -c 'join_timeout' "$src/horovod/common/gloo/gloo_context.cc") == 3 ]] \
  || { log "could not apply the rendezvous join timeout"; exit 1; }
perl -0pi -e 's/(\n([ \t]*)timestamp = _epoch_time_s\(\)\n)[ \t]*try:\n([ \t]*coordinator_client\.notify_hosts_updated)/$1$2threading.Thread(target=self._notify_coordinator, daemon=True,\n$2                 args=(coordinator_client, coordinator_slot_info, timestamp, update_res)).start()\n\n    def _notify_coordinator(self, coordinator_client, coordinator_slot_info, timestamp, update_res):\n$2try:\n$3/s' \
  "$src/horovod/runner/elastic/driver.py"
[[ $(grep -c '_notify_coordinator' "$src/horovod/runner/elastic/driver.py") == 2 ]] \
  || { log "could not move the host-change notification out of the driver's lock"; exit 1; }
perl -pi -e 's/^SSH_CONNECT_TIMEOUT_S = 10$/SSH_CONNECT_TIMEOUT_S = int(os.environ.get("GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS", "10"))/' \
  "$src/horovod/runner/launch.py"
[[ $(grep -c 'GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS' "$src/horovod/runner/launch.py") == 1 ]] \
  || { log "could not make horovodrun's ssh check timeout settable"; exit 1; }
perl -0pi -e 's/(out->send\(sendRank, slot, byteOffsets\[sendIndex\], byteCounts\[sendIndex\]\);)(\n[ \t]*)(out->recv\(recvRank, slot, byteOffsets\[recvIndex\], byteCounts\[recvIndex\]\);)/$3$2$1/g' \
  "$src/third_party/gloo/gloo/allgatherv.cc"
[[ $(grep -A1 'out->recv(recvRank, slot' "$src/third_party/gloo/gloo/allgatherv.cc" | grep -c 'out->send(sendRank, slot') == 2 ]] \
  || { log "could not post the allgather's receives before its sends"; exit 1; }
# Written only once every edit is verified: `globaldl doctor` reads it on every device, since
# the compiled library cannot show whether the interface fix went in.
cat >"$src/horovod/globaldl_patches.py" <<'PY'
"""Source edits applied by globaldl's scripts/build-horovod.sh before this Horovod was built."""

APPLIED = (
    "drop-xla-mpi-ops",
    "gloo-process-set-interface",
    "gloo-rendezvous-join-timeout",
    "elastic-notify-outside-lock",
    "ssh-check-connect-timeout",
    "gloo-allgather-receive-first",
)
PY

(
  cd "$src"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
    HOROVOD_CMAKE=${HOROVOD_CMAKE:-/usr/bin/cmake} MAKEFLAGS="-j$(nproc)"
  "$venv/bin/pip" wheel -q --no-build-isolation --no-deps . -w "$work/dist" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; exit 1; }
)
mkdir -p "$out_dir"
wheel=$(ls "$work"/dist/horovod-*.whl)
cp "$wheel" "$out_dir/.partial.whl"
mv "$out_dir/.partial.whl" "$out_dir/$(basename "$wheel")"
log "built $out_dir/$(basename "$wheel")"
