"""Low-VRAM running of the DiT: transformer blocks streamed from pinned host memory, VAE tiling by budget.

`BlockOffload` moves every block's parameters and buffers into one pinned host buffer per block and
keeps only `slots` (default 2) block-sized device buffers. Before block i runs, its bytes are already
on the device (one H2D copy per block, issued on a side CUDA stream while block i-1 computes); the
block's tensors are re-pointed at that slot (`tensor.data = view`) and block i+1 is prefetched into the
next slot as soon as the block that last used it has finished (CUDA events order the two streams).
At 480P a block computes for ~66 ms while its fp8 bytes (0.43 GiB) cross PCIe in ~17 ms (27 GB/s
measured on an H200), so the copies hide behind compute: the 480P fp8 forward under a 24 GiB cap ran
at 1.00x the resident time with a 4.4 GiB peak (benchmarks/RESULTS.md).

Each block is wrapped in an `OffloadedBlock` (hooks would be traced into a compiled block); the
wrapped `DiTBlock` can still be compiled with `model.runtime.compile.compile_blocks`. Without CUDA (tests) the
same slot logic runs synchronously on the CPU.

`vae_tiling_for` picks spatial VAE tiling when the free device memory is short of what an untiled
decode needs.

`decide_offload` is the `auto` rule of `infinitetalk.offload`: offload when the device is smaller than
what a resident run needs (`MemoryNeed`: DiT weight bytes from `dit_weight_split` + a working set per
token measured on the H200 + the other models + the conditioning-encode memo), never on a CPU; one
`DeviceMemoryError` line when even an offloaded run (the weights outside the blocks + two block slots)
does not fit. Pure functions: testable without a GPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from model.config import DiTConfig
from model.network.tiling import TileSpec

log = logging.getLogger(__name__)

_ALIGN = 256  # byte alignment of every tensor inside a block buffer (fp8 GEMMs want 16)


@dataclass(frozen=True)
class _Entry:
    """One tensor of a block: its owner module and attribute, and where it sits in the block buffer."""

    module: str
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int


def _block_layout(block: nn.Module) -> tuple[list[_Entry], int]:
    entries, offset = [], 0
    tensors = [(n, p) for n, p in block.named_parameters()] + [(n, b) for n, b in block.named_buffers()]
    for full, t in tensors:
        module, _, name = full.rpartition(".")
        nbytes = t.numel() * t.element_size()
        entries.append(_Entry(module, name, tuple(t.shape), t.dtype, offset, nbytes))
        offset += math.ceil(nbytes / _ALIGN) * _ALIGN
    return entries, offset


def _views(buffer: torch.Tensor, entries: list[_Entry]) -> list[torch.Tensor]:
    return [buffer[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape) for e in entries]


class OffloadedBlock(nn.Module):
    """A DiT block whose weights are loaded into a device slot right before it runs."""

    def __init__(self, block: nn.Module, index: int, offload: BlockOffload):
        super().__init__()
        self.block = block
        self.index = index
        self._offload = [offload]  # a list, so nn.Module does not register the manager as a child

    def forward(self, *args, **kwargs):
        manager = self._offload[0]
        manager.before(self.index)
        out = self.block(*args, **kwargs)
        manager.after(self.index)
        return out


class BlockOffload:
    """Stream `model.blocks` from pinned host memory through `slots` device buffers (see module doc).

    Usage: `offload = BlockOffload(model, device="cuda")` after the rest of the model is on the device
    (blocks may be on the device or the host; they end up in pinned host memory and their device
    copies are freed). `prepare(block)` runs on each block right before it is pinned (the fp8
    conversion of a host-built DiT: one block's float weights on the device at a time, never the
    whole DiT). `offload.remove()` puts every block back on the device.
    """

    def __init__(
        self,
        model: nn.Module,
        device: torch.device | str,
        *,
        slots: int = 2,
        prepare: Callable[[nn.Module], None] | None = None,
    ):
        if slots < 2:
            raise ValueError(f"BlockOffload needs at least 2 slots (one computes, one loads), got {slots}")
        blocks = model.blocks
        if len(blocks) < slots:
            raise ValueError(f"BlockOffload: {len(blocks)} blocks but {slots} slots; keep them resident")
        self.model = model
        self.device = torch.device(device)
        self.slots = slots
        cuda = self.device.type == "cuda"
        self._inner = list(blocks)
        self.host: list[torch.Tensor] = []
        self.layouts: list[list[_Entry]] = []  # per block: blocks of a mixed-type GGUF file differ
        for block in self._inner:
            if prepare is not None:  # e.g. fp8 quantization on the device, one block at a time
                prepare(block)
            entries, nbytes = _block_layout(block)
            self.layouts.append(entries)
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
            for view, tensor in zip(_views(buf, entries), self._tensors(block, entries), strict=True):
                view.copy_(tensor.detach())
                tensor.data = view  # frees the original storage now: host peak = model + one block
            self.host.append(buf)
        self.block_bytes = max(buf.numel() for buf in self.host)  # one slot holds any block
        self.device_buffers = [
            torch.empty(self.block_bytes, dtype=torch.uint8, device=self.device) for _ in range(slots)
        ]
        self._slot_views: dict[tuple[int, int], list[torch.Tensor]] = {}  # (slot, block) -> views
        for i in range(len(self._inner)):  # free the original storage: point every block at slot 0 for now
            self._bind(i, 0)
        self.copy_stream = torch.cuda.Stream(self.device) if cuda else None
        self.ready = [torch.cuda.Event() if cuda else None for _ in range(slots)]
        self.free = [torch.cuda.Event() if cuda else None for _ in range(slots)]
        self.slot_block: list[int | None] = [None] * slots  # which block each slot holds
        self._next_slot = 0
        model.blocks = nn.ModuleList(OffloadedBlock(b, i, self) for i, b in enumerate(self._inner))
        log.info(
            "block offload: %d blocks x %.2f GiB in pinned host memory, %d device slots",
            len(self._inner),
            self.block_bytes / 2**30,
            slots,
        )

    # --- tensor plumbing ---

    @staticmethod
    def _tensors(block: nn.Module, entries: list[_Entry]) -> list[torch.Tensor]:
        out = []
        for e in entries:
            owner = block.get_submodule(e.module) if e.module else block
            out.append(getattr(owner, e.name))
        return out

    def _bind(self, index: int, slot: int) -> None:
        views = self._slot_views.get((slot, index))
        if views is None:
            views = _views(self.device_buffers[slot], self.layouts[index])
            self._slot_views[(slot, index)] = views
        for tensor, view in zip(self._tensors(self._inner[index], self.layouts[index]), views, strict=True):
            tensor.data = view

    # --- scheduling ---

    def _load(self, index: int, avoid: int | None) -> int:
        """Make sure block `index` is (being) copied into a slot; returns the slot."""
        if index in self.slot_block:
            return self.slot_block.index(index)
        slot = self._next_slot if self._next_slot != avoid else (self._next_slot + 1) % self.slots
        self._next_slot = (slot + 1) % self.slots
        if self.copy_stream is None:
            self.device_buffers[slot][: self.host[index].numel()].copy_(self.host[index])
        else:
            with torch.cuda.stream(self.copy_stream):
                self.copy_stream.wait_event(self.free[slot])  # the slot's last user has finished
                host = self.host[index]
                self.device_buffers[slot][: host.numel()].copy_(host, non_blocking=True)
                self.ready[slot].record(self.copy_stream)
        self.slot_block[slot] = index
        return slot

    def before(self, index: int) -> None:
        """Called right before block `index` runs: wait for its bytes, bind it, prefetch the next one."""
        slot = self._load(index, avoid=None)
        if self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])
        self._bind(index, slot)
        self._current = slot
        self._load((index + 1) % len(self._inner), avoid=slot)  # wraps to block 0 for the next call

    def after(self, index: int) -> None:
        """Called right after block `index` was enqueued: its slot is free once that work is done."""
        if self.copy_stream is not None:
            self.free[self._current].record(torch.cuda.current_stream(self.device))

    def device_bytes(self) -> int:
        """Device memory held for block weights (all slots)."""
        return self.slots * self.block_bytes

    def remove(self) -> None:
        """Copy every block back into its own device tensors and unwrap the blocks."""
        if self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        for block, host, entries in zip(self._inner, self.host, self.layouts, strict=True):
            for tensor, view in zip(self._tensors(block, entries), _views(host, entries), strict=True):
                tensor.data = view.to(self.device, copy=True)
        self.model.blocks = nn.ModuleList(self._inner)
        self.host.clear()
        self.device_buffers.clear()
        self._slot_views.clear()


# ---------------------------------------------------------------------------------------------
# VAE tiling from free memory
# ---------------------------------------------------------------------------------------------

# Peak device bytes of an untiled Wan-VAE decode per output pixel of one frame, by VAE dtype (the
# decoder works on one latent frame = 4 video frames at a time, so the peak scales with H*W only).
# Measured with benchmarks/bench_speed.py on an H200 (480P, 81 frames); see benchmarks/RESULTS.md.
VAE_DECODE_BYTES_PER_PIXEL = {torch.float32: 23_000, torch.bfloat16: 12_000}


def indexed_device(device: torch.device | str, current: int | None = None) -> torch.device:
    """`device` with its index: a bare `cuda` is the current CUDA device (`current`, default
    `torch.cuda.current_device()`); torch's per-process memory fraction refuses unindexed devices."""
    device = torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device() if current is None else current)


