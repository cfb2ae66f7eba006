"""Horovod and Gloo settings that fit the fleet's links: cycle time and timeouts, or a refusal.

Gloo gives up on any single wait of a collective after HOROVOD_GLOO_TIMEOUT_SECONDS (30 s by
default), and horovodrun on the start of its workers after `--start-timeout`. On NB-IoT a
dense LeNet step moves 370 kB per device through 26 kbit/s: minutes per step, past both. So
before it launches, `fleet run` estimates what one dense exchange takes on the fleet's worst
path and sets the timeouts to cover it, or refuses with the numbers when the user's own
setting (or the run's time limit) cannot be met; never a silent hang.

The estimate is a ring allreduce of the model's dense fp32 gradients over N devices: each
device sends 2(N-1)/N of them through the narrowest link on any device-to-device path, in
2(N-1) rounds that each wait for the worst one-way delay (plus jitter). Every codec of
globaldl sends fewer bytes per rank than that in any single round (a round of an allgather
carries one rank's compressed payload), so a timeout sized for the dense exchange also covers
every single wait of a compressed one.

horovodrun itself first checks ssh to every device with a fixed 10 s ConnectTimeout, shorter
than one NB-IoT round trip; globaldl's build of Horovod reads that timeout from
GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS (scripts/build-horovod.sh, edit 5), which `fleet run` sets
from the devices' round trip to this host, or refuses to launch when that Horovod lacks the edit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from globaldl import horovod_edits
from globaldl.fleet.cycle_time import auto_cycle_time_ms
from globaldl.fleet.launcher import REACH_TIMEOUT_SECONDS
from globaldl.fleet.paths import HOST, fleet_path
from globaldl.fleet.shaping import ETHERNET_FRAME_BYTES, LinkDirection
from globaldl.fleet.sshd import connect_timeout_seconds
from globaldl.fleet.state import FleetState

GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
CYCLE_TIME_ENV = "HOROVOD_CYCLE_TIME"
HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS = 30
SSH_CONNECT_TIMEOUT_ENV = "GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS"
HOROVOD_SSH_CONNECT_TIMEOUT_SECONDS = 10  # runner/launch.py's SSH_CONNECT_TIMEOUT_S
# Headroom over the estimate: TCP restarts slow start after an idle step, and a device may
# still be computing when its peers are already waiting for it.
SAFETY_FACTOR = 3.0
# Connecting every pair of ranks and the rendezvous cost a handful of round trips.
SETUP_ROUND_TRIPS = 10
# horovodrun's start: ssh checks and logins (a dozen round trips each, more while TCP still
# retransmits early), the task services, the rendezvous.
START_ROUND_TRIPS = 40
# With full frames of 1514 bytes, TCP carries 1448 payload bytes.
WIRE_BYTES_PER_PAYLOAD_BYTE = ETHERNET_FRAME_BYTES / 1448


class LinkBudgetError(ValueError):
    """The links cannot carry the run within the timeouts the user set; the message says why."""


@dataclass(frozen=True)
class LinkBudget:
    """The worst the fleet's links offer a collective."""

    devices: int
    narrowest_up_kbit_per_second: float
    narrowest_down_kbit_per_second: float
    narrowest_path_kbit_per_second: float
    worst_one_way_ms: float  # device to device, delays plus jitter
    worst_host_round_trip_ms: float  # device to the core (horovodrun's driver), plus jitter

    @property
    def worst_round_trip_ms(self) -> float:
        """Device to device and back, at worst."""
        return 2 * self.worst_one_way_ms

    def dense_exchange_seconds(self, gradient_bytes: int) -> float:
        """One ring allreduce of `gradient_bytes` per device across the fleet (see module doc)."""
        if self.devices < 2:
            return 0.0
        rounds = 2 * (self.devices - 1)
        sent_bytes = rounds / self.devices * gradient_bytes * WIRE_BYTES_PER_PAYLOAD_BYTE
        transfer_seconds = sent_bytes * 8 / (self.narrowest_path_kbit_per_second * 1000)
        return transfer_seconds + rounds * self.worst_one_way_ms / 1000


