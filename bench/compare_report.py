"""The report of ``bench/compare.py``: ``bench/reports/<date>.md`` plus PNG plots (matplotlib).

Plots, after the paper's figures: ``*-fig4-producer.png`` (producer throughput against MB sent,
every peer, unbatched and batched), ``*-fig5-consumer.png`` (consumer throughput against MB
consumed), ``*-retained.png``, ``*-partitions.png``, ``*-latency.png``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

PAPER = {"unbatched": 50_000, "batched": 400_000, "consume": 22_000}
BATCH_RECORDS = 50
#: Rates measured over less than this many seconds are marked (†) as noisy.
SHORT_S = 0.25
PEER_ORDER = ("tributary", "rabbitmq", "activemq", "nats", "redis")
TITLES = {
    "tributary": "Tributary",
    "rabbitmq": "RabbitMQ",
    "activemq": "ActiveMQ",
    "nats": "NATS JetStream",
    "redis": "Redis Streams",
}
COLORS = {
    "tributary": "#d62728",
    "rabbitmq": "#ff7f0e",
    "activemq": "#8c564b",
    "nats": "#2ca02c",
    "redis": "#1f77b4",
}


# ---- lookups ----------------------------------------------------------------------------------


class Results:
    def __init__(self, results, peers: list[str]) -> None:
        self.by_key = {(r.peer, r.experiment): r for r in results}
        self.results = results
        self.peers = [p for p in PEER_ORDER if p in peers]
        self.others = [p for p in self.peers if p != "tributary"]

    def get(self, peer: str, experiment: str):
        return self.by_key.get((peer, experiment))

    def rate(self, peer: str, experiment: str) -> float | None:
        r = self.get(peer, experiment)
        return r.rate if r is not None and r.ok else None

    def short(self, peer: str, experiment: str) -> bool:
        """Measured over less than SHORT_S seconds (noisy on a shared machine)."""
        r = self.get(peer, experiment)
        return r is not None and r.ok and r.seconds < SHORT_S

    def latency(self, peer: str, experiment: str, key: str) -> float | None:
        r = self.get(peer, experiment)
        if r is None or not r.ok or key not in r.extra:
            return None
        return r.extra[key]


def fmt_rate(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "—"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}×" if value < 10 else f"{value:.0f}×"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if value < 10 else f"{value:,.0f}"


# ---- rows of the headline table ---------------------------------------------------------------


def headline_rows(res: Results, sizes: dict) -> list[dict]:
    """Every comparable experiment: label, kind ("rate" or "latency"), values per peer."""
    rows: list[dict[str, Any]] = []

    def rate_row(label: str, experiment: str) -> None:
        rows.append(
            dict(
                label=label,
                kind="rate",
                experiment=experiment,
                values={p: res.rate(p, experiment) for p in res.peers},
                short={p: res.short(p, experiment) for p in res.peers},
            )
        )

    rate_row("produce, unbatched (msg/s)", "unbatched")
    rate_row("produce, batched 50 (msg/s)", "batched")
    rate_row("consume (msg/s)", "consume")
    for rate in sizes["rates"]:
        for key, name in (("p50_ms", "p50"), ("p99_ms", "p99")):
            rows.append(
                dict(
                    label=f"latency {name} at {rate:,}/s (ms)",
                    kind="latency",
                    experiment=f"latency@{rate}",
                    values={p: res.latency(p, f"latency@{rate}", key) for p in res.peers},
                )
            )
    for level in sizes["retained_mb"]:
        rate_row(f"produce with {level:,} MB retained (msg/s)", f"retained-produce@{level}")
        rate_row(f"consume with {level:,} MB retained (msg/s)", f"retained-consume@{level}")
    for partitions in sizes["partitions"]:
        rate_row(f"produce, {partitions} partitions (msg/s)", f"partitions-produce@{partitions}")
        rate_row(f"consume, {partitions} partitions (msg/s)", f"partitions-consume@{partitions}")
    for row in rows:
        trib = row["values"].get("tributary")
        ratios: dict[str, float | None] = {}
        for peer in res.others:
            other = row["values"].get(peer)
            if trib is None or other is None or other <= 0 or trib <= 0:
                ratios[peer] = None
            else:
                # > 1: Tributary is ahead (more msg/s, or less latency)
                ratios[peer] = trib / other if row["kind"] == "rate" else other / trib
        row["ratios"] = ratios
        known = [v for v in ratios.values() if v is not None]
        row["worst"] = min(known) if known else None
        row["met"] = None if not known or len(known) < len(res.others) else min(known) >= 1.0
        if trib is None:
            row["met"] = None
    return rows


def headline_table(res: Results, rows: list[dict]) -> list[str]:
    head = [
        "experiment",
        "Tributary",
        *[TITLES[p] for p in res.others],
        "Tributary ÷ best peer",
        "ahead of all?",
    ]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + [":---:"]) + "|",
    ]
    for row in rows:
        fmt = fmt_rate if row["kind"] == "rate" else fmt_ms
        short = row.get("short", {})

        def mark(peer: str, short: dict = short) -> str:
            return "†" if short.get(peer) else ""

        cells = [row["label"], f"**{fmt(row['values'].get('tributary'))}**{mark('tributary')}"]
        for peer in res.others:
            value = row["values"].get(peer)
            ratio = row["ratios"].get(peer)
            cells.append(f"{fmt(value)}{mark(peer)} ({fmt_ratio(ratio)})" if value is not None else "—")
        cells.append(fmt_ratio(row["worst"]))
        cells.append({True: "yes", False: "**no**", None: "n/a"}[row["met"]])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def paper_rows(res: Results) -> list[tuple[str, str, float | None, int]]:
    def best(*experiments: str) -> tuple[str, float | None]:
        found = [(e, v) for e in experiments if (v := res.rate("tributary", e)) is not None]
        if not found:
            return experiments[0], None
        return max(found, key=lambda item: item[1])

    rows = []
    e, v = best("unbatched")
    rows.append(
        ("produce, unbatched (1 message per request, no acknowledgement awaited)", e, v, PAPER["unbatched"])
    )
    e, v = best("variant-batched-acks0", "batched")
    rows.append(
        ("produce, batched 50 (the paper's Kafka: no acknowledgement awaited)", e, v, PAPER["batched"])
    )
    e, v = best("consume")
    rows.append(("consume (200 KB fetches)", e, v, PAPER["consume"]))
    return rows


# ---- plots ------------------------------------------------------------------------------------


def windowed(samples, bytes_per_message: int, points: int = 40) -> tuple[list[float], list[float]]:
    """(MB so far, msg/s over the last window) from (seconds, messages) samples.

    A window in which nothing was counted (a fire-and-forget producer's final wait for the broker's
    barrier) is merged into the window before it, so the last point carries that wait and the line
    ends near the reported average instead of at the client's send rate.
    """
    if len(samples) < 2:
        return [], []
    total = samples[-1][0]
    window = max(total / points, 0.01)
    segments: list[list[float]] = []  # [t0, c0, t1, c1]
    last_t, last_c = samples[0]
    for t, c in samples[1:]:
        if t - last_t >= window or (t, c) == tuple(samples[-1]):
            if t > last_t:
                if c == last_c and segments:
                    segments[-1][2] = t
                else:
                    segments.append([last_t, last_c, t, c])
            last_t, last_c = t, c
    xs = [seg[3] * bytes_per_message / 1e6 for seg in segments if seg[3] > seg[1]]
    ys = [(seg[3] - seg[1]) / (seg[2] - seg[0]) for seg in segments if seg[3] > seg[1]]
    return xs, ys


def plots(directory: Path, stem: str, res: Results, sizes: dict) -> dict[str, str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    made: dict[str, str] = {}
    for plot in (_plot_producer, _plot_consumer, _plot_scaling, _plot_latency):
        made.update(plot(plt, directory, stem, res, sizes))
    return made


def _plot_producer(plt, directory: Path, stem: str, res: Results, sizes: dict) -> dict[str, str]:
    """Figure 4: producer throughput against data sent."""
    made: dict[str, str] = {}
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for peer in res.peers:
        for experiment, style, label in (
            ("unbatched", "-", "unbatched"),
            ("batched", "--", "batched 50"),
            ("variant-batched-acks0", ":", "batched 50, acks=0"),
        ):
            r = res.get(peer, experiment)
            if r is None or not r.ok:
                continue
            xs, ys = windowed(r.samples, r.bytes_per_message)
            if xs:
                ax.plot(
                    xs, ys, style, color=COLORS[peer], label=f"{TITLES[peer]} {label} (avg {r.rate:,.0f}/s)"
                )
    for key, value in (("unbatched", PAPER["unbatched"]), ("batched", PAPER["batched"])):
        ax.axhline(value, color="grey", linewidth=0.8, linestyle="-.")
        ax.text(0, value * 1.05, f"Kafka 2011, {key}: {value:,}/s", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("MB sent (200-byte messages)")
    ax.set_ylabel("messages/s")
    ax.set_title(f"Producer performance (cf. the paper's Figure 4), {sizes['messages']:,} messages")
    legend(ax, fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    made["fig4"] = save(fig, directory, f"{stem}-fig4-producer.png")

    return made


def _plot_consumer(plt, directory: Path, stem: str, res: Results, sizes: dict) -> dict[str, str]:
    """Figure 5: consumer throughput against data consumed."""
    made: dict[str, str] = {}
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for peer in res.peers:
        r = res.get(peer, "consume")
        if r is None or not r.ok:
            continue
        xs, ys = windowed(r.samples, r.bytes_per_message)
        if xs:
            ax.plot(xs, ys, "-", color=COLORS[peer], label=f"{TITLES[peer]} (avg {r.rate:,.0f}/s)")
    ax.axhline(PAPER["consume"], color="grey", linewidth=0.8, linestyle="-.")
    ax.text(0, PAPER["consume"] * 1.05, f"Kafka 2011: {PAPER['consume']:,}/s", color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("MB consumed (200-byte messages)")
    ax.set_ylabel("messages/s")
    ax.set_title("Consumer performance (cf. the paper's Figure 5): ~200 KB / 1,000 messages per pull")
    legend(ax, fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    made["fig5"] = save(fig, directory, f"{stem}-fig5-consumer.png")

    return made


def _plot_scaling(plt, directory: Path, stem: str, res: Results, sizes: dict) -> dict[str, str]:
    """Retained data and partitions: rate against size / count."""
    made: dict[str, str] = {}
    for name, keys, xlabel, values, logx in (
        (
            "retained",
            ("retained-produce@{}", "retained-consume@{}"),
            "MB already retained",
            sizes["retained_mb"],
            False,
        ),
        (
            "partitions",
            ("partitions-produce@{}", "partitions-consume@{}"),
            "partitions (queues / streams / keys)",
            sizes["partitions"],
            True,
        ),
    ):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for ax, key, what in zip(axes, keys, ("produce (batched 50)", "consume")):
            for peer in res.peers:
                points = [(v, res.rate(peer, key.format(v))) for v in values]
                points = [(v, r) for v, r in points if r is not None]
                if points:
                    ax.plot(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        "o-",
                        color=COLORS[peer],
                        label=TITLES[peer],
                    )
            ax.set_yscale("log")
            if logx:
                ax.set_xscale("log", base=2)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("messages/s")
            ax.set_title(what)
            ax.grid(True, which="both", alpha=0.3)
            legend(ax, fontsize=8)
        fig.suptitle("Throughput as the retained log grows" if name == "retained" else "Many partitions")
        made[name] = save(fig, directory, f"{stem}-{name}.png")

    return made


def _plot_latency(plt, directory: Path, stem: str, res: Results, sizes: dict) -> dict[str, str]:
    """Latency: p50 and p99 per peer and rate."""
    made: dict[str, str] = {}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(res.peers))
    for i, peer in enumerate(res.peers):
        xs, p50, p99 = [], [], []
        for j, rate in enumerate(sizes["rates"]):
            a = res.latency(peer, f"latency@{rate}", "p50_ms")
            b = res.latency(peer, f"latency@{rate}", "p99_ms")
            if a is not None and b is not None:
                xs.append(j + i * width)
                p50.append(a)
                p99.append(b)
        if xs:
            ax.bar(xs, p99, width, color=COLORS[peer], alpha=0.35)
            ax.bar(xs, p50, width, color=COLORS[peer], label=f"{TITLES[peer]} (solid p50, light p99)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes["rates"]))])
    ax.set_xticklabels([f"{r:,} msg/s" for r in sizes["rates"]])
    ax.set_yscale("log")
    ax.set_ylabel("produce -> consumed (ms)")
    ax.set_title("End-to-end latency at fixed rates")
    legend(ax, fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    made["latency"] = save(fig, directory, f"{stem}-latency.png")
    return made


def legend(ax, **kwargs) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def save(fig, directory: Path, name: str) -> str:
    import warnings

    import matplotlib.pyplot as plt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tight_layout's notes on crowded legends
        fig.tight_layout()
    fig.savefig(directory / name, dpi=110)

    plt.close(fig)
    return name


# ---- the profile ------------------------------------------------------------------------------


def profile_section(profile: dict | None) -> list[str]:
    if not profile:
        return ["No profile was taken (`--no-profile`, or Tributary not run)."]
    if "error" in profile:
        return [f"The profile failed: `{profile['error']}`"]
    lines = [
        f"py-spy at {profile['rate_hz']} Hz on the client (this benchmark's process, which runs the SDK), "
        "the gateway and the storage node, during separate runs of the same size (so the sampling does not "
        "touch the measured numbers). CPU is from `/proc/<pid>/stat` over the phase: 1.00 = one core busy "
        "the whole time. Areas count each sample's innermost Python frame (time inside a C extension "
        "counts toward the Python function that called it).",
        "",
    ]
    for phase, data in profile["phases"].items():
        lines.append(f"**{phase}** — {data['rate']:,.0f} msg/s under the profiler, {data['wall']:.2f} s")
        lines.append("")
        cpu = ", ".join(f"{name} {share:.2f}" for name, (_, share) in data["cpu"].items())
        others = data.get("others")
        if others:
            cpu += ", " + ", ".join(f"{name} {share:.2f}" for name, share in others.items())
        lines.append(f"CPU (cores): {cpu}")
        lines.append("")
        lines.append("| process | samples | where the time goes (areas) | top functions (self time) |")
        lines.append("|---|---:|---|---|")
        for name, summary in data["processes"].items():
            areas = "; ".join(f"{a} {share:.0%}" for a, share in summary["areas"][:6])
            functions = "; ".join(f"`{f}` {share:.0%}" for f, share in summary["functions"][:5])
            lines.append(f"| {name} | {summary['samples']:,} | {areas} | {functions} |")
        if data.get("errors"):
            lines.append("")
            lines.append(f"py-spy errors: {data['errors']}")
        lines.append("")
    return lines


LEVERS = {
    "unbatched": (
        "Since issue 19 the SDK produces over the gateway's raw data listener (length-prefixed frames, "
        "not one gRPC message per record; `--tributary-data-path grpc` measures the old path, bounded "
        "by gRPC Python's ~7,900 messages/s, `bench/grpc_ceiling.py`). Since the 2026-11-25 round a "
        "record that fills its batch alone is sealed with its frame in one C call on the application "
        "thread (the I/O thread only stamps the correlation id and writes), and a queued record holds 5"
        " objects the garbage collector walks instead of 13 (full collections over hundreds of "
        "thousands of queued records were a third of the client): the client's CPU per record fell from"
        " ~26-33 us to ~14-15 us; the gateway spends ~14 and the node ~7 (`bench/gateway_produce.py`). "
        "The third 2026-11-25 round cut the gateway's CPU per request ~25-30% unbatched and ~18% "
        "batched (A/B, /proc): NamedTuples for the per-request objects, payloads kept as views of the "
        "frame up to the node's link, frames served in place from each read. With 20,000 messages the "
        "run lasts ~0.4 s and its start-up weighs in: use `--messages 200000`. Next levers: garbage "
        "collection in the gateway (full collections over queued requests), a direct raw-produce path "
        "without the per-request tuples, the merged append's join (7% of the gateway, batched). The "
        "fourth round (2026-11-25) found the SDK, not the gateway, bounds the batched acks=0 row (the "
        "SDK's main thread at 0.8-1.05 cores, the gateway 0.16, the node 0.2; one gateway full "
        "collection in 1M messages): a queued record's future is now untracked by the garbage collector"
        " until a callback is hung on it (SDK CPU per record ~3.1 -> ~2.7 us in that row, A/B), and the"
        " node checks CRC-32C with the SSE 4.2 instruction (a 10 KB batch 4.85 -> 1.2 us). That row "
        "rose from 277-304k to 341k. Next levers there: the per-record chain of Python calls in the SDK"
        " (send -> prepare -> append -> builder), the per-batch wake-up of the I/O thread."
    ),
    "batched": (
        "With one 50-record batch in flight, the rate is one client -> gateway -> storage node -> back "
        "round trip per batch (~50/rate seconds each), with every process well under a core: "
        "latency-bound on the hops, not on the record codec (C). The second 2026-11-25 round serves a "
        "produce frame in the callback that read it, in the gateway's data listener and in the node's "
        "append connection (no task woken, no loop turn between reading a request and starting its "
        "append), and gives the waits for answers one timer per connection instead of one per request: "
        "syscalls per one-at-a-time acks=1 request gateway 13 -> 6, node 6 -> 4, SDK 10 -> 6; CPU per "
        "request gateway ~205-235 -> ~160-190 us, node ~137-147 -> ~107-130 (A/B, /proc); one acks=1 "
        "send at a time ~1,500 -> ~2,200/s, this row ~56k -> ~75k. Each of the three processes still "
        "wakes from sleep once a request, and loopback sends are 25-50% of the busy CPU of gateway and "
        "node. The third round reads the SDK's answers in the socket's callback (client syscalls per "
        "one-at-a-time acks=1 send 19.8 -> 16.5, strace) and trims the gateway's per-request objects: "
        "one acks=1 send at a time ~2,200 -> ~2,450/s, this row ~75k -> ~81-85k. Of the SDK's ~16 "
        "syscalls a send, ~8 are futex calls between the application thread and the I/O thread. Next "
        "levers: the node's offset-index file kept open (openat + close per append), fewer thread "
        "handoffs in the SDK. The fourth round writes a request on the application's thread while the "
        "SDK's I/O loop waits in select (acks 1/all; `IOThread.call_if_idle`): SDK CPU per "
        "one-at-a-time acks=1 send ~225 -> ~170 us (`bench/sdk_send.py --only sync`). CPU per such send"
        " is now SDK ~170-190 us, gateway ~190-200, node ~115-125, in series: ~0.5 ms of CPU per round "
        "trip bounds it near 2,000/s, and /proc puts ~75% of the gateway's in user time on its one "
        "event-loop thread, in two loop turns a send. This row 69-89k over three runs (Redis Streams "
        "77-88k). Next levers: less Python per loop turn in gateway and node (the node's offset-index "
        "file is still opened and closed per entry: 8.5 vs 1.1 us on a kept descriptor)."
    ),
    "consume": (
        "Consumption is bound by the fetch round trip. The SDK writes the next fetch in the loop turn "
        "that buffers an answer (as Kafka's consumer does), and since the second 2026-11-25 round the "
        "gateway starts a fetch session's next read at the storage node as soon as it writes the answer"
        " (read ahead, `gateway/server/fetch_ahead.py`): the next fetch finds its data there or already"
        " waiting. A fetch waits at the node when a record lands 47-60% of the time instead of 5-6%; "
        "over 1,000,000 messages four runs gave 0.85-1.42M msg/s (was ~0.66-0.74M). CPU per message did"
        " not change (client ~0.85 us, gateway ~0.5, node ~0.3): the run swings with how the three "
        "processes share two cores. Next levers: more than one answer read ahead, the gateway writing a"
        " fetch answer in the turn that completes it, answers pushed on a session without waiting for "
        "the next request. The fourth round measured chaining the read ahead (the next read started "
        "from the positions after a read that ended before its fetch came): 75-87% of reads chained, "
        "but no gain (22 A/B pairs, p50 ratio 1.01-1.04): the SDK sends its next fetch as soon as an "
        "answer is buffered, so only ~3% of reads end before their fetch; not merged (branch "
        "h19-readahead)."
    ),
    "latency": (
        "A probe crosses four Python processes and two SDK I/O threads (producer SDK -> gateway -> "
        "storage node, then the consumer's long poll: gateway -> storage node fetch port -> gateway -> "
        "SDK). Timestamped per hop at 2,000/s under load (2026-11-25, second round; p50 ~4.5 ms with "
        "tracing): send() -> frame written ~1.1 ms (a record waits for the previous request's round "
        "trip), frame -> node append ~0.8 ms, append -> the fetch's answer at the gateway ~1.3 ms (0.53"
        " ms when a fetch already waited at the node), gateway -> poll() returns ~0.9 ms. The node "
        "wakes a waiting fetch ~0.1 ms after the append. At 2,000/s the pipeline spends ~0.45-0.7 ms of"
        " CPU a message over client, gateway and node (0.9-1.4 of the two cores), so it batches and "
        "queues; at 500/s each cycle ends inside the 2 ms gap. The read ahead keeps a fetch waiting at "
        "the node about half the time (was ~8%), which cut the p99 more than the p50. The third round "
        "made an idempotent producer keep up to 5 requests of a partition in flight (Kafka's "
        "max.in.flight, sequence numbers keeping order); sending every record at once that way made "
        "this p50 1.2-1.6x *higher* (A/B): the send -> acknowledged time did not move, because the "
        "gateway keeps one append per partition in flight to the node, so the wait moved there and each"
        " record cost a request. So only complete batches are pipelined, and this run (Kafka's default "
        "producer, acks=all) sends as before. Next levers: the gateway pipelining an idempotent "
        "stream's appends to the node (the node orders them by sequence), then fewer process wake-ups "
        "per hop and less CPU per message (at 2,000/s the pipeline is half busy, so it queues). The "
        "fourth round built that gateway pipelining (up to 5 appends of an idempotent stream's "
        "partition in flight to the node) and measured it with and without the SDK pipelining every "
        "record: no gain (new/old p50 2.88/3.22, 3.34/3.58, 2.04/2.04 ms; with the SDK pipelining too, "
        "send -> frame written fell ~0.6 -> ~0.15 ms but every hop after the node got slower); not "
        "merged (branch h19-latency). Its hop trace: with no fetch waiting at the node a record waits "
        "~2.2 ms for the next (57% of records), ~0.47 ms with one waiting; the gateway holds a "
        "read-ahead's data ~0.92 ms when it comes before the SDK's fetch. This run's p50 at 2,000/s "
        "(1.81 ms, was 2.01) comes with the SDK's cheaper sends. Next levers: a long poll the node "
        "re-arms itself (a second read parked while the first is answered), less CPU per message in "
        "each process."
    ),
    "retained": (
        "Tributary's produce and consume rates do not fall as the retained log grows (the paper's claim"
        " holds: compare its columns in the retained table); where a peer is ahead here it is ahead at "
        "0 MB too, so the lever is the one for the plain produce / consume rows. The consume columns "
        "read 40,000 messages in ~0.1 s (†): they swing by +-30% between runs."
    ),
    "partitions": (
        "Produce: one batch in flight in both cases. Since the 2026-11-25 round the node rewrites the "
        "recovery-point checkpoint (two fsyncs) at most once a minute on the flush policy's flushes "
        "(Kafka's log.flush.offset.checkpoint.interval.ms), not 256 times a second at flush.ms=1000: "
        "without flush.ms a batch to one of 256 partitions costs the node what one to a single "
        "partition does; with it ~270 vs ~200 us (the per-partition data fsync on the flush tick). "
        "Consume: fetch sessions (KIP-227) between the SDK and the gateway name only partitions that "
        "changed, but the gateway -> node hop still names every session partition on every fetch (~570 "
        "us of gateway and ~450 us of node CPU for a fetch of 256 quiet partitions). Next levers: a "
        "fetch session on the gateway -> node hop, fewer log fsyncs per flush tick. The consume rows "
        "read for well under a second: rerun with a larger `--messages` before reading much into one "
        "figure. The third 2026-11-25 round measured the node at 256 vs 1 partitions "
        "(`bench/gateway_produce.py --partitions`): +55-80 us a request with flush.ms=1000, +0-25 "
        "without; strace puts 61% of the node's syscall time in the 256 fsyncs a second (238 us each). "
        "The open-handle cache's touch now costs ~0.09 us (was ~0.75). Next lever: the flush tick's "
        "fsyncs issued together so the journal commits once for many partitions. The fourth round does "
        "that (four flush threads: a tick of 256 due flushes 0.4-1.2 s -> ~0.05-0.15 s of wall time; "
        "before, a tick outlasted its 1 s interval, so partitions were flushed every ~2 s), and a flush"
        " no longer fsyncs the indexes of the segment it ends in (recovery rebuilds them; CPU per flush"
        " 160-281 -> 115-172 us). Produce 256/1 stayed ~0.9x (0.99, 0.87, 0.88 over three runs): the "
        "remaining cost is the log fsync itself (~100 us of kernel CPU per partition per second, which "
        "flush.ms asks for). Consume: the SDK's and gateway's per-fetch passes over 256 partitions cost"
        " about a third of what they did, and a consumer no longer restarts its fetch routine (and a "
        "ListOffsets of every partition) at each seek: 256/1 was 1.23x, 1.29x and 2.67x slower over "
        "three runs (the rows last 0.06-0.08 s). Next lever: a fetch session on the gateway -> node hop"
        " (the node still decodes a 256-partition request per fetch, ~230 us)."
    ),
}


def phase_of(profile: dict | None, prefix: str) -> dict | None:
    if not profile or "phases" not in profile:
        return None
    for name, data in profile["phases"].items():
        if name.startswith(prefix):
            return data
    return None


def cpu_line(data: dict | None) -> str:
    if not data:
        return ""
    shares = ", ".join(f"{name.split(' (')[0]} {share:.2f}" for name, (_, share) in data["cpu"].items())
    return f"CPU in cores during the profiled run: {shares}"


def _unbatched_evidence(res: Results, profile: dict | None) -> list[str]:
    parts = [cpu_line(phase_of(profile, "produce, unbatched"))]
    java, sdk = res.rate("tributary", "variant-java-unbatched"), res.rate("tributary", "unbatched")
    if java and sdk:
        parts.append(f"Java stub client {java:,.0f} msg/s vs the SDK's {sdk:,.0f} msg/s")
    return parts


def _batched_evidence(res: Results, profile: dict | None) -> list[str]:
    parts = [cpu_line(phase_of(profile, "produce, batched"))]
    rate = res.rate("tributary", "batched")
    if rate:
        parts.append(f"{1e3 * BATCH_RECORDS / rate:.2f} ms per acknowledged 50-record batch")
    java = res.rate("tributary", "variant-java-batched")
    if java:
        parts.append(f"Java stub client {java:,.0f} msg/s")
    return parts


def _consume_evidence(res: Results, profile: dict | None) -> list[str]:
    data = phase_of(profile, "consume")
    parts = [cpu_line(data)]
    if data:
        client = next((v for k, v in data["processes"].items() if k.startswith("client")), None)
        if client and client["functions"]:
            name, share = client["functions"][0]
            parts.append(f"the client's top function `{name}` has {share:.0%} of its samples")
    return parts


def _partitions_evidence(res: Results, profile: dict | None) -> list[str]:
    parts = []
    for experiment in sorted(
        {r.experiment for r in res.results if r.experiment.startswith("variant-partitions-noflush@")}
    ):
        count = experiment.split("@")[1]
        without, with_ = (
            res.rate("tributary", experiment),
            res.rate("tributary", f"partitions-produce@{count}"),
        )
        if without and with_:
            parts.append(
                f"produce over {count} partitions {with_:,.0f} msg/s with flush.ms=1000, "
                f"{without:,.0f} msg/s on a topic without it"
            )
    for experiment in sorted(
        {r.experiment for r in res.results if r.experiment.startswith("partitions-consume@")},
        key=lambda e: int(e.split("@")[1]),
    ):
        value = res.rate("tributary", experiment)
        if value:
            parts.append(f"consume over {experiment.split('@')[1]} partitions {value:,.0f} msg/s")
    return parts


def _latency_evidence(res: Results, profile: dict | None) -> list[str]:
    parts = []
    for experiment in sorted({r.experiment for r in res.results if r.experiment.startswith("latency@")}):
        trib = res.latency("tributary", experiment, "p50_ms")
        best = [(res.latency(p, experiment, "p50_ms"), p) for p in res.others]
        best = [b for b in best if b[0] is not None]
        if trib and best:
            value, peer = min(best)
            parts.append(
                f"p50 at {experiment.split('@')[1]}/s: Tributary {trib:.2f} ms, {TITLES[peer]} {value:.2f} ms"
            )
    return parts


_EVIDENCE = {
    "unbatched": _unbatched_evidence,
    "batched": _batched_evidence,
    "consume": _consume_evidence,
    "partitions": _partitions_evidence,
    "latency": _latency_evidence,
}


def evidence(key: str, res: Results, profile: dict | None) -> str:
    """This run's numbers behind a lever."""
    gather = _EVIDENCE.get(key)
    parts = [p for p in (gather(res, profile) if gather else []) if p]
    return ("This run: " + "; ".join(parts) + ". ") if parts else ""