def free_device_memory(device: torch.device | str) -> int:
    """Bytes a new allocation can still get on `device`: free driver memory + the allocator's cached
    blocks, capped by `torch.cuda.set_per_process_memory_fraction`."""
    device = indexed_device(device)
    free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device)
    allocated = torch.cuda.memory_allocated(device)
    available = free + reserved - allocated
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if fraction is not None:
        available = min(available, int(fraction(device) * total) - allocated)
    return max(available, 0)


def vae_tiling_for(
    height: int,
    width: int,
    free_bytes: int,
    *,
    dtype: torch.dtype = torch.float32,
    headroom: float = 0.8,
    overlap: int = 64,
) -> TileSpec | None:
    """Tiling for decoding (height x width)-pixel frames within `free_bytes`; None when untiled fits.

    The tile is the largest multiple of 64 px whose estimated peak fits in `headroom * free_bytes`;
    neighbouring tiles overlap by `overlap` px (blended).
    """
    per_pixel = VAE_DECODE_BYTES_PER_PIXEL.get(dtype, VAE_DECODE_BYTES_PER_PIXEL[torch.float32])
    budget = headroom * free_bytes
    if height * width * per_pixel <= budget:
        return None
    side = int(math.sqrt(budget / per_pixel)) // 64 * 64
    if side <= overlap:
        raise MemoryError(
            f"VAE decode of {height}x{width} needs tiles smaller than {overlap + 64}px to fit "
            f"{free_bytes / 2**30:.2f} GiB free"
        )
    side = min(side, max(height, width))
    return TileSpec(tile=side, stride=side - overlap)


