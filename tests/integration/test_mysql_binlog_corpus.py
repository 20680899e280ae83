"""Binlog files written by real MySQL servers (5.7.19-5.7.38 with and without checksums, an
AliSQL 5.7.38, 8.0.26-8.0.31, 8.2.0, 9.0.1, 9.6.0: the folder `shared/mysql-binlogs` beside
the repository, each with a FILE.txt naming its origin), read as the replication stream
hands them over (testbed/mysql_lab/dump.py: a fake Rotate, the Format_description with its
in-use flag cleared, the events as stored) by the relay's decoder and the verifier's own reader, every
table watched, and compared value by value with each other and with two oracles:
python-mysql-replication's own classes and `mariadb-binlog -vv`.

Documented exceptions (each asserted below, never skipped):
* the verifier looks a table's columns up once per read (spark_jobs/mysql/binlog_table_map.py
  `TableMapRewriter._looked_up`): where the file's Table_maps name no columns (5.7, or
  binlog_row_metadata=MINIMAL) and the table was altered inside the range read (canal's
  file: 4, 5 and 6 columns), the rows of the other layouts are reported undecidable with
  their cause, not read. The relay looks up per table id and reads them.
* python-mysql-replication 1.0.17 (the oracle is wrong there, not the readers) drops a
  Transaction_payload (type 40, MySQL 8.0.20's binlog_transaction_compression) and a
  Gtid_tagged_log_event (42, MySQL 8.3's tagged GTIDs) without a word and raises on a
  VECTOR column (242, MySQL 9.0): what it does not yield is checked to be exactly those
  events' content.
* mariadb-binlog (MariaDB's reader) refuses MySQL's Transaction_payload and tagged GTID
  events ("incompatible MySQL 8.0 TRANSACTION_PAYLOAD_EVENT"), stops at a VECTOR column's
  Table_map, and at the one byte left after AliSQL's last event: it is compared up to
  where it stops.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.integration import mysql_binlog_corpus as corpus

pytestmark = pytest.mark.integration

if not corpus.CORPUS.is_dir():
    pytest.skip(f"no real MySQL binlog files: {corpus.CORPUS} is absent", allow_module_level=True)

FILES = corpus.corpus_files()

# A relay decoder bug these files found, fixed: a TEXT column after a VECTOR read as bytes
# (MySQL 9 counts VECTOR among the character columns of a Table_map's charset fields,
# sql/log_event.cc is_character_type; rust_mysql_common__vector.binlog's DEFAULT_CHARSET is
# "binary, column 1 utf8mb4" for (id, VECTOR, TEXT, VECTOR)). No file is expected to fail.
RELAY_XFAIL: dict[str, str] = {}


def _param(path: Path, xfail_relay: dict[str, str] | None = None) -> object:
    reason = (xfail_relay or {}).get(path.name)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(path, id=path.name, marks=marks)


def _without_before(records: list[tuple]) -> list[tuple]:
    """The relay keeps an update's after image only."""
    return [r[:3] + (None,) + r[4:] if r[0] == "update" else r for r in records]


def _undecidable_ends(f: corpus.BinlogFile, anomalies: list[str]) -> set[int]:
    """The end positions of the rows events the verifier reported undecidable (it names
    their start)."""
    starts = {int(a.split(" at ")[1].split(" ")[0]) for a in anomalies if "undecidable" in a}
    ends = {end for start, end in corpus.event_extents(f) if start in starts}
    assert len(ends) == len(starts), (starts, ends)
    return ends


def _without_undecidable(f: corpus.BinlogFile, records: list[tuple], anomalies: list[str]) -> list[tuple]:
    """`records` less the rows of the rows events the verifier reported undecidable."""
    ends = _undecidable_ends(f, anomalies)
    return [r for r in records if not (r[0] in ("insert", "update", "delete") and r[-1] in ends)]