def lever_for(experiment: str) -> str:
    if experiment.startswith("latency"):
        return LEVERS["latency"]
    if experiment.startswith("retained"):
        return LEVERS["retained"]
    if experiment.startswith("partitions"):
        return LEVERS["partitions"]
    return LEVERS.get(experiment, "")


# ---- the report -------------------------------------------------------------------------------


def write(
    directory: Path,
    runner,
    machine: dict,
    sizes: dict,
    peers: list[str],
    profile: dict | None,
    started: dt.datetime,
    finished: dt.datetime,
    command: str,
    path: Path | None = None,
) -> Path:
    """Write the report (``path``, else ``<date>.md``, else ``<date>-<HHMM>.md`` if that exists)."""
    directory.mkdir(parents=True, exist_ok=True)
    if path is None:
        stem = started.strftime("%Y-%m-%d")
        path = directory / f"{stem}.md"
        if path.exists():
            stem = started.strftime("%Y-%m-%d-%H%M")
            path = directory / f"{stem}.md"
    stem = path.stem
    res = Results(runner.results, peers)
    rows = headline_rows(res, sizes)
    images = plots(directory, stem, res, sizes)
    info = runner.peer_info

    out = _intro(started, finished, command, sizes)
    headline, paper_misses = _headline(res, rows)
    out += headline
    out += _targets(res, rows, paper_misses, profile)
    out += _producer(res, runner, info, images)
    out += _consumer(res, images)
    out += _latency(res, sizes, images)
    out += _retained(res, sizes, images)
    out += _partitions(res, sizes, images)
    out += _machine(machine)
    out += _brokers(res, runner, info, command, path)
    path.write_text("\n".join(out))
    return path