# ---------------------------------------------------------------------------------------------
# When to offload: what a resident run needs against what the device has
# ---------------------------------------------------------------------------------------------

# Device bytes per DiT token above the weights (activations, attention workspaces, allocator slack) of
# one DiT call, from the peaks in benchmarks/RESULTS.md (H200, one speaker; 480P = 32,760 tokens, 720P =
# 75,600; weights from `dit_weight_bytes` of the 14B preset: 35.2 GiB bf16, 17.9 GiB with fp8 blocks):
#   compiled: bf16 37.8 - 35.2 = 2.6 GiB (85 kB/token), 720P 41.0 - 35.2 = 5.8 (82 kB);
#             fp8 20.9 - 17.9 = 3.0 (98 kB), 720P 25.4 - 17.9 = 7.5 (106 kB)        -> 110 kB
#   eager:    bf16 40.5 - 35.2 = 5.3 (174 kB), 720P 47.3 - 35.2 = 12.1 (172 kB)      -> 180 kB
#             fp8 27.4 - 17.9 = 9.5 (311 kB; the activation quantization is unfused) -> 320 kB
# Batched guidance branches multiply it by the batch: 3-call batched compiled bf16 42.7 - 35.2 = 7.5 GiB
# (246 kB/token), fp8 27.3 - 17.9 = 9.4 GiB (308 kB/token), both within 3 x 110 kB.
WORKING_BYTES_PER_TOKEN = {"compiled": 110_000, "eager": 180_000, "eager_fp8": 320_000}
GUIDANCE_BRANCHES = 3  # cond + text-null + audio-null: the batch of `batch_branches`
# The other components resident on the device next to the DiT: Wan VAE fp32 (127 M params, 0.51 GB)
# + CLIP ViT-H/14 visual tower fp16 (632 M, 1.26 GB) + wav2vec2-base fp32 (95 M, 0.38 GB).
OTHER_MODELS_BYTES = 2_150_000_000
T5_BYTES = 11_400_000_000  # umT5-XXL encoder in bf16 (5.7 B params), when it is not kept on the CPU
RESERVE_BYTES = 2**30  # CUDA context, cuBLAS/cuDNN workspaces, allocator fragmentation


