"""fp8 (e4m3) matmuls for the DiT's linear layers on Hopper (sm_89+), with a CPU emulation path.

`Fp8Linear` keeps the weight as float8_e4m3fn with one float32 scale per output channel and quantizes
its input per row (token) on the fly: scale_row = max|x_row| / 448, x_q = x / scale_row. The product
runs through `torch._scaled_mm` (fp8 tensor cores, ~1.7x the bf16 GEMM rate on an H200) with both
scales applied in its epilogue. The activation quantization is plain torch ops, so when the block is
compiled (`model.runtime.compile.compile_blocks`) inductor fuses it into the op that produces the activation
(LayerNorm + modulation, GELU, attention output); eager, it is a separate pass that costs about as
much as the fp8 GEMM saves.

Without fp8 matmul support (CPU, pre-Ada GPUs, float32 runs) the same quantized values go through
"dequantize, then float matmul": identical rounding of weights and activations, float32 accumulation
(what the tiny goldens and the CPU tests measure).

Weights come from bf16/fp32 Linears (`quantize_weight`: per-output-channel max-abs scaling) or
unchanged from the official quanto fp8 files (`model.weights.quant.DequantLinear`: `_data` e4m3 + `_scale`
per output row, the same format).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
_MIN_AMAX = 1e-12  # all-zero rows quantize to zeros with a tiny, finite scale


def fp8_matmul_supported(device: torch.device | str) -> bool:
    """True when `torch._scaled_mm` runs fp8 on `device` (CUDA compute capability >= 8.9)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weight -> e4m3 data (out, in) and float32 scales (out,), data * scale ~ weight."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(_MIN_AMAX) / FP8_MAX  # (out,)
    data = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return data, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row fp8 quantization of x (M, K): e4m3 (M, K) and float32 scales (M, 1), q * scale ~ x.

    Written in torch ops so a compiled producer (norm, modulation, GELU) absorbs it into its kernel.
    """
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp_min(_MIN_AMAX) / FP8_MAX  # (M, 1)
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


class Fp8Linear(nn.Module):
    """y = x W^T + b with W in e4m3 (per-output-channel scales) and x quantized per row.

    The e4m3 weight is held as a uint8 view, so `module.to(dtype)` can never convert it; the bias stays
    in the run dtype. `use_scaled_mm` selects `torch._scaled_mm` (needs CUDA sm_89+, bf16 input);
    otherwise (or for other inputs) the emulation path computes the same quantized product in float32.
    """

    def __init__(
        self,
        data: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        use_scaled_mm: bool = False,
        fused_bias: bool = True,
    ):
        super().__init__()
        if data.dtype != FP8_DTYPE:
            raise ValueError(f"Fp8Linear data must be {FP8_DTYPE}, got {data.dtype}")
        self.out_features, self.in_features = data.shape
        if self.in_features % 16 or self.out_features % 16:
            raise ValueError(
                f"Fp8Linear needs in/out features divisible by 16 (fp8 GEMM), got {tuple(data.shape)}"
            )
        self.use_scaled_mm = use_scaled_mm
        self.fused_bias = fused_bias
        self.register_buffer("weight_data", data.contiguous().view(torch.uint8))  # (out, in) e4m3 bytes
        self.register_buffer("weight_scale", scale.detach().float().reshape(1, -1).contiguous())  # (1, out)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> Fp8Linear:
        """Quantize a float Linear (per-output-channel max-abs scales); the bias keeps its dtype."""
        data, scale = quantize_weight(linear.weight)
        return cls(data, scale, linear.bias, **kwargs)

    def dequantized_weight(self) -> torch.Tensor:
        """(out, in) float32 weight the fp8 data stands for."""
        return self.weight_data.view(FP8_DTYPE).float() * self.weight_scale.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out) in x's dtype."""
        lead = x.shape[:-1]
        q, scale_a = quantize_rows(x.reshape(-1, self.in_features))  # (M, in) e4m3, (M, 1)
        w = self.weight_data.view(FP8_DTYPE)  # (out, in)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.use_scaled_mm and x.is_cuda and x.dtype == torch.bfloat16:
            out = torch._scaled_mm(
                q,
                w.t(),  # (in, out) column-major, as the fp8 GEMM wants
                scale_a=scale_a,
                scale_b=self.weight_scale,
                bias=bias if self.fused_bias else None,
                out_dtype=x.dtype,
            )  # (M, out)
            if bias is not None and not self.fused_bias:
                out = out + bias
        else:  # emulation: the same quantized operands, float32 accumulation
            out = F.linear(q.float() * scale_a, self.dequantized_weight())
            if bias is not None:
                out = out + bias.float()
            out = out.to(x.dtype)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        mode = "scaled_mm" if self.use_scaled_mm else "emulated"
        return f"in_features={self.in_features}, out_features={self.out_features}, {mode}"


