"""Is a service still answering others while it handles a bad (or huge) request?

:func:`while_repeating` sends the request over and over from a thread of its own (its own
channel: another client) and, once the first answer is in, so that the service is demonstrably
busy with it, times a few probe calls from the test's thread. The caller asserts on both: the bad
request's answers (fast, the right error) and the probes' latencies (under a second).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: What "stays responsive" means in the issue: another client's call answers within a second.
PROBE_DEADLINE_S = 1.0


@dataclass
class Observed:
    #: (seconds, answer or exception) per bad request sent.
    answers: list[tuple[float, Any]] = field(default_factory=list)
    #: Seconds per probe call, in order.
    probe_latencies: list[float] = field(default_factory=list)

    @property
    def slowest_probe(self) -> float:
        return max(self.probe_latencies)

    @property
    def slowest_answer(self) -> float:
        return max(seconds for seconds, _ in self.answers)


def while_repeating(
    request: Callable[[], Any],
    probe: Callable[[], Any],
    *,
    probes: int = 5,
    first_answer_timeout: float = 30.0,
    min_answers: int = 1,
) -> Observed:
    """Repeat ``request`` in a thread while timing ``probes`` calls of ``probe`` in this one."""
    observed = Observed()
    stop = threading.Event()
    answered = threading.Event()

    def repeat() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                answer = request()
            except Exception as exc:  # noqa: BLE001 -- the answer under test may be an error: the test asserts on it
                answer = exc
            observed.answers.append((time.monotonic() - started, answer))
            answered.set()

    thread = threading.Thread(target=repeat, name="bad-request", daemon=True)
    thread.start()
    try:
        assert answered.wait(first_answer_timeout), "the request under test never got an answer"
        for _ in range(probes):
            started = time.monotonic()
            probe()
            observed.probe_latencies.append(time.monotonic() - started)
        deadline = time.monotonic() + first_answer_timeout
        while len(observed.answers) < min_answers and time.monotonic() < deadline:
            answered.clear()
            answered.wait(deadline - time.monotonic())
    finally:
        stop.set()
        thread.join(first_answer_timeout)
    assert not thread.is_alive(), "the request under test hung"
    return observed