# The conditioning-encode memo (`model.network.vae.ZeroTailMemo`, held on the VAE's device for a whole shot):
# 1.48 GiB in float32 / 0.74 GiB in bfloat16 for an 81-frame 896x448 clip (benchmarks/RESULTS.md, the
# smoke's `vae` run), i.e. bytes per pixel and frame of the conditioning clip by VAE dtype.
MEMO_BYTES_PER_PIXEL_FRAME = {torch.float32: 49, torch.bfloat16: 25}


def memo_bytes(height: int, width: int, frames: int, vae_dtype: torch.dtype) -> int:
    """Device bytes of one shot's conditioning-encode memo at (height x width) and `frames` frames."""
    per = MEMO_BYTES_PER_PIXEL_FRAME.get(vae_dtype, MEMO_BYTES_PER_PIXEL_FRAME[torch.float32])
    return height * width * frames * per


def _meta_dit_sizes(
    config: DiTConfig,
    dtype: torch.dtype,
    *,
    fp8_blocks: bool,
    quantized: bool,
    gguf_bytes: float | None = None,
) -> tuple[nn.Module, Callable[[torch.Tensor], int]]:
    """A meta-device DiT and the device bytes of each of its tensors: floats at `dtype`; 1 byte per
    weight (+ a float32 scale per output row) for the block Linears with `fp8_blocks`, or for every
    Linear of a quantized DiT; `gguf_bytes` per weight (block scales included) for a GGUF one's."""
    from model.network.dit import InfiniteTalkDiT  # keep `import model.runtime.offload` light

    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    one_byte = {
        id(m.weight)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and (quantized or (fp8_blocks and name.startswith("blocks.")))
    }

    def nbytes(p: torch.Tensor) -> int:
        if id(p) in one_byte:
            return p.numel() + 4 * p.shape[0] if gguf_bytes is None else math.ceil(p.numel() * gguf_bytes)
        return p.numel() * (dtype.itemsize if p.is_floating_point() else p.element_size())

    return model, nbytes


def dit_weight_bytes(config: DiTConfig, dtype: torch.dtype, *, fp8_blocks: bool, quantized: bool) -> int:
    """Device bytes of the whole DiT's weights (see `_meta_dit_sizes`)."""
    model, nbytes = _meta_dit_sizes(config, dtype, fp8_blocks=fp8_blocks, quantized=quantized)
    return sum(nbytes(p) for p in [*model.parameters(), *model.buffers()])


def dit_weight_split(
    config: DiTConfig,
    dtype: torch.dtype,
    *,
    fp8_blocks: bool,
    quantized: bool,
    gguf_bytes: float | None = None,
) -> tuple[int, int]:
    """(bytes of the DiT's weights outside its blocks, bytes of one block as `BlockOffload` lays it out)."""
    model, nbytes = _meta_dit_sizes(
        config, dtype, fp8_blocks=fp8_blocks, quantized=quantized, gguf_bytes=gguf_bytes
    )
    tensors = [*model.named_parameters(), *model.named_buffers()]
    rest = sum(nbytes(p) for n, p in tensors if not n.startswith("blocks."))
    block = model.blocks[0]
    one = sum(math.ceil(nbytes(p) / _ALIGN) * _ALIGN for p in [*block.parameters(), *block.buffers()])
    return rest, one


