"""PySpark's Python worker daemon (`pyspark.daemon`), quiet when the JVM goes first.

When a job fails early (for example a binlog the user may not read) Spark cancels its
tasks and closes their sockets while a forked worker may still be writing; the stock
daemon then prints a `BrokenPipeError` traceback to the stderr `cdc verify` shares, after
the one-line error. A worker that finds its socket closed has nothing to report: this
module ends it quietly and otherwise runs the stock daemon unchanged
(`spark.python.daemon.module`).
"""

from __future__ import annotations

from pyspark import daemon

_stock_worker = daemon.worker


def _worker(sock, authenticated):  # pyspark's own signature
    try:
        return _stock_worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return 1  # the JVM closed the socket: the task was cancelled or Spark is stopping


daemon.worker = _worker

if __name__ == "__main__":
    daemon.manager()
