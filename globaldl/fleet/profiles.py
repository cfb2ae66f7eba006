"""Link profiles of emulated devices and sites: rate, delay, jitter and loss per direction.

A profile describes one ACCESS LINK (a device's, or a site's wide-area uplink) between its
inner end (the device) and the network core. Each direction has its own rate, one-way delay,
jitter and random loss:

* `up_delay_ms` is the time a packet spends crossing the link from the device to the core,
  beyond the time its bytes take at the link's rate (serialisation); `down_delay_ms` the same
  from the core to the device. A device's round trip to the core (where the fleet's host sits)
  is therefore up + down delay; between two devices A and B a packet crosses A's uplink and
  B's downlink, so the A->B one-way delay is A.up + B.down and the round trip adds B.up + A.down.
* `*_jitter_ms` spreads each packet's delay uniformly over [delay - jitter, delay + jitter];
  packets of one direction keep their order (a FIFO link), so under load they queue behind a
  slower predecessor, as on real links.
* `*_loss_percent` drops that share of the packets of one direction at random.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from globaldl.fleet.shaping import LinkDirection

# deploy/ is data next to the package in the repository (the package is installed editable).
DEFAULT_PROFILES_PATH = Path(__file__).resolve().parents[2] / "deploy" / "fleet" / "profiles.yaml"
PROFILES_SCHEMA_VERSION = 2
CUSTOM = "custom"
_PROFILE_KEYS = ("description", "source", "up", "down")
_DIRECTION_KEYS = ("kbit_per_second", "delay_ms", "jitter_ms", "loss_percent")
# Schema 1 (and older state and result files) had one latency, jitter and loss for both
# directions; from_config still reads them so committed results stay loadable.
_LEGACY_SYMMETRIC_KEYS = {
    "one_way_latency_ms": "delay_ms",
    "jitter_ms": "jitter_ms",
    "loss_percent": "loss_percent",
}


@dataclass(frozen=True)
class LinkProfile:
    """One access link: rate, one-way delay, jitter and random loss, per direction.

    Example:
        >>> lte = LinkProfile("lte", 5000, 17500, up_delay_ms=35, down_delay_ms=35)
        >>> lte.impaired, lte.core_round_trip_ms
        (True, 70.0)

    """

    name: str
    up_kbit_per_second: float
    down_kbit_per_second: float
    up_delay_ms: float = 0.0
    down_delay_ms: float = 0.0
    up_jitter_ms: float = 0.0
    down_jitter_ms: float = 0.0
    up_loss_percent: float = 0.0
    down_loss_percent: float = 0.0
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("profile name must not be empty")
        for field in ("up_kbit_per_second", "down_kbit_per_second"):
            value = getattr(self, field)
            if not _is_number(value) or not value > 0 or math.isinf(value):
                raise ValueError(
                    f"profile {self.name!r}: {field} must be a positive number, got {value!r}"
                )
        for direction in ("up", "down"):
            for field in (f"{direction}_delay_ms", f"{direction}_jitter_ms"):
                value = getattr(self, field)
                if not _is_number(value) or value < 0 or math.isinf(value):
                    raise ValueError(
                        f"profile {self.name!r}: {field} must be a number >= 0, got {value!r}"
                    )
            loss = getattr(self, f"{direction}_loss_percent")
            if not _is_number(loss) or not 0 <= loss < 100:
                raise ValueError(
                    f"profile {self.name!r}: {direction}_loss_percent must be in [0, 100), "
                    f"got {loss!r}"
                )
            jitter, delay = (getattr(self, f"{direction}_{key}_ms") for key in ("jitter", "delay"))
            if jitter > delay:
                raise ValueError(
                    f"profile {self.name!r}: {direction}_jitter_ms ({jitter:g}) must not exceed "
                    f"{direction}_delay_ms ({delay:g}): a packet cannot arrive before it is sent"
                )

    @property
    def uplink(self) -> LinkDirection:
        """Device -> core."""
        return LinkDirection(
            self.up_kbit_per_second, self.up_delay_ms, self.up_jitter_ms, self.up_loss_percent
        )

    @property
    def downlink(self) -> LinkDirection:
        """Core -> device."""
        return LinkDirection(
            self.down_kbit_per_second,
            self.down_delay_ms,
            self.down_jitter_ms,
            self.down_loss_percent,
        )

    @property
    def impaired(self) -> bool:
        """True when the link adds delay, jitter or loss (emulated in user space, see vde.py)."""
        return self.uplink.impaired or self.downlink.impaired

    @property
    def core_round_trip_ms(self) -> float:
        """Mean round trip between the device and the core, serialisation left out."""
        return self.up_delay_ms + self.down_delay_ms

    def rates_only(self) -> LinkProfile:
        """The same rates without delay, jitter or loss (what is shaped with `--latency off`)."""
        return LinkProfile(
            self.name,
            self.up_kbit_per_second,
            self.down_kbit_per_second,
            description=self.description,
            source=self.source,
        )

    def get_config(self) -> dict[str, Any]:
        """Plain-data form; `LinkProfile.from_config(p.get_config()) == p`."""
        return asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LinkProfile:
        """Build a profile from `get_config()` output (or a schema-1 symmetric one)."""
        config = dict(config)
        for legacy, key in _LEGACY_SYMMETRIC_KEYS.items():
            if legacy in config:
                value = config.pop(legacy)
                config.setdefault(f"up_{key}", value)
                config.setdefault(f"down_{key}", value)
        return cls(**config)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def load_profiles(path: Path = DEFAULT_PROFILES_PATH) -> dict[str, LinkProfile]:
    """Read and validate a profiles YAML file; raise ValueError naming the bad entry or key."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("profiles"), dict):
        raise ValueError(f"{path}: expected a mapping with a 'profiles' mapping")
    if document.get("schema_version") != PROFILES_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version must be {PROFILES_SCHEMA_VERSION}, got "
            f"{document.get('schema_version')!r} (schema 2 gives each profile an `up:` and a "
            f"`down:` mapping with {', '.join(_DIRECTION_KEYS)})"
        )
    return {
        name: _profile_from_entry(path, name, entry) for name, entry in document["profiles"].items()
    }


