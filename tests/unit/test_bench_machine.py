"""What every benchmark's results.json says of the machine that ran it."""

from __future__ import annotations

from pathlib import Path

from engram_cli.bench.machine import calibration, cpu_model, describe_machine, machine_line


def test_cpu_model_is_read_from_the_kernels_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 9R14\n"
    )
    assert cpu_model(cpuinfo) == "AMD EPYC 9R14"


def test_cpu_model_without_cpuinfo_is_still_a_name(tmp_path: Path) -> None:
    assert cpu_model(tmp_path / "missing")  # the platform's word, or "unknown"


def test_calibration_times_both_workloads() -> None:
    measured = calibration()
    assert set(measured) == {"python_ms", "numpy_ms"}
    assert all(value > 0 for value in measured.values())


def test_the_machine_entry_and_its_line() -> None:
    machine = describe_machine()
    assert machine["cpus"] and machine["cpu_model"] and machine["python"]
    line = machine_line(machine)
    assert machine["cpu_model"] in line and "calibration python" in line
    bare = describe_machine(calibrate=False)
    assert "calibration" not in bare
    assert "calibration" not in machine_line(bare)
