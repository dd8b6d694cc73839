"""Light-ASD, a small audio-visual active-speaker network (Liao et al., CVPR 2023), for the CPU.

Written from the paper's description and the published checkpoint's key names and shapes (the official
`weight/pretrain_AVA_CVPR.model` of github.com/Junhua-Liao/Light-ASD, trained on AVA-ActiveSpeaker, MIT; converted once to
`model/speaker/assets/light_asd_ava.safetensors`, see docs/models.md): about 1 M parameters.

- visual encoder: three blocks over a grey face clip, each two parallel paths (a spatial 3x3 resp. 5x5
  convolution, then a temporal 3 resp. 5 frame one, each with batch norm + ReLU) summed and mixed by a
  1x1 convolution; the first block halves the resolution, 3x3/2 max pools follow the first two; a spatial
  max over what is left gives 128 features per frame (25 fps);
- audio encoder: the same block shape over 13 MFCCs at 100 fps (the "m" convolutions along the MFCC axis,
  the "t" ones along time), 3/2 max pools along time after the first two (100 -> 25 fps), then the mean
  over the MFCC axis: 128 features per video frame;
- fusion: audio + visual features summed, a forward GRU, GELU, a second GRU run backwards in time on that,
  GELU; a linear head gives two logits per frame, of which the second is the speaking score (> 0:
  speaking, as the reference scores it).
Batch norms are folded into their convolutions once at load time (eval only).  Must not import tasks/.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model.checkpoint import CheckpointError, read_safetensors, strict_assign
from model.speaker.light_asd_format import FACE_SIDE, MFCC_PER_FRAME, N_MFCC, VIDEO_FPS

WEIGHTS = Path(__file__).parent / "assets" / "light_asd_ava.safetensors"
PIXEL_MEAN, PIXEL_STD = 0.4161, 0.1688  # grey level normalisation (of values in 0..1)
BN_EPS = 1e-3


class _Block(nn.Module):
    """Two parallel factorised-convolution paths (kernel 3 and 5) summed, then a 1x1 mix.

    ``a`` names the first convolution of each path ("s": spatial for video, "m": along the MFCC axis for
    audio), "t" the second (time).  Video tensors are (N, C, T, H, W), audio (N, C, MFCC, T).
    """

    def __init__(self, video: bool, c_in: int, c_out: int, down: bool = False) -> None:
        super().__init__()
        self.video, self.down = video, down
        conv, bn = (nn.Conv3d, nn.BatchNorm3d) if video else (nn.Conv2d, nn.BatchNorm2d)
        self.a = "s" if video else "m"
        for k in (3, 5):
            first = (1, k, k) if video else (k, 1)
            second = (k, 1, 1) if video else (1, k)
            setattr(self, f"{self.a}_{k}", conv(c_in, c_out, first, bias=False))
            setattr(self, f"bn_{self.a}_{k}", bn(c_out, eps=BN_EPS))
            setattr(self, f"t_{k}", conv(c_out, c_out, second, bias=False))
            setattr(self, f"bn_t_{k}", bn(c_out, eps=BN_EPS))
        self.last = conv(c_out, c_out, (1, 1, 1) if video else (1, 1), bias=False)
        self.bn_last = bn(c_out, eps=BN_EPS)
        self.folded: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def fold(self) -> None:
        """Fold each batch norm (running statistics) into the convolution before it (eval only)."""
        for name in (f"{self.a}_3", "t_3", f"{self.a}_5", "t_5", "last"):
            conv, bn = getattr(self, name), getattr(self, f"bn_{name}")
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            w = conv.weight * scale.reshape(-1, *[1] * (conv.weight.dim() - 1))
            self.folded[name] = (w.detach().contiguous(), (bn.bias - bn.running_mean * scale).detach())

    def _conv(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w, b = self.folded[name]
        if self.video and name.startswith("t_"):  # (k, 1, 1) over time: a 2-D one on (N, C, T, H*W) is ~3x
            n, c, t, h, wd = x.shape  # faster on the CPU than conv3d
            y = F.conv2d(x.reshape(n, c, t, h * wd), w[..., 0], b, padding=(w.shape[2] // 2, 0))
            return F.relu(y).reshape(n, -1, t, h, wd)
        pad = tuple(s // 2 for s in w.shape[2:])
        stride = (1, 2, 2) if self.down and name.startswith("s_") else 1
        fn = F.conv3d if self.video else F.conv2d
        return F.relu(fn(x, w, b, stride=stride, padding=pad))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a
        y = self._conv(self._conv(x, f"{a}_3"), "t_3") + self._conv(self._conv(x, f"{a}_5"), "t_5")
        return self._conv(y, "last")


class _VisualEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block1 = _Block(True, 1, 32, down=True)
        self.block2 = _Block(True, 32, 64)
        self.block3 = _Block(True, 64, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1, T, 112, 112) normalised grey -> (N, T, 128)."""
        x = F.max_pool3d(self.block1(x), (1, 3, 3), (1, 2, 2), (0, 1, 1))  # (N, 32, T, 28, 28)
        x = F.max_pool3d(self.block2(x), (1, 3, 3), (1, 2, 2), (0, 1, 1))  # (N, 64, T, 14, 14)
        x = self.block3(x)  # (N, 128, T, 14, 14)
        return x.amax(dim=(3, 4)).transpose(1, 2)


