"""A child process that dies with its parent: Linux's prctl(PR_SET_PDEATHSIG, SIGKILL).
Used by the reader process the relay ships and by the lab servers (`testbed/`).

Caveat from prctl(2): the signal fires when the parent *thread* that started the child
exits, so start children from a long-lived thread."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    ulong = ctypes.c_ulong
    prctl.argtypes = [ctypes.c_int, ulong, ulong, ulong, ulong]  # type: ignore[attr-defined]  # a ctypes function
    prctl.restype = ctypes.c_int  # type: ignore[attr-defined]  # a ctypes function
    return prctl


_prctl = _load_prctl()  # resolved at import: a child between fork and exec only calls it


def die_with_parent(parent_pid: int | None = None, exit_code: int = 1) -> None:
    """SIGKILL this process when its parent goes away. With `parent_pid`: exit at once
    (`exit_code`) if the parent is already gone (re-parented before prctl took effect).
    Safe as a `preexec_fn` (no allocation beyond the call)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(exit_code)
