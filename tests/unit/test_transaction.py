"""Transaction assembly: rows are held until the commit and released in order."""

import pytest

from cdc.assembly.transaction import OutboxChangeRefused, StatementFormatRefused, TransactionAssembler
from cdc.errors import ConfigError
from cdc.events.identity import TxIdentity
from cdc.events.outbox import DeadLetter, OutboxEvent, OutboxMapper, OutboxTable
from cdc.events.topics import TopicRouter
from cdc.position import BinlogPosition
from cdc.source_events import (
    RollbackToSavepoint,
    RowChange,
    RowInsert,
    Savepoint,
    Statement,
    TxBegin,
    TxCommit,
    TxRollback,
    XaCommit,
    XaEnd,
    XaPrepare,
    XaRollback,
)
from fakes import Binlog, outbox_row

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


def P(pos, file="mysql-bin.000001"):
    return BinlogPosition(file, pos)


def assembler(tables=None, **kw):
    tables = tables or [OutboxTable("shop", "outbox")]
    return TransactionAssembler(tables, OutboxMapper(TopicRouter()), "src", server_id=3, **kw)


def feed_all(asm, events):
    out = []
    for ev in events:
        tx = asm.feed(ev)
        if tx is not None:
            out.append(tx)
    return out


def ids(tx):
    return [item.event_id for item in tx.items()]


def test_rows_are_released_only_at_commit():
    asm = assembler()
    assert asm.feed(TxBegin(P(4), P(100))) is None
    assert asm.in_transaction
    assert asm.feed(RowInsert("shop", "outbox", outbox_row("a"), P(200))) is None
    assert asm.feed(RowInsert("shop", "outbox", outbox_row("b"), P(300))) is None
    assert asm.resume_point is None
    tx = asm.feed(TxCommit(P(400), 1_700_000_000))
    assert tx is not None and tx.size == 2 and tx.end == P(400)
    assert ids(tx) == ["a", "b"]
    assert tx.identity == TxIdentity("src", P(4), None, 3, 1_700_000_000_000)
    assert [item.identity.row for item in tx.items()] == [0, 1]
    assert asm.resume_point == P(400) and not asm.in_transaction


def test_release_frees_the_rows():
    asm = assembler()
    tx = feed_all(
        asm, [TxBegin(P(4), P(100)), RowInsert("shop", "outbox", outbox_row("a"), P(200)), TxCommit(P(300), 1)]
    )[0]
    tx.release()
    assert list(tx.items()) == []


def test_rollback_discards_the_transaction():
    b = Binlog()
    b.transaction([outbox_row("a"), outbox_row("b")], outcome="rollback")
    b.transaction([outbox_row("c")])
    asm = assembler()
    txs = feed_all(asm, b.events)
    assert len(txs) == 1 and ids(txs[0]) == ["c"]
    assert asm.discarded_rows == 2
    # the rolled-back transaction's row index does not leak into the next one
    assert [i.identity.row for i in txs[0].items()] == [0]


def test_rollback_moves_the_resume_point():
    asm = assembler()
    feed_all(asm, [TxBegin(P(4), P(100)), RowInsert("shop", "outbox", outbox_row("a"), P(200)), TxRollback(P(300))])
    assert asm.resume_point == P(300) and not asm.in_transaction


def test_rollback_to_savepoint_cuts_back():
    b = Binlog()
    b.begin()
    b.insert(outbox_row("a"))
    b.savepoint("s1")
    b.insert(outbox_row("b"))
    b.insert(outbox_row("c"))
    b.rollback_to("s1")
    b.insert(outbox_row("d"))
    b.commit()
    asm = assembler()
    [tx] = feed_all(asm, b.events)
    assert ids(tx) == ["a", "d"] == [r["id"] for r in b.txs[0].outbox_rows]
    assert [i.identity.row for i in tx.items()] == [0, 1]
    assert asm.discarded_rows == 2


def test_rollback_to_unknown_savepoint_keeps_rows():
    asm = assembler()
    txs = feed_all(
        asm,
        [
            TxBegin(P(4), P(100)),
            RowInsert("shop", "outbox", outbox_row("a"), P(200)),
            RollbackToSavepoint("nope", P(300)),
            TxCommit(P(400), 1),
        ],
    )
    assert ids(txs[0]) == ["a"]


