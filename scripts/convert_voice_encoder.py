"""Convert Resemblyzer's voice-encoder checkpoint (`resemblyzer/pretrained.pt` inside the `Resemblyzer==0.1.4`
wheel on PyPI, Apache-2.0) into `model/speaker/assets/ge2e_voice.safetensors` (`model/speaker/voice_id.py`): the LSTM and linear
tensors cast to float16 (2.9 MB); the GE2E loss's two similarity scalars and the optimiser state, training-only,
are left out.  Run once, by hand:

    pip download --no-deps Resemblyzer==0.1.4 -d /tmp/res && unzip /tmp/res/Resemblyzer-0.1.4-py3-none-any.whl -d /tmp/res
    python scripts/convert_voice_encoder.py /tmp/res/resemblyzer/pretrained.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.speaker.voice_id import WEIGHTS, VoiceEncoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path, help="resemblyzer/pretrained.pt")
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    args = ap.parse_args()
    # a plain tensor file of the official release; weights_only refuses anything that is not tensors and dicts
    state = torch.load(args.checkpoint, map_location="cpu", weights_only=True)["model_state"]
    keep = VoiceEncoder().state_dict().keys()
    missing = sorted(set(keep) - set(state))
    if missing:
        raise SystemExit(f"{args.checkpoint}: not a Resemblyzer voice encoder (missing {', '.join(missing)})")
    save_file({k: state[k].to(torch.float16).contiguous() for k in keep}, str(args.out))


if __name__ == "__main__":
    main()