def working_bytes_per_token(*, fp8_blocks: bool, compiled: bool, batched: bool) -> int:
    """Device bytes per token of one DiT call above its weights (measured; see the table above)."""
    base = WORKING_BYTES_PER_TOKEN["compiled" if compiled else "eager_fp8" if fp8_blocks else "eager"]
    return base * (GUIDANCE_BRANCHES if batched else 1)


def resident_need(
    dit_bytes: int, tokens: int, *, per_token: int, other_bytes: int = OTHER_MODELS_BYTES
) -> int:
    """Device bytes a resident run needs: DiT weights + working set of `tokens` + other models + reserve."""
    return dit_bytes + tokens * per_token + other_bytes + RESERVE_BYTES


@dataclass(frozen=True)
class MemoryNeed:
    """Device bytes of a run, piece by piece: the DiT's weights resident and with block offload (the
    weights outside the blocks + `slots` block buffers), the DiT call's working set, and everything else
    resident next to it (VAE, CLIP, wav2vec2, umT5 unless on the CPU, the conditioning-encode memo)."""

    dit_resident: int
    dit_offloaded: int
    working: int
    other: int

    @property
    def resident(self) -> int:
        return self.dit_resident + self.working + self.other + RESERVE_BYTES

    @property
    def offloaded(self) -> int:
        return self.dit_offloaded + self.working + self.other + RESERVE_BYTES

    def describe(self, offloaded: bool) -> str:
        gib = 2**30
        dit = self.dit_offloaded if offloaded else self.dit_resident
        return (
            f"DiT weights {dit / gib:.1f} + working set {self.working / gib:.1f} + other models and memo "
            f"{self.other / gib:.1f} + reserve {RESERVE_BYTES / gib:.1f} GiB"
        )


class DeviceMemoryError(RuntimeError):
    """The device's usable memory is below what even an offloaded run needs (raised before loading)."""


@dataclass(frozen=True)
class OffloadDecision:
    """Whether the DiT blocks are offloaded, and a one-line why (with the numbers)."""

    offload: bool
    reason: str


def decide_offload(
    setting: str | bool,
    *,
    device_type: str,
    limit_bytes: int | None,
    need_bytes: int,
    offload_bytes: int | None = None,
    device: str = "",
    detail: str = "",
) -> OffloadDecision:
    """`infinitetalk.offload` -> a decision. `auto`: offload on a CUDA device whose usable memory
    (`limit_bytes`, see `device_memory_limit`) is below `need_bytes` (resident); never on a CPU.
    With `offload_bytes` (what an offloaded run needs) and a known limit, `auto` and `true` raise one
    `DeviceMemoryError` line when even that does not fit (`detail`: the pieces, for the message)."""
    gib = 2**30
    if setting not in ("auto", True, False):
        raise ValueError(f"offload must be auto, true or false, got {setting!r}")
    if (
        setting is not False
        and device_type == "cuda"
        and limit_bytes is not None
        and offload_bytes is not None
        and limit_bytes < offload_bytes
    ):
        raise DeviceMemoryError(
            f"{device or device_type}: {limit_bytes / gib:.1f} GiB usable is too small for any mode: even "
            f"with the DiT blocks streamed from host memory a run needs ~{offload_bytes / gib:.1f} GiB"
            + (f" ({detail})" if detail else "")
            + "; keep umT5 on the CPU (t5_cpu), use fp8 or a quantized DiT, or a larger device / cap"
        )
    if setting is True or setting is False:
        return OffloadDecision(setting, f"forced by offload: {str(setting).lower()}")
    if device_type != "cuda" or limit_bytes is None:
        return OffloadDecision(False, f"auto: {device_type} run, the DiT stays where it is")
    numbers = f"device {limit_bytes / gib:.1f} GiB, a resident run needs ~{need_bytes / gib:.1f} GiB"
    if limit_bytes < need_bytes:
        return OffloadDecision(True, f"auto: {numbers} -> blocks streamed from pinned host memory")
    return OffloadDecision(False, f"auto: {numbers} -> resident")


def device_memory_limit(device: torch.device | str) -> int:
    """Total bytes this process may use on a CUDA `device` (the card's memory, capped by
    `torch.cuda.set_per_process_memory_fraction`)."""
    device = indexed_device(device)
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return int(fraction(device) * total) if fraction is not None else total
