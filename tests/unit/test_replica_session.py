"""Who holds a replica server id at start: the relay's own dead session (end it), or a
session to wait out and, if it outlives the bound, refuse (cdc/replica_session.py)."""

from __future__ import annotations

from cdc.replica_session import (
    DumpThread,
    Listed,
    Machine,
    SessionTag,
    assess,
    refusal,
    wait_bound,
)

HERE = Machine(host="web-1", boot="1a2b3c4d", pidns="4026531836")
TAG = SessionTag(conn=57, host="web-1", boot="1a2b3c4d", pidns="4026531836", pid=1234, start=998877)
DUMP = DumpThread(id=57, user="cdc", host="10.0.0.5:53014")


def dead(_pid: int, _start: int) -> bool:
    return False


def alive(_pid: int, _start: int) -> bool:
    return True


def test_a_tag_round_trips_and_fits_a_report_host():
    text = TAG.text()
    assert SessionTag.parse(text) == TAG
    assert len(text) <= 60
    long = SessionTag(conn=2**32 - 1, host="h" * 200, boot="b" * 8, pidns="4" * 12, pid=4194304, start=2**40)
    assert len(long.text()) <= 120 and SessionTag.parse(long.text()) is not None


def test_anything_else_is_no_tag():
    for text in ("", "127.0.0.1", "cdc;", "cdc;c=x;h=a;b=b;n=n;p=1;s=2", "cdc;c=1", "replica-2.example", "cdc;c=1;;"):
        assert SessionTag.parse(text) is None, text


def test_no_listing_is_free():
    assert assess(7422, [Listed(7423, TAG.text())], [DUMP], "cdc", HERE, dead) == []


def test_our_own_session_whose_process_is_gone_is_to_be_ended():
    [f] = assess(7422, [Listed(7422, TAG.text())], [DUMP], "cdc", HERE, dead)
    assert f.kind == "dead" and f.conn == 57
    assert "connection 57" in f.where and "10.0.0.5:53014" in f.where


def test_a_session_whose_process_still_runs_here_is_not_ended():
    [f] = assess(7422, [Listed(7422, TAG.text())], [DUMP], "cdc", HERE, alive)
    assert f.kind == "wait" and f.conn == 57
    assert "connection 57" in f.where and "10.0.0.5:53014" in f.where and "pid 1234 on web-1" in f.where


def test_another_machine_or_boot_or_pid_namespace_cannot_be_proven_dead():
    for machine in (
        Machine("web-2", HERE.boot, HERE.pidns),
        Machine(HERE.host, "ffffffff", HERE.pidns),
        Machine(HERE.host, HERE.boot, "4026532000"),
        Machine(HERE.host, "", HERE.pidns),
    ):
        [f] = assess(7422, [Listed(7422, TAG.text())], [DUMP], "cdc", machine, dead)
        assert f.kind == "wait", machine


def test_another_users_session_is_never_ended():
    [f] = assess(7422, [Listed(7422, TAG.text())], [DumpThread(57, "app", "10.0.0.5:53014")], "cdc", HERE, dead)
    assert f.kind == "wait"
    # not visible at all (another account, no PROCESS privilege): wait too
    [f] = assess(7422, [Listed(7422, TAG.text())], [], "cdc", HERE, dead)
    assert f.kind == "wait" and "connection 57" in f.where


def test_an_untagged_replica_is_waited_for_and_named_by_host_and_its_only_dump_connection():
    other_relays_dump = DumpThread(99, "cdc", "10.0.0.9:40000")
    listed = [Listed(7422, "10.0.0.7"), Listed(5, SessionTag(99, "x", "b", "n", 1, 2).text())]
    [f] = assess(7422, listed, [DumpThread(61, "repl", "10.0.0.7:3307"), other_relays_dump], "cdc", HERE, dead)
    assert f.kind == "wait" and f.conn == 61
    assert "10.0.0.7:3307" in f.where and "connection 61" in f.where
    [f] = assess(7422, [Listed(7422, "10.0.0.7")], [], "cdc", HERE, dead)
    assert f.kind == "wait" and f.conn is None
    assert "host 10.0.0.7" in f.where and "not visible" in f.where


def test_the_bound_is_a_few_heartbeats():
    assert wait_bound(1.0) >= 3.0
    assert wait_bound(0.5) >= 1.5
    assert wait_bound(0.5) < wait_bound(2.0)


def test_the_refusal_is_one_line_naming_the_session_and_the_fix():
    [f] = assess(7422, [Listed(7422, TAG.text())], [DUMP], "cdc", HERE, alive)
    line = refusal(7422, f, 3.5)
    assert "\n" not in line
    assert line.startswith("another replica is connected with server id 7422")
    assert "connection 57" in line and "10.0.0.5:53014" in line
    assert "source.replica_server_id" in line and "stop the other relay" in line
