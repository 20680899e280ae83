"""Build an optional native module for the running interpreter, stamped with the SHA-256 of
its source (`BUILT_FROM`) so that its loader (cdc/native_build.py) uses the build only while
the source is unchanged. The builds are git-ignored build output; `./run.sh setup` runs this
for each target where a C compiler is. A missing C compiler (or mypyc) is one line and exit 0
(the Python module stays in use), a failed build is one line and exit 1.

    .venv/bin/python tools/build_native.py json_kinds    # cdc/_json_kinds_compiled*.so: mypyc
        over a copy of cdc/json_kinds.py, the json format's proof walk (docs/output-formats.md)
    .venv/bin/python tools/build_native.py sink_native   # connectors/_sink_native*.so: gcc over
        connectors/sink_native.c, the RabbitMQ Streams and NATS sinks' encoders (docs/sinks.md)
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

from cdc import json_kinds_native  # noqa: E402  # after the checkout is on the path
from connectors import sink_native  # noqa: E402


def _last_line(run: subprocess.CompletedProcess[str]) -> str:
    return ((run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"])[0]


def build_json_kinds(compiler: str) -> int:
    say = "build_json_kinds:"
    try:
        import mypyc  # noqa: F401  # ships with mypy (the test extra)
    except ImportError:
        print(f"{say} mypyc is not installed (pip install mypy); the json walk stays pure Python")
        return 0
    source, stem = json_kinds_native.SOURCE, json_kinds_native.COMPILED_NAME.rpartition(".")[2]
    digest = json_kinds_native.source_digest()
    for old in source.parent.glob(f"{stem}*.so"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="json-kinds-") as tmp:
        package = Path(tmp) / "cdc"
        package.mkdir()
        (package / "__init__.py").write_text("")
        text = source.read_text() + f'\n\nBUILT_FROM = "{digest}"  # the SHA-256 of cdc/json_kinds.py\n'
        (package / f"{stem}.py").write_text(text)
        run = subprocess.run([sys.executable, "-m", "mypyc", f"cdc/{stem}.py"], cwd=tmp, capture_output=True, text=True)
        built = sorted(package.glob(f"{stem}*.so"))
        if run.returncode != 0 or not built:
            print(f"{say} mypyc failed ({_last_line(run)}); the json walk stays pure Python")
            return 1
        for so in built:
            shutil.copy2(so, source.parent / so.name)
    print(f"{say} built {', '.join(so.name for so in built)} from json_kinds.py {digest[:12]}")
    return 0


def build_sink_native(compiler: str) -> int:
    """gcc (or the interpreter's CC) over connectors/sink_native.c into this interpreter's
    build, stamped with the source's digest."""
    say = "build_sink_native:"
    source, stem = sink_native.SOURCE, sink_native.COMPILED_NAME.rpartition(".")[2]
    digest = sink_native.source_digest()
    target = source.parent / f"{stem}{sysconfig.get_config_var('EXT_SUFFIX')}"
    target.unlink(missing_ok=True)  # this interpreter's; another's (tools/unit_tiers.sh) stays
    with tempfile.TemporaryDirectory(prefix="sink-native-") as tmp:
        built = Path(tmp) / target.name
        command = [
            compiler, "-O2", "-shared", "-fPIC", "-Wall",
            f"-I{sysconfig.get_paths()['include']}", f'-DBUILT_FROM="{digest}"',
            str(source), "-o", str(built),
        ]  # fmt: skip
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0 or not built.exists():
            print(f"{say} the compile failed ({_last_line(run)}); the sinks' Python encoders stay in use")
            return 1
        shutil.copy2(built, target)
    print(f"{say} built {target.name} from {source.name} {digest[:12]}")
    return 0


TARGETS = {
    "json_kinds": (build_json_kinds, "build_json_kinds: no C compiler ({}); the json walk stays pure Python"),
    "sink_native": (
        build_sink_native,
        "build_sink_native: no C compiler ({}); the sinks' Python encoders stay in use",
    ),
}


def main(target: str) -> int:
    build, no_compiler = TARGETS[target]
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        print(no_compiler.format(compiler))
        return 0
    return build(compiler)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TARGETS:
        print(f"usage: {sys.argv[0]} {'|'.join(TARGETS)}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
