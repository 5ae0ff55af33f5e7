"""Command-line plumbing for the entry points: flag parsing that reports mistakes in one line."""

import importlib.util
import os
import sys
from collections.abc import Callable, Sequence

import ml_collections
from absl import app, flags, logging

from experiments.errors import UserError, run_cli


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Loads `path.py[:arg]` the way `config_flags` does, for use outside flag parsing."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise UserError(f"config file {path!r} not found; pass e.g. --config=configs/default.py")
    module_spec = importlib.util.spec_from_file_location("_attn_config", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        return module.get_config(arg or None)
    except Exception as e:  # a broken or unknown config is the user's to fix
        raise UserError(f"cannot load config {spec!r}: {e}") from None


def _explain_override(argv: Sequence[str]) -> str | None:
    """Names the first `--config.a.b=v` override whose key does not exist, with the valid keys."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if spec is None:
        return None
    config = load_config_file(spec)
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        keys = arg[len("--config.") :].split("=", 1)[0].split(".")
        node = config
        for depth, key in enumerate(keys):
            if not isinstance(node, ml_collections.ConfigDict) or key not in node:
                where = ".".join(["config", *keys[:depth]])
                valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "(none)"
                return f"unknown config field {'.'.join(keys)!r}: {where} has {valid}"
            node = node[key]
    return None


def _one_line(message: str) -> str:
    """The first line, plus the last when the message embeds a traceback (that names the cause)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    return f"{lines[0]} {lines[-1]}" if "Traceback" in message else lines[0]


def _check_config_loaded() -> None:
    """config_flags defers a failed load (e.g. a missing file) to the config's first use."""
    if "config" not in flags.FLAGS or flags.FLAGS["config"].value is None:
        return
    flag = flags.FLAGS["config"]
    try:
        flag.value.keys()
    except OSError as e:
        cause = str(e).strip().splitlines()[-1].strip()
        raise UserError(f"cannot load --config={flag.config_filename}: {cause}") from None


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl flag parsing, with every parse error turned into a one-line UserError."""
    try:
        rest = flags.FLAGS(argv)
        _check_config_loaded()
        return rest
    except flags.Error as e:
        raise UserError(_one_line(str(e))) from None
    except UserError:
        raise
    except Exception as e:
        explained = _explain_override(argv[1:])
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(explained or f"bad flags: {first}") from None


def main(fn: Callable[[list[str]], object]) -> None:
    """Runs `fn(argv)` under absl with one-line errors for flags, configs and user input."""

    def parse(argv: list[str]) -> list[str]:
        try:
            return parse_flags(argv)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    def run(argv: list[str]) -> None:
        # Orbax and TFDS log every file they touch at INFO; users want the bar and the results.
        logging.set_verbosity(logging.WARNING)
        run_cli(lambda: fn(argv))

    app.run(run, flags_parser=parse)
