"""The doctor's output: one table, a verdict per device, then what to fix."""

from __future__ import annotations

from globaldl.doctor.checks import COLUMNS, DeviceReport, Verdict

VERDICT_WORDS = {Verdict.OK: "ok", Verdict.WARN: "WARN", Verdict.FAIL: "FAIL"}


def render(reports: list[DeviceReport]) -> str:
    """The table, the reasons under it, and a last line that says whether a run would work."""
    header = ["device", *COLUMNS, "verdict"]
    rows = [
        [report.host, *(check.cell for check in report.checks), VERDICT_WORDS[report.verdict]]
        for report in reports
    ]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]  # fmt: skip
    reasons = [
        f"{report.host}: {VERDICT_WORDS[check.verdict]} {check.name}: {check.detail}"
        for report in reports
        for check in report.checks
        if check.detail and check.verdict in (Verdict.WARN, Verdict.FAIL)
    ]
    if reasons:
        lines += ["", *reasons]
    failing = [report.host for report in reports if report.verdict is Verdict.FAIL]
    lines.append("")
    if failing:
        lines.append(
            f"verdict: a run would FAIL: {len(failing)} of {len(reports)} devices "
            f"({', '.join(failing)})"
        )
    else:
        warned = sum(report.verdict is Verdict.WARN for report in reports)
        lines.append(
            f"verdict: ready, {len(reports)} devices"
            + (f" ({warned} with warnings)" if warned else "")
        )
    return "\n".join(lines)
