"""`globaldl fleet tcp`: TCP state sampled from ss, parsed and summarized per connection."""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fleet_support import needs_fleet_system

from globaldl.fleet.shaping import LinkDirection
from globaldl.fleet.tcpstate import (
    Connection,
    Sample,
    check_sampling,
    parse_ss,
    sample_here,
    summarize,
)

# Two connections as `ss -tin state established` printed them on a fleet device (LTE, BBR).
SS_OUTPUT = """\
Recv-Q Send-Q Local Address:Port  Peer Address:Port Process
0      61756      10.77.0.2:36759    10.77.0.3:51246
\t bbr wscale:10,10 rto:348 rtt:147.515/1.713 ato:40 mss:1448 pmtu:1500 rcvmss:1448 \
advmss:1448 cwnd:134 ssthresh:64 bytes_sent:20340551 bytes_acked:20320279 \
bytes_received:19842279 segs_out:21845 segs_in:21675 data_segs_out:14830 data_segs_in:14551 \
bbr:(bw:4936784bps,mrtt:139.479,pacing_gain:1.25,cwnd_gain:2) send 10522699bps lastrcv:4 \
lastack:4 pacing_rate 6109272bps delivery_rate 4885448bps delivered:14817 app_limited \
busy:87168ms unacked:14 rcv_rtt:146 rcv_space:95616 rcv_ssthresh:281724 notsent:41484 \
minrtt:139.344 snd_wnd:575488
0      0          [::ffff:10.77.0.2]:22       [::ffff:10.77.0.1]:34254
\t cubic wscale:10,10 rto:276 rtt:72.628/3.285 ato:40 mss:1448 pmtu:1500 rcvmss:1448 \
advmss:1448 cwnd:18 bytes_sent:4297 bytes_acked:4297 bytes_received:6733 segs_out:39 \
segs_in:58 data_segs_out:32 data_segs_in:31 send 2.87Mbps lastsnd:216 lastrcv:216 \
lastack:148 pacing_rate 4.69Mbps delivery_rate 308160bps delivered:33 busy:2360ms \
rcv_space:14480 rcv_ssthresh:82912 minrtt:69.333 snd_wnd:76800
"""


def test_parse_ss_reads_each_connection_with_its_window_rates_and_pause():
    busy, ssh = parse_ss(SS_OUTPUT)
    assert (busy.local, busy.local_port, busy.peer, busy.peer_port) == (
        "10.77.0.2", 36759, "10.77.0.3", 51246,
    )  # fmt: skip
    assert busy.congestion_control == "bbr"
    assert (busy.cwnd, busy.bytes_sent, busy.rto_ms) == (134, 20340551, 348.0)
    assert busy.rtt_ms == pytest.approx(147.515)
    assert busy.last_send_ms is None  # sent within the last millisecond: ss prints no lastsnd
    assert busy.pacing_bits_per_second == 6109272
    assert busy.delivery_bits_per_second == 4885448
    assert busy.bbr_bandwidth_bits_per_second == 4936784
    assert busy.app_limited
    # Another congestion control, rates with unit prefixes, and no BBR estimate.
    assert ssh.congestion_control == "cubic"
    assert (ssh.cwnd, ssh.last_send_ms, ssh.peer_port) == (18, 216.0, 34254)
    # An IPv6 socket's IPv4 ends read as the plain addresses the fleet gave its devices.
    assert (ssh.local, ssh.peer) == ("10.77.0.2", "10.77.0.1")
    assert ssh.pacing_bits_per_second == pytest.approx(4.69e6)
    assert ssh.bbr_bandwidth_bits_per_second is None
    assert not ssh.app_limited


def test_bad_sampling_is_refused_naming_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"interval_ms must be >= 5 .*got 1"):
        check_sampling(10, 1)
    with pytest.raises(ValueError, match=r"seconds must be in \(0, 3600\], got 0"):
        check_sampling(0, 25)
    with pytest.raises(ValueError, match="min_bytes must be >= 0, got -1"):
        summarize([], {}, min_bytes=-1)


def _connection(local_port: int, peer: str, bytes_sent: int, cwnd: int, **extra) -> Connection:
    values = {
        "local": "10.0.0.2", "local_port": local_port, "peer": peer, "peer_port": 4000,
        "congestion_control": "bbr", "cwnd": cwnd, "rtt_ms": 140.0, "rto_ms": 350.0,
        "bytes_sent": bytes_sent, "last_send_ms": None, "pacing_bits_per_second": 5e6,
        "delivery_bits_per_second": None, "bbr_bandwidth_bits_per_second": 4e6,
        "app_limited": True,
    } | extra  # fmt: skip
    return Connection(**values)


