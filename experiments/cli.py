"""Command-line plumbing for the entry points: flags, config files and one-line errors.

An entry point defines its flags with `define_flags(fv)`, does its work in `main(fv, argv)`, and
ends with `cli.main(define_flags, main)`. `run` does the same in this process, on fresh flags:
what a command line prints and returns, without starting Python again.
"""

import contextlib
import importlib.util
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from experiments import compile_cache, fields, parallel, workdirs
from experiments.errors import UserError
from experiments.training import loop

Define = Callable[[flags.FlagValues], None]
Main = Callable[[flags.FlagValues, list[str]], int | None]
INTERRUPTED = 130  # the shell's status for Ctrl-C
BROKEN_PIPE = 141  # ... and for a reader of stdout that went away (`| head`)


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


def parse(fv: flags.FlagValues, argv: Sequence[str]) -> list[str]:
    """absl flag parsing into `fv`; every mistake becomes a one-line UserError."""
    try:
        rest = fv(argv)
        _check_config_loaded(fv)
        return rest
    except flags.Error as e:
        raise UserError(_one_line(str(e))) from None
    except UserError:
        raise
    except Exception as e:  # ml_collections: an override of a field that does not exist
        raise UserError(_unknown_override(argv[1:], e)) from None


def run(define_flags: Define, entry: Main, argv: Sequence[str]) -> int:
    """Runs an entry point on `argv` in this process, with fresh flags; returns the exit status."""
    fv = flags.FlagValues()
    define_flags(fv)

    def parse_and_run() -> int | None:
        saved, sys.argv = sys.argv, list(argv)  # config_flags reads overrides from sys.argv
        try:
            rest = parse(fv, argv)
        finally:
            sys.argv = saved
        return entry(fv, rest)

    return _reported(parse_and_run)


def main(define_flags: Define, entry: Main) -> None:
    """An entry point's `__main__`: absl's app.run (help flags, logging) with one-line errors,
    and compiled programs kept between runs (`compile_cache`)."""
    define_key_flags(define_flags, flags.FLAGS, sys.argv[0])  # absl's name for __main__
    compile_cache.enable()
    # absl's --help prints the main module's docstring: every command's ends with where its
    # compiled programs are kept.
    command = sys.modules["__main__"]
    command.__doc__ = (command.__doc__ or "") + compile_cache.help_text()
    rest: list[list[str]] = []

    def parse_or_exit(argv: list[str]) -> list[str]:
        status = _reported(lambda: rest.append(parse(flags.FLAGS, argv)))
        if status:
            sys.exit(status)
        return rest[0]

    def run_entry(argv: list[str]) -> int:
        status = _reported(lambda: entry(flags.FLAGS, argv))
        if status == BROKEN_PIPE:  # stdout cannot be flushed: skipping that is ending quietly
            sys.stderr.flush()
            os._exit(status)
        return status

    signal.signal(signal.SIGINT, _exit_interrupted)
    app.run(run_entry, flags_parser=parse_or_exit)


def define_key_flags(define_flags: Define, fv: flags.FlagValues, module: str) -> None:
    """`define_flags(fv)`, with every flag it defines a key flag of `module`: --help lists only
    the main module's key flags, which left out those defined here and in `parallel` (train's
    --config and --workdir)."""
    before = set(fv)
    define_flags(fv)
    for name in sorted(set(fv) - before):
        fv.register_key_flag_for_module(module, fv[name])


def define_convert_flag(fv: flags.FlagValues) -> None:
    """--convert, of the commands that serve a trained run (predict, evaluate, visualize):
    `serving.converting`."""
    flags.DEFINE_string(
        "convert",
        None,
        "Convert every text by this OpenCC conversion before the model reads it, e.g. t2s for "
        "traditional Chinese given to a model trained on simplified; default: the run's "
        "data.convert; '' converts nothing.",
        flag_values=fv,
    )


def define_run_flags(fv: flags.FlagValues) -> None:
    """The flags of a command that trains in a workdir (train, pretrain)."""
    config_flags.DEFINE_config_file(
        "config", None, "Path to a config file[:variant].", flag_values=fv
    )
    flags.DEFINE_string(
        "workdir", None, "Directory for checkpoints, vocabulary and metrics.", flag_values=fv
    )
    parallel.define_flags(fv)


