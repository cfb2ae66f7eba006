"""The emulated IoT fleet: namespaces with shaped links, CPU/memory limits, an sshd per device."""

from globaldl.fleet.fleet import Fleet, FleetError, LinkEmulationUnavailableError
from globaldl.fleet.plan import DeviceSpec, FleetPlan, plan_fleet
from globaldl.fleet.profiles import LinkProfile, device_profiles, load_profiles, resolve_profile
from globaldl.fleet.state import DEFAULT_STATE_DIR, DeviceState, FleetState

__all__ = [
    "DEFAULT_STATE_DIR",
    "DeviceSpec",
    "DeviceState",
    "Fleet",
    "FleetError",
    "FleetPlan",
    "FleetState",
    "LinkProfile",
    "LinkEmulationUnavailableError",
    "device_profiles",
    "load_profiles",
    "plan_fleet",
    "resolve_profile",
]