def _intro(started: dt.datetime, finished: dt.datetime, command: str, sizes: dict) -> list[str]:
    """The title and what was run."""
    out: list[str] = []
    add = out.append
    minutes = (finished - started).total_seconds() / 60
    add(
        "# The 2011 paper's experiments, side by side: Tributary, RabbitMQ, ActiveMQ, NATS JetStream, Redis "
        "Streams"
    )
    add("")
    add(
        f"Run {started:%Y-%m-%d %H:%M}–{finished:%H:%M} ({minutes:.1f} min) with `{command}`: 200-byte "
        f"messages, {sizes['messages']:,} per produce experiment, {sizes.get('consume_messages', 0):,} for "
        f"the consume experiment, {sizes.get('retained_messages', 0):,} for the retained-data and "
        f"{sizes.get('partition_messages', 0):,} for the partition experiments; the same payloads for every "
        "broker, each broker alone on loopback on this machine, one after the other. Retained-data levels "
        f"{', '.join(f'{v:,} MB' for v in sizes['retained_mb'])}; partitions "
        f"{', '.join(map(str, sizes['partitions']))}; latency at "
        f"{', '.join(f'{r:,}' for r in sizes['rates'])} msg/s. Every message of every produce row was read "
        "back and its count and checksum (sum of CRC-32s) checked; a row that did not check out shows its "
        "error instead of a number."
    )
    add("")
    return out