def _profile_from_entry(path: Path, name: object, entry: object) -> LinkProfile:
    if not isinstance(name, str) or name == CUSTOM or ":" in name:
        raise ValueError(f"{path}: profile name {name!r} is reserved or contains ':'")
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: profile {name!r} must be a mapping")
    _check_keys(path, f"profile {name!r}", entry, _PROFILE_KEYS, required=("up", "down"))
    fields: dict[str, Any] = {
        "description": entry.get("description", ""),
        "source": entry.get("source", ""),
    }
    for direction in ("up", "down"):
        values = entry[direction]
        where = f"profile {name!r} {direction}"
        if not isinstance(values, dict):
            raise ValueError(f"{path}: {where} must be a mapping of {', '.join(_DIRECTION_KEYS)}")
        _check_keys(path, where, values, _DIRECTION_KEYS, required=("kbit_per_second",))
        for key, value in values.items():
            fields[f"{direction}_{key}"] = value
    try:
        return LinkProfile(name=name, **fields)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _check_keys(
    path: Path,
    where: str,
    entry: dict[str, Any],
    allowed: tuple[str, ...],
    required: tuple[str, ...],
) -> None:
    unknown = sorted(str(key) for key in set(entry) - set(allowed))
    if unknown:
        raise ValueError(f"{path}: {where} has unknown keys {unknown}; allowed: {list(allowed)}")
    missing = [key for key in required if key not in entry]
    if missing:
        raise ValueError(f"{path}: {where} is missing {missing}")


def _allowed_names(profiles: dict[str, LinkProfile]) -> str:
    return ", ".join([*sorted(profiles), CUSTOM, f"{CUSTOM}:UP_MBIT:DOWN_MBIT[:ONE_WAY_DELAY_MS]"])


