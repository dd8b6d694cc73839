"""Regional `torch.compile` of the DiT: compile the repeated transformer block, not the whole model.

All 40 blocks share one code object and identical parameter shapes, so dynamo traces the block once
and every block reuses that graph (parameters are graph inputs). What inductor gains there is the
fusion of the float32 elementwise work around the matmuls: LayerNorm + modulation, RMS qk-norm +
RoPE, gated residuals, GELU, and the fp8 activation quantization of `model.weights.fp8.Fp8Linear`.

Shapes: `dynamic=True` makes token count, frames and batch symbolic, so chunks of another length or
resolution do not recompile. Dynamo still specialises size-1 dimensions, so a batch of 1 and a
batch of 2-3 (batched guidance branches) are two graphs; one- and two-speaker calls are two more.
Those are all the graphs a run meets; `compiled_graph_count` lets tests check that nothing else
recompiles after warm-up.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from model.network.dit_blocks import DiTBlock

log = logging.getLogger(__name__)


def compile_blocks(
    model: nn.Module,
    *,
    backend: str = "inductor",
    mode: str | None = None,
    dynamic: bool | None = True,
    fullgraph: bool = True,
) -> nn.Module:
    """Compile every `DiTBlock` of `model` in place (also blocks wrapped by `model.runtime.offload`).

    The surrounding forward (embeddings, audio projection, head, TeaCache decisions, offload
    bookkeeping) stays eager. Returns the model.
    """
    blocks = [m for m in model.modules() if isinstance(m, DiTBlock)]
    if not blocks:
        raise ValueError("compile_blocks: the model has no DiTBlock")
    for block in blocks:
        block.compile(backend=backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph)
    log.info("compiled %d DiT blocks (backend %s, mode %s, dynamic %s)", len(blocks), backend, mode, dynamic)
    return model


def compiled_graph_count() -> int:
    """Graphs dynamo has compiled in this process so far (a recompile adds one)."""
    from torch._dynamo.utils import counters  # private module, import late

    return int(counters["stats"]["unique_graphs"])


def reset_compiled() -> None:
    """Forget every compiled graph (tests, or before re-compiling with other settings)."""
    torch._dynamo.reset()
