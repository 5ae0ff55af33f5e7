"""XLA compiler options for the batched forward pass (`classify.eval_step`: evaluate, predict
--path, validation during training).

On CPU, jaxlib's newer XLA hands dots and the fusions around them to YNNPACK kernels. For a
forward pass at serving sizes, XLA's own emitters and Eigen's matmul are faster on the CPUs this
was measured on (benchmarks/analysis.md, section 9): all-MiniLM-L6-v2 at 64 x 128 took 0.74-0.76
of the time (0.93 of ONNX Runtime's), a two-layer d=128 model at 64 x 256 0.68, the default's d=64
model at 64 x 128 1.03. The training step keeps XLA's defaults: there the switch gained nothing.
"""

import functools

import jax

# An empty list of YNNPACK fusion types: none.
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def forward() -> dict:
    """The options for a forward-only program on the default backend: none off CPU, and none where
    this jaxlib's XLA has no YNNPACK fusions to switch off (jaxlib 0.7.2 has none, and refuses the
    option's name)."""
    if jax.default_backend() != "cpu":
        return {}
    try:
        jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options=NO_YNN)
    except Exception:  # XLA's error for an option it does not know differs across jaxlibs
        return {}
    return dict(NO_YNN)
