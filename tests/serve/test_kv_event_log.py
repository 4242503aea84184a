"""A replica's KV event log is bounded (a server runs for months) and never lets a reader miss an
event silently: one that fell behind what the log keeps, or that read a previous server's log
further than this one has come, is told to resync."""
from paged.serve.kv_events import KVEventLog


def test_the_log_keeps_the_last_n_events_and_a_reader_behind_them_is_reset():
    log = KVEventLog(capacity=4)
    for i in range(6):  # N + 2
        log.blocks_stored([bytes([i]) * 16])
    assert [e[0] for e in log.events] == [3, 4, 5, 6]
    caught_up = log.since(2)  # the events it needs are all kept
    assert not caught_up["reset"] and [e["seq"] for e in caught_up["events"]] == [3, 4, 5, 6]
    assert caught_up["events"][0]["hashes"] == [(b"\x02" * 16).hex()]
    behind = log.since(1)  # event 2 is gone
    assert behind["reset"] and behind["events"] == [] and behind["seq"] == 6


def test_each_kind_of_change_is_one_numbered_event():
    log = KVEventLog(capacity=8)
    log.blocks_stored([b"\x01" * 16, b"\x02" * 16])
    log.blocks_removed([b"\x01" * 16])
    log.all_blocks_cleared()
    assert [(e["seq"], e["kind"], len(e["hashes"])) for e in log.since(0)["events"]] == [
        (1, "stored", 2), (2, "removed", 1), (3, "cleared", 0)]
    assert log.since(3) == {"epoch": log.epoch, "seq": 3, "reset": False, "events": []}


def test_a_reader_ahead_of_the_log_is_reset():
    """A reader's seq from before its replica restarted is past the new log's last event."""
    log = KVEventLog()
    log.blocks_stored([b"\x01" * 16])
    assert log.since(5)["reset"] and KVEventLog().epoch != log.epoch