def _scaled_mm_takes_bias(device: torch.device) -> bool:
    """Whether this torch's row-wise `_scaled_mm` accepts a bf16 bias (else it is added afterwards)."""
    a = torch.ones(16, 16, device=device).to(FP8_DTYPE)
    s = torch.ones(16, 1, device=device)
    try:
        torch._scaled_mm(
            a, a.t(), scale_a=s, scale_b=s.t(), bias=torch.ones(16, device=device, dtype=torch.bfloat16),
            out_dtype=torch.bfloat16,
        )  # fmt: skip
    except RuntimeError:
        return False
    return True


def fp8_options(device: torch.device | str, use_scaled_mm: bool | None = None) -> dict[str, bool]:
    """`Fp8Linear` keyword arguments for layers that run on `device` (`use_scaled_mm=None`: the fp8 GEMM
    where the device supports it; whether its `_scaled_mm` takes the bias is asked once here)."""
    device = torch.device(device)
    if use_scaled_mm is None:
        use_scaled_mm = fp8_matmul_supported(device)
    return {
        "use_scaled_mm": use_scaled_mm,
        "fused_bias": _scaled_mm_takes_bias(device) if use_scaled_mm else True,
    }


def convert_to_fp8(
    model: nn.Module,
    *,
    use_scaled_mm: bool | None = None,
    include: str = "blocks.",
    device: torch.device | str | None = None,
    place: torch.device | str | None = None,
    options: dict[str, bool] | None = None,
) -> int:
    """Replace every Linear under `include` (default: the transformer blocks; "" = all) with an `Fp8Linear`.

    Float Linears are quantized (per-output-channel scales); `model.weights.quant.DequantLinear`s holding
    official fp8 data are converted without requantizing (int8 ones are requantized from their
    dequantized weight). The embeddings, time MLP and head stay as they are (tiny share of the FLOPs,
    and the official float32 islands read their weights). `use_scaled_mm=None` picks the fp8 GEMM when
    the run device supports it (`options`: precomputed `fp8_options`, for block-by-block callers).
    `device`: where each layer is quantized (default: the model's device), so a host-resident model
    gets exactly the bits a resident one would. `place`: where each converted layer goes (default:
    where the float layer was). Layer by layer, holding no reference to a converted float layer:
    the extra memory on `device` is one float weight at a time. Returns the number of converted layers.
    """
    from model.weights.quant import DequantLinear  # quant imports the DiT; keep fp8 light

    device = torch.device(device) if device is not None else next(model.parameters()).device
    kwargs = options if options is not None else fp8_options(device, use_scaled_mm)
    names = [
        name
        for name, m in model.named_modules()
        if name.startswith(include) and isinstance(m, nn.Linear) and not isinstance(m, Fp8Linear)
    ]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        m = getattr(parent, child)
        if isinstance(m, DequantLinear):
            home = m.weight_data.device
            m.to(device)  # 1 byte per weight; replaced below, so the move costs no second copy
            if m.data_dtype == FP8_DTYPE:
                data, scale = m.weight_data.view(FP8_DTYPE), m.weight_scale.reshape(-1)
            else:
                data, scale = quantize_weight(m.weight)
        else:
            home = m.weight.device
            data, scale = quantize_weight(m.weight.to(device))  # a transient copy on `device`
        bias = None if m.bias is None else m.bias.to(device)
        new = Fp8Linear(data, scale, bias, **kwargs).to(home if place is None else place)
        setattr(parent, child, new)
        del m, data, scale, bias
    log.debug(
        "fp8: %d Linears converted (%s)", len(names), "scaled_mm" if kwargs["use_scaled_mm"] else "emulated"
    )
    return len(names)