def custom_profile(up_mbit: float, down_mbit: float, delay_ms: float = 0.0) -> LinkProfile:
    """Rates in Mbit/s and one delay for both directions, named `custom:UP:DOWN[:DELAY]`."""
    for flag, value in (("up_mbit", up_mbit), ("down_mbit", down_mbit)):
        if not _is_number(value) or not value > 0:
            raise ValueError(
                f"custom profile: {flag} must be a positive number of Mbit/s, got {value!r}"
            )
    if not _is_number(delay_ms) or not 0 <= delay_ms < math.inf:
        raise ValueError(f"custom profile: one-way delay must be >= 0 ms, got {delay_ms!r}")
    name = f"{CUSTOM}:{up_mbit:g}:{down_mbit:g}" + (f":{delay_ms:g}" if delay_ms else "")
    delay_text = f"{delay_ms:g} ms one-way delay each way" if delay_ms else "no delay"
    return LinkProfile(
        name=name,
        up_kbit_per_second=up_mbit * 1000,
        down_kbit_per_second=down_mbit * 1000,
        up_delay_ms=delay_ms,
        down_delay_ms=delay_ms,
        description=f"custom (up {up_mbit:g} Mbit/s, down {down_mbit:g} Mbit/s, {delay_text})",
    )


def resolve_profile(
    spec: str,
    profiles: dict[str, LinkProfile],
    up_mbit: float | None = None,
    down_mbit: float | None = None,
) -> LinkProfile:
    """Turn `NAME`, `custom` (with both rates) or `custom:UP:DOWN[:DELAY_MS]` into a profile."""
    if spec == CUSTOM:
        if up_mbit is None or down_mbit is None:
            raise ValueError(
                "profile 'custom' needs both --up-mbit and --down-mbit (or use custom:UP:DOWN)"
            )
        return custom_profile(up_mbit, down_mbit)
    if up_mbit is not None or down_mbit is not None:
        raise ValueError(f"--up-mbit/--down-mbit only apply to --profile custom, not {spec!r}")
    if spec.startswith(f"{CUSTOM}:"):
        numbers = _parse_numbers(spec.split(":")[1:])
        if numbers is None or len(numbers) not in (2, 3):
            raise ValueError(
                f"bad custom profile {spec!r}; expected "
                "custom:UP_MBIT:DOWN_MBIT[:ONE_WAY_DELAY_MS], e.g. custom:5:20 or custom:5:20:50"
            )
        return custom_profile(*numbers)
    if spec not in profiles:
        raise ValueError(f"unknown profile {spec!r}; valid profiles: {_allowed_names(profiles)}")
    return profiles[spec]


def _parse_numbers(texts: list[str]) -> list[float] | None:
    try:
        return [float(text) for text in texts]
    except ValueError:
        return None


def parse_mix(mix: str, profiles: dict[str, LinkProfile]) -> list[LinkProfile]:
    """Expand `lte:2,slow-4g:2` (or `custom:5:20:50:2`) into one profile per device, in order."""
    expanded: list[LinkProfile] = []
    for entry in (part.strip() for part in mix.split(",")):
        spec, separator, count_text = entry.rpartition(":")
        if not separator or not spec:
            raise ValueError(
                f"bad --mix entry {entry!r}; expected PROFILE:COUNT, e.g. lte:2,slow-4g:2"
            )
        try:
            count = int(count_text)
        except ValueError:
            raise ValueError(
                f"bad --mix entry {entry!r}: count {count_text!r} is not an integer"
            ) from None
        if count < 1:
            raise ValueError(f"bad --mix entry {entry!r}: count must be at least 1, got {count}")
        expanded.extend([resolve_profile(spec, profiles)] * count)
    return expanded


def device_profiles(
    profiles: dict[str, LinkProfile],
    devices: int | None = None,
    profile: str | None = None,
    mix: str | None = None,
    up_mbit: float | None = None,
    down_mbit: float | None = None,
) -> list[LinkProfile]:
    """One profile per device: `devices` x `profile`, or `mix` (checked against `devices`)."""
    if mix is not None:
        if profile is not None or up_mbit is not None or down_mbit is not None:
            raise ValueError("--mix cannot be combined with --profile/--up-mbit/--down-mbit")
        expanded = parse_mix(mix, profiles)
        if devices is not None and devices != len(expanded):
            raise ValueError(
                f"--devices {devices} does not match --mix {mix!r}, which makes {len(expanded)} "
                "devices"
            )
        return expanded
    if devices is None or devices < 1:
        raise ValueError(f"--devices must be at least 1, got {devices}")
    if profile is None:
        raise ValueError(
            f"--profile is required (or --mix); valid profiles: {_allowed_names(profiles)}"
        )
    return [resolve_profile(profile, profiles, up_mbit, down_mbit)] * devices
