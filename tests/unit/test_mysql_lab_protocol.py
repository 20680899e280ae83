"""The MySQL lab server's pure parts (testbed/mysql_lab/): its side of the login checked
against PyMySQL's client side (pymysql/_auth.py), its packets, and statements answered over
a data directory with no socket."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from pymysql import _auth

from testbed.mysql_lab.auth import (
    Accounts,
    caching_sha2_scramble_ok,
    greeting,
    make_nonce,
    native_scramble_ok,
    parse_handshake_response,
)
from testbed.mysql_lab.binlog_dir import BinlogDir
from testbed.mysql_lab.lab import default_state, write_state
from testbed.mysql_lab.locks import UserLocks
from testbed.mysql_lab.protocol import MysqlError, lenenc_int, read_lenenc_int, result_set_packets
from testbed.mysql_lab.queries import Result, Statements
from testbed.mysql_lab.sessions import Session


def test_nonce_has_no_nul_or_dollar():
    for _ in range(50):
        nonce = make_nonce()
        assert len(nonce) == 20 and 0 not in nonce and ord("$") not in nonce


def test_caching_sha2_fast_path_accepts_pymysqls_scramble_and_only_it():
    accounts = Accounts("cdc", "s3cret")
    nonce = make_nonce()
    assert caching_sha2_scramble_ok(accounts.stored_hash(), nonce, _auth.scramble_caching_sha2(b"s3cret", nonce))
    assert not caching_sha2_scramble_ok(accounts.stored_hash(), nonce, _auth.scramble_caching_sha2(b"other", nonce))
    assert not caching_sha2_scramble_ok(accounts.stored_hash(), nonce, b"short")


def test_full_authentication_decrypts_pymysqls_rsa_answer():
    accounts = Accounts("cdc", "s3cret")
    nonce = make_nonce()
    sent = _auth.sha2_rsa_encrypt(b"s3cret", nonce, accounts.public_pem)
    assert accounts.decrypt(sent, nonce) == b"s3cret"
    assert accounts.decrypt(b"\x00" * 256, nonce) is None


def test_native_password_scramble():
    nonce = make_nonce()
    assert native_scramble_ok("pw", nonce, _auth.scramble_native_password(b"pw", nonce))
    assert not native_scramble_ok("pw", nonce, _auth.scramble_native_password(b"px", nonce))


def test_greeting_layout_as_pymysql_reads_it():
    nonce = make_nonce()
    data = greeting("9.1.0", 42, nonce)
    assert data[0] == 10 and data[1:7] == b"9.1.0\x00"
    assert struct.unpack_from("<I", data, 7)[0] == 42
    assert data[11:19] == nonce[:8] and data[19] == 0
    assert data[-len(b"caching_sha2_password\x00") :] == b"caching_sha2_password\x00"
    assert nonce[8:] + b"\x00" in data


def test_handshake_response_parse():
    caps = (1 << 9) | (1 << 15) | (1 << 19) | (1 << 21) | (1 << 3) | (1 << 20)
    attrs = lenenc_int(4) + b"_pid" + lenenc_int(3) + b"123"
    data = (
        struct.pack("<IIB23s", caps, 1 << 24, 255, b"")
        + b"cdc\x00"
        + lenenc_int(3)
        + b"abc"
        + b"shop\x00"
        + b"caching_sha2_password\x00"
        + lenenc_int(len(attrs))
        + attrs
    )
    r = parse_handshake_response(data)
    assert (r.user, r.auth_response, r.database, r.plugin, r.attributes) == (
        "cdc",
        b"abc",
        "shop",
        "caching_sha2_password",
        {"_pid": "123"},
    )


@pytest.mark.parametrize("n", [0, 250, 251, 65535, 65536, 1 << 24, (1 << 24) + 1])
def test_lenenc_round_trip(n):
    assert read_lenenc_int(lenenc_int(n), 0) == (n, len(lenenc_int(n)))


def test_result_set_packets_end_with_eof_and_null_is_fb():
    from testbed.mysql_lab.protocol import Column

    packets = result_set_packets([Column("a"), Column("b", integer=True)], [("x", None)])
    assert packets[0] == b"\x02" and packets[3][0] == 0xFE and packets[-1][0] == 0xFE
    assert packets[4] == b"\x01x\xfb"


# -- statements over a directory, no socket -------------------------------------------------


class FakeLab:
    def __init__(self, path: Path):
        self.dir = BinlogDir(path)
        self.locks = UserLocks()
        self.started = time.monotonic()
        self.default_version = "8.4.3"
        self.port = 3306
        self.killed: list[int] = []
        self._sessions: list[Session] = []

    def sessions(self) -> list[Session]:
        return list(self._sessions)

    def kill(self, conn_id: int, query_only: bool) -> bool:
        self.killed.append(conn_id)
        return any(s.id == conn_id for s in self._sessions)


@pytest.fixture
def statements(tmp_path):
    state = default_state("9.1.0", 7, "3e11fa47-71ca-11e1-a4f1-000c29a2f5b1")
    state["gtid_executed"] = "3e11fa47-71ca-11e1-a4f1-000c29a2f5b1:1-5:blue:1"
    write_state(tmp_path, state)
    lab = FakeLab(tmp_path)
    session = Session(8, "cdc", "127.0.0.1", 5555)
    lab._sessions.append(session)
    return Statements(lab, session)


def rows(st: Statements, sql: str) -> list[tuple]:
    result = st.answer(sql)
    assert isinstance(result, Result)
    return result.rows


def test_select_expressions_name_their_columns_as_typed(statements):
    result = statements.answer("SELECT VERSION(), @@server_id AS sid, @@GLOBAL.gtid_mode")
    assert isinstance(result, Result)
    assert [c.name for c in result.columns] == ["VERSION()", "sid", "@@GLOBAL.gtid_mode"]
    assert [c.integer for c in result.columns] == [False, True, False]


def test_select_values(statements):
    assert rows(statements, "SELECT VERSION(), @@server_id, @@global.gtid_mode, CONNECTION_ID()") == [
        ("9.1.0", 7, "ON", 8)
    ]
    assert rows(statements, "SELECT @@gtid_executed") == [("3e11fa47-71ca-11e1-a4f1-000c29a2f5b1:1-5:blue:1",)]


def test_set_user_and_session_variables(statements):
    statements.answer("SET @master_heartbeat_period = 500000000, @slave_uuid = 'a-b'")
    statements.answer("SET @master_binlog_checksum = @@global.binlog_checksum")
    assert statements.session.user_vars == {
        "master_heartbeat_period": 500000000,
        "slave_uuid": "a-b",
        "master_binlog_checksum": "CRC32",
    }
    statements.answer("SET NAMES utf8mb4 COLLATE utf8mb4_0900_ai_ci")
    statements.answer("SET AUTOCOMMIT = 1")
    with pytest.raises(MysqlError) as err:
        statements.answer("SET GLOBAL binlog_format = 'STATEMENT'")
    assert err.value.code == 1227
    with pytest.raises(MysqlError) as err:
        statements.answer("SET SESSION no_such_variable = 1")
    assert err.value.code == 1193


def test_show_variables_like_and_where(statements):
    assert rows(statements, "SHOW VARIABLES LIKE 'binlog_row_%'") == [
        ("binlog_row_image", "FULL"),
        ("binlog_row_metadata", "FULL"),
        ("binlog_row_value_options", ""),
    ]
    assert rows(statements, "SHOW GLOBAL VARIABLES WHERE Variable_name = 'gtid_mode'") == [("gtid_mode", "ON")]


def test_version_decides_the_status_statements(statements):
    with pytest.raises(MysqlError) as err:
        statements.answer("SHOW MASTER STATUS")
    assert err.value.code == 1064
    assert rows(statements, "SHOW BINARY LOG STATUS") == []  # no binlog file yet
    statements.lab.default_version = "8.0.40"
    statements.lab.dir.path.joinpath("lab_state.json").unlink()
    assert rows(statements, "SHOW MASTER STATUS") == []


def test_kill_an_unknown_thread(statements):
    with pytest.raises(MysqlError) as err:
        statements.answer("KILL 99")
    assert err.value.code == 1094 and err.value.message == "Unknown thread id: 99"


def test_xa_recover_convert_xid(statements):
    state = statements.lab.dir.state()
    state["xa_prepared"] = [{"format_id": 7, "gtrid": "6162", "bqual": "63"}]
    write_state(statements.lab.dir.path, state)
    assert rows(statements, "XA RECOVER") == [(7, 2, 1, b"abc")]
    assert rows(statements, "XA RECOVER CONVERT XID") == [(7, 2, 1, "0x616263")]


def test_unknown_statements_are_parse_errors(statements):
    for sql in ("FLUSH LOGS", "SELECT COUNT(*) FROM information_schema.COLUMNS", "SHOW ENGINES"):
        with pytest.raises(MysqlError) as err:
            statements.answer(sql)
        assert err.value.code == 1064