def _headline(res: Results, rows: list[dict]) -> tuple[list[str], list[tuple]]:
    """The headline table and the paper's rows; also the paper rows Tributary missed."""
    out: list[str] = []
    add = out.append
    add("## Headline")
    add("")
    add(
        "msg/s unless marked ms; in brackets **Tributary ÷ that peer** (for latency: that peer's ms ÷ "
        'Tributary\'s ms), so above 1.00× means Tributary is ahead. "Tributary ÷ best peer" is the smallest '
        f"of those ratios. † = measured over less than {SHORT_S} s (the message count is small for that "
        "broker's speed): on this shared machine such a figure moves by ±30% between runs; rerun with a "
        "larger `--messages` / `--full` to pin it down."
    )
    add("")
    out.extend(headline_table(res, rows))
    add("")
    add(
        "Against the paper's Kafka (2011: 8-core 2 GHz, 16 GB, 6-disk RAID 10, producer and broker on two "
        "machines over 1 Gb; here: everything on one shared 2-core VM):"
    )
    add("")
    add("| experiment | Tributary row | Tributary msg/s | Kafka 2011 | ratio | met? |")
    add("|---|---|---:|---:|---:|:---:|")
    paper_misses = []
    for label, experiment, value, target in paper_rows(res):
        ratio = value / target if value else None
        met = ratio is not None and ratio >= 1.0
        if not met:
            paper_misses.append((label, experiment, value, target))
        label_of = res.get("tributary", experiment).label if res.get("tributary", experiment) else experiment
        add(
            f"| {label} | {label_of} | {fmt_rate(value)} | {target:,} | {fmt_ratio(ratio)} | "
            f"{'yes' if met else '**no**'} |"
        )
    add("")

    return out, paper_misses


