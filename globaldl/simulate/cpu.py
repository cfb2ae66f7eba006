"""A device's CPU under a cgroup v1 CFS quota: full core speed until the period's quota is spent.

The fleet caps each device with `cpu.cfs_quota_us = cores x cpu.cfs_period_us` (period 100 ms).
The kernel lets the cgroup run at full speed until it has used its quota for the current
period, then stops it until the next period starts; unused quota is not carried over. So a
burst shorter than the quota runs at full speed (a quarter-core device computes a 10 ms step in
10 ms, not 40 ms), while work longer than the quota, or work that meets a quota another thread
already spent, waits for the next period. A fluid "q cores" model gets both wrong.

`CfsQuota` tracks this per device, vectorised over devices. Work is given in CPU-seconds of the
reference core (a device's `speed` divides it beforehand). A device runs at one core while it
runs, or at `rate` cores where devices share a host: the emulated fleet's devices compute in
step with each other on one machine's cores, so each runs at that machine's cores divided among
them (a real device has its own core: rate 1). A device whose quota is at least its rate never
spends it. The model remembers the use of the two latest periods a device touched, so work
may be handed over slightly out of time order (Horovod's loop reserving its cycle just before
the training thread's compute catches up); the two share the quota by alternating `advance`
and `run` calls.
"""

from __future__ import annotations

import numpy as np

CFS_PERIOD_SECONDS = 0.1
_EPSILON = 1e-12


class CfsQuota:
    """Quota accounting of many devices, each with its own period phase (cgroups start apart)."""

    def __init__(
        self,
        cores: np.ndarray,
        period_offset_seconds: np.ndarray | None = None,
        period_seconds: float = CFS_PERIOD_SECONDS,
        rate: np.ndarray | float = 1.0,
    ) -> None:
        self.cores = np.asarray(cores, dtype=float)
        if np.any(self.cores <= 0):
            raise ValueError(f"cores must be > 0, got {self.cores[self.cores <= 0][:3]}")
        if not period_seconds > 0:
            raise ValueError(f"period_seconds must be > 0, got {period_seconds!r}")
        count = len(self.cores)
        self.rate = np.array(np.broadcast_to(np.asarray(rate, dtype=float), (count,)))
        if np.any(~(self.rate > 0)) or np.any(self.rate > 1):
            raise ValueError(f"rate must be in (0, 1] cores, got {self.rate[:3]}")
        # A quota below the rate can be spent within a period; at or above it, never.
        self.binding = self.cores < self.rate
        self.period_seconds = float(period_seconds)
        self.offset = (
            np.zeros(count)
            if period_offset_seconds is None
            else np.asarray(period_offset_seconds, dtype=float) % self.period_seconds
        )
        # CPU-seconds used in the two latest periods each device touched (index, use).
        self.period = np.full((2, count), -1, dtype=np.int64)
        self.used = np.zeros((2, count))

    def _period_of(self, times: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """The period each time falls in, consistent with `_period_end`.

        Hours into a simulation, a division alone can put a period's end into the period it
        ends; the model would then never leave it.
        """
        index = np.floor((times - offset) / self.period_seconds).astype(np.int64)
        return np.where(self._period_end(index, offset) <= times, index + 1, index)

    def _period_end(self, index: np.ndarray, offset: np.ndarray) -> np.ndarray:
        return offset + (index + 1) * self.period_seconds

    def run(
        self, start_seconds: np.ndarray, cpu_seconds: np.ndarray, devices: np.ndarray | None = None
    ) -> np.ndarray:
        """When work of `cpu_seconds` started at `start_seconds` is done, on each device.

        The work runs at the device's rate (one core, or its share of a shared host) while the
        period's quota lasts; when the quota is spent it waits for the next period. `devices`
        selects a subset (default: all).
        """
        finish, _ = self.advance(start_seconds, cpu_seconds, np.inf, devices)
        return finish

    def advance(
        self,
        start_seconds: np.ndarray,
        cpu_seconds: np.ndarray,
        until_seconds: np.ndarray | float,
        devices: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run work from `start_seconds`, but no later than `until_seconds`.

        Returns (when each device stopped: done or at `until_seconds`, work still left).
        """
        index = slice(None) if devices is None else np.asarray(devices)
        shape = self.cores[index].shape
        time_now = np.array(np.broadcast_to(start_seconds, shape), dtype=float)
        remaining = np.array(np.broadcast_to(cpu_seconds, shape), dtype=float)
        until = np.broadcast_to(np.asarray(until_seconds, dtype=float), shape)
        busy = (remaining > _EPSILON) & (time_now < until)
        if not busy.any():
            return time_now, np.where(remaining > _EPSILON, remaining, 0.0)
        if np.any(remaining < 0):
            raise ValueError("cpu_seconds must be >= 0")
        cores, offset, rate = self.cores[index], self.offset[index], self.rate[index]
        quota = cores * self.period_seconds
        unlimited = ~self.binding[index]
        periods, uses = self.period[:, index].copy(), self.used[:, index].copy()
        columns = np.arange(len(cores))
        while np.any(busy):
            current = self._period_of(time_now, offset)
            slot = self._slot(periods, current)
            known = periods[slot, columns] == current
            uses[slot, columns] = np.where(busy & ~known, 0.0, uses[slot, columns])
            periods[slot, columns] = np.where(busy, current, periods[slot, columns])
            used = uses[slot, columns]
            period_end = self._period_end(current, offset)
            runnable = np.where(unlimited, remaining, np.maximum(quota - used, 0.0))
            # CPU-seconds until the work is done, the quota spent, the period or `until` ends.
            wall_left = np.minimum(period_end, until) - time_now
            step = np.minimum(np.minimum(remaining, runnable), rate * wall_left)
            step = np.where(busy, np.maximum(step, 0.0), 0.0)
            time_now = np.where(busy, np.minimum(time_now + step / rate, period_end), time_now)
            remaining = remaining - step
            uses[slot, columns] = used + step
            busy = (remaining > _EPSILON) & (time_now < until)
            # Out of quota before the period's end: wait for the next period.
            throttled = busy & (used + step >= quota - _EPSILON) & ~unlimited
            time_now = np.where(throttled, np.minimum(period_end, until), time_now)
            busy = (remaining > _EPSILON) & (time_now < until)
        self.period[:, index], self.used[:, index] = periods, uses
        return time_now, np.where(remaining > _EPSILON, remaining, 0.0)

    @staticmethod
    def _slot(periods: np.ndarray, current: np.ndarray) -> np.ndarray:
        """Which of the two remembered periods holds `current`, else the older one to reuse."""
        older = np.where(periods[0] <= periods[1], 0, 1)
        return np.where(periods[0] == current, 0, np.where(periods[1] == current, 1, older))

    def available_at(self, times: np.ndarray, devices: np.ndarray | None = None) -> np.ndarray:
        """The earliest time at or after `times` at which each device may run (has quota left)."""
        index = slice(None) if devices is None else np.asarray(devices)
        times = np.broadcast_to(np.asarray(times, dtype=float), self.cores[index].shape)
        offset, cores = self.offset[index], self.cores[index]
        current = self._period_of(times, offset)
        periods, uses = self.period[:, index], self.used[:, index]
        used = np.where(periods[0] == current, uses[0], 0.0) + np.where(
            periods[1] == current, uses[1], 0.0
        )
        exhausted = (used >= cores * self.period_seconds - _EPSILON) & self.binding[index]
        return np.where(exhausted, self._period_end(current, offset), times)
