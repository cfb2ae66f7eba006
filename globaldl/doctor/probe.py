"""What `globaldl doctor` runs on each device over ssh: standard library only, one file.

Sent as source in the ssh command line, so a device needs nothing of globaldl but the Python
that horovodrun would start. Modes:

    facts  ADDRESS PORTS            print the device's facts as one JSON line
    serve  ADDRESS PORTS            facts, then hold PORTS and one free port open and answer
                                    peers (time, echo, sink) until stdin closes
    client PEER_ADDRESS PEER_PORT SECONDS
                                    round trip and rate to a peer's server, one JSON line

PORTS is a comma-separated list (the metrics ports, may be empty).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

ECHO_ROUNDS = 7
CHUNK_BYTES = 64 * 1024


def _versions() -> dict:
    """Python, TensorFlow, Horovod versions; Horovod's Gloo build and globaldl's patches."""
    from importlib import metadata

    found: dict = {"python": ".".join(str(part) for part in sys.version_info[:3])}
    for name in ("tensorflow", "horovod", "globaldl"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["gloo_built"] = found["tensorflow_built"] = None
    found["patches"] = []
    if found["horovod"] and found["tensorflow"]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        try:
            import horovod.tensorflow as hvd

            found["gloo_built"] = bool(hvd.gloo_built())
            found["tensorflow_built"] = True
        except Exception as error:  # a broken build is what this reports, whatever it raises
            found["tensorflow_built"] = False
            found["horovod_error"] = f"{type(error).__name__}: {error}"[:300]
        try:
            from horovod import globaldl_patches

            found["patches"] = list(globaldl_patches.APPLIED)
        except ImportError:
            pass
    return found


def _hostname_addresses() -> tuple[str, list[str]]:
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return name, []
    addresses: list[str] = []
    for info in infos:
        if info[4][0] not in addresses:
            addresses.append(info[4][0])
    return name, addresses


def _memory_available_bytes() -> int | None:
    """MemAvailable, or less where the process's cgroup limits it (containers, emulated devices)."""
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        return None
    limit = usage = None
    try:
        with open("/proc/self/cgroup") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":  # cgroup v2
                    base = "/sys/fs/cgroup" + path
                    limit = _read_number(base + "/memory.max")
                    usage = _read_number(base + "/memory.current")
                elif "memory" in controllers.split(","):
                    base = "/sys/fs/cgroup/memory" + path
                    limit = _read_number(base + "/memory.limit_in_bytes")
                    usage = _read_number(base + "/memory.usage_in_bytes")
                    break
    except OSError:
        pass
    if limit is not None and usage is not None and limit < 1 << 60:
        cgroup_free = max(0, limit - usage)
        available = cgroup_free if available is None else min(available, cgroup_free)
    return available


def _read_number(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _bind(address: str, port: int) -> tuple[socket.socket | None, str | None]:
    listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        listener.bind((address, port))
        listener.listen(16)
    except OSError as error:
        listener.close()
        return None, error.strerror or str(error)
    return listener, None


def facts(address: str, ports: list[int]) -> tuple[dict, list[socket.socket]]:
    """The device's facts, and the listeners it holds (its metrics ports and one free port)."""
    name, addresses = _hostname_addresses()
    report: dict = {
        "hostname": name,
        "hostname_addresses": addresses,
        "memory_available_bytes": _memory_available_bytes(),
        "time": time.time(),
        "ports": {},
    }
    listeners: list[socket.socket] = []
    for port in ports:
        listener, error = _bind(address, port)
        report["ports"][str(port)] = error or "free"
        if listener is not None:
            listeners.append(listener)
    # Gloo listens on a port the kernel picks; a peer must reach such a port.
    listener, error = _bind(address, 0)
    if listener is not None:
        report["peer_port"] = listener.getsockname()[1]
        listeners.append(listener)
    else:
        report["peer_port_error"] = error
    report.update(_versions())
    return report, listeners


def _answer(connection: socket.socket) -> None:
    """One peer connection: `time`, `echo` (round trips) or `sink` (count bytes until EOF)."""
    with connection:
        request = connection.recv(16).split(b"\n", 1)[0]
        if request == b"time":
            connection.sendall(repr(time.time()).encode() + b"\n")
        elif request == b"echo":
            while True:
                data = connection.recv(64)
                if not data:
                    break
                connection.sendall(data)
        elif request == b"sink":
            received, first, last = 0, None, None
            while True:
                data = connection.recv(CHUNK_BYTES)
                if not data:
                    break
                now = time.monotonic()
                first = now if first is None else first
                last = now
                received += len(data)
            seconds = (last - first) if first is not None and last is not None else 0.0
            try:
                connection.sendall(json.dumps({"bytes": received, "seconds": seconds}).encode())
            except OSError:
                pass


def serve(listeners: list[socket.socket]) -> None:
    """Answer every listener's connections until stdin closes (the doctor is done)."""
    for listener in listeners:

        def accept(listener: socket.socket = listener) -> None:
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=_answer, args=(connection,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()


def client(peer: str, port: int, seconds: float) -> dict:
    """Median round trip and the rate the peer received, over one connection each."""
    report: dict = {"peer": peer, "port": port}
    try:
        with socket.create_connection((peer, port), timeout=5) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.sendall(b"echo\n")
            time.sleep(0.05)  # the request line and the first ping must not share a segment
            rounds = []
            for _ in range(ECHO_ROUNDS):
                started = time.monotonic()
                connection.sendall(b"x")
                if connection.recv(64) == b"":
                    raise ConnectionError("peer closed the echo connection")
                rounds.append(time.monotonic() - started)
            report["rtt_seconds"] = sorted(rounds)[len(rounds) // 2]
        with socket.create_connection((peer, port), timeout=10) as connection:
            connection.sendall(b"sink\n")
            time.sleep(0.05)
            block = b"\0" * CHUNK_BYTES
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                connection.sendall(block)
            connection.shutdown(socket.SHUT_WR)
            connection.settimeout(max(30.0, seconds * 10))
            answer = json.loads(connection.recv(4096) or b"{}")
        report["received_bytes"] = answer.get("bytes", 0)
        report["receive_seconds"] = answer.get("seconds", 0.0)
    except (OSError, ValueError) as error:
        report["error"] = f"{type(error).__name__}: {error}"
    return report


def main(argv: list[str]) -> None:
    """Run one mode (see the module docstring)."""
    mode = argv[0]
    if mode in ("facts", "serve"):
        ports = [int(port) for port in argv[2].split(",") if port]
        report, listeners = facts(argv[1], ports)
        print(json.dumps(report), flush=True)
        if mode == "serve":
            serve(listeners)
    elif mode == "client":
        print(json.dumps(client(argv[1], int(argv[2]), float(argv[3]))), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