def run_in_workdir(
    fv: flags.FlagValues, work: Callable[[ml_collections.ConfigDict, str], Any]
) -> Any:
    """What train and pretrain do with their flags: join the other processes, run
    `work(config, workdir)` with Ctrl-C saying where a rerun resumes, and remove a workdir the run
    created when it is refused. Returns work's result on process 0, None on the others."""
    config, workdir = fv.config, fv.workdir
    if config is None or not workdir:
        raise UserError("both --config=configs/<name>.py and --workdir=DIR are required")
    fields.check_overrides(config, config_flags.get_override_values(fv["config"]))
    parallel.initialize_from_flags(fv)
    fresh = not os.path.exists(workdir)
    with interrupt_detail(lambda: loop.resume_hint(workdir)):
        try:
            result = work(config, workdir)
        except UserError:
            if fresh and parallel.is_primary():  # a refused run leaves no empty workdir
                workdirs.remove_if_unused(workdir)
            raise
    return result if parallel.is_primary() else None


_interrupt_details: list[Callable[[], str]] = []


@contextlib.contextmanager
def interrupt_detail(detail: Callable[[], str]) -> Iterator[None]:
    """While inside, Ctrl-C says `interrupted; <detail()>`, e.g. where to resume from."""
    _interrupt_details.append(detail)
    try:
        yield
    finally:
        _interrupt_details.remove(detail)


def _exit_interrupted(signum: int, frame: object) -> None:
    """Ctrl-C ends the process here, with no KeyboardInterrupt unwinding the stack. A
    KeyboardInterrupt during a compile stops jax's wait for it but not XLA's compiler thread,
    which then used what the unwinding freed, or the interpreter's teardown, and segfaulted.
    Ending at once is as safe as SIGKILL, which training survives anywhere (atomic saves)."""
    detail = _interrupt_details[-1]() if _interrupt_details else ""
    text = f"interrupted; {detail}" if detail else "interrupted"
    print(f"\n{text}", file=sys.stderr, flush=True)  # below a progress bar, if one is drawn
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    os._exit(INTERRUPTED)


def _reported(fn: Callable[[], int | None]) -> int:
    """Runs `fn`; a UserError, an OSError or Ctrl-C becomes one stderr line and an exit status."""
    # Orbax and TFDS log every file they touch at INFO; users want the bar and the results.
    logging.set_verbosity(logging.WARNING)
    try:
        return fn() or 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout's reader stopped reading: end quietly, as Unix tools do
        return BROKEN_PIPE
    except OSError as e:  # a read-only or full disk: the machine's state, not a bug to trace
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C in a notebook or in-process run (`main` exits at once)
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


def _one_line(message: str) -> str:
    """The first line, plus the last when the message embeds a traceback (that names the cause)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    return f"{lines[0]} {lines[-1]}" if "Traceback" in message else lines[0]


def _check_config_loaded(fv: flags.FlagValues) -> None:
    """config_flags defers a failed load (e.g. a missing file) to the config's first use."""
    if "config" not in fv or fv["config"].value is None:
        return
    try:
        fv["config"].value.keys()
    except OSError as e:
        cause = str(e).strip().splitlines()[-1].strip()
        raise UserError(f"cannot load --config={fv['config'].config_filename}: {cause}") from None


def _unknown_override(argv: Sequence[str], error: Exception) -> str:
    """Names the `--config.a.b=v` override whose field does not exist. ml_collections' own
    "Did you mean" says what to write when a field is close; otherwise this lists the valid ones."""
    while error.args and isinstance(error.args[0], BaseException):  # AttributeError(KeyError(..))
        error = error.args[0]
    lines = str(error.args[0] if error.args else error).splitlines()
    suggestion = next((line for line in lines if line.startswith("Did you mean")), None)
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    config = load_config_file(spec) if spec else None
    for arg in argv if config is not None else ():
        if not arg.startswith("--config."):
            continue
        keys = arg[len("--config.") :].split("=", 1)[0].split(".")
        node = config
        for depth, key in enumerate(keys):
            if not isinstance(node, ml_collections.ConfigDict) or key not in node:
                field = ".".join(keys)
                if suggestion:
                    return f"unknown config field {field!r}: {suggestion}"
                where = ".".join(["config", *keys[:depth]])
                valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "(none)"
                return f"unknown config field {field!r}: {where} has {valid}"
            node = node[key]
    return f"bad flags: {lines[0] if lines else type(error).__name__}"
