"""The site map: read once, checked before training, and how a worker finds its own site."""

from __future__ import annotations

from pathlib import Path

import pytest

from globaldl.settings import SettingsError, TrainSettings
from globaldl.sites import SiteMapError, load_site_map


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sites.yaml"
    path.write_text(text)
    return path


def test_a_worker_finds_its_site_by_the_first_of_its_names_the_map_lists(tmp_path: Path) -> None:
    site_map = load_site_map(write(tmp_path, "sites:\n  a: [dev1, 10.0.0.2]\n  b: [dev3]\n"))
    assert site_map.sites == {"a": ("dev1", "10.0.0.2"), "b": ("dev3",)}
    assert site_map.site_of(["dev3", "10.0.0.2"]) == "b"  # the hostfile name comes first
    assert site_map.site_of(["laptop", "10.0.0.2"]) == "a"  # then an address
    with pytest.raises(SiteMapError, match=r"lists none of this device's names \['laptop'\]"):
        site_map.site_of(["laptop"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n", r"must hold `sites: \{SITE: \[HOST, \.\.\.\], \.\.\.\}`"),
        ("sites: {}\n", "lists no sites"),
        ("sites:\n  a: []\n", "site 'a' .* must list at least one host"),
        ("sites:\n  a: [dev1]\n  b: [dev1]\n", "host 'dev1' is in two sites .*: 'a' and 'b'"),
        ("sites:\n  a: [[dev1]]\n", r"lists \['dev1'\], not a host name"),
        ("sites: [\n", "is not valid YAML"),
    ],
)
def test_a_bad_site_map_is_refused_naming_the_file_and_the_problem(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(SiteMapError, match=message):
        load_site_map(write(tmp_path, text))


def test_hierarchy_settings_are_checked_before_training(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="hierarchy 'sites' needs sites_file"):
        TrainSettings(hierarchy="sites")
    with pytest.raises(SettingsError, match="hierarchy 'tree' is not one of: none, sites"):
        TrainSettings(hierarchy="tree")
    with pytest.raises(SettingsError, match="cannot read site map .*missing.yaml"):
        TrainSettings(hierarchy="sites", sites_file=tmp_path / "missing.yaml")
    good = write(tmp_path, "sites:\n  a: [dev1]\n")
    with pytest.raises(SettingsError, match="hierarchy 'sites' and elastic cannot be combined"):
        TrainSettings(hierarchy="sites", sites_file=good, elastic=True)
    assert TrainSettings(hierarchy="sites", sites_file=good).sites_file == good
