"""`python -m testbed.mysql_lab --datadir DIR [--port N] [--user U] [--password-env VAR]`:
run the lab server until SIGTERM. Prints `ready <port>` on stdout once it listens; logs
(connections, dumps, `unknown statement: ...`) go to DIR/lab_server.log."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading

from testbed.mysql_lab.server import LabServer
from testbed.mysql_lab.variables import DEFAULT_VERSION


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.mysql_lab", description=__doc__)
    ap.add_argument("--datadir", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--user", default="cdc")
    ap.add_argument("--password-env", default="CDC_LAB_PASSWORD", help="variable holding the password")
    ap.add_argument("--version", default=DEFAULT_VERSION, help="until lab_state.json names one")
    ap.add_argument("--tls-cert", default="", help="PEM certificate: offer TLS (CLIENT_SSL) with it")
    ap.add_argument("--tls-key", default="", help="PEM key of --tls-cert")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.datadir):
        print(f"mysql lab: --datadir {args.datadir} is not a directory: create it first", file=sys.stderr)
        return 2
    logging.basicConfig(
        filename=os.path.join(args.datadir, "lab_server.log"),
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    tls = None
    if args.tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            tls.load_cert_chain(args.tls_cert, args.tls_key or None)
        except (OSError, ssl.SSLError) as exc:
            print(
                f"mysql lab: cannot load --tls-cert/--tls-key ({exc}): give a PEM certificate and its key",
                file=sys.stderr,
            )
            return 2
    try:
        server = LabServer(args.datadir, args.user, os.environ.get(args.password_env, ""), args.host, args.port,
                           args.version, tls)  # fmt: skip
    except OSError as exc:
        print(
            f"mysql lab: cannot listen on {args.host}:{args.port} ({exc.strerror}): pick another port", file=sys.stderr
        )
        return 2
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.stop, daemon=True).start())
    print(f"ready {server.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