def test_gtid_then_begin_is_one_transaction():
    b = Binlog()
    b.transaction([outbox_row("a"), outbox_row("b")], gtid=f"{U1}:7")
    assert isinstance(b.events[1], TxBegin) and b.events[1].gtid is None
    asm = assembler()
    [tx] = feed_all(asm, b.events)
    assert ids(tx) == ["a", "b"]
    assert tx.identity.gtid == f"{U1}:7"
    assert tx.identity.start == b.events[0].start  # the GTID event is the transaction's start


def test_a_new_begin_cuts_an_unfinished_transaction_and_releases_nothing_of_it():
    asm = assembler()
    txs = feed_all(
        asm,
        [
            TxBegin(P(4), P(100)),
            RowInsert("shop", "outbox", outbox_row("lost1"), P(200)),
            RowInsert("shop", "outbox", outbox_row("lost2"), P(300)),
            # the stream was cut and reopened: a new transaction starts
            TxBegin(P(4), P(100)),
            RowInsert("shop", "outbox", outbox_row("a"), P(200)),
            TxCommit(P(300), 1),
        ],
    )
    assert len(txs) == 1 and ids(txs[0]) == ["a"]
    assert asm.discarded_rows == 2


def test_a_new_gtid_cuts_an_unfinished_gtid_transaction():
    asm = assembler()
    txs = feed_all(
        asm,
        [
            TxBegin(P(4), P(100), f"{U1}:1"),
            TxBegin(P(100), P(200)),
            RowInsert("shop", "outbox", outbox_row("lost"), P(300)),
            TxBegin(P(4), P(100), f"{U1}:1"),
            TxBegin(P(100), P(200)),
            RowInsert("shop", "outbox", outbox_row("a"), P(300)),
            TxCommit(P(400), 1),
        ],
    )
    assert [ids(t) for t in txs] == [["a"]]
    assert txs[0].identity.gtid == f"{U1}:1"


def test_reset_mid_transaction_releases_nothing():
    asm = assembler()
    feed_all(asm, [TxBegin(P(4), P(100)), RowInsert("shop", "outbox", outbox_row("lost"), P(200))])
    asm.reset()
    assert not asm.in_transaction and asm.discarded_rows == 1
    # a commit without a transaction (the stream resumed after the BEGIN) is not a release
    txs = feed_all(asm, [RowInsert("shop", "outbox", outbox_row("orphan"), P(300))])
    assert txs == []
    txs = feed_all(
        asm, [TxBegin(P(400), P(500)), RowInsert("shop", "outbox", outbox_row("a"), P(600)), TxCommit(P(700), 1)]
    )
    assert [ids(t) for t in txs] == [["a"]]


def test_standalone_ddl_completes_an_empty_transaction():
    b = Binlog()
    b.begin(gtid="0-1-5", begin_query=False, standalone=True)
    ddl = b.statement("ALTER TABLE shop.outbox ADD COLUMN x INT")
    asm = assembler()
    [tx] = feed_all(asm, b.events)
    assert tx.size == 0 and list(tx.items()) == []
    assert tx.end == ddl.end and asm.resume_point == ddl.end
    assert tx.identity.gtid == "0-1-5"


def test_mysql_ddl_after_a_gtid_without_begin_completes_it():
    asm = assembler()
    [tx] = feed_all(asm, [TxBegin(P(4), P(100), f"{U1}:3"), Statement("CREATE TABLE t (a INT)", P(200), 5)])
    assert tx.size == 0 and tx.end == P(200) and tx.identity.gtid == f"{U1}:3"
    assert asm.resume_point == P(200)


def test_statement_outside_a_transaction_moves_the_resume_point():
    asm = assembler()
    assert asm.feed(Statement("CREATE TABLE t (a INT)", P(200), 5)) is None
    assert asm.resume_point == P(200)


def test_statement_inside_an_explicit_transaction_does_not_end_it():
    asm = assembler()
    txs = feed_all(
        asm,
        [
            TxBegin(P(4), P(100)),
            RowInsert("shop", "outbox", outbox_row("a"), P(200)),
            Statement("INSERT INTO myisam_t VALUES (1)", P(300)),
            RowInsert("shop", "outbox", outbox_row("b"), P(400)),
            TxCommit(P(500), 1),
        ],
    )
    assert [ids(t) for t in txs] == [["a", "b"]]


def test_non_outbox_tables_are_ignored_and_the_transaction_still_completes():
    b = Binlog()
    b.transaction([], other_rows=3)
    b.begin()
    b.insert({"id": 1}, table="orders")
    b.insert(outbox_row("a"))
    b.insert({"id": 2}, schema="other", table="outbox")
    b.commit()
    asm = assembler()
    txs = feed_all(asm, b.events)
    assert [t.size for t in txs] == [0, 1]
    assert ids(txs[1]) == ["a"]
    assert txs[0].end == b.txs[0].end  # an empty transaction still moves the position
    assert not asm.watches("shop", "orders") and asm.watches("shop", "outbox")


