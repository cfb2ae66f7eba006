"""Link profiles (asymmetric rates, latency, loss) of emulated devices, loaded from data."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

# deploy/ is data next to the package in the repository (the package is installed editable).
DEFAULT_PROFILES_PATH = Path(__file__).resolve().parents[2] / "deploy" / "fleet" / "profiles.yaml"
CUSTOM = "custom"
_PROFILE_KEYS = (
    "description",
    "down_kbit_per_second",
    "up_kbit_per_second",
    "one_way_latency_ms",
    "jitter_ms",
    "loss_percent",
)


@dataclass(frozen=True)
class LinkProfile:
    """One device's access link: rates each way, one-way latency, jitter and random loss.

    Example:
        >>> LinkProfile("lte", up_kbit_per_second=5000, down_kbit_per_second=17500,
        ...             one_way_latency_ms=32.5).needs_netem
        True

    """

    name: str
    up_kbit_per_second: float
    down_kbit_per_second: float
    one_way_latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("profile name must not be empty")
        for field in ("up_kbit_per_second", "down_kbit_per_second"):
            value = getattr(self, field)
            if not _is_number(value) or not value > 0 or math.isinf(value):
                raise ValueError(
                    f"profile {self.name!r}: {field} must be a positive number, got {value!r}"
                )
        for field in ("one_way_latency_ms", "jitter_ms"):
            value = getattr(self, field)
            if not _is_number(value) or value < 0 or math.isinf(value):
                raise ValueError(f"profile {self.name!r}: {field} must be >= 0, got {value!r}")
        if not _is_number(self.loss_percent) or not 0 <= self.loss_percent < 100:
            raise ValueError(
                f"profile {self.name!r}: loss_percent must be in [0, 100), got "
                f"{self.loss_percent!r}"
            )
        if self.jitter_ms > self.one_way_latency_ms:
            raise ValueError(
                f"profile {self.name!r}: jitter_ms ({self.jitter_ms}) must not exceed "
                f"one_way_latency_ms ({self.one_way_latency_ms})"
            )

    @property
    def needs_netem(self) -> bool:
        """True when the profile asks for latency, jitter or loss, which only tc netem emulates."""
        return self.one_way_latency_ms > 0 or self.jitter_ms > 0 or self.loss_percent > 0

    def rates_only(self) -> LinkProfile:
        """The same rates without latency, jitter or loss (what is shaped when netem is missing)."""
        return LinkProfile(
            self.name,
            self.up_kbit_per_second,
            self.down_kbit_per_second,
            description=self.description,
        )

    def get_config(self) -> dict[str, Any]:
        """Plain-data form; `LinkProfile.from_config(p.get_config()) == p`."""
        return asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LinkProfile:
        """Build a profile from `get_config()` output."""
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
    if document.get("schema_version") != 1:
        raise ValueError(
            f"{path}: schema_version must be 1, got {document.get('schema_version')!r}"
        )
    profiles: dict[str, LinkProfile] = {}
    for name, entry in document["profiles"].items():
        if (
            not isinstance(name, str)
            or name == CUSTOM
            or name.startswith(f"{CUSTOM}:")
            or ":" in name
        ):
            raise ValueError(f"{path}: profile name {name!r} is reserved or contains ':'")
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: profile {name!r} must be a mapping")
        unknown = sorted(set(entry) - set(_PROFILE_KEYS))
        if unknown:
            raise ValueError(
                f"{path}: profile {name!r} has unknown keys {unknown}; allowed: "
                f"{list(_PROFILE_KEYS)}"
            )
        missing = [
            key for key in ("down_kbit_per_second", "up_kbit_per_second") if key not in entry
        ]
        if missing:
            raise ValueError(f"{path}: profile {name!r} is missing {missing}")
        profiles[name] = LinkProfile(name=name, **entry)
    return profiles


def _allowed_names(profiles: dict[str, LinkProfile]) -> str:
    return ", ".join([*sorted(profiles), CUSTOM, f"{CUSTOM}:UP_MBIT:DOWN_MBIT"])


def custom_profile(up_mbit: float, down_mbit: float) -> LinkProfile:
    """A rate pair without latency or loss, named `custom:UP:DOWN` (Mbit/s)."""
    for flag, value in (("up_mbit", up_mbit), ("down_mbit", down_mbit)):
        if not _is_number(value) or not value > 0:
            raise ValueError(
                f"custom profile: {flag} must be a positive number of Mbit/s, got {value!r}"
            )
    return LinkProfile(
        name=f"{CUSTOM}:{up_mbit:g}:{down_mbit:g}",
        up_kbit_per_second=up_mbit * 1000,
        down_kbit_per_second=down_mbit * 1000,
        description=f"custom rates (up {up_mbit:g} Mbit/s, down {down_mbit:g} Mbit/s), no latency",
    )


def resolve_profile(
    spec: str,
    profiles: dict[str, LinkProfile],
    up_mbit: float | None = None,
    down_mbit: float | None = None,
) -> LinkProfile:
    """Turn `NAME`, `custom` (with both rates) or `custom:UP:DOWN` into a profile."""
    if spec == CUSTOM:
        if up_mbit is None or down_mbit is None:
            raise ValueError(
                "profile 'custom' needs both --up-mbit and --down-mbit (or use custom:UP:DOWN)"
            )
        return custom_profile(up_mbit, down_mbit)
    if up_mbit is not None or down_mbit is not None:
        raise ValueError(f"--up-mbit/--down-mbit only apply to --profile custom, not {spec!r}")
    if spec.startswith(f"{CUSTOM}:"):
        rates = _parse_rates(spec.split(":")[1:])
        if rates is None:
            raise ValueError(
                f"bad custom profile {spec!r}; expected custom:UP_MBIT:DOWN_MBIT, e.g. custom:5:20"
            )
        return custom_profile(*rates)
    if spec not in profiles:
        raise ValueError(f"unknown profile {spec!r}; valid profiles: {_allowed_names(profiles)}")
    return profiles[spec]


def _parse_rates(texts: list[str]) -> tuple[float, float] | None:
    if len(texts) != 2:
        return None
    try:
        return float(texts[0]), float(texts[1])
    except ValueError:
        return None


def parse_mix(mix: str, profiles: dict[str, LinkProfile]) -> list[LinkProfile]:
    """Expand `lte:2,slow-4g:2` (or `custom:5:20:2`) into one profile per device, in order."""
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