def _targets(res: Results, rows: list[dict], paper_misses: list[tuple], profile: dict | None) -> list[str]:
    """What was missed, where the time goes, and the profile."""
    out: list[str] = []
    add = out.append
    missed_rows = [r for r in rows if r["met"] is False]
    add("## Targets")
    add("")
    met_rows = [r for r in rows if r["met"] is True]
    any_na = any(r["met"] is None for r in rows)
    add(
        f"Ahead of every peer in {len(met_rows)} of {len(rows)} comparable rows"
        f"{' (rows marked n/a lack a number for Tributary or a peer)' if any_na else ''}; "
        f"ahead of the paper's Kafka in {3 - len(paper_misses)} of 3."
    )
    add("")
    if missed_rows or paper_misses:
        add("Missed:")
        add("")
        for row in missed_rows:
            behind = [
                f"{TITLES[p]} ({fmt_ratio(v)})" for p, v in row["ratios"].items() if v is not None and v < 1.0
            ]
            add(f"- **{row['label']}** — behind {', '.join(behind)}.")
        for label, _experiment, value, target in paper_misses:
            add(f"- **{label}** vs Kafka 2011 — {fmt_rate(value)} of {target:,} msg/s.")
        add("")
        add("Where the time goes and the next lever, per missed experiment (profile below):")
        add("")
        seen = set()
        for experiment in [r["experiment"] for r in missed_rows] + [m[1] for m in paper_misses]:
            key = (
                experiment.split("@")[0]
                .replace("retained-produce", "retained")
                .replace("retained-consume", "retained")
            )
            key = key.replace("partitions-produce", "partitions").replace("partitions-consume", "partitions")
            key = "batched" if key.startswith("variant-batched") else key
            if key in seen:
                continue
            seen.add(key)
            lever = lever_for(key)
            if lever:
                add(f"- *{key}*: {evidence(key, res, profile)}{lever}")
        add("")
    add("### Profile of Tributary (py-spy)")
    add("")
    out.extend(profile_section(profile))
    add("")

    return out