@pytest.mark.parametrize("path", [_param(p, RELAY_XFAIL) for p in FILES])
def test_relay_and_verifier_read_the_same_transactions_and_rows(path: Path) -> None:
    """Every GTID, BEGIN, commit, XA prepare, statement and row image (inserts, deletes,
    updates' after images) of every table: the relay's decoder and the verifier's reader
    agree, positions included."""
    f = corpus.read_file(path)
    catalogue = corpus.Catalogue(f)
    relay = corpus.relay_records(f, catalogue, verify_checksum=f.crc)
    verifier, anomalies = corpus.verifier_records(f, catalogue)
    assert any(r[0] in ("insert", "update", "delete") for r in relay), "a file without rows proves nothing"
    if anomalies:
        # documented exception: the verifier's one look-up a table (module docstring)
        assert path.name == "canal__mysql-bin.000003", anomalies
        assert all("binlog_row_metadata is not FULL" in a for a in anomalies)
        read = _without_undecidable(f, relay, anomalies)
        assert len({r[-1] for r in relay} - {r[-1] for r in read}) == len(anomalies)
        relay = read
    assert relay == _without_before(verifier)


@pytest.mark.parametrize("path", [_param(p) for p in FILES])
@pytest.mark.parametrize("reads", [1, 3, 64])
@pytest.mark.parametrize("tables", ["all", "every other"])
def test_relay_reading_socket_buffers_gives_what_it_gives_event_by_event(path: Path, reads: int, tables: str) -> None:
    """The relay's reader path (`decode_reads` over a socket read's packets: other tables'
    rows and cached Table_maps skipped in the buffer) yields exactly what `decode` yields
    one event at a time, whatever the reads hold, with every table watched or every other
    one (by name)."""
    f = corpus.read_file(path)
    names = sorted(corpus.table_maps(f))
    watched = set(names) if tables == "all" else set(names[::2])
    kw = {"verify_checksum": False, "watched": watched}
    one_by_one = corpus.relay_records(f, corpus.Catalogue(f), **kw)
    assert corpus.relay_records(f, corpus.Catalogue(f), reads=reads, **kw) == one_by_one


def test_the_verifier_reports_rows_of_an_altered_table_it_cannot_name() -> None:
    """The exception above, exactly: canal's wanshao.wanshao_test has 4, 5 and 6 columns in
    one file under MySQL 5.7 (no column names in Table_maps); the verifier, told the first
    layout, reports each rows event of the others as undecidable naming
    binlog_row_metadata, and the relay reads every row."""
    f = corpus.read_file(corpus.CORPUS / "canal__mysql-bin.000003")
    catalogue = corpus.Catalogue(f)
    relay = corpus.relay_records(f, catalogue)
    _verifier, anomalies = corpus.verifier_records(f, catalogue)
    widths = {len(r[3]) for r in relay if r[0] == "insert" and r[2] == "wanshao_test"}
    assert widths == {4, 5, 6}
    assert len(anomalies) == 17 and all("wanshao.wanshao_test" in a for a in anomalies)
    # the relay: once per table id (224-227: each ALTER gives the table a new one)
    assert catalogue.relay_calls.count(("wanshao", "wanshao_test")) == 4
    assert catalogue.verifier_calls.count(("wanshao", "wanshao_test")) == 1  # once per read


def test_relay_verifying_checksums_reads_a_file_written_without_them() -> None:
    """MySQL 5.7.20 with binlog_checksum=NONE: the replica announces NONE
    (`SET @master_binlog_checksum = @@global.binlog_checksum`), so the fake Rotate comes
    without a CRC (sql/rpl_binlog_sender.cc fake_rotate_event: a checksum only when
    event_checksum_on()). The relay's decoder finds that out in its `_rotate`, but its
    `decode` checks the CRC first when verify_checksum is on."""
    f = corpus.read_file(corpus.CORPUS / "mysql-binlog-connector-java__mysql-bin.checksum-none")
    assert not f.crc
    assert corpus.relay_records(f, corpus.Catalogue(f), verify_checksum=True) == corpus.relay_records(
        f, corpus.Catalogue(f), verify_checksum=False
    )


@pytest.mark.parametrize("path", [_param(p) for p in FILES])
def test_every_event_crc_and_the_in_use_flag(path: Path) -> None:
    """Every stored event's CRC32 holds (computed with LOG_EVENT_BINLOG_IN_USE_F clear, as
    MySQL computes it before setting the flag); the Format_description sent has the flag
    clear and a CRC that holds as it is."""
    f = corpus.read_file(path)
    if f.crc:
        assert all(corpus.crc_ok(ev) for ev in f.events)
        sent = f.sent[1]
        assert sent[17] & 1 == 0 and corpus.crc_ok(sent)
    assert f.tail == (b"\0" if path.name == "polardbx-cdc__mysql_bin.1" else b"") or len(f.tail) < 19


