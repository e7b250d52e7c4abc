"""The pure screen of ``tributary top``: rates from traffic totals, groups, unreachable nodes."""

from gateway.cli.top import GroupSample, NodeSample, Snapshot, render


def _snapshot(at, bytes_in, records_in, bytes_out, *, groups=(), reachable=True):
    node = NodeSample(0, "127.0.0.1:9000", 3, 5_000_000, bytes_in, records_in, bytes_out, reachable)
    return Snapshot(at, {0: node}, list(groups), topics=2, partitions=4, offline=1)


def test_first_screen_has_no_rates():
    screen = render(_snapshot(100.0, 1000, 10, 500))
    assert "topics 2  partitions 4  offline 1" in screen
    line = next(row for row in screen.splitlines() if row.startswith("0 "))
    assert "5.0 MB" in line and line.split()[-1] == "-"
    assert "no consumer groups" in screen


def test_rates_between_two_snapshots():
    before = _snapshot(100.0, 0, 0, 0)
    after = _snapshot(
        102.0, 4_000_000, 20_000, 8_000_000, groups=[GroupSample("billing", "Stable", 3, 1234, 900)]
    )
    screen = render(after, before)
    line = next(row for row in screen.splitlines() if row.startswith("0 "))
    assert "2.0 MB/s" in line and "10,000.0 rec/s" in line and "4.0 MB/s" in line
    assert "billing" in screen and "1,234" in screen and "Stable" in screen


def test_restarted_node_and_unreachable_node():
    before = _snapshot(100.0, 9_000, 90, 9_000)
    restarted = _snapshot(101.0, 100, 1, 50)  # totals began again: no negative rate
    assert "-" in next(row for row in render(restarted, before).splitlines() if row.startswith("0 "))
    down = _snapshot(102.0, 0, 0, 0, reachable=False)
    assert "unreachable" in render(down, restarted)
