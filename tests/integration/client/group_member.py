"""A consumer-group member as its own process, so a test can ``kill -9`` it (not a test module).

    python tests/integration/client/group_member.py SERVERS TOPIC GROUP [--session-ms N]
        [--heartbeat-ms N] [--delay-ms N] [--instance-id ID]

It subscribes to TOPIC in GROUP with ``enable_auto_commit=False`` and ``auto_offset_reset=
"earliest"``. For every poll it *processes* the records -- prints ``R <partition> <offset>
<value>`` per record, flushed (and sleeps ``--delay-ms`` per record, a slow application) -- and
only then commits them (and prints ``C``): at-least-once, so a crash can repeat records but never
skip one. Listener calls print ``A <partitions>`` (assigned), ``V <partitions>`` (revoked) and
``L <partitions>`` (lost), partitions as ``p,p,...``. SIGTERM/SIGINT close the consumer (which
leaves the group).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from gateway.client import Consumer, ConsumerRebalanceListener, WakeupError


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def partitions_text(partitions) -> str:
    return ",".join(str(tp.partition) for tp in sorted(partitions))


class Printer(ConsumerRebalanceListener):
    def on_partitions_assigned(self, assigned):
        say(f"A {partitions_text(assigned)}")

    def on_partitions_revoked(self, revoked):
        say(f"V {partitions_text(revoked)}")

    def on_partitions_lost(self, lost):
        say(f"L {partitions_text(lost)}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("servers")
    parser.add_argument("topic")
    parser.add_argument("group")
    parser.add_argument("--session-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-ms", type=int, default=500)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--instance-id")
    args = parser.parse_args()
    consumer = Consumer(
        servers=args.servers,
        group_id=args.group,
        group_instance_id=args.instance_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=20,
        session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=args.heartbeat_ms,
    )
    signal.signal(signal.SIGTERM, lambda *_: consumer.wakeup())
    signal.signal(signal.SIGINT, lambda *_: consumer.wakeup())
    consumer.subscribe([args.topic], listener=Printer())
    say("READY")
    try:
        while True:
            polled = consumer.poll(timeout_ms=200)
            for records in polled.values():
                for record in records:
                    say(f"R {record.partition} {record.offset} {record.value.decode()}")
                    time.sleep(args.delay_ms / 1000.0)
            if polled:
                consumer.commit()  # after processing
                say("C")
    except WakeupError:
        pass
    finally:
        consumer.close()
        say("CLOSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