def _producer(res: Results, runner, info: dict, images: dict[str, str]) -> list[str]:
    """Figure 4's section and how each broker was driven."""
    out: list[str] = []
    add = out.append
    add("## Producer (cf. Figure 4)")
    add("")
    if "fig4" in images:
        add(f"![producer throughput against MB sent]({images['fig4']})")
        add("")
    add("| broker | mode | messages | seconds | msg/s | MB/s | checked |")
    add("|---|---|---:|---:|---:|---:|---|")
    for peer in res.peers:
        for r in runner.results:
            if r.peer == peer and (
                r.experiment in ("unbatched", "batched") or r.experiment.startswith("variant")
            ):
                add(detail_row(r))
    add("")
    add("How each broker was driven (same semantics for all; see `bench/peers/`):")
    add("")
    add("| broker | unbatched | batched | consume |")
    add("|---|---|---|---|")
    for peer in res.peers:
        i = info.get(peer, {})
        add(
            f"| {TITLES[peer]} | {i.get('unbatched', '')} | {i.get('batched', '')} | {i.get('consume', '')} |"
        )
    add("")
    return out


def _consumer(res: Results, images: dict[str, str]) -> list[str]:
    """Figure 5's section."""
    out: list[str] = []
    add = out.append
    add("## Consumer (cf. Figure 5)")
    add("")
    if "fig5" in images:
        add(f"![consumer throughput against MB consumed]({images['fig5']})")
        add("")
    add("| broker | messages | seconds | msg/s | MB/s | checked |")
    add("|---|---:|---:|---:|---:|---|")
    for peer in res.peers:
        r = res.get(peer, "consume")
        if r is not None:
            add(detail_row(r, mode=False))
    add("")
    return out


