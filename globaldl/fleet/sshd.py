"""One sshd per device (key login only), so horovodrun reaches devices as it reaches real hosts."""

from __future__ import annotations

import math
import os
import pwd
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from globaldl.files import write_text_atomically
from globaldl.fleet.cgroups import join_groups
from globaldl.fleet.system import CommandError, process_start_ticks, run

SSHD = "/usr/sbin/sshd"
SSH_PORT = 22
LOGIN_TIMEOUT_SECONDS = 20.0
# One attempt may take this long on a busy machine (a handful of devices' sshd on a fraction of
# a core each) before the next one starts.
ATTEMPT_TIMEOUT_SECONDS = 10.0
LOGIN_ROUND_TRIPS = 25


def connect_timeout_seconds(round_trip_ms: float) -> int:
    """The ssh ConnectTimeout for a host `round_trip_ms` away: 3 s plus two round trips.

    It bounds the TCP connect and the server's banner, a round trip each; on NB-IoT (~12 s of
    round trip) that is 28 s, where a fixed 10 s cannot even connect.
    """
    return 3 + math.ceil(2 * round_trip_ms / 1000)


def generate_key(path: Path, comment: str) -> str:
    """Create an ed25519 key pair at `path` (+ `.pub`); return the public key line."""
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return Path(f"{path}.pub").read_text().strip()


def sshd_config_text(
    address: str, host_key: Path, authorized_keys: list[Path], pid_file: Path
) -> str:
    """An sshd configuration for one device: its own address, root by key only, no PAM.

    `authorized_keys`: the fleet's key file, then the device's own, where provisioning
    (deploy/ansible) adds keys without touching the machine's ~/.ssh, which every device shares.
    """
    return "\n".join(
        [
            f"ListenAddress {address}:{SSH_PORT}",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {' '.join(str(path) for path in authorized_keys)}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # PAM (pam_systemd) would move sessions out of the device's cgroups.
            "UsePAM no",
            "StrictModes yes",
            # As a Debian sshd: file copies (Ansible, scp) go over sftp.
            "Subsystem sftp internal-sftp",
            "X11Forwarding no",
            "PrintMotd no",
            # sshd drops a login unfinished after 2 minutes by default: on NB-IoT a login
            # takes a dozen round trips of 12 s.
            "LoginGraceTime 900",
            # Horovod opens one ssh session per rank and per probe at once.
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "LogLevel INFO",
            "",
        ]
    )


def ensure_privilege_separation_dir() -> bool:
    """Create sshd's empty chroot directory /run/sshd if missing; return True if created here."""
    path = Path("/run/sshd")
    if path.is_dir():
        return False
    path.mkdir(mode=0o755)
    return True


