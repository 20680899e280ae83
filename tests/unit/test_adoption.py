"""Taking over from Debezium (cdc/adoption.py, connectors/debezium/java_offset_file.py, the relay's
adopted window): Debezium's offset file read as the JVM writes it, its offsets parsed or
refused in one line, and the relay over the fakes publishing every event after the
adopted offset exactly once whatever part of them Debezium had already published."""

import json
import logging
import random
from collections import Counter

import pytest

from cdc.adoption import AdoptedWindow, AdoptionError, parse_debezium_offset, pick_offset
from cdc.checkpoint import Checkpoint
from cdc.position import BinlogPosition
from connectors.debezium.java_offset_file import OffsetFileError, parse_offset_file, serialize_offset_map
from fakes import SOURCE_NAME, Binlog, FakeCheckpointStore, FakeKafka, RelayHarness, outbox_row

# Written by Debezium 3.6.3 embedded (Kafka Connect 4.3's FileOffsetBackingStore) on this machine.
JVM_FILE = bytes.fromhex(
    "aced0005737200116a6176612e7574696c2e486173684d61700507dac1c31660d10300024600"
    "0a6c6f6164466163746f724900097468726573686f6c6478703f4000000000000c7708000000"
    "100000000175720002"
    "5b42acf317f8060854e00200007870000000195b22656e6731222c7b"
    "22736572766572223a22706678227d5d7571007e00020000005b7b2274735f736563223a3137"
    "39353538353939382c2266696c65223a226d7973716c2d62696e2e303030303031222c22706f"
    "73223a323734352c22726f77223a312c227365727665725f6964223a31312c226576656e7422"
    "3a337d78"
)
JVM_KEY = b'["eng1",{"server":"pfx"}]'
JVM_VALUE = b'{"ts_sec":1795585998,"file":"mysql-bin.000001","pos":2745,"row":1,"server_id":11,"event":3}'


def test_reads_the_file_the_jvm_wrote_and_writes_the_same_bytes():
    assert parse_offset_file(JVM_FILE) == {JVM_KEY: JVM_VALUE}
    assert serialize_offset_map({JVM_KEY: JVM_VALUE}) == JVM_FILE


def test_round_trips_several_entries_with_back_references_and_nulls():
    entries = {
        b'["a",{"server":"x"}]': b'{"file":"mysql-bin.000002","pos":4}',
        b'["b",{"server":"y"}]': None,
        None: b"{}",
        b"k" * 300: b"v" * 70000,
    }
    assert parse_offset_file(serialize_offset_map(entries)) == entries


@pytest.mark.parametrize(
    "damage",
    [lambda b: b[:-1], lambda b: b"\x00" + b[1:], lambda b: b[:40], lambda b: b.replace(b"HashMap", b"TreeMap")],
)
def test_a_damaged_or_foreign_file_is_refused_in_one_line(damage):
    with pytest.raises(OffsetFileError) as err:
        parse_offset_file(damage(JVM_FILE), "offsets.dat")
    text = str(err.value)
    assert "offsets.dat" in text and "\n" not in text and "offset.storage.file.filename" in text