def test_row_indexes_run_in_order_across_two_outbox_tables():
    t1 = OutboxTable("shop", "outbox")
    t2 = OutboxTable("billing", "events", topic="billing.{type}")
    asm = assembler(tables=[t1, t2])
    txs = feed_all(
        asm,
        [
            TxBegin(P(4), P(100)),
            RowInsert("shop", "outbox", outbox_row("a"), P(200)),
            RowInsert("billing", "events", outbox_row("b", type="paid"), P(300)),
            RowInsert("shop", "outbox", outbox_row("c"), P(400)),
            RowInsert("billing", "events", outbox_row("d", type="paid"), P(500)),
            TxCommit(P(600), 1),
        ],
    )
    items = list(txs[0].items())
    assert [(i.event_id, i.identity.row, i.topic, i.table) for i in items] == [
        ("a", 0, "outbox.event.order", "shop.outbox"),
        ("b", 1, "billing.paid", "billing.events"),
        ("c", 2, "outbox.event.order", "shop.outbox"),
        ("d", 3, "billing.paid", "billing.events"),
    ]


def test_dead_letters_keep_their_row_index():
    asm = assembler()
    txs = feed_all(
        asm,
        [
            TxBegin(P(4), P(100)),
            RowInsert("shop", "outbox", outbox_row("a"), P(200)),
            RowInsert("shop", "outbox", outbox_row("b", aggregate_type="bad type"), P(300)),
            TxCommit(P(400), 1),
        ],
    )
    items = list(txs[0].items())
    assert isinstance(items[0], OutboxEvent) and isinstance(items[1], DeadLetter)
    assert items[1].identity.row == 1 and items[1].cause == "illegal_topic"


@pytest.mark.parametrize("policy", ["ignore", "warn"])
def test_update_and_delete_on_outbox_are_counted_and_ignored(policy):
    seen = []
    asm = assembler(on_change=policy, on_ignored_change=seen.append)
    txs = feed_all(
        asm,
        [
            TxBegin(P(4), P(100)),
            RowInsert("shop", "outbox", outbox_row("a"), P(200)),
            RowChange("delete", "shop", "outbox", outbox_row("a"), P(300)),
            RowChange("update", "shop", "outbox", outbox_row("a"), P(350)),
            RowChange("delete", "shop", "orders", {"id": 1}, P(380)),
            TxCommit(P(400), 1),
        ],
    )
    assert [ids(t) for t in txs] == [["a"]]
    assert [c.kind for c in seen] == ["delete", "update"]


def test_update_on_outbox_with_stop_policy_is_refused():
    asm = assembler(on_change="stop")
    asm.feed(TxBegin(P(4), P(100)))
    with pytest.raises(OutboxChangeRefused, match=r"DELETE on outbox table shop\.outbox"):
        asm.feed(RowChange("delete", "shop", "outbox", outbox_row("a"), P(300)))
    # a change on another table is fine
    assembler(on_change="stop").feed(RowChange("update", "shop", "orders", {}, P(10)))


def test_unknown_on_change_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="on_change"):
        assembler(on_change="explode")


def test_heartbeats_and_unknown_events_are_ignored():
    from cdc.source_events import Heartbeat, ServerInfo

    asm = assembler()
    assert asm.feed(Heartbeat(P(4))) is None and asm.feed(ServerInfo(1, "mysql")) is None
    assert asm.resume_point is None


def test_a_large_transaction_spills_and_yields_every_row_in_order(tmp_path):
    asm = assembler(memory_limit=1000, spill_dir=str(tmp_path))
    asm.feed(TxBegin(P(4), P(100)))
    n = 50_000
    for i in range(n):
        asm.feed(
            RowInsert(
                "shop",
                "outbox",
                {"id": i, "aggregatetype": "order", "aggregateid": i % 7, "type": "t", "payload": None},
                P(200 + i),
            )
        )
    buffer = asm._rows  # the buffer of the open transaction
    assert buffer.spilled and buffer.spilled_total > 0
    tx = asm.feed(TxCommit(P(100_000), 1))
    assert tx.size == n
    count = 0
    for expected, item in enumerate(tx.items()):
        assert item.event_id == str(expected) and item.identity.row == expected
        count += 1
    assert count == n
    tx.release()
    # the next transaction starts with a fresh, unspilled buffer
    [tx2] = feed_all(
        asm,
        [
            TxBegin(P(200_000), P(200_100)),
            RowInsert("shop", "outbox", outbox_row("x"), P(200_200)),
            TxCommit(P(200_300), 2),
        ],
    )
    assert ids(tx2) == ["x"]