def test_summary_rates_each_flight_over_its_own_time_and_counts_small_windows():
    peer = "10.0.0.3"
    # A flight of 100 kB over 0.2 s (4 Mbit/s), a pause of 0.3 s at a window of 10 segments,
    # then a flight of 25 kB over 0.05 s (4 Mbit/s): 125 kB over 0.25 s of flights.
    points = [
        (0.0, 0, 100, None),
        (0.1, 50_000, 100, None),
        (0.2, 100_000, 100, 10.0),
        (0.5, 100_000, 10, 300.0),
        (0.55, 125_000, 100, None),
    ]
    samples = [
        Sample("dev-1", at, (_connection(5000, peer, sent, cwnd, last_send_ms=pause),))
        for at, sent, cwnd, pause in points
    ]
    # Left out: the host's ssh session, a peer outside the fleet, a connection below min_bytes.
    samples.append(Sample("dev-1", 0.0, (_connection(22, peer, 0, 10),)))
    samples.append(Sample("dev-1", 0.5, (_connection(22, peer, 10**6, 10),)))
    samples.append(Sample("dev-1", 0.0, (_connection(6000, "10.9.9.9", 0, 10),)))
    samples.append(Sample("dev-1", 0.5, (_connection(6000, "10.9.9.9", 10**6, 10),)))
    samples.append(Sample("dev-1", 0.0, (_connection(7000, peer, 0, 10),)))
    samples.append(Sample("dev-1", 0.5, (_connection(7000, peer, 1000, 10),)))
    (row,) = summarize(samples, {"dev-1": "10.0.0.2", "dev-2": peer}, min_bytes=10_000)
    assert (row["device"], row["peer"], row["congestion_control"]) == ("dev-1", "dev-2", "bbr")
    assert row["bytes_sent"] == 125_000
    assert row["flights"] == 2
    assert row["flight_mbit_per_second"] == pytest.approx(4.0)
    assert (row["cwnd_min"], row["cwnd_median"], row["cwnd_max"]) == (10, 100, 100)
    assert row["samples_at_initial_window_or_below"] == 1
    assert row["longest_pause_ms"] == 300.0
    assert row["bbr_bandwidth_mbit_sending"] == pytest.approx(4.0)
    assert row["pacing_mbit_sending"] == pytest.approx(5.0)


def test_sampler_sees_a_real_loopback_transfer_with_its_congestion_control():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    server, _ = listener.accept()
    control = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    control = control.split(b"\0", 1)[0].decode()
    stop = threading.Event()

    def drain() -> None:
        while server.recv(1 << 16):
            pass

    def send() -> None:
        chunk = b"x" * 4096
        while not stop.is_set():
            client.sendall(chunk)
            time.sleep(0.002)

    threads = [threading.Thread(target=drain), threading.Thread(target=send)]
    for thread in threads:
        thread.start()
    records = []
    try:
        count = sample_here(0.4, 20, records.append)
    finally:
        stop.set()
        threads[1].join()
        client.close()
        threads[0].join()
        server.close()
        listener.close()
    assert count == len(records) >= 5
    mine = [
        Connection(**item)
        for record in records
        for item in record["connections"]
        if item["peer_port"] == port  # the client's end: it is the one sending
    ]
    assert len(mine) >= 5
    assert {connection.congestion_control for connection in mine} == {control}
    assert mine[-1].bytes_sent > mine[0].bytes_sent > 0


@needs_fleet_system
def test_fleet_tcp_reports_a_shaped_transfer_between_two_devices(test_fleet, tmp_path: Path):
    # CUBIC, as real devices mostly run, whatever the host's default (BBR here). A namespace may
    # only take an allowed one: the fleet allows it while it is up and restores the list after.
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    allowed_before = allowed.read_text()
    up = test_fleet.up(
        "-n", "2", "--profile", "custom:5:20", "--latency", "off", "--congestion-control", "cubic"
    )  # fmt: skip
    assert up.stdout.count("TCP cubic") == 2
    sender, receiver = test_fleet.device(1), test_fleet.device(2)
    transfer = subprocess.Popen(
        test_fleet.cli_argv(
            "measure", "--from", sender, "--to", receiver, "--seconds", "4", "--no-round-trip",
        ),
        env=test_fleet.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # the receiver is listening and the bulk transfer under way
        out = tmp_path / "tcp.json"
        completed = test_fleet.cli(
            "tcp", "--seconds", "1.5", "--interval-ms", "25", "--out", str(out),
            "--samples-csv", str(tmp_path / "samples.csv"),
        )  # fmt: skip
    finally:
        transfer_output, transfer_errors = transfer.communicate(timeout=60)
    assert transfer.returncode == 0, transfer_errors
    assert completed.returncode == 0, completed.stderr
    rows = json.loads(out.read_text())["rows"]
    (row,) = [row for row in rows if (row["device"], row["peer"]) == (sender, receiver)]
    expected = subprocess.run(
        ["ip", "netns", "exec", sender, "sysctl", "-n", "net.ipv4.tcp_congestion_control"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert row["congestion_control"] == expected == "cubic"
    status = json.loads(test_fleet.cli("status", "--json").stdout)
    assert [device["congestion_control"] for device in status["devices"]] == ["cubic", "cubic"]
    assert row["uplink_mbit"] == 5.0
    # The uplink shapes it. The bulk transfer sends through the whole window, so over the window
    # TCP hands the interface about 5 Mbit/s: at most the link's rate plus what its tbf can hold
    # (the queue may fill during the window). Within a flight it may hand over more: CUBIC pauses
    # after a tail drop while the full queue drains, and those pauses are not part of a flight
    # (six runs: flights 5.1-6.8 Mbit/s, the window 4.8-5.2).
    uplink = LinkDirection(rate_kbit_per_second=5000)
    window_mbit = row["bytes_sent"] * 8 / row["seconds"] / 1e6
    held_mbit = (uplink.queue_bytes + uplink.burst_bytes) * 8 / row["seconds"] / 1e6
    assert 4.0 <= window_mbit <= 5.0 + held_mbit, row
    assert row["flight_mbit_per_second"] >= window_mbit, row
    assert row["bytes_sent"] > 1.0 * 5e6 / 8 * 0.5
    assert "| device | peer |" in completed.stdout
    assert "cubic" in allowed.read_text().split()
    # Every device was sampled over the whole window, not only the one read first.
    with (tmp_path / "samples.csv").open() as handle:
        times: dict[str, list[float]] = {}
        for record in csv.DictReader(handle):
            times.setdefault(record["device"], []).append(float(record["time"]))
    assert set(times) == {sender, receiver}
    for device, seen in times.items():
        assert max(seen) - min(seen) >= 1.0, (device, len(seen))
    print(f"\n{completed.stdout}\n{transfer_output}")
    assert test_fleet.cli("down").returncode == 0
    assert allowed.read_text() == allowed_before
