"""Build the optional compiled walk of the json format: mypyc over a copy of
cdc/json_kinds.py named `cdc._json_kinds_compiled` and stamped with the source's SHA-256
(`BUILT_FROM`), so that cdc/json_kinds_native.py uses the build only while the source is
unchanged. Writes cdc/_json_kinds_compiled*.so (git-ignored build output) for the running
interpreter; a missing C compiler or mypyc is one line and exit 0 (the pure-Python walk
stays in use), a failed compile is one line and exit 1.
    .venv/bin/python tools/build_json_kinds.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cdc.json_kinds_native import COMPILED_NAME, SOURCE, source_digest  # noqa: E402

STEM = COMPILED_NAME.rpartition(".")[2]


def main() -> int:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        print(f"build_json_kinds: no C compiler ({compiler}); the json walk stays pure Python")
        return 0
    try:
        import mypyc  # noqa: F401  # ships with mypy (the test extra)
    except ImportError:
        print("build_json_kinds: mypyc is not installed (pip install mypy); the json walk stays pure Python")
        return 0
    digest = source_digest()
    for old in SOURCE.parent.glob(f"{STEM}*.so"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="json-kinds-") as tmp:
        package = Path(tmp) / "cdc"
        package.mkdir()
        (package / "__init__.py").write_text("")
        text = SOURCE.read_text() + f'\n\nBUILT_FROM = "{digest}"  # the SHA-256 of cdc/json_kinds.py\n'
        (package / f"{STEM}.py").write_text(text)
        run = subprocess.run([sys.executable, "-m", "mypyc", f"cdc/{STEM}.py"], cwd=tmp, capture_output=True, text=True)
        built = sorted(package.glob(f"{STEM}*.so"))
        if run.returncode != 0 or not built:
            last = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
            print(f"build_json_kinds: mypyc failed ({last[0]}); the json walk stays pure Python")
            return 1
        for so in built:
            shutil.copy2(so, SOURCE.parent / so.name)
    print(f"build_json_kinds: built {', '.join(so.name for so in built)} from json_kinds.py {digest[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
