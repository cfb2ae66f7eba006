"""The machine record kept with every benchmark and experiment number."""

from pathlib import Path

from globaldl.bench.results import _first_cpu_fields, _tcp_congestion_control, machine_description

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: another
stepping\t: 0
"""


def test_the_first_processors_fields_are_read_up_to_its_blank_line(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    fields = _first_cpu_fields(path)
    assert fields["cpu family"] == "26" and fields["model"] == "2"
    assert fields["model name"] == "AMD EPYC" and fields["stepping"] == "1"
    assert _first_cpu_fields(tmp_path / "missing") == {}


def test_the_record_names_the_cpus_generation_beside_its_name():
    machine = machine_description()
    fields = _first_cpu_fields()
    if "cpu family" in fields:
        assert machine["cpu_signature"].startswith(f"family {fields['cpu family']} model ")
    assert machine["cpu"] == fields.get("model name", machine["cpu"])
    assert machine["cores"] >= 1


def test_the_record_names_the_kernels_tcp_congestion_control(tmp_path):
    setting = Path("/proc/sys/net/ipv4/tcp_congestion_control")
    assert machine_description()["tcp_congestion_control"] == setting.read_text().strip()
    written = tmp_path / "tcp_congestion_control"
    written.write_text("cubic\n")
    assert _tcp_congestion_control(written) == "cubic"
    assert _tcp_congestion_control(tmp_path / "missing") == "unknown"