def link_budget(state: FleetState, devices: Sequence[str]) -> LinkBudget:
    """The budget of the paths between `devices` (device names) and to the core."""
    if not devices:
        raise ValueError("a link budget needs at least one device")
    pairs = [fleet_path(state, a, b) for a, b in itertools.permutations(devices, 2)]
    to_host = [fleet_path(state, name, HOST) for name in devices]
    profiles = [state.device(name).profile for name in devices]
    profiles += [state.site(site).wan for site in {state.device(n).site for n in devices} if site]
    frame = ETHERNET_FRAME_BYTES
    return LinkBudget(
        devices=len(devices),
        narrowest_up_kbit_per_second=min(p.up_kbit_per_second for p in profiles),
        narrowest_down_kbit_per_second=min(p.down_kbit_per_second for p in profiles),
        narrowest_path_kbit_per_second=min(
            (p.rate_bits_per_second / 1000 for p in pairs),
            default=min(p.up_kbit_per_second for p in profiles),
        ),
        worst_one_way_ms=max(
            (p.one_way_ms(True, frame) + _jitter(p.forward) for p in pairs), default=0.0
        ),
        worst_host_round_trip_ms=max(
            p.round_trip_ms(frame) + _jitter(p.forward) + _jitter(p.backward) for p in to_host
        ),
    )


def _jitter(hops: Sequence[LinkDirection]) -> float:
    return sum(hop.jitter_ms for hop in hops)


@dataclass(frozen=True)
class HorovodLinkSettings:
    """What `fleet run` sets for Horovod, and why."""

    cycle_time_ms: float
    gloo_timeout_seconds: int
    start_timeout_seconds: int
    reach_timeout_seconds: float
    ssh_connect_timeout_seconds: int
    dense_gradient_bytes: int | None
    dense_exchange_seconds: float | None
    notes: tuple[str, ...]

    def environment(self) -> dict[str, str]:
        """The variables of horovodrun's own ssh check and those it forwards to every worker."""
        return {
            CYCLE_TIME_ENV: f"{self.cycle_time_ms:g}",
            GLOO_TIMEOUT_ENV: str(self.gloo_timeout_seconds),
            SSH_CONNECT_TIMEOUT_ENV: str(self.ssh_connect_timeout_seconds),
        }


def horovod_link_settings(
    budget: LinkBudget,
    *,
    dense_gradient_bytes: int | None,
    compressed: bool,
    environ: Mapping[str, str],
    start_timeout_seconds: int | None,
    default_start_timeout_seconds: int,
    run_timeout_seconds: float,
    horovod_edits_installed: Sequence[str],
) -> HorovodLinkSettings:
    """Cycle time and timeouts for the budget; LinkBudgetError where the user's own can't hold.

    A cycle time or Gloo timeout in `environ` is the user's choice and is kept; a Gloo timeout
    shorter than one exchange needs is refused for a dense run (it would fail on its first
    step) and reported for a compressed one (its exchanges are smaller). A start timeout is
    only ever raised.
    """
    notes: list[str] = []
    exchange = None
    if dense_gradient_bytes is not None:
        exchange = budget.dense_exchange_seconds(dense_gradient_bytes)
        notes.append(
            f"a dense exchange of {dense_gradient_bytes:,} gradient bytes across "
            f"{budget.devices} devices takes ~{exchange:.1f} s (narrowest path "
            f"{budget.narrowest_path_kbit_per_second:g} kbit/s, worst one-way "
            f"{budget.worst_one_way_ms:.0f} ms)"
        )
    setup_seconds = (
        SETUP_ROUND_TRIPS * max(budget.worst_round_trip_ms, budget.worst_host_round_trip_ms) / 1000
    )
    needed_timeout = max(
        HOROVOD_DEFAULT_GLOO_TIMEOUT_SECONDS,
        math.ceil(SAFETY_FACTOR * (exchange or 0.0) + setup_seconds),
    )
    if exchange is not None and not compressed and exchange > run_timeout_seconds:
        raise LinkBudgetError(
            f"one dense exchange takes ~{exchange:.0f} s on these links ({notes[-1]}), longer "
            f"than the run may last (--timeout-seconds {run_timeout_seconds:g}); compress the "
            "gradients (e.g. --prune topk --quantize int8), use faster links, or allow more time"
        )
    gloo_timeout = needed_timeout
    if GLOO_TIMEOUT_ENV in environ:
        gloo_timeout = _positive_int(GLOO_TIMEOUT_ENV, environ[GLOO_TIMEOUT_ENV])
        if gloo_timeout < needed_timeout:
            problem = (
                f"{GLOO_TIMEOUT_ENV}={gloo_timeout} is shorter than a collective may wait on these "
                f"links ({needed_timeout} s: {SAFETY_FACTOR:g} x the exchange plus "
                f"{SETUP_ROUND_TRIPS} round trips of {budget.worst_round_trip_ms:.0f} ms)"
            )
            if not compressed and exchange is not None:
                raise LinkBudgetError(
                    f"{problem}; {notes[-1]}. Raise it to at least {needed_timeout}, or unset it "
                    "and `fleet run` sets it"
                )
            notes.append(f"{problem}; kept, as compressed exchanges are smaller")
        else:
            notes.append(f"{GLOO_TIMEOUT_ENV}={gloo_timeout} as set (>= {needed_timeout} needed)")
    else:
        notes.append(f"{GLOO_TIMEOUT_ENV}={gloo_timeout}")
    if CYCLE_TIME_ENV in environ:
        cycle_time = _positive_float(CYCLE_TIME_ENV, environ[CYCLE_TIME_ENV])
        notes.append(f"{CYCLE_TIME_ENV}={cycle_time:g} ms as set")
    else:
        cycle_time = auto_cycle_time_ms(
            budget.narrowest_up_kbit_per_second, budget.narrowest_down_kbit_per_second
        )
        notes.append(f"{CYCLE_TIME_ENV}={cycle_time:g} ms for the narrowest link")
    start_needed = default_start_timeout_seconds + math.ceil(
        START_ROUND_TRIPS * budget.worst_host_round_trip_ms / 1000
    )
    start_timeout = max(start_timeout_seconds or default_start_timeout_seconds, start_needed)
    if start_timeout_seconds is not None and start_timeout > start_timeout_seconds:
        notes.append(
            f"--start-timeout raised from {start_timeout_seconds} to {start_timeout} s "
            f"({START_ROUND_TRIPS} round trips of {budget.worst_host_round_trip_ms:.0f} ms to the "
            "host)"
        )
    ssh_timeout = _ssh_connect_timeout(budget, environ, horovod_edits_installed, notes)
    return HorovodLinkSettings(
        cycle_time_ms=cycle_time,
        gloo_timeout_seconds=gloo_timeout,
        start_timeout_seconds=start_timeout,
        # A TCP connect to each device's sshd: one round trip, and SYN retries on slow links.
        reach_timeout_seconds=REACH_TIMEOUT_SECONDS + 2 * budget.worst_host_round_trip_ms / 1000,
        ssh_connect_timeout_seconds=ssh_timeout,
        dense_gradient_bytes=dense_gradient_bytes,
        dense_exchange_seconds=exchange,
        notes=tuple(notes),
    )