def test_alisql_event_types_are_ignorable_and_ignored() -> None:
    """AliSQL 5.7.38 writes event types of its own (80, 101) among MySQL's: each carries
    LOG_EVENT_IGNORABLE_F (0x80; MySQL's Log_event: a reader that does not know the type
    may skip it), and the relay's decoder and the verifier's reader give exactly what they
    give with those events removed from the stream. The file ends with one byte of an
    event the copy cut short; the readers stop before it."""
    f = corpus.read_file(corpus.CORPUS / "polardbx-cdc__mysql_bin.1")
    own = [ev for ev in f.events if ev[4] in (80, 101)]
    assert len(own) == 3 and all(struct.unpack_from("<H", ev, 17)[0] & 0x80 for ev in own)
    assert len(f.tail) == 1
    relay = corpus.relay_records(f, corpus.Catalogue(f))
    verifier, _ = corpus.verifier_records(f, corpus.Catalogue(f))
    f.sent = [ev for ev in f.sent if ev[4] not in (80, 101)]
    assert corpus.relay_records(f, corpus.Catalogue(f)) == relay
    assert corpus.verifier_records(f, corpus.Catalogue(f))[0] == verifier
    assert [r[0] for r in relay] == ["begin", "update", "xa_end", "xa_prepare"]


# -- python-mysql-replication's own classes -------------------------------------------------

LIBRARY_UNREAD = {
    # file -> what the library drops or cannot read (module docstring)
    "mysql-binlog-connector-java__mysql-bin.compressed": "payload",
    "rust_mysql_common__binlog_transaction_with_GTID_TAG.000001": "tagged",
    "rust_mysql_common__vector.binlog": "vector",
}


def _verifier_as_library(records: list[tuple]) -> list[tuple]:
    out = []
    for r in records:
        if r[0] in ("begin", "statement", "xa_end"):
            continue  # queries: compared as text by kind below
        out.append(r)
    return out


@pytest.mark.parametrize("path", [_param(p) for p in FILES])
def test_library_oracle_agrees_where_it_reads(path: Path) -> None:
    """python-mysql-replication's classes on the packets as sent, nothing prepared: its
    GTIDs, commits, XA prepares and row images (before and after) equal the verifier's,
    except what it cannot read (LIBRARY_UNREAD), which is checked to be exactly that."""
    f = corpus.read_file(path)
    catalogue = corpus.Catalogue(f)
    verifier, anomalies = corpus.verifier_records(f, catalogue)
    library, unread = corpus.library_records(f)
    lib = _without_undecidable(f, [r for r in library if r[0] != "query"], anomalies)
    ver = _verifier_as_library(verifier)
    what = LIBRARY_UNREAD.get(path.name)
    if what == "payload":
        # the whole transaction sits in the Transaction_payload: the library yields none of it
        assert lib == [] and len(ver) == 2 and unread == []
        return
    if what == "tagged":
        # no GTID record: the library does not know type 42 (it yields nothing for it)
        assert [r for r in ver if r[0] != "gtid"] == lib
        gtids = [r[1] for r in ver if r[0] == "gtid"]
        assert len(gtids) == 1 and len(gtids[0].split(":")) == 3, gtids  # uuid:tag:gno
        return
    if what == "vector":
        # it reads no metadata byte for a VECTOR, so each Table_map's optional metadata is
        # misread (an unknown field type, or a length past the event) and every rows event
        # raises on the type: one refusal per rows event, none read wrong
        table_maps = [u for u in unread if u.startswith("type 19 ")]
        rows_events = [u for u in unread if not u.startswith("type 19 ")]
        assert all("MetadataFieldType" in u or "Result length not requested length" in u for u in table_maps)
        assert all("Unknown MySQL column type: 242" in u for u in rows_events)
        assert len(rows_events) == len({r[-1] for r in ver if r[0] in ("insert", "update", "delete")})
        read = {(r[1], r[2]) for r in lib if r[0] in ("insert", "update", "delete")}
        assert read == set()  # every table of the file has a VECTOR column
        assert [r for r in ver if r[0] not in ("insert", "update", "delete")] == lib
        return
    assert unread == []
    # (where a Table_map names no columns the library names them UNKNOWN_COL<i>, as the
    # catalogue does; its SET is a Python set, compared as a frozenset with the verifier's text)
    assert lib == corpus.sets_as_names(ver, lib)


