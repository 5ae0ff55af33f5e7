"""Compiled programs kept between runs: JAX's persistent compilation cache, switched on for every
command, so that a second train, evaluate or predict of the same shapes reads each program back
from disk instead of compiling it again (a fine-tuned encoder's train step takes seconds to tens
of seconds per batch shape on a CPU).

The cache lives in the user's cache directory, $XDG_CACHE_HOME/attn/jax (~/.cache/attn/jax
without XDG_CACHE_HOME); JAX's own variables override it: JAX_COMPILATION_CACHE_DIR=DIR puts it
elsewhere, JAX_ENABLE_COMPILATION_CACHE=false turns it off. Programs that compile in under
JAX's threshold (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, 1 s by default) are not kept: they
cost about as much to read back.
"""

import os

import jax


def default_directory() -> str:
    """$XDG_CACHE_HOME/attn/jax, or ~/.cache/attn/jax."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "attn", "jax")


def directory() -> str | None:
    """Where compiled programs are kept: JAX_COMPILATION_CACHE_DIR's directory, else
    `default_directory()`; None when JAX_ENABLE_COMPILATION_CACHE turns the cache off."""
    if not jax.config.jax_enable_compilation_cache:
        return None
    return jax.config.jax_compilation_cache_dir or default_directory()


def enable() -> None:
    """Points JAX's persistent cache at `directory()`. Call it before anything compiles: JAX
    reads the setting when it first needs the cache."""
    path = directory()
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", path)


def help_text() -> str:
    """A paragraph for a command's --help: where its compiled programs are kept."""
    path = directory()
    where = f"in {path}" if path else "nowhere: JAX_ENABLE_COMPILATION_CACHE turns the cache off"
    return (
        f"\nCompiled programs are kept between runs {where} ($XDG_CACHE_HOME/attn/jax or "
        "~/.cache/attn/jax by default; JAX_COMPILATION_CACHE_DIR=DIR puts them elsewhere, "
        "JAX_ENABLE_COMPILATION_CACHE=false turns the cache off).\n"
    )
