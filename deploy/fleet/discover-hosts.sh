#!/bin/sh
# Horovod Elastic host discovery for the emulated fleet: prints ADDR:1 per live device
# (devices taken out with `globaldl fleet kill` disappear, `fleet revive` brings them back).
#   horovodrun -np 2 --min-np 1 --gloo --host-discovery-script deploy/fleet/discover-hosts.sh \
#     --ssh-identity-file /run/globaldl-fleet/ssh/id_ed25519 ...
# GLOBALDL_FLEET_STATE_DIR selects the fleet (default /run/globaldl-fleet). The module is run
# directly because Horovod calls this every few seconds and `globaldl` itself loads TensorFlow.
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../../.venv/bin/python" -m globaldl.cli.fleet hosts
