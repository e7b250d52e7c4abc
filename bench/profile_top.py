"""py-spy profiles of a local cluster's processes during one benchmark phase, and their top entries.

:class:`Profiler` starts ``py-spy record --format raw`` (collapsed stacks) on this process (the
SDK), every gateway and every storage node, and stops them (SIGINT: py-spy then writes its file)
when the phase ends; :func:`top` reads such a file and lists the functions with the most samples,
by self time (the innermost frame) and by inclusive time (anywhere on the stack). Sampling is
``--nonblocking`` (the processes are not paused: their rates are what they would be without it,
and a stack may be slightly torn) and ``--gil`` (only the thread holding the GIL: where the
process spends its Python CPU, not where its threads wait for the GIL, a lock or a system call).

    python bench/profile_top.py /tmp/prof/10000-gateway-0.txt      # the top entries of one file
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Profiler:
    """py-spy recorders on a cluster's processes, one collapsed-stack file each in ``directory``."""

    directory: Path
    phase: str
    recorders: dict[str, subprocess.Popen] = field(default_factory=dict)

    @classmethod
    def start(cls, directory: Path, phase: str, cluster, rate: int = 200) -> Profiler:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(py_spy).exists():
            raise RuntimeError("--profile needs py-spy (pip install py-spy)")
        directory.mkdir(parents=True, exist_ok=True)
        targets = {"sdk": os.getpid()}
        targets |= {f"gateway-{i}": p.pid for i, p in enumerate(cluster.gateways)}
        targets |= {f"storage-{i}": p.pid for i, p in cluster.storage_nodes.items()}
        profiler = cls(directory, phase)
        for name, pid in targets.items():
            output = profiler.path(name)
            profiler.recorders[name] = subprocess.Popen(
                [py_spy, "record", "--nonblocking", "--gil", "--format", "raw", "--rate", str(rate)]
                + ["--pid", str(pid), "--output", str(output)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        return profiler

    def path(self, name: str) -> Path:
        return self.directory / f"{self.phase}-{name}.txt"

    def stop(self, entries: int = 12) -> None:
        """Stop every recorder, and write each process's top entries beside its stacks."""
        for recorder in self.recorders.values():
            recorder.send_signal(signal.SIGINT)
        for name, recorder in self.recorders.items():
            try:
                recorder.wait(60)
            except subprocess.TimeoutExpired:
                recorder.kill()
            path = self.path(name)
            if path.exists():
                path.with_suffix(".top").write_text(format_top(path, entries))


def _function(frame: str) -> str:
    """``func (file:line)`` -> ``func (file)``: a function's samples over all its lines."""
    name, _, where = frame.rpartition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if name and ":" in where else frame


def top(
    path: Path, entries: int = 12, *, by_line: bool = False
) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, top functions by self samples, top by inclusive samples) of a collapsed-stack
    file; ``by_line`` tells a function's lines apart."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        # py-spy puts the thread first ("process 12:..."/"thread (0x..)"): not a function.
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not by_line:
            frames = [_function(f) for f in frames]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return total, own.most_common(entries), inclusive.most_common(entries)


def format_top(path: Path, entries: int = 12, *, by_line: bool = False) -> str:
    total, own, inclusive = top(path, entries, by_line=by_line)
    lines = [f"{path.name}: {total:,} samples"]
    for title, rows in (("self", own), ("inclusive", inclusive)):
        lines.append(f"  by {title}:")
        lines += [f"    {100 * n / max(1, total):5.1f}%  {frame}" for frame, n in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--entries", type=int, default=15)
    parser.add_argument("--by-line", action="store_true", help="tell a function's lines apart")
    args = parser.parse_args(argv)
    for path in args.files:
        print(format_top(path, args.entries, by_line=args.by_line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
