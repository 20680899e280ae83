"""The relay's config file as the `cdc` commands read it: TOML, with environment
overrides and secrets resolved by `cdc.config.load_config`."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from cdc.config import Config, load_config
from cdc.errors import NeedsOperator


def read_config(path: str) -> Config:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CliError(f"config file {path} not found: pass --config with the path of your relay.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot read config file {path}: {exc.strerror}") from None
    return load_config(raw, os.environ, lambda p: Path(p).read_text())


class CliError(NeedsOperator):
    pass
