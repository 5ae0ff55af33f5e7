"""A family config's fields: the checks its __post_init__ runs on them, each refusing a bad value
in one line that names the field ("bert.Config.d_model must be an integer >= 1; got 0"), and
their config.json keys, read (`config_from`) and written back (`config_keys`).

A family's key table maps each field to (its config.json key, the default when the key is absent;
None: required), as transformers' config class names and defaults them.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from attn.encoders.hub import CheckpointError

__all__ = [
    "Keys",
    "built",
    "choice",
    "config_from",
    "config_keys",
    "divisible",
    "flag",
    "integer",
    "real",
]

Keys = Mapping[str, tuple[str, Any]]  # field -> (config.json key, default; None = required)


def _name(cfg: Any, field: str) -> str:
    """ "bert.Config.d_model": the family's subpackage, the class and the field."""
    return f"{type(cfg).__module__.split('.')[-2]}.{type(cfg).__name__}.{field}"


def integer(cfg: Any, field: str, lo: int | None = None) -> None:
    """An integer field (>= lo, when given), stored as int; a bool is refused."""
    v = getattr(cfg, field)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or (lo is not None and v < lo):
        at_least = f" >= {lo}" if lo is not None else ""
        raise ValueError(f"{_name(cfg, field)} must be an integer{at_least}; got {v!r}")
    object.__setattr__(cfg, field, int(v))


def real(cfg: Any, field: str, lo: float, hi: float, *, closed: bool = True) -> None:
    """A float field in [lo, hi) (closed) or (lo, hi), stored as float; a bool is refused."""
    v = getattr(cfg, field)
    inside = isinstance(v, numbers.Real) and (lo <= v < hi if closed else lo < v < hi)
    if isinstance(v, bool) or not inside:
        low = "[" if closed else "("
        raise ValueError(f"{_name(cfg, field)} must be a float in {low}{lo}, {hi}); got {v!r}")
    object.__setattr__(cfg, field, float(v))


def flag(cfg: Any, field: str) -> None:
    """A bool field."""
    v = getattr(cfg, field)
    if not isinstance(v, bool):
        raise ValueError(f"{_name(cfg, field)} must be a bool; got {v!r}")


def choice(cfg: Any, field: str, options: Iterable[Any]) -> None:
    """A field that is one of `options` (named in the message as given)."""
    v = getattr(cfg, field)
    if v not in options:
        raise ValueError(f"{_name(cfg, field)} must be one of {options}; got {v!r}")


def divisible(cfg: Any, field: str, by: str) -> None:
    """Field `field` a multiple of field `by` (the model width, of the number of heads)."""
    if getattr(cfg, field) % getattr(cfg, by):
        raise ValueError(
            f"{_name(cfg, field)}={getattr(cfg, field)} must be divisible by "
            f"{_name(cfg, by)}={getattr(cfg, by)}"
        )


def config_from(hf: Mapping[str, Any], keys: Keys, where: str, faults: list[str]) -> dict:
    """The fields `keys` names, read from config.json `hf` (the default where a key is absent);
    CheckpointError in one line naming `faults` (the options the family found it does not
    compute) and every required key that is missing."""
    missing = [key for key, default in keys.values() if default is None and key not in hf]
    if missing:
        faults = [*faults, f"no {', '.join(missing)}"]
    if faults:
        raise CheckpointError(f"{where}: config.json is not supported: {'; '.join(faults)}")
    return {field: hf.get(key, default) for field, (key, default) in keys.items()}


def built(config: type, where: str, **fields: Any) -> Any:
    """config(**fields); its own refusal (a field's check) as a CheckpointError of `where`."""
    try:
        return config(**fields)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: config.json is not supported: {e}") from None


def config_keys(cfg: Any, keys: Keys) -> dict:
    """config.json's keys of a config's fields: `config_from` backwards."""
    return {key: getattr(cfg, field) for field, (key, _) in keys.items()}
