"""`settle_worker`: a Python worker takes what its imports made out of the cyclic garbage
collector's sight once, before its first read, so that PySpark's full `gc.collect()` after
every task stops walking them; what the tasks make stays collectable."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc
import weakref
import spark_jobs.common as common
common.settle_worker()
frozen = gc.get_freeze_count()
common.settle_worker()  # once per process
assert gc.get_freeze_count() == frozen, (frozen, gc.get_freeze_count())
class Cycle:
    pass
a, b = Cycle(), Cycle()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None, "an object made after settling was not collected"
print(frozen)
"""


def test_settle_worker_freezes_the_imported_heap_once_and_later_garbage_is_still_collected():
    # Python 3.12 starts with objects in the permanent generation already (375 on 3.12.1);
    # what matters is that the probe, not this process, is the one settled.
    before = gc.get_freeze_count()
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) > 10_000  # the readers' modules: tens of thousands of objects
    assert gc.get_freeze_count() == before  # this process was not touched