def test_rollback_to_savepoint_after_spilling(tmp_path):
    asm = assembler(memory_limit=3, spill_dir=str(tmp_path))
    events = [TxBegin(P(4), P(100))]
    events += [RowInsert("shop", "outbox", outbox_row(f"a{i}"), P(200 + i)) for i in range(5)]
    events += [Savepoint("s", P(300))]
    events += [RowInsert("shop", "outbox", outbox_row(f"b{i}"), P(400 + i)) for i in range(5)]
    events += [
        RollbackToSavepoint("s", P(500)),
        RowInsert("shop", "outbox", outbox_row("c"), P(600)),
        TxCommit(P(700), 1),
    ]
    [tx] = feed_all(asm, events)
    assert ids(tx) == [f"a{i}" for i in range(5)] + ["c"]


# -- XA (two-phase) transactions ------------------------------------------------------

XID = "X'7831',X'',1"


def _prepare_group(start, gtid="0-1-3", rows=("a",), xid=XID):
    """MariaDB's shape: a GTID event that opens the group, rows, XA END, XA_prepare."""
    evs = [TxBegin(P(start), P(start + 50), gtid, False, True)]
    evs += [RowInsert("shop", "outbox", outbox_row(r), P(start + 100 + i)) for i, r in enumerate(rows)]
    evs += [XaEnd(xid, P(start + 200)), XaPrepare(xid, P(start + 250), 1_700_000_001)]
    return evs


def test_an_xa_transaction_is_held_at_prepare_and_published_at_its_commit_with_the_commit_identity():
    asm = assembler()
    marks = feed_all(asm, _prepare_group(400, rows=("a", "b")))
    assert len(marks) == 1 and marks[0].size == 0 and marks[0].xa.kind == "prepare"
    assert marks[0].xa.prepared_at == P(400) and asm.prepared_xids == [XID]
    other = feed_all(
        asm,
        [
            TxBegin(P(700), P(750), "0-1-4", False, True),
            RowInsert("shop", "outbox", outbox_row("c"), P(800)),
            TxCommit(P(900), 1_700_000_002),
        ],
    )
    assert ids(other[0]) == ["c"]
    done = feed_all(asm, [TxBegin(P(1000), P(1050), "0-1-5", True), XaCommit(XID, P(1050), P(1100), 1_700_000_003)])
    assert len(done) == 1 and ids(done[0]) == ["a", "b"] and done[0].xa.kind == "commit"
    assert done[0].identity == TxIdentity("src", P(1000), "0-1-5", 3, 1_700_000_003_000, P(400))
    assert done[0].end == P(1100) and asm.prepared_xids == [] and asm.resume_point == P(1100)
    assert ("cdc.xa.prepare", b"mysql-bin.000001:400") in done[0].identity.headers()


def test_an_xa_rollback_after_prepare_publishes_nothing():
    asm = assembler()
    feed_all(asm, _prepare_group(400))
    out = feed_all(asm, [TxBegin(P(1000), P(1050), "0-1-5", True), XaRollback(XID, P(1100))])
    assert len(out) == 1 and out[0].size == 0 and out[0].xa.kind == "rollback"
    assert asm.prepared_xids == [] and asm.discarded_rows == 1


def test_prepared_xa_rows_survive_a_reconnect():
    asm = assembler()
    feed_all(asm, _prepare_group(400))
    asm.reset()  # the stream was cut and is reopened after the prepare group
    done = feed_all(asm, [XaCommit(XID, P(1000), P(1100), 5)])  # no GTID event: a server without GTIDs
    assert ids(done[0]) == ["a"] and done[0].identity.start == P(1000) and done[0].identity.gtid is None


def test_an_xa_commit_whose_prepare_was_never_read_publishes_nothing_and_is_counted():
    asm = assembler()
    out = feed_all(asm, [TxBegin(P(1000), P(1050), "0-1-5", True), XaCommit(XID, P(1050), P(1100), 5)])
    assert out[0].size == 0 and asm.xa_outcomes_unmatched == 1