def _latency(res: Results, sizes: dict, images: dict[str, str]) -> list[str]:
    """The end-to-end latency section."""
    out: list[str] = []
    add = out.append
    add("## End-to-end latency (produce -> consumed)")
    add("")
    if "latency" in images:
        add(f"![latency]({images['latency']})")
        add("")
    add(
        "Each probe carries its send time (CLOCK_MONOTONIC, the same clock in every process of the machine); "
        "the producer sends one at a time at the target rate, a consumer subscribed before the first probe "
        "records its arrival. Tributary's producer uses acks=1 and linger 0; the consumer a long poll."
    )
    add("")
    add("| broker | target rate | sent at | probes | p50 ms | p99 ms | p99.9 ms | max ms |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|")
    for rate in sizes["rates"]:
        for peer in res.peers:
            r = res.get(peer, f"latency@{rate}")
            if r is None:
                continue
            if not r.ok:
                add(f"| {TITLES[peer]} | {rate:,} | — | — | {r.error} | | | |")
                continue
            e = r.extra
            add(
                f"| {TITLES[peer]} | {rate:,} | {e['sent_rate']:,.0f} | {r.messages:,} | "
                f"{fmt_ms(e['p50_ms'])} | {fmt_ms(e['p99_ms'])} | {fmt_ms(e['p999_ms'])} | "
                f"{fmt_ms(e['max_ms'])} |"
            )
    add("")
    return out


def _retained(res: Results, sizes: dict, images: dict[str, str]) -> list[str]:
    """Throughput against the retained log."""
    out: list[str] = []
    add = out.append
    add("## Throughput as the retained log grows")
    add("")
    if "retained" in images:
        add(f"![retained]({images['retained']})")
        add("")
    add(
        "Per level, one destination holds: the messages consumed later, then the retained filler (64 KiB "
        "messages), then the timed produce; the timed consume reads the oldest messages with everything else "
        "still retained behind them. Everything is read back afterwards and checked. For the queue brokers "
        '"retained" is a backlog of unconsumed messages; for the logs (Tributary, NATS, Redis) it is history.'
    )
    add("")
    levels = sizes["retained_mb"]
    add(
        "| broker | "
        + " | ".join(f"produce @ {v:,} MB" for v in levels)
        + " | "
        + " | ".join(f"consume @ {v:,} MB" for v in levels)
        + f" | produce {levels[-1]:,} MB ÷ {levels[0]:,} MB | "
        f"consume {levels[-1]:,} MB ÷ {levels[0]:,} MB |"
    )
    add("|---|" + "---:|" * (2 * len(levels) + 2))
    for peer in res.peers:
        cells = [cell(res.get(peer, f"retained-produce@{v}")) for v in levels]
        cells += [cell(res.get(peer, f"retained-consume@{v}")) for v in levels]
        for kind in ("produce", "consume"):
            first, last = (
                res.rate(peer, f"retained-{kind}@{levels[0]}"),
                res.rate(peer, f"retained-{kind}@{levels[-1]}"),
            )
            cells.append(fmt_ratio(last / first) if first and last else "—")
        add(f"| {TITLES[peer]} | " + " | ".join(cells) + " |")
    add("")
    return out


