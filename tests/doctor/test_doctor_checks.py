"""The doctor's judgement: which facts make a run fail, which only warn, and what it says."""

from __future__ import annotations

from pathlib import Path

import pytest

from globaldl.doctor.checks import Verdict, evaluate
from globaldl.doctor.hostfile import HostEntry, read_hostfile
from globaldl.doctor.remote import DeviceProbe
from globaldl.doctor.table import render

NEED = 700 * 2**20


def healthy(host: str, **changes: object) -> DeviceProbe:
    facts = {
        "hostname": f"dev-{host}",
        "hostname_addresses": [host],
        "memory_available_bytes": 2 * 2**30,
        "ports": {"19100": "free"},
        "peer_port": 40000,
        "python": "3.11.2",
        "tensorflow": "2.21.0",
        "horovod": "0.28.1",
        "globaldl": "0.1.0",
        "tensorflow_built": True,
        "gloo_built": True,
        "patches": [
            "drop-xla-mpi-ops",
            "gloo-process-set-interface",
            "gloo-rendezvous-join-timeout",
            "elastic-notify-outside-lock",
            "ssh-check-connect-timeout",
            "gloo-allgather-receive-first",
        ],
    }
    facts.update(changes)
    return DeviceProbe(
        HostEntry(host, 1),
        facts=facts,
        clock_offset_seconds=0.01,
        metrics_reachable={19100: "ok"},
        link={"peer": "x", "port": 1, "rtt_seconds": 0.002, "received_bytes": 10**6,
              "receive_seconds": 1.0},
    )  # fmt: skip


def verdicts(probes: list[DeviceProbe]) -> dict[str, dict[str, Verdict]]:
    return {
        report.host: {check.name: check.verdict for check in report.checks}
        for report in evaluate(probes, NEED)
    }


def test_healthy_fleet_is_ready() -> None:
    reports = evaluate([healthy("10.0.0.2"), healthy("10.0.0.3")], NEED)
    assert [report.verdict for report in reports] == [Verdict.OK, Verdict.OK]
    assert render(reports).splitlines()[-1] == "verdict: ready, 2 devices"


def test_hostname_on_loopback_fails_that_device_and_names_the_trap() -> None:
    probes = [healthy("10.0.0.2"), healthy("10.0.0.3", hostname_addresses=["127.0.1.1"])]
    reports = evaluate(probes, NEED)
    assert reports[0].verdict is Verdict.OK
    assert reports[1].verdict is Verdict.FAIL
    text = render(reports)
    assert (
        "10.0.0.3: FAIL hostname: host name dev-10.0.0.3 resolves to 127.0.1.1 (loopback)" in text
    )
    assert text.splitlines()[-1] == "verdict: a run would FAIL: 1 of 2 devices (10.0.0.3)"


def test_taken_metrics_port_fails() -> None:
    probe = healthy("10.0.0.2", ports={"19100": "Address already in use"})
    assert verdicts([probe])["10.0.0.2"]["ports"] is Verdict.FAIL
    assert "metrics port 19100 cannot be bound" in render(evaluate([probe], NEED))


def test_the_odd_versions_out_fail_and_the_majority_passes() -> None:
    probes = [healthy("a"), healthy("b"), healthy("c", tensorflow="2.20.0")]
    found = verdicts(probes)
    assert [found[host]["versions"] for host in "abc"] == [Verdict.OK, Verdict.OK, Verdict.FAIL]
    assert "tensorflow 2.20.0 (most devices: 2.21.0)" in render(evaluate(probes, NEED))


@pytest.mark.parametrize(
    ("changes", "check"),
    [
        ({"patches": []}, "horovod"),
        ({"gloo_built": False}, "horovod"),
        ({"horovod": None}, "versions"),
        ({"memory_available_bytes": 300 * 2**20}, "memory"),
    ],
)
def test_each_broken_fact_fails_its_check(changes: dict, check: str) -> None:
    assert verdicts([healthy("a", **changes)])["a"][check] is Verdict.FAIL


def test_horovod_without_the_later_edits_only_warns_naming_what_is_missing() -> None:
    probe = healthy("a", patches=["drop-xla-mpi-ops", "gloo-process-set-interface"])
    assert verdicts([probe])["a"]["horovod"] is Verdict.WARN
    text = render(evaluate([probe], NEED))
    assert "gloo-rendezvous-join-timeout" in text and "elastic-notify-outside-lock" in text
    assert "ssh-check-connect-timeout (horovodrun gives up on hosts over 10 s" in text
    assert "gloo-allgather-receive-first (gathered payloads over the link's burst" in text


def test_clock_skew_and_tight_memory_only_warn() -> None:
    probe = healthy("a", memory_available_bytes=800 * 2**20)
    probe.clock_offset_seconds = 2.0
    found = verdicts([probe])["a"]
    assert found["clock"] is Verdict.WARN and found["memory"] is Verdict.WARN
    assert evaluate([probe], NEED)[0].verdict is Verdict.WARN


def test_unreachable_device_fails_and_skips_the_rest() -> None:
    probe = DeviceProbe(HostEntry("a", 1), ssh_error="Connection refused")
    (report,) = evaluate([probe], NEED)
    assert report.verdict is Verdict.FAIL
    assert {check.verdict for check in report.checks[1:]} == {Verdict.SKIPPED}
    assert "cannot run the probe over ssh: Connection refused" in render([report])


def test_unreachable_peer_port_fails_the_link() -> None:
    probe = healthy("a")
    probe.link = {"peer": "b", "port": 40000, "error": "ConnectionRefusedError: refused"}
    assert verdicts([probe])["a"]["link"] is Verdict.FAIL


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("# devices\n10.0.0.2 slots=1\n", "line 1"),
        ("10.0.0.2 slots=1\n\n10.0.0.3 slots=1\n", "line 2"),
        ("10.0.0.2\n", "line 1"),
        ("10.0.0.2 slots=0\n", "line 1"),
        ("10.0.0.2 slots=1\n10.0.0.2 slots=1\n", "more than once"),
        ("", "lists no hosts"),
    ],
)
def test_hostfile_lines_horovodrun_would_misread_are_refused(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(ValueError, match=why):
        read_hostfile(path)


def test_hostfile_as_horovod_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("10.0.0.2 slots=1\nnuc slots=2\n")
    assert read_hostfile(path) == [HostEntry("10.0.0.2", 1), HostEntry("nuc", 2)]