def test_xa_one_phase_commits_the_open_transaction():
    asm = assembler()
    # MySQL: XA START, rows, XA END, then XA COMMIT ... ONE PHASE (a query, or a prepare event with one_phase)
    for last in (XaCommit(XID, P(300), P(350), 7, one_phase=True), XaPrepare(XID, P(350), 7, one_phase=True)):
        out = feed_all(
            asm,
            [
                TxBegin(P(4), P(50), "u:1"),
                TxBegin(P(50), P(100)),
                RowInsert("shop", "outbox", outbox_row("a"), P(200)),
                XaEnd(XID, P(300)),
                last,
            ],
        )
        assert ids(out[0]) == ["a"] and out[0].xa is None and out[0].identity.start == P(4)


def test_mysql_two_phase_shape_opened_by_an_xa_start_query_is_held_then_published_at_its_commit():
    """MySQL writes the prepare group as a GTID event, a `XA START` query, rows, `XA END`
    and XA_prepare; the outcome as a GTID event and a `XA COMMIT` query (byte-level shape:
    not exercised against a MySQL server here)."""
    from cdc.source_events import query_event

    asm = assembler()
    prepare = [
        TxBegin(P(4), P(50), "u:1"),
        query_event("XA START X'7831',X'',1", P(50), P(100), 5),
        RowInsert("shop", "outbox", outbox_row("a"), P(200)),
        query_event("XA END X'7831',X'',1", P(200), P(250), 5),
        XaPrepare(XID, P(300), 5),
    ]
    assert feed_all(asm, prepare)[0].size == 0 and asm.prepared_xids == [XID]
    done = feed_all(asm, [TxBegin(P(300), P(350), "u:2"), query_event("XA COMMIT X'7831',X'',1", P(350), P(400), 6)])
    assert ids(done[0]) == ["a"] and done[0].identity.gtid == "u:2" and done[0].identity.xa_prepared_at == P(4)


def test_an_xa_recover_row_names_the_xid_as_the_binlog_does():
    from cdc.source_events import recovered_xid

    assert recovered_xid((1, 2, 0, b"x1")) == XID
    assert recovered_xid((7, 2, 2, "x2bq")) == "X'7832',X'6271',7"


def test_xa_queries_are_recognised_with_their_xid():
    from cdc.source_events import query_event

    assert query_event("XA COMMIT X'7831',X'',1", P(1), P(2), 3) == XaCommit(XID, P(1), P(2), 3)
    assert query_event("XA ROLLBACK X'7832',X'6271',7", P(1), P(2), 3) == XaRollback("X'7832',X'6271',7", P(2))
    assert query_event("XA COMMIT 'x1' ONE PHASE", P(1), P(2), 3) == XaCommit(XID, P(1), P(2), 3, True)
    assert query_event("XA END X'7831',X'',1", P(1), P(2), 3) == XaEnd(XID, P(2))


# -- statement-logged writes ----------------------------------------------------------


def _statement_tx(sql, schema="shop"):
    return [TxBegin(P(4), P(50), "0-1-9", False, True), Statement(sql, P(200), 5, schema), TxCommit(P(300), 5)]


@pytest.mark.parametrize(
    "sql,schema",
    [
        ("INSERT INTO shop.outbox VALUES ('g','o','1','t','p')", ""),
        ("insert into outbox (id) values ('g')", "shop"),
        ("/* app */ REPLACE LOW_PRIORITY INTO `shop`.`outbox` SET id = 'g'", "other"),
        ("LOAD DATA INFILE '/tmp/x' INTO TABLE outbox", "shop"),
    ],
)
def test_a_statement_logged_outbox_insert_stops_the_relay_naming_table_position_and_fix(sql, schema):
    asm = assembler()
    with pytest.raises(StatementFormatRefused) as err:
        feed_all(asm, _statement_tx(sql, schema))
    text = str(err.value)
    assert "shop.outbox" in text and "mysql-bin.000001:200" in text and "binlog_format=ROW" in text
    assert "on_statement" in text and "\n" not in text


def test_a_statement_logged_outbox_insert_of_a_transaction_that_rolls_back_is_nothing():
    """A session in STATEMENT format that rolls back after touching a non-transactional
    table leaves BEGIN, the statements and ROLLBACK in the binlog: nothing was committed,
    nothing stops the relay."""
    asm = assembler()
    evs = _statement_tx("INSERT INTO shop.outbox VALUES ('g')")
    evs[-1] = TxRollback(P(300))
    assert feed_all(asm, evs) == [] and asm.resume_point == P(300)
    assert (
        len(
            feed_all(
                asm,
                [
                    TxBegin(P(300), P(350), "0-1-10", False, True),
                    RowInsert("shop", "outbox", outbox_row("a"), P(400)),
                    TxCommit(P(500), 5),
                ],
            )
        )
        == 1
    )