def _partitions(res: Results, sizes: dict, images: dict[str, str]) -> list[str]:
    """Throughput against the partition count."""
    out: list[str] = []
    add = out.append
    add("## Many partitions")
    add("")
    if "partitions" in images:
        add(f"![partitions]({images['partitions']})")
        add("")
    add(
        "A partition is a Tributary partition, a RabbitMQ / ActiveMQ queue, a NATS stream, a Redis stream "
        f"key. max({sizes.get('partition_messages', sizes['messages']):,}, 100 × partitions) messages, "
        "batches of 50 round-robin over the partitions, one batch in flight; one consumer reads all "
        "partitions."
    )
    add("")
    add(
        "| broker | "
        + " | ".join(f"produce, {p}" for p in sizes["partitions"])
        + " | "
        + " | ".join(f"consume, {p}" for p in sizes["partitions"])
        + " |"
    )
    add("|---|" + "---:|" * (2 * len(sizes["partitions"])))
    for peer in res.peers:
        cells = [cell(res.get(peer, f"partitions-produce@{p}")) for p in sizes["partitions"]]
        cells += [cell(res.get(peer, f"partitions-consume@{p}")) for p in sizes["partitions"]]
        add(f"| {TITLES[peer]} | " + " | ".join(cells) + " |")
    add("")

    return out


def _machine(machine: dict) -> list[str]:
    """The machine the run had."""
    out: list[str] = []
    add = out.append
    add("## Machine")
    add("")
    add(f"- CPU: {machine.get('cpu', '?')}, {machine.get('cores')} cores")
    add(
        f"- memory: {machine.get('memory_gib', 0):.1f} GiB ({machine.get('memory_available_gib', 0):.1f} GiB "
        "available at the start)"
    )
    add(f"- disk: {machine.get('disk')}; broker data under `{machine.get('data_dir')}`")
    add(f"- {machine.get('platform')}, Python {machine.get('python')}")
    la0, la1 = machine.get("loadavg_start", (0, 0, 0)), machine.get("loadavg_end", (0, 0, 0))
    add(
        f"- load average at the start {la0[0]:.2f} / {la0[1]:.2f} / {la0[2]:.2f}, at the end {la1[0]:.2f} / "
        f"{la1[1]:.2f} / {la1[2]:.2f}. The machine is shared with other engineers' test runs, so part of the "
        "CPU went elsewhere during this run; every broker saw the same conditions only approximately "
        "(per-broker load averages below)."
    )
    add("")
    return out


def _brokers(res: Results, runner, info: dict, command: str, path: Path) -> list[str]:
    """Versions, clients, settings, failures and how to rerun."""
    out: list[str] = []
    add = out.append
    add("## Brokers, clients, settings")
    add("")
    add("| broker | versions | client (and why) | persistence | started in | load avg before → after |")
    add("|---|---|---|---|---:|---|")
    for peer in res.peers:
        i = info.get(peer, {})
        versions = "; ".join(f"{k} {v}" for k, v in (i.get("versions") or {}).items())
        if i.get("java"):
            versions += "; Java client: " + "; ".join(f"{k} {v}" for k, v in i["java"].items())
        before, after = i.get("loadavg_before"), i.get("loadavg_after")
        load = f"{before[0]:.2f} → {after[0]:.2f}" if before and after else "—"
        started_in = f"{i['start_seconds']:.1f} s" if "start_seconds" in i else "—"
        add(
            f"| {TITLES[peer]} | {versions or '—'} | {i.get('client', '')} | {i.get('persistence', '')} | "
            f"{started_in} | {load} |"
        )
    add("")
    unavailable = {p: i["error"] for p, i in info.items() if i.get("error")}
    if unavailable:
        add("Not measured:")
        add("")
        for peer, error in unavailable.items():
            add(f"- **{TITLES.get(peer, peer)}**: {error}")
        add("")
    failures = [r for r in runner.results if r.error]
    if failures:
        add("Errors (rows without a number):")
        add("")
        for r in failures:
            add(f"- {TITLES.get(r.peer, r.peer)}, {r.label}: `{r.error.splitlines()[0][:300]}`")
        add("")
    add(
        "Install what the benchmark needs (it does this itself when something is missing and it runs as "
        "root):"
    )
    add("")
    add("```")
    add("apt-get install -y --no-install-recommends rabbitmq-server activemq nats-server redis-server")
    add(
        "apt-get install -y --no-install-recommends libgrpc-java protobuf-compiler-grpc-java-plugin "
        "libprotobuf-java protobuf-compiler libnetty-java libperfmark-java "
        "libgeronimo-annotation-1.3-spec-java   # the Java stub client"
    )
    add(".venv/bin/pip install pika stomp.py nats-py redis hiredis matplotlib py-spy")
    add("```")
    add("")
    add(
        f"Rerun: `{command}` (small default) or `python bench/compare.py --full`. Raw numbers and time "
        f"series: `{path.with_suffix('.json').name}`."
    )
    add("")
    return out


def cell(r) -> str:
    if r is None:
        return "—"
    if not r.ok:
        return "error"
    return fmt_rate(r.rate)


def detail_row(r, mode: bool = True) -> str:
    title = TITLES.get(r.peer, r.peer)
    if not r.ok:
        middle = f"{r.label} | — | — | — | — |" if mode else "— | — | — | — |"
        return f"| {title} | {middle} {r.error.splitlines()[0][:200]} |"
    mb = r.rate * r.bytes_per_message / 1e6
    if mode:
        return (
            f"| {title} | {r.label} | {r.messages:,} | {r.seconds:.2f} | {r.rate:,.0f} | {mb:.2f} | "
            f"{r.checked} |"
        )
    return f"| {title} | {r.messages:,} | {r.seconds:.2f} | {r.rate:,.0f} | {mb:.2f} | {r.checked} |"
