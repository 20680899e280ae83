"""The catch-up benchmark of an older commit and of the working tree, alternating, in one
session, on one interpreter: drift across many changes shows against a fixed baseline,
not only each change against the naive parse of its own run.

    ./run.sh bench baseline [--commit 9689857] [--mixed] [--events 100000] [--rounds 2]

The older commit is checked out into a temporary directory (`git worktree add --detach`,
removed at the end) and its own `bench/catchup.py` runs there with this venv's Python, so
its relay imports its own modules (the script puts its checkout first on `sys.path`; the
relay it starts runs `python -m cdc_cli.main` in that checkout). The rounds alternate which
side goes first. Each run writes its own binlog on its own throwaway server, so each prints
its own naive-parse rate: the ratio to it is the figure that holds across the two, and the
events/s, CPU and first-event times of the two sides are compared directly too.

Default commit 9689857 is round 1's last (the issue's reference for "at least as fast as
round 1"). The working tree's uncommitted changes are part of "now".
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.catchup import compiled_environment  # noqa: E402  # after the sys.path entry above

_FIGURES = {
    "rate": re.compile(r"relay end to end: ([\d,]+) events/s"),
    "cpu": re.compile(r"CPU ([\d.]+)s"),
    "first": re.compile(r"first event after ([\d.]+)s"),
    "steady": re.compile(r"relay after its first event: ([\d,]+) events/s"),
    "naive": re.compile(r"naive python-mysql-replication parse: ([\d,]+) outbox events/s"),
}


def figures(output: str) -> dict[str, float]:
    """The numbers a catch-up run printed (the same lines since round 1)."""
    out = {}
    for name, rx in _FIGURES.items():
        m = rx.search(output)
        if m is None:
            raise SystemExit(f"bench baseline: the catch-up run printed no {name!r} figure:\n{output[-2000:]}")
        out[name] = float(m.group(1).replace(",", ""))
    return out


def run_catchup(checkout: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, str(checkout / "bench" / "catchup.py"), "--events", str(args.events)]
    if args.mixed:
        cmd.append("--mixed")
    # Both trees' relays run from compiled bytecode, as an installed relay does (see
    # bench/catchup.py's relay_environment): an older catchup.py passes its environment on.
    env = compiled_environment(checkout)
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"bench baseline: catch-up in {checkout} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return figures(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="9689857", help="the older commit (default: round 1's last, 9689857)")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--mixed", action="store_true")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs, alternating which side goes first")
    args = ap.parse_args()
    sha = subprocess.run(
        ["git", "rev-parse", "--short", args.commit], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if not sha:
        raise SystemExit(f"bench baseline: {args.commit!r} is not a commit of this repository")
    with tempfile.TemporaryDirectory(prefix="cdc-baseline-") as tmp:
        old = Path(tmp) / sha
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), sha], cwd=ROOT, check=True)
        try:
            sides: dict[str, list[dict[str, float]]] = {sha: [], "now": []}
            for i in range(args.rounds):
                order = [(sha, old), ("now", ROOT)] if i % 2 == 0 else [("now", ROOT), (sha, old)]
                for name, checkout in order:
                    f = run_catchup(checkout, args)
                    sides[name].append(f)
                    print(
                        f"round {i + 1} {name:>8}: {f['rate']:,.0f} events/s incl. start-up, "
                        f"{f['steady']:,.0f} after the first event ({f['first']:.2f} s), CPU {f['cpu']:.1f} s, "
                        f"naive parse {f['naive']:,.0f}/s, ratio {f['rate'] / f['naive']:.2f}x",
                        flush=True,
                    )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    kind = "mixed" if args.mixed else "outbox-only"
    print(f"\n{kind}, {args.events} events, medians of {args.rounds} run(s) each:")
    med = {n: {k: statistics.median(r[k] for r in runs) for k in _FIGURES} for n, runs in sides.items()}
    for name in (sha, "now"):
        m = med[name]
        print(
            f"  {name:>8}: {m['rate']:,.0f} events/s, {m['steady']:,.0f} after the first event, first event "
            f"{m['first']:.2f} s, CPU {m['cpu']:.1f} s, ratio to the naive parse {m['rate'] / m['naive']:.2f}x"
        )
    a, b = med[sha], med["now"]
    print(
        f"  now / {sha}: rate {b['rate'] / a['rate']:.2f}x, after the first event {b['steady'] / a['steady']:.2f}x, "
        f"CPU {b['cpu'] / a['cpu']:.2f}x, first event {b['first'] - a['first']:+.2f} s"
    )


if __name__ == "__main__":
    main()