def test_a_statement_logged_outbox_insert_cut_back_by_a_savepoint_is_nothing():
    asm = assembler()
    evs = _statement_tx("INSERT INTO shop.outbox VALUES ('g')")
    evs[1:1] = [Savepoint("s1", P(100))]
    evs[3:3] = [RollbackToSavepoint("s1", P(250))]
    assert feed_all(asm, evs)[0].size == 0


def test_a_statement_logged_outbox_insert_in_an_xa_prepare_stops_at_its_commit_not_its_rollback():
    for outcome, refused in ((XaRollback(XID, P(700)), False), (XaCommit(XID, P(600), P(700), 5), True)):
        asm = assembler()
        prepare = [
            TxBegin(P(4), P(50), "0-1-3", False, True),
            Statement("INSERT INTO shop.outbox VALUES ('g')", P(200), 5, "shop"),
            XaEnd(XID, P(250)),
            XaPrepare(XID, P(300), 5),
        ]
        assert feed_all(asm, prepare)[0].size == 0
        if refused:
            with pytest.raises(StatementFormatRefused):
                feed_all(asm, [outcome])
        else:
            assert feed_all(asm, [outcome])[0].size == 0


def test_a_statement_logged_outbox_insert_is_dead_lettered_when_configured_and_keeps_its_place():
    asm = assembler(on_statement="dead_letter")
    evs = _statement_tx("INSERT INTO shop.outbox VALUES ('g')")
    evs.insert(1, RowInsert("shop", "outbox", outbox_row("a"), P(100)))
    tx = feed_all(asm, evs)[0]
    items = list(tx.items())
    assert [type(i) for i in items] == [OutboxEvent, DeadLetter]
    assert items[1].cause == "statement_format" and items[1].row == {"sql": "INSERT INTO shop.outbox VALUES ('g')"}
    assert items[1].identity.row == 1 and items[1].table == "shop.outbox"


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO shop.orders SELECT * FROM shop.outbox",  # reads the outbox, writes another table
        "UPDATE shop.orders SET a = 1",
        "SET @x = 1",
    ],
)
def test_statements_that_do_not_write_the_outbox_pass(sql):
    asm = assembler()
    tx = feed_all(asm, _statement_tx(sql))[0]
    assert tx.size == 0 and tx.end == P(300)


def test_a_statement_logged_update_of_the_outbox_follows_on_change():
    asm = assembler(on_change="stop")
    with pytest.raises(OutboxChangeRefused):
        feed_all(asm, _statement_tx("UPDATE outbox SET payload = 'x'"))


def test_a_mariadb_transaction_is_not_ended_by_a_statement_inside_it():
    """MariaDB's GTID event opens the transaction itself (no BEGIN query): a statement
    inside it must not complete it (that put checkpoints inside transactions)."""
    asm = assembler()
    out = feed_all(
        asm,
        [
            TxBegin(P(4), P(50), "0-1-9", False, True),
            Statement("INSERT INTO shop.orders VALUES (1)", P(100), 5, "shop"),
            RowInsert("shop", "outbox", outbox_row("a"), P(200)),
            TxCommit(P(300), 5),
        ],
    )
    assert len(out) == 1 and ids(out[0]) == ["a"] and out[0].end == P(300)


def test_replace_written_as_delete_then_insert_of_the_same_id_is_a_change_not_a_second_event():
    asm = assembler(on_change="warn")
    out = feed_all(
        asm,
        [
            TxBegin(P(4), P(50), "0-1-9", False, True),
            RowChange("delete", "shop", "outbox", outbox_row("b"), P(100)),
            RowInsert("shop", "outbox", outbox_row("b", payload="new"), P(150)),
            RowInsert("shop", "outbox", outbox_row("c"), P(160)),
            TxCommit(P(200), 5),
        ],
    )
    assert ids(out[0]) == ["c"]
    # insert-then-delete (the usual outbox pattern) still publishes the insert
    out = feed_all(
        asm,
        [
            TxBegin(P(300), P(350), "0-1-10", False, True),
            RowInsert("shop", "outbox", outbox_row("d"), P(400)),
            RowChange("delete", "shop", "outbox", outbox_row("d"), P(450)),
            TxCommit(P(500), 5),
        ],
    )
    assert ids(out[0]) == ["d"]