class _AudioEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block1 = _Block(False, 1, 32)
        self.block2 = _Block(False, 32, 64)
        self.block3 = _Block(False, 64, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1, 13, 4T) MFCCs -> (N, T, 128)."""
        x = F.max_pool2d(self.block1(x), (1, 3), (1, 2), (0, 1))  # (N, 32, 13, 2T)
        x = F.max_pool2d(self.block2(x), (1, 3), (1, 2), (0, 1))  # (N, 64, 13, T)
        return self.block3(x).mean(dim=2).transpose(1, 2)


class _Fusion(nn.Module):
    """A forward GRU, then a second one over its (GELU) output run backwards in time."""

    def __init__(self, c: int = 128) -> None:
        super().__init__()
        self.gru_forward = nn.GRU(c, c, batch_first=True)
        self.gru_backward = nn.GRU(c, c, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, 128) -> (N, T, 128)."""
        x = F.gelu(self.gru_forward(x)[0])
        x = self.gru_backward(x.flip(1))[0].flip(1)
        return F.gelu(x)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.visualEncoder = _VisualEncoder()
        self.audioEncoder = _AudioEncoder()
        self.GRU = _Fusion()


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.FC = nn.Linear(128, 2)


class LightASD(nn.Module):
    """The network with the checkpoint's layout (``model.*``, ``lossAV.FC``, ``lossV.FC``; the visual-only
    head ``lossV`` is training-time and unused here).  Call `fold` (the loader does) before use."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _Net()
        self.lossAV = _Head()
        self.lossV = _Head()

    def fold(self) -> LightASD:
        for enc in (self.model.visualEncoder, self.model.audioEncoder):
            for block in (enc.block1, enc.block2, enc.block3):
                block.fold()
        return self.eval()

    @torch.inference_mode()
    def visual(self, faces: torch.Tensor) -> torch.Tensor:
        """(N, T, 112, 112) grey levels 0..255 -> (N, T, 128)."""
        x = (faces.float() / 255.0 - PIXEL_MEAN) / PIXEL_STD
        return self.model.visualEncoder(x.unsqueeze(1))

    @torch.inference_mode()
    def audio(self, mfcc: torch.Tensor) -> torch.Tensor:
        """(N, 4T, 13) MFCCs -> (N, T, 128)."""
        return self.model.audioEncoder(mfcc.float().transpose(1, 2).unsqueeze(1))

    @torch.inference_mode()
    def scores(self, audio_emb: torch.Tensor, visual_emb: torch.Tensor) -> torch.Tensor:
        """(N, T, 128) x 2 -> (N, T) speaking score (the head's second logit; > 0: speaking)."""
        return self.lossAV.FC(self.model.GRU(audio_emb + visual_emb))[..., 1]

    def forward(self, mfcc: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
        """(N, 4T, 13) MFCCs, (N, T, 112, 112) grey faces -> (N, T) speaking scores."""
        return self.scores(self.audio(mfcc), self.visual(faces))


def load_light_asd(path: Path | str = WEIGHTS) -> LightASD:
    """The network with the weights of ``path`` (safetensors), batch norms folded, in eval mode, float32 CPU.

    A missing, unreadable or foreign file raises `CheckpointError` naming it.
    """
    path = Path(path)
    state = read_safetensors(path, dtype=torch.float32)
    with torch.device("meta"):
        net = LightASD()
    return strict_assign(net, state, source=path, device="cpu").fold()  # type: ignore[return-value]


__all__ = [
    "FACE_SIDE",
    "MFCC_PER_FRAME",
    "N_MFCC",
    "VIDEO_FPS",
    "WEIGHTS",
    "CheckpointError",
    "LightASD",
    "load_light_asd",
]