def start_sshd(
    netns: str, hostname: str, config: Path, log: Path, groups: list[str]
) -> tuple[int, int]:
    """Start a device's sshd in its namespace, with its own host name, inside its cgroups.

    The launching process joins the cgroups before exec, so sshd and every session it forks
    (the training processes) inherit the device's CPU and memory limits. `unshare --uts` gives
    the device its own host name. Returns (pid, start ticks) of the daemonised sshd.
    """
    pid_file = _config_value(config, "PidFile")
    pid_file.unlink(missing_ok=True)
    launcher = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            netns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            # `ip netns exec` mounts a fresh /sys, which hides the cgroup hierarchies; mounting
            # the device's own controllers back lets it read its limits as a real device (or a
            # container) does. Best effort: the limits hold whether or not they can be read.
            'hostname "$1" && { mount -t tmpfs cgroup /sys/fs/cgroup && for c in cpu memory; do '
            "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c; "
            'done; } 2>/dev/null; exec "$2" -f "$3" -E "$4"',
            "sh",
            hostname,
            SSHD,
            str(config),
            str(log),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: join_groups(groups),  # noqa: PLW1509 (no threads run in the CLI)
        start_new_session=True,
    )
    try:
        _, stderr = launcher.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.communicate()
        raise RuntimeError(f"sshd for {netns} did not daemonise within 15 s; see {log}") from None
    if launcher.returncode != 0:
        raise RuntimeError(
            f"sshd for {netns} failed to start (exit {launcher.returncode}): {stderr.strip()}; see "
            f"{log}"
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        if text:
            pid = int(text)
            ticks = process_start_ticks(pid)
            if ticks is not None:
                return pid, ticks
        time.sleep(0.05)
    raise RuntimeError(f"sshd for {netns} wrote no pid file {pid_file} within 10 s; see {log}")


def _config_value(config: Path, key: str) -> Path:
    for line in config.read_text().splitlines():
        if line.startswith(f"{key} "):
            return Path(line.split(maxsplit=1)[1])
    raise ValueError(f"{config} has no {key}")


def wait_for_login(
    address: str, identity_file: Path, expected_hostname: str, round_trip_ms: float = 0.0
) -> None:
    """Log in by key as horovodrun will, until the device answers with its own host name.

    An ssh login costs a dozen round trips (TCP, key exchange, authentication, the command)
    and more where TCP retransmits before it has measured the round trip,
    so every wait grows with the device's round trip to the host; on NB-IoT that is minutes.
    """
    round_trips_seconds = LOGIN_ROUND_TRIPS * round_trip_ms / 1000
    timeout_seconds = LOGIN_TIMEOUT_SECONDS + 2 * round_trips_seconds
    deadline = time.monotonic() + timeout_seconds
    last_error = ""
    while time.monotonic() < deadline:
        try:
            completed = run(
                [
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "StrictHostKeyChecking=no",
                    # Our own probe must not add entries to the user's known_hosts.
                    "-o",
                    "UserKnownHostsFile=/dev/null",
                    "-o",
                    "LogLevel=ERROR",
                    "-o",
                    f"ConnectTimeout={connect_timeout_seconds(round_trip_ms)}",
                    "-i",
                    str(identity_file),
                    f"root@{address}",
                    "hostname",
                ],
                check=False,
                timeout_seconds=ATTEMPT_TIMEOUT_SECONDS + round_trips_seconds,
            )
        except CommandError as error:  # this attempt timed out: try again until the deadline
            last_error = str(error)
            continue
        if completed.returncode == 0 and completed.stdout.strip() == expected_hostname:
            return
        last_error = completed.stderr.strip() or f"host name {completed.stdout.strip()!r}"
        time.sleep(0.2)
    raise RuntimeError(
        f"could not log in to {expected_hostname} ({address}) by ssh within {timeout_seconds:g} s: "
        f"{last_error}"
    )


# horovodrun reaches every worker through one long ssh session, and Horovod Elastic re-forms
# the ring only once the session of a lost worker has ended. A device that vanishes without
# closing it (power lost, link gone, or its sshd's FIN dropped with the packets still queued
# on its shaped link when `fleet kill` takes the link down) leaves the session open for good:
# measured, a chaos run hung 13 minutes after such a kill. ssh's own keepalive ends it.
CLIENT_CONFIG_DIR = Path("/etc/ssh/ssh_config.d")
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_MISSES = 3


def keepalive_config_path(prefix: str, config_dir: Path = CLIENT_CONFIG_DIR) -> Path:
    """The ssh client settings `fleet up` writes for its devices (removed by `fleet down`)."""
    return config_dir / f"globaldl-fleet-{prefix}.conf"


def keepalive_misses(round_trip_ms: float) -> int:
    """Unanswered keepalives before ssh ends a session: 3, and one more per 5 s of slack.

    A keepalive waits behind whatever the link has queued; ten round trips of slack per
    device keep a slow but live NB-IoT device (seconds per round trip) connected.
    """
    slack_seconds = 10 * max(round_trip_ms, 0.0) / 1000
    return KEEPALIVE_MISSES + int(slack_seconds // KEEPALIVE_INTERVAL_SECONDS)


def keepalive_config(prefix: str, devices: Sequence[tuple[str, float]]) -> str:
    """The ssh client settings per device address, from `(address, round trip in ms)` pairs."""
    lines = [
        f"# Written by `globaldl fleet up` (prefix {prefix}); removed by `globaldl fleet down`.",
        "# horovodrun's session to a device must end when the device vanishes without closing",
        "# it: Horovod Elastic re-forms the ring only then (globaldl/fleet/sshd.py).",
    ]
    for address, round_trip_ms in devices:
        lines += [
            f"Host {address}",
            f"    ServerAliveInterval {KEEPALIVE_INTERVAL_SECONDS}",
            f"    ServerAliveCountMax {keepalive_misses(round_trip_ms)}",
        ]
    return "\n".join(lines) + "\n"


def known_hosts_path() -> Path:
    """The file ssh (and so horovodrun) adds host keys to: ~/.ssh/known_hosts of the real user."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"


def forget_host_keys(known_hosts: Path, public_keys: list[str]) -> int:
    """Drop known_hosts lines holding one of our (fresh, fleet-only) host keys; return how many.

    Matching on the key rather than the address works with hashed host names and never
    touches an entry for another machine that happened to use the same address.
    """
    ours = {" ".join(key.split()[:2]) for key in public_keys}
    try:
        lines = known_hosts.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    kept = [line for line in lines if " ".join(line.split()[1:3]) not in ours]
    removed = len(lines) - len(kept)
    if removed:
        write_text_atomically(known_hosts, "".join(kept), mode=known_hosts.stat().st_mode & 0o777)
    return removed
