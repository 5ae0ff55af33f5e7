"""Where arrays live: data parallelism over every device, batches split and the state replicated."""

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.cli import UserError


def data_parallel(data: Any) -> tuple[NamedSharding, NamedSharding]:
    """(batch sharding: first axis split over every device, replicated sharding) for config.data,
    whose batch sizes must divide by the device count."""
    n = jax.device_count()
    for name in ("batch_size", "eval_batch_size"):
        if data[name] % n:
            raise UserError(
                f"config.data.{name}={data[name]} is not divisible by the {n} devices; "
                f"use a multiple of {n}"
            )
    mesh = Mesh(np.array(jax.devices()), ("data",))
    return NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())


def put_batch(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Where a batch goes: split along its first axis over the devices of `sharding`.

    The one place to change for several processes: each would pass only its own rows and build
    the global arrays with `jax.make_array_from_process_local_data`.
    """
    return jax.device_put(batch, sharding)