# -- mariadb-binlog ------------------------------------------------------------------------


def _mariadb_boundaries(out: corpus.MariadbOutput) -> list[tuple]:
    """The transaction boundaries mariadb-binlog shows for a MySQL binlog: where each
    MySQL GTID event (type 33, which it prints as ignorable, without its GTID) starts,
    where each XID event and each XA_prepare event (printed `XID = X'..'`) ends."""
    out_: list[tuple] = []
    for start, end, what in out.events:
        if what == "Ignorable event type 33 (MySQL Gtid)":
            out_.append(("gtid", start))
        elif what.startswith("Xid = "):
            out_.append(("commit", end))
        elif what.startswith("XID = X'"):
            out_.append(("xa_prepare", end))
    return out_


@pytest.mark.parametrize("path", [_param(p) for p in FILES])
def test_mariadb_binlog_sees_the_same_transaction_boundaries(path: Path) -> None:
    """Every GTID event start, XID end and XA_prepare end mariadb-binlog prints (up to
    where it stops) is one the verifier's reader (and so the relay's decoder) names, in
    the same order; the XID ends are all the commits the readers name in that range."""
    f = corpus.read_file(path)
    verifier, _ = corpus.verifier_records(f, corpus.Catalogue(f))
    out = corpus.mariadb_binlog(path)
    theirs = _mariadb_boundaries(out)
    reach = max((end for _, end, _ in out.events), default=0)
    ours = [(r[0], r[2] if r[0] == "gtid" else r[-1]) for r in verifier if r[0] in ("gtid", "commit", "xa_prepare")]
    ours = [(kind, at) for kind, at in ours if at < reach or (kind != "gtid" and at == reach)]
    assert theirs == ours
    if path.name not in MARIADB_STOPS:
        assert len(theirs) == sum(1 for r in verifier if r[0] in ("gtid", "commit", "xa_prepare"))


MARIADB_STOPS = {
    "mysql-binlog-connector-java__mysql-bin.compressed": "TRANSACTION_PAYLOAD_EVENT",
    "rust_mysql_common__binlog_transaction_with_GTID_TAG.000001": "event_type: 42",
    "polardbx-cdc__mysql_bin.1": "Event truncated",
    "rust_mysql_common__vector.binlog": "",
}


@pytest.mark.parametrize("path", [_param(p) for p in FILES])
def test_mariadb_binlog_oracle_agrees_where_it_reads(path: Path) -> None:
    """`mariadb-binlog -vv --base64-output=decode-rows`: each row image it prints (insert,
    update before and after, delete), column by column, equals the verifier's as
    mariadb-binlog prints the type (`mariadb_text`), at the same end position."""
    f = corpus.read_file(path)
    catalogue = corpus.Catalogue(f)
    verifier, anomalies = corpus.verifier_records(f, catalogue)
    out = corpus.mariadb_binlog(path)
    rows = out.rows
    stop = MARIADB_STOPS.get(path.name)
    if stop is None:
        assert out.code == 0, out.stderr
    else:
        assert out.code == 1 and stop in out.stderr
    skipped = _undecidable_ends(f, anomalies)
    ours = [r for r in verifier if r[0] in ("insert", "update", "delete")]
    theirs = [m for m in rows if m.end not in skipped]
    if stop is not None:
        ours = ours[: len(theirs)]
    layouts = corpus.table_maps(f)
    assert len(theirs) == len(ours), (len(theirs), len(ours))
    for mine, printed in zip(ours, theirs, strict=True):
        assert (mine[0], mine[1], mine[2], mine[-1]) == (printed.kind, printed.schema, printed.table, printed.end)
        images = [mine[3], mine[4]] if mine[0] == "update" else [mine[3]]
        assert len(images) == len(printed.images)
        for values, columns in zip(images, printed.images, strict=True):
            assert len(values) == len(columns)
            layout = layouts[(mine[1], mine[2])]
            for i, ((name, value), (text, comment)) in enumerate(zip(values.items(), columns, strict=True)):
                want = corpus.mariadb_text(value, comment, layout.values_of(i) if len(layout.types) > i else None)
                assert text == want or (text.startswith(want + " (") and want.startswith("-")), (
                    f"{mine[1]}.{mine[2]} {name} at {mine[-1]}: mariadb-binlog prints {text} ({comment}), "
                    f"the verifier read {value!r}"
                )
