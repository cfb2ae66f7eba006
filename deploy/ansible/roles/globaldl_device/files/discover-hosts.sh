#!/bin/sh
# Horovod Elastic host discovery for a provisioned fleet: prints the ADDR:SLOTS lines of
# elastic-hosts (beside this script, written by deploy/ansible) whose sshd answers within 2 s,
# so a device that dies drops out and one that comes back is taken in again.
#   horovodrun -np 4 --min-np 2 --host-discovery-script ~/globaldl-fleet/discover-hosts.sh ...
here=$(cd "$(dirname "$0")" && pwd)
while IFS= read -r entry; do
  case $entry in '' | '#'*) continue ;; esac
  address=${entry%:*}
  if timeout 2 bash -c "exec 3<>/dev/tcp/$address/22" 2>/dev/null; then
    echo "$entry"
  fi
done <"$here/elastic-hosts"
