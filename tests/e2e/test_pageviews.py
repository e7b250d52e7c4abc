"""The streaming job counts page views per minute and writes each closed window once."""

import json
from collections import Counter

import pyarrow.parquet as pq

from gateway.client import Producer
from spark_jobs.pageviews import page_views, start_query

MINUTE = 60_000


def test_page_views_per_minute(spark, servers, make_topic, tmp_path):
    topic = make_topic(2)
    base = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE
    events = [(f"/p{i % 3}", base + i * 1_500) for i in range(200)]  # five minutes of traffic
    events.append(("/late-marker", base + 10 * MINUTE))  # moves the watermark past every window above
    with Producer(servers=servers) as producer:
        for page, ts in events:
            value = json.dumps({"user": "u", "page": page, "ts": ts}).encode()
            producer.send(topic, value, key=page.encode(), timestamp=ts)

    frame = page_views(spark, servers, topic, watermark="1 minute")
    query = start_query(
        frame, checkpoint=tmp_path / "checkpoint", output=tmp_path / "out", available_now=True
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()

    table = pq.read_table(tmp_path / "out").to_pylist()
    got = {(int(r["window_start"].timestamp() * 1000), r["page"]): r["views"] for r in table}
    want = Counter((ts - ts % MINUTE, page) for page, ts in events[:-1])
    assert got == dict(want)