@pytest.mark.parametrize("cut", [0, 1, 4, 40, len(JVM_FILE) // 2, len(JVM_FILE) - 1])
def test_an_empty_or_cut_short_file_is_a_save_debezium_did_not_finish(cut):
    """FileOffsetBackingStore.save rewrites the file in place: a Debezium killed while
    saving leaves it empty or cut short. One line says so, that no position can be taken
    from it, and what the operator can do (the offsets topic, or a start position)."""
    with pytest.raises(OffsetFileError) as err:
        parse_offset_file(JVM_FILE[:cut], "offsets.dat")
    text = str(err.value)
    assert "\n" not in text
    assert ("offsets.dat is empty" if cut == 0 else f"offsets.dat is truncated after {cut} bytes") in text
    assert "stopped while saving it" in text and "no position can be taken from it" in text
    assert "--debezium-offsets-topic" in text and "source.start" in text


def test_parses_debezium_offsets_and_refuses_what_cannot_be_adopted():
    off = pick_offset({JVM_KEY: JVM_VALUE}, "eng1", None, "the file")
    assert (off.position, off.events_to_skip, off.rows_to_skip, off.server_id) == (
        BinlogPosition("mysql-bin.000001", 2745),
        3,
        1,
        11,
    )
    assert str(off) == "mysql-bin.000001:2745 (+3 events, 1 rows)"
    key = b'["c",{"server":"p"}]'
    gtid = parse_debezium_offset(
        key, b'{"file":"binlog.000007","pos":157,"gtids":"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"}', "t"
    )
    assert gtid.gtids == "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5" and gtid.events_to_skip == 0
    for value, words in [
        (None, "tombstone"),
        (b'{"pos":4}', "not a Debezium MySQL offset"),
        (b'{"file":"mysql-bin.000001","pos":4,"snapshot":true}', "snapshot"),
        (b"[1]", "not a Debezium MySQL offset"),
    ]:
        with pytest.raises(AdoptionError, match=words):
            parse_debezium_offset(key, value, "t")
    with pytest.raises(AdoptionError, match="no offset of connector 'other'.*it holds: eng1"):
        pick_offset({JVM_KEY: JVM_VALUE}, "other", None, "the file")
    two = {
        b'["c",{"server":"p"}]': b'{"file":"f.000001","pos":4}',
        b'["c",{"server":"q"}]': b'{"file":"f.000001","pos":4}',
    }
    with pytest.raises(AdoptionError, match="--debezium-server"):
        pick_offset(two, "c", None, "t")
    assert pick_offset(two, "c", "q", "t").server == "q"


def test_the_adopted_window_survives_the_checkpoint_round_trip():
    window = AdoptedWindow(BinlogPosition("mysql-bin.000003", 900), {"t.order": {0: 5, 1: 0}}, "Debezium x")
    cp = Checkpoint(SOURCE_NAME, BinlogPosition("mysql-bin.000001", 4), adopted=window)
    back = Checkpoint.from_dict(json.loads(json.dumps(cp.to_dict())))
    assert back.adopted == window and back == cp
    assert "adopted" not in Checkpoint(SOURCE_NAME, BinlogPosition("mysql-bin.000001", 4)).to_dict()


# -- the relay adopting -------------------------------------------------------------------------


def debezium_world(seed: int, window_from_offset: bool = False):
    """A binlog of 40 transactions of 1-3 outbox rows; Debezium published every event of
    the first `cut` transactions and a random part after it (the records of a batch it
    acknowledged but did not store the offset of), then stopped. Its offset names the
    start of the transaction `cut` (with a skip count when it was inside it). The adopted
    window's offsets are each partition's start, or with `window_from_offset` its first
    record after Debezium's offset (so that every id in the window is of an event the
    relay reads again)."""
    rng = random.Random(seed)
    b = Binlog()
    n = 0
    for t in range(40):
        rows = []
        for _ in range(rng.randint(1, 3)):
            rows.append(outbox_row(f"e{n}", rng.choice(["order", "user"]), f"k{rng.randint(0, 5)}"))
            n += 1
        b.transaction(rows, outcome="rollback" if t % 13 == 5 else "commit", other_rows=t % 2)
    kafka = FakeKafka({"outbox.event.order": 3, "outbox.event.user": 3, "outbox.dlq": 1})
    committed = b.committed()
    cut = rng.randint(0, len(committed) - 1)
    published = [row for tx in committed[:cut] for row in tx.outbox_rows]
    n_before = len(published)
    after = [row for tx in committed[cut:] for row in tx.outbox_rows]
    published += after[: rng.randint(0, min(len(after), 12))]  # in order, like one producer
    before_offset = Counter()
    for i, row in enumerate(published):
        topic = f"outbox.event.{row['aggregatetype']}"
        key = row["aggregateid"].encode()
        kafka.append(topic, kafka.partition_for(topic, key), key, b"payload", [("id", row["id"].encode())])
        if window_from_offset and i < n_before:
            before_offset[(topic, kafka.partition_for(topic, key))] += 1
    window = AdoptedWindow(
        b.end,
        {
            t: {p: before_offset[(t, p)] for p in range(len(parts))}
            for t, parts in kafka.logs.items()
            if t != "outbox.dlq"
        },
        "Debezium test",
    )
    cp = Checkpoint(
        SOURCE_NAME,
        committed[cut].start,
        server_id=1,
        offsets={t: dict(ps) for t, ps in window.offsets.items()},
        partitions={t: len(parts) for t, parts in kafka.logs.items() if t != "outbox.dlq"},
        adopted=window,
    )
    return b, kafka, cp, len(published)


def assert_each_event_once(kafka, binlog):
    expected = [str(row["id"]) for tx in binlog.committed() for row in tx.outbox_rows]
    got = Counter(r.header_text["id"] for r in kafka.records() if r.topic != "outbox.dlq")
    assert {k: v for k, v in got.items() if v > 1} == {}
    assert set(got) == set(expected)


@pytest.mark.parametrize("seed", range(12))
def test_the_relay_publishes_after_the_adopted_offset_exactly_once(seed):
    b, kafka, cp, by_debezium = debezium_world(seed)
    h = RelayHarness(b, kafka=kafka, store=FakeCheckpointStore(cp))
    summary = h.run()
    assert_each_event_once(kafka, b)
    skipped = summary.recovery["adopted_skipped"]
    assert summary.events_published + skipped == sum(
        len(tx.outbox_rows) for tx in b.committed() if not tx.start < cp.position
    )
    assert h.store.current.adopted is None  # the window is passed: the next start is the relay's own
    assert h.store.current.position == b.end


@pytest.mark.parametrize("seed", range(6))
def test_the_adoption_is_reported_once_even_when_every_debezium_message_was_matched_early(seed, caplog):
    """The operator's line "adoption ... complete: N events Debezium had published after its
    offset were not sent again" comes once, with the count, also when the last message
    Debezium published was matched before the relay reached the window's end (the
    recovery was then dropped without saying so)."""
    b, kafka, cp, _ = debezium_world(seed, window_from_offset=True)
    with caplog.at_level(logging.INFO, logger="cdc"):
        summary = RelayHarness(b, kafka=kafka, store=FakeCheckpointStore(cp)).run()
    lines = [r.getMessage() for r in caplog.records if "Debezium had published after its offset" in r.getMessage()]
    assert lines == [
        f"adoption from Debezium test complete: {summary.recovery['adopted_skipped']} events Debezium had published "
        f"after its offset were not sent again"
    ]


@pytest.mark.parametrize("seed", range(12))
def test_killed_inside_the_adopted_window_and_restarted_still_exactly_once(seed):
    b, kafka, cp, _ = debezium_world(100 + seed)
    store = FakeCheckpointStore(cp)
    rng = random.Random(seed)
    for _ in range(3):
        stop_after = rng.randint(1, 6)
        h = RelayHarness(b, kafka=kafka, store=store)
        if not h.run_until_killed(lambda h: h.relay.metrics.events_published >= stop_after, rng):
            break
        assert store.current.adopted is not None or not store.current.position < cp.adopted.until
    RelayHarness(b, kafka=kafka, store=store).run()
    assert_each_event_once(kafka, b)


def test_without_the_window_the_same_messages_would_be_published_twice():
    """The id matching is what prevents the copies (the test above would fail without it)."""
    b, kafka, cp, by_debezium = debezium_world(3)
    plain = Checkpoint(cp.source, cp.position, server_id=1, offsets=cp.offsets, partitions=cp.partitions)
    RelayHarness(b, kafka=kafka, store=FakeCheckpointStore(plain)).run()
    got = Counter(r.header_text["id"] for r in kafka.records())
    assert any(v > 1 for v in got.values())


def test_cdc_adopt_refuses_bad_input_in_one_line_exit_2(tmp_path, capsys):
    from cdc_cli.main import main

    config = tmp_path / "relay.toml"
    config.write_text(
        '[source]\nname = "x"\nhost = "127.0.0.1"\nport = 1\nuser = "u"\nreplica_server_id = 5\n'
        '[[outbox.tables]]\nschema = "s"\ntable = "outbox"\n[kafka]\nbootstrap = "127.0.0.1:1"\n'
        f'[checkpoint]\nstore = "file"\npath = "{tmp_path / "cp.json"}"\n'
    )
    (tmp_path / "bad.dat").write_bytes(b"garbage")
    (tmp_path / "ok.dat").write_bytes(JVM_FILE)
    (tmp_path / "empty.dat").write_bytes(b"")
    (tmp_path / "cut.dat").write_bytes(JVM_FILE[:60])
    cases = [
        (["--debezium-offsets-file", str(tmp_path / "bad.dat")], "not a Kafka Connect FileOffsetBackingStore"),
        (["--debezium-offsets-file", str(tmp_path / "missing.dat")], "cannot read the Debezium offset file"),
        (["--debezium-offsets-file", str(tmp_path / "ok.dat")], "no offset of connector 'c'.*it holds: eng1"),
        (["--debezium-offsets-file", str(tmp_path / "empty.dat")], "empty.dat is empty.*stopped while saving it"),
        (["--debezium-offsets-file", str(tmp_path / "cut.dat")], "cut.dat is truncated after 60 bytes.*source.start"),
        ([], "give one of --debezium-offsets-file"),
    ]
    for extra, words in cases:
        code = main(["adopt", "--config", str(config), "--debezium-connector", "c", *extra])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert __import__("re").search(words, err), err