def _ssh_connect_timeout(
    budget: LinkBudget, environ: Mapping[str, str], installed: Sequence[str], notes: list[str]
) -> int:
    """The timeout of horovodrun's ssh check: the user's, else 10 s or what the link needs.

    LinkBudgetError when the link needs more and the installed Horovod cannot be told so.
    """
    needed = max(
        HOROVOD_SSH_CONNECT_TIMEOUT_SECONDS,
        connect_timeout_seconds(budget.worst_host_round_trip_ms),
    )
    if SSH_CONNECT_TIMEOUT_ENV in environ:
        timeout = _positive_int(SSH_CONNECT_TIMEOUT_ENV, environ[SSH_CONNECT_TIMEOUT_ENV])
        notes.append(f"{SSH_CONNECT_TIMEOUT_ENV}={timeout} as set ({needed} s suggested)")
    elif needed == HOROVOD_SSH_CONNECT_TIMEOUT_SECONDS:
        return needed
    else:
        timeout = needed
        notes.append(
            f"{SSH_CONNECT_TIMEOUT_ENV}={timeout} for horovodrun's ssh check (Horovod's own "
            f"{HOROVOD_SSH_CONNECT_TIMEOUT_SECONDS} s is less than 3 s plus two round trips of "
            f"{budget.worst_host_round_trip_ms:.0f} ms to the host)"
        )
    if timeout > HOROVOD_SSH_CONNECT_TIMEOUT_SECONDS and (
        horovod_edits.SSH_CONNECT_TIMEOUT not in installed
    ):
        raise LinkBudgetError(
            "horovodrun checks ssh to every device within "
            f"{HOROVOD_SSH_CONNECT_TIMEOUT_SECONDS} s, and a device is "
            f"{budget.worst_host_round_trip_ms:.0f} ms of round trip from this host ({needed} s "
            "needed); this Horovod lacks the edit that makes the wait "
            f"settable ({horovod_edits.SSH_CONNECT_TIMEOUT}): install the wheel of "
            "scripts/build-horovod.sh (`make setup`)"
        )
    return timeout


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a whole number of seconds >= 1, got {text!r}")
    return value


def _positive_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{name} must be a number of milliseconds > 0, got {text!r}")
    return value
