"""A rate over sliding sample windows, and the throttle time of a quota on it (Kafka's ``Rate``
over a windowed sum, and ``QuotaUtils.throttleTime``). Pure: the caller passes the time.

The rate is kept in ``samples`` windows of ``window_s`` seconds each (Kafka's
``quota.window.num``, 11, and ``quota.window.size.seconds``, 1). A window starts at the first
value recorded after the previous one ended (windows are not aligned to the clock), and a window
older than ``samples * window_s`` is forgotten. The rate is the sum of the windows kept divided
by the time they span, counted from the start of the oldest.

One departure from Kafka: the span counts at least one window, where Kafka counts at least
``samples - 1``. Kafka's floor lets a new (or long idle) client send ``samples - 1`` seconds of
its quota at once; a greedy client is then held until that burst has left the windows, finds
them nearly empty, bursts again, and keeps alternating between bursts and silence with the
period of the window span. Modelled with a client that sends 64 KiB as soon as it may (the
``tests/unit/services/test_sampled_rate.py`` model), a 1 MB/s quota lets through 1.13 MB/s in
its first 20 s and between 0.58 and 1.10 MB/s over later 20 s periods with Kafka's floor;
with a floor of one window, 1.003 MB/s and 0.996 to 1.003 MB/s.

A quota is violated when the rate after recording a value is above the bound; the throttle time
is what brings the rate back to the bound if nothing else is recorded: with *O* the rate, *T*
the bound and *W* the span, ``O * W / (W + X) = T`` gives ``X = (O - T) / T * W``.

Not thread-safe: the gateway uses it on its event loop only.
"""

from __future__ import annotations

__all__ = ["SampledRate"]


class _Sample:
    __slots__ = ("start", "value")

    def __init__(self, start: float) -> None:
        self.start = start
        self.value = 0.0


class SampledRate:
    """Sum per second over the last ``samples`` windows of ``window_s`` seconds."""

    __slots__ = ("_current", "_samples", "last_recorded", "samples", "window_s")

    def __init__(self, samples: int = 11, window_s: float = 1.0) -> None:
        if samples < 2:
            raise ValueError(f"a sampled rate needs at least 2 samples, not {samples}")
        if window_s <= 0:
            raise ValueError(f"the sample window must be positive, not {window_s}")
        self.samples = samples
        self.window_s = window_s
        self._samples: list[_Sample] = []
        self._current = 0
        #: When a value was last recorded (-inf: never); all samples are obsolete
        #: ``samples * window_s`` after it, and the rate is then 0.
        self.last_recorded = float("-inf")

    def record(self, value: float, now: float) -> None:
        samples = self._samples
        if not samples:
            samples.append(_Sample(now))
            self._current = 0
        sample = samples[self._current]
        if now - sample.start >= self.window_s:
            sample = self._advance(now)
        sample.value += value
        self.last_recorded = now

    def _advance(self, now: float) -> _Sample:
        self._current = (self._current + 1) % self.samples
        if self._current >= len(self._samples):
            sample = _Sample(now)
            self._samples.append(sample)
            return sample
        sample = self._samples[self._current]
        sample.start, sample.value = now, 0.0
        return sample

    def _purge(self, now: float) -> None:
        expire = self.samples * self.window_s
        for sample in self._samples:
            if now - sample.start >= expire:
                sample.start, sample.value = now, 0.0

    def window_span(self, now: float) -> float:
        """The seconds the kept windows span (at least one window)."""
        self._purge(now)
        oldest = min((s.start for s in self._samples), default=now)
        return max(now - oldest, self.window_s)

    def measure(self, now: float) -> float:
        """The rate per second now."""
        span = self.window_span(now)
        return sum(s.value for s in self._samples) / span

    def throttle_s(self, bound: float, now: float) -> float:
        """Seconds to hold the client so the rate falls back to ``bound`` (0 within it)."""
        span = self.window_span(now)
        rate = sum(s.value for s in self._samples) / span
        if rate <= bound:
            return 0.0
        return (rate - bound) / bound * span

    def peek(self, now: float) -> float:
        """The rate per second now, changing nothing (for a metrics exporter on another thread:
        a value one record behind is fine)."""
        expire = self.samples * self.window_s
        kept = [(s.start, s.value) for s in list(self._samples) if now - s.start < expire]
        oldest = min((start for start, _ in kept), default=now)
        return sum(value for _, value in kept) / max(now - oldest, self.window_s)

    def idle(self, now: float) -> bool:
        """True when every value recorded has left the windows (the rate is 0 for good)."""
        return now - self.last_recorded >= self.samples * self.window_s
