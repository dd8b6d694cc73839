"""Light-ASD (model/speaker/light_asd.py) and its MFCCs (model/speaker/mfcc.py): the committed weights through the real loader
against a forward pass recomputed here from the raw state dict (unfolded batch norms, plain conv3d, the GRU
equations written out), the MFCCs against python_speech_features, and bad weight files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from model.checkpoint import CheckpointError
from model.speaker.light_asd import WEIGHTS, load_light_asd
from model.speaker.mfcc import mfcc

SPEECH_WAV = Path(__file__).parent / "data" / "speech.wav"


def _cbr(x, sd, conv, bn, stride=1):
    """relu(batchnorm(conv(x))) straight from the state dict (eps 1e-3, running statistics)."""
    w = sd[conv + ".weight"]
    pad = tuple(k // 2 for k in w.shape[2:])
    y = (F.conv3d if w.dim() == 5 else F.conv2d)(x, w, None, stride=stride, padding=pad)
    y = F.batch_norm(y, sd[bn + ".running_mean"], sd[bn + ".running_var"], sd[bn + ".weight"], sd[bn + ".bias"],
                     training=False, eps=1e-3)  # fmt: skip
    return F.relu(y)


def _block(x, sd, p, first, down=False):
    s = (1, 2, 2) if down else 1
    y3 = _cbr(_cbr(x, sd, f"{p}.{first}_3", f"{p}.bn_{first}_3", s), sd, f"{p}.t_3", f"{p}.bn_t_3")
    y5 = _cbr(_cbr(x, sd, f"{p}.{first}_5", f"{p}.bn_{first}_5", s), sd, f"{p}.t_5", f"{p}.bn_t_5")
    return _cbr(y3 + y5, sd, f"{p}.last", f"{p}.bn_last")


def _gru(x, sd, p):
    """One GRU layer over (1, T, C), gates r, z, n in PyTorch's order."""
    wi, wh, bi, bh = (sd[f"{p}.{k}_l0"] for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    h = torch.zeros(wh.shape[1], dtype=torch.float64)
    out = []
    for t in range(x.shape[1]):
        gi, gh = wi @ x[0, t] + bi, wh @ h + bh
        r = torch.sigmoid(gi[:128] + gh[:128])
        z = torch.sigmoid(gi[128:256] + gh[128:256])
        n = torch.tanh(gi[256:] + r * gh[256:])
        h = (1 - z) * n + z * h
        out.append(h)
    return torch.stack(out)[None]


def _reference(sd, audio, faces):
    """Speaking scores (1, T) recomputed from the raw checkpoint in float64."""
    sd = {k: v.double() for k, v in sd.items()}
    v = ((faces.double() / 255 - 0.4161) / 0.1688)[:, None]  # (1, 1, T, 112, 112)
    e = "model.visualEncoder"
    v = F.max_pool3d(_block(v, sd, f"{e}.block1", "s", True), (1, 3, 3), (1, 2, 2), (0, 1, 1))
    v = F.max_pool3d(_block(v, sd, f"{e}.block2", "s"), (1, 3, 3), (1, 2, 2), (0, 1, 1))
    v = _block(v, sd, f"{e}.block3", "s").amax(dim=(3, 4)).transpose(1, 2)  # (1, T, 128)
    a = audio.double().transpose(1, 2)[:, None]  # (1, 1, 13, 4T)
    e = "model.audioEncoder"
    a = F.max_pool2d(_block(a, sd, f"{e}.block1", "m"), (1, 3), (1, 2), (0, 1))
    a = F.max_pool2d(_block(a, sd, f"{e}.block2", "m"), (1, 3), (1, 2), (0, 1))
    a = _block(a, sd, f"{e}.block3", "m").mean(dim=2).transpose(1, 2)  # (1, T, 128)
    x = F.gelu(_gru(a + v, sd, "model.GRU.gru_forward"))
    x = F.gelu(_gru(x.flip(1), sd, "model.GRU.gru_backward").flip(1))
    return (x @ sd["lossAV.FC.weight"].T + sd["lossAV.FC.bias"])[..., 1]


def test_the_network_matches_a_forward_recomputed_from_the_checkpoint():
    net = load_light_asd()
    sd = load_file(str(WEIGHTS))
    g = torch.Generator().manual_seed(3)
    n_t = 12
    faces = torch.randint(0, 256, (2, n_t, 112, 112), generator=g).float()
    faces[1] = torch.linspace(0, 255, 112)[None, None, :] * torch.ones(n_t, 112, 1)  # a smooth ramp
    audio = torch.randn(2, 4 * n_t, 13, generator=g) * 10
    got = net(audio, faces)  # batched: both clips at once
    assert got.shape == (2, n_t) and got.dtype == torch.float32
    for i in range(2):
        want = _reference(sd, audio[i : i + 1], faces[i : i + 1])
        assert torch.allclose(got[i].double(), want[0], atol=2e-4), (got[i], want)
    assert (got[0] - got[1]).abs().max() > 1e-2  # the inputs matter


def test_mfcc_equals_python_speech_features():
    psf = pytest.importorskip("python_speech_features")
    x, sr = sf.read(SPEECH_WAV, dtype="float32")
    for clip in (x, x[:5000], np.zeros(900, np.float32), x[:300]):
        want = psf.mfcc(clip.astype(np.float64) * 32768, sr, numcep=13, winlen=0.025, winstep=0.010)
        got = mfcc(clip, sr)
        assert got.shape == want.shape
        assert np.abs(got - want).max() < 1e-3 * max(1.0, np.abs(want).max())


def test_bad_weight_files_give_one_line_naming_the_file(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00\x01not a safetensors file" * 10)
    with pytest.raises(CheckpointError, match="junk.safetensors") as e:
        load_light_asd(junk)
    assert "\n" not in str(e.value)
    other = tmp_path / "other.safetensors"
    sd = load_file(str(WEIGHTS))
    sd.pop("lossAV.FC.weight")
    sd["model.GRU.gru_forward.weight_ih_l0"] = torch.zeros(384, 64)
    save_file(sd, str(other))
    with pytest.raises(CheckpointError, match="other.safetensors") as e:
        load_light_asd(other)
    msg = str(e.value)
    assert "\n" not in msg and "lossAV.FC.weight" in msg and "gru_forward.weight_ih_l0" in msg
    with pytest.raises(CheckpointError, match="absent.safetensors"):
        load_light_asd(tmp_path / "absent.safetensors")
