"""Where arrays live: data parallelism over every device of every process, batches split and the
state replicated.

With several processes each one builds only its own rows of a global batch (`rows`), and `put`
joins them into one global array; one process holds every row, so the same code serves both.
"""

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.errors import UserError


@dataclasses.dataclass(frozen=True)
class DataParallel:
    batch: NamedSharding  # first axis split over every device
    replicated: NamedSharding

    def rows(self, batch_size: int) -> slice:
        """The rows of a global batch that this process's devices hold (contiguous: the mesh
        lists each process's devices together)."""
        spans = self.batch.addressable_devices_indices_map((batch_size,)).values()
        starts, stops = zip(*(s[0].indices(batch_size)[:2] for s in spans), strict=True)
        return slice(min(starts), max(stops))

    def put(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Where a batch goes: this process's rows of it, joined with the other processes' into
        global arrays split along the first axis."""
        return {
            k: jax.make_array_from_process_local_data(self.batch, v) for k, v in local_batch.items()
        }


def data_parallel(data: Any) -> DataParallel:
    """Batch and replicated shardings over every device for config.data, whose batch sizes must
    divide by the device count."""
    n = jax.device_count()
    for name in ("batch_size", "eval_batch_size"):
        if data[name] % n:
            raise UserError(
                f"config.data.{name}={data[name]} is not divisible by the {n} devices; "
                f"use a multiple of {n}"
            )
    # Sorted by process, so that each process's rows of a batch are one contiguous block.
    ordered = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(ordered), ("data",))
    return DataParallel(
        NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    )


def fetch(x: jax.Array) -> np.ndarray:
    """A global array, whole, on the host of every process."""
    return multihost_utils.process_allgather(x, tiled=True)


def replicate(tree: Any, dp: DataParallel) -> Any:
    """`tree`, which every process computed alike, on every device of every process."""
    return jax.device_put(tree, dp.replicated)
