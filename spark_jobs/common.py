"""Small shared helpers of the verifier: the identity-key string both sides join on,
Kafka's default partitioner (murmur2), option parsing and the redaction of connection
settings. The Spark session itself is set up in `spark_jobs/session.py`.

Nothing here comes from the relay's transaction or recovery code; only the value types
(`cdc.position`, the header names in `cdc.events.identity`) are shared on purpose.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from cdc.position import file_sequence
from cdc.tls import TLS_KEYS

_settled = False


def settle_worker() -> None:
    """Once per Python worker process, before its first read: import what the readers use
    and take everything that exists then out of the cyclic garbage collector's sight
    (`gc.freeze`). PySpark's reused worker runs a full `gc.collect()` after every task;
    over the ~50,000 objects of the imported modules that cost 10-50 ms a task, twice per
    micro-batch of `cdc verify --follow` - half of its workers' CPU when the batches are
    small. Objects made by the tasks stay collectable."""
    global _settled
    if _settled:
        return
    _settled = True
    for name in ("pyarrow", "pyarrow.ipc", "confluent_kafka", "pymysql", "pymysqlreplication", "fastavro"):
        try:
            importlib.import_module(name)
        except ImportError:  # a reader that needs it says so itself
            pass
    gc.collect()
    gc.freeze()


# PySpark's process that runs a streaming source's reader (started by the JVM with `-m`)
_STREAM_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
# What the runner meets when the JVM closed its socket: the query was stopped
_JVM_GONE = (EOFError, BrokenPipeError, ConnectionResetError)


def stream_reader_stopped() -> None:
    """A streaming reader's `stop()`. PySpark's runner calls it in a `finally` around its
    loop of the JVM's calls, then writes the error back to the JVM. When the query stops,
    the JVM closes the runner's socket (and then ends the process): a runner that reads
    the close first gets EOFError, its write back fails, and the interpreter prints a
    traceback into the stderr `cdc verify` shares (seen once in a full test run, on Ctrl-C
    of `--follow`). There is nothing to report then: the runner ends at once, quietly, as
    spark_jobs/worker_daemon.py ends a worker the JVM left. Anywhere else, or for any other
    error, nothing happens here."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) == _STREAM_RUNNER and isinstance(sys.exc_info()[1], _JVM_GONE):
        sys.stderr.flush()
        os._exit(0)


# Separator of the identity-key string: ASCII unit separator, never in a source name,
# a GTID or a binlog file name.
KEY_SEP = "\x1f"

SECRET_OPTION_NAMES = frozenset({"password", "passwd", "tls_key_password", "key_password"})

try:  # the data source base classes; the pure-python parts of the sources work without Spark
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except Exception:  # pragma: no cover
    DataSource = object  # type: ignore[misc,assignment]  # a stand-in base when pyspark is not installed
    DataSourceReader = object  # type: ignore[misc,assignment]  # a stand-in base when pyspark is not installed

    class InputPartition:  # type: ignore[no-redef]  # a stand-in when pyspark is not installed
        def __init__(self, value: Any) -> None:
            self.value = value


def identity_key(source: str, gtid: str | None, file: str | None, pos: int | None, row: int) -> str:
    """The identity of one event as one string: `(source, gtid, row)` when the transaction
    has a GTID, else `(source, file, pos, row)` - the rule of `cdc.events.identity`."""
    if gtid:
        return f"g{KEY_SEP}{source}{KEY_SEP}{gtid}{KEY_SEP}{row}"
    return f"p{KEY_SEP}{source}{KEY_SEP}{file}{KEY_SEP}{pos}{KEY_SEP}{row}"


def file_seq_or_none(name: str | None) -> int | None:
    if not name:
        return None
    try:
        return file_sequence(name)[1]
    except Exception:
        return None


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (the Java client's and librdkafka's murmur2 partitioners),
    as a signed 32-bit value."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (
            (data[i4] & 0xFF)
            | ((data[i4 + 1] & 0xFF) << 8)
            | ((data[i4 + 2] & 0xFF) << 16)
            | ((data[i4 + 3] & 0xFF) << 24)
        )
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length4 * 4
    if rest == 3:
        h ^= (data[tail + 2] & 0xFF) << 16
    if rest >= 2:
        h ^= (data[tail + 1] & 0xFF) << 8
    if rest >= 1:
        h ^= data[tail] & 0xFF
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: bytes | str | None, partitions: int) -> int | None:
    """The partition Kafka's murmur2 partitioners pick for a non-null key
    (`toPositive(murmur2(key)) % partitions`); None for a null key (random)."""
    if key is None or partitions <= 0:
        return None
    if isinstance(key, str):
        key = key.encode("utf-8")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# ---------------------------------------------------------------------------- options


