"""The probe's measuring parts over real sockets: a taken port, round trips and a rate."""

from __future__ import annotations

import socket

from globaldl.doctor import probe


def test_a_held_port_is_reported_in_use_and_a_free_one_is_held() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    try:
        listener, error = probe._bind("127.0.0.1", taken)
        assert listener is None and "in use" in str(error)
        listener, error = probe._bind("127.0.0.1", 0)
        assert error is None and listener is not None
        listener.close()
    finally:
        holder.close()


def test_client_measures_round_trip_and_the_bytes_the_peer_received() -> None:
    listener, _ = probe._bind("127.0.0.1", 0)
    assert listener is not None
    port = listener.getsockname()[1]

    import threading

    def accept_two() -> None:
        for _ in range(2):
            connection, _ = listener.accept()
            probe._answer(connection)

    server = threading.Thread(target=accept_two, daemon=True)
    server.start()
    report = probe.client("127.0.0.1", port, 0.2)
    server.join(timeout=10)
    listener.close()
    assert "error" not in report, report
    assert 0 < report["rtt_seconds"] < 1.0
    assert report["received_bytes"] > probe.CHUNK_BYTES
    assert report["receive_seconds"] > 0


def test_client_names_a_refused_peer() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert "ConnectionRefusedError" in probe.client("127.0.0.1", port, 0.1)["error"]
