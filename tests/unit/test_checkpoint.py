"""Checkpoint: the stored form and its refusals."""

import json

import pytest

from cdc.checkpoint import FORMAT_VERSION, Checkpoint
from cdc.errors import ConfigError, PositionError
from cdc.position import BinlogPosition

CP = Checkpoint(
    source="shop-db",
    position=BinlogPosition("mysql-bin.000042", 1234),
    gtids="3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100",
    server_id=7,
    offsets={"outbox.event.order": {0: 10, 2: 5, 1: 3}, "outbox.dlq": {0: 1}},
    partitions={"outbox.event.order": 3, "outbox.dlq": 1},
    written_at_ms=1_700_000_000_123,
    events_delivered=99,
    xa_held=(("X'7831',X'',1", "mysql-bin.000041:900", 1_700_000_000),),
)


def test_round_trip():
    assert Checkpoint.from_dict(CP.to_dict()) == CP


def test_round_trip_through_json():
    # the stored form is primitives only: partition numbers become strings in JSON
    data = json.loads(json.dumps(CP.to_dict()))
    assert data["v"] == FORMAT_VERSION
    assert data["offsets"]["outbox.event.order"] == {"0": 10, "1": 3, "2": 5}
    assert Checkpoint.from_dict(data) == CP


def test_a_checkpoint_written_before_xa_was_recorded_reads_as_holding_none():
    data = CP.to_dict()
    del data["xa"]
    assert Checkpoint.from_dict(data).xa_held == ()


def test_a_tagged_gtid_set_round_trips_unchanged():
    tagged = Checkpoint(
        "s", BinlogPosition("binlog.000003", 900), gtids="3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:blue:1-3:red:7"
    )
    back = Checkpoint.from_dict(json.loads(json.dumps(tagged.to_dict())))
    assert back == tagged and back.gtids == tagged.gtids


def test_minimal_checkpoint_round_trip():
    cp = Checkpoint("s", BinlogPosition("mysql-bin.000001", 4))
    back = Checkpoint.from_dict(json.loads(json.dumps(cp.to_dict())))
    assert back == cp and back.gtids is None and back.offsets == {} and back.partitions == {}


@pytest.mark.parametrize("version", [None, 0, 2, "1"])
def test_unknown_version_is_refused(version):
    data = CP.to_dict()
    if version is None:
        del data["v"]
    else:
        data["v"] = version
    with pytest.raises(ConfigError, match="version"):
        Checkpoint.from_dict(data)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.pop("source"),
        lambda d: d.pop("file"),
        lambda d: d.pop("pos"),
        lambda d: d.update(pos="abc"),
        lambda d: d.update(pos=None),
        lambda d: d.update(server_id="x"),
        lambda d: d.update(offsets={"t": {"zero": 1}}),
        lambda d: d.update(offsets={"t": {"0": "ten"}}),
        lambda d: d.update(partitions={"t": "three"}),
        lambda d: d.update(written_at_ms=[1]),
    ],
)
def test_damaged_checkpoint_is_a_config_error(damage):
    data = CP.to_dict()
    damage(data)
    with pytest.raises(ConfigError, match="damaged"):
        Checkpoint.from_dict(data)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.update(offsets=[["t", 0, 1]]),
        lambda d: d.update(partitions=[3]),
        lambda d: d.update(offsets={"t": [1, 2]}),
    ],
)
def test_damaged_structure_is_a_config_error_not_a_traceback(damage):
    data = CP.to_dict()
    damage(data)
    with pytest.raises(ConfigError):
        Checkpoint.from_dict(data)


def test_malformed_file_name_is_refused():
    data = CP.to_dict()
    data["file"] = "not a binlog"
    with pytest.raises((ConfigError, PositionError)):
        Checkpoint.from_dict(data)