def opt_json(options: Mapping[str, str], name: str, default: Any = None) -> Any:
    value = options.get(name)
    if value is None or value == "":
        return default
    return json.loads(value)


def opt_int(options: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    value = options.get(name)
    if value is None or value == "":
        return default
    return int(value)


def opt_bool(options: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = options.get(name)
    if value is None or value == "":
        return default
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def mysql_settings_from_options(options: Mapping[str, str]) -> dict[str, Any]:
    """A connection dict (connectors/mysql/client.py) from data source options (`host`,
    `port`, `user`, `password` and the TLS settings' `tls_*`, cdc/tls.py)."""
    settings: dict[str, Any] = {
        "host": options.get("host") or "127.0.0.1",
        "port": int(options.get("port") or 3306),
        "user": options.get("user") or "root",
        "password": options.get("password") or "",
    }
    settings.update({key: str(options[key]) for key in TLS_KEYS if options.get(key)})
    return settings


SINK_TLS_OPTIONS = ("ca_file", "cert_file", "key_file", "key_password")  # key_password: a secret


def sink_tls_context(fmt: str, options: Mapping[str, Any], on: bool = False) -> Any:
    """The TLS context a sink source (`cdc_rabbitmq`, `cdc_nats`) connects with, from its
    options `ca_file` (the CA of the broker's certificate; "" the system's), `cert_file` and
    `key_file` (a client certificate; `key_password` for an encrypted key: without it such a key
    is an error, not OpenSSL's prompt on the terminal); None when `on` is false and none of them is set. The
    certificate's name is always checked against the address connected to
    (`ssl.create_default_context`: CERT_REQUIRED, check_hostname), as the relay does. The
    files are read where the source runs: on a cluster they must exist on every executor."""
    import ssl

    ca, cert, key = (str(options.get(name) or "") for name in ("ca_file", "cert_file", "key_file"))
    if not (on or ca or cert):
        return None
    key_password = str(options.get("key_password") or "")

    def no_password() -> bytes:
        raise RuntimeError(
            f"{fmt}: the client key {key or cert} is encrypted and no password is set: set the key_password "
            "option (cdc verify sets it from the sink's key_password_env or key_password_file)"
        )

    try:
        context = ssl.create_default_context(cafile=ca or None)
        if cert:
            context.load_cert_chain(cert, key or None, password=key_password or no_password)
    except (OSError, ssl.SSLError) as exc:
        raise RuntimeError(
            f"{fmt}: the TLS files cannot be used ({type(exc).__name__}: {exc}): check ca_file, cert_file and "
            "key_file (and key_password for an encrypted key)"
        ) from None
    return context


def tls_hint(exc: BaseException) -> str:
    """What to check after a failed TLS connection (certificate, name), else ""."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return "; the broker's certificate was refused: check ca_file (its CA) and that the address is a name the certificate holds"
    if isinstance(exc, ssl.SSLError):
        return "; the TLS handshake failed: check that the port serves TLS and the client certificate (cert_file, key_file)"
    return ""


def redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Connection settings safe to print: secrets replaced by `***`."""
    return {k: ("***" if k.lower() in SECRET_OPTION_NAMES and v else v) for k, v in settings.items()}


def scrub(text: str, settings: Mapping[str, Any] | None) -> str:
    """`text` with any secret value of `settings` replaced by `***`."""
    if not settings:
        return text
    for key, value in settings.items():
        if key.lower() in SECRET_OPTION_NAMES and value:
            text = text.replace(str(value), "***")
    return text


def where(settings: Mapping[str, Any]) -> str:
    return f"{settings.get('user')}@{settings.get('host')}:{settings.get('port')}"


# ------------------------------------------------------------------------------ Spark
