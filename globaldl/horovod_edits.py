"""The names of scripts/build-horovod.sh's source edits to Horovod, as the built wheel records them.

The build writes every name into `horovod/globaldl_patches.py` (`APPLIED`) once the edit is
verified; scripts/setup.sh and the Ansible role spell the newest name and the wheel tag
themselves.
"""

from __future__ import annotations

INTERFACE_FIX = "gloo-process-set-interface"
JOIN_TIMEOUT = "gloo-rendezvous-join-timeout"
NOTIFY_OUTSIDE_LOCK = "elastic-notify-outside-lock"
SSH_CONNECT_TIMEOUT = "ssh-check-connect-timeout"
ALLGATHER_RECEIVE_FIRST = "gloo-allgather-receive-first"
# A wheel without it was built by an older build script.
NEWEST = ALLGATHER_RECEIVE_FIRST
# scripts/setup.sh caches its wheel under horovod-VERSION-WHEEL_TAG-tfTF-TAG; a new edit bumps it.
WHEEL_TAG = "patched6"


def installed() -> tuple[str, ...]:
    """The edits of the Horovod this process imports; () for a Horovod globaldl did not build."""
    try:
        from horovod import globaldl_patches
    except ImportError:
        return ()
    return tuple(getattr(globaldl_patches, "APPLIED", ()))
