"""What the SDK benchmarks' markdown reports share: the load line, a list of runs, writing the file."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable
from pathlib import Path

REPORTS = Path(__file__).parent / "reports"


def load_line(load_at_start: float) -> str:
    """The machine's load while the benchmark ran: numbers taken beside other work say so."""
    return (
        f"Load average (1 min) {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
        f"{os.cpu_count()} cores (above the core count, other processes were sharing the machine)."
    )


def runs(rates: Iterable[float]) -> str:
    """Every run's rate, comma-separated (the reports list them beside the best)."""
    return ", ".join(f"{rate:,.0f}" for rate in rates)


def write_report(lines: list[str], name: str, path: Path | None = None) -> Path:
    """Print the report and write it to ``path`` (default ``bench/reports/<name>-<date>.md``)."""
    report = "\n".join(lines) + "\n"
    print(report)
    path = path or REPORTS / f"{name}-{datetime.date.today().isoformat()}.md"
    path.write_text(report)
    print(f"written to {path}")
    return path
