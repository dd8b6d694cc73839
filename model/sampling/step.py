"""Which sampling step the model calls in progress belong to: the sampler marks each step, the DiT reads it.

The DiT's per-step choices (frame-window self-attention after the first dense steps,
`model.network.sparse_attention`) need the step of the chunk's loop; the sampler's model contract stays as it
is (no extra argument), so the step travels in a context variable around the step's calls.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_STEP: contextvars.ContextVar[int | None] = contextvars.ContextVar("dubflow_sampling_step", default=None)


@contextlib.contextmanager
def sampling_step(index: int) -> Iterator[None]:
    """Mark the model calls inside as the chunk's `index`-th sampling step run (0 = the first)."""
    token = _STEP.set(index)
    try:
        yield
    finally:
        _STEP.reset(token)


def current_step() -> int | None:
    """The sampling step of the calls in progress (None outside a sampler's step: a direct call)."""
    return _STEP.get()
