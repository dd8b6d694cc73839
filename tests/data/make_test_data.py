"""Regenerate the small committed test inputs in this folder (run once by hand, not by the tests).

face.jpg   head-and-shoulders crop of scikit-image's ``astronaut`` (NASA photo of Eileen Collins, public domain).
speech.wav a short English sentence spoken by espeak-ng (``apt-get install espeak-ng``), 16 kHz mono PCM16.
"""

import subprocess
import tempfile
from pathlib import Path

import cv2
import librosa
import numpy as np
import soundfile as sf
from skimage import data

HERE = Path(__file__).resolve().parent


def make_face() -> Path:
    """Crop the astronaut's head and shoulders and save a small JPEG."""
    img = data.astronaut()  # (512, 512, 3) RGB
    crop = img[0:300, 90:330]  # (300, 240, 3)
    crop = cv2.resize(crop, (192, 240), interpolation=cv2.INTER_AREA)
    out = HERE / "face.jpg"
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(crop, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 88])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    out.write_bytes(buf.tobytes())
    return out


def make_speech() -> Path:
    """Synthesize a short sentence with espeak-ng and store it as 16 kHz mono PCM16."""
    out = HERE / "speech.wav"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(
            ["espeak-ng", "-v", "en", "-s", "160", "-w", str(raw), "Dubbing films is fun, isn't it?"],
            check=True,
        )
        audio, sr = sf.read(raw, dtype="float32")
    audio = librosa.resample(audio, orig_sr=sr, target_sr=16000)
    audio = audio / max(1e-6, float(np.abs(audio).max())) * 0.5
    sf.write(out, audio, 16000, subtype="PCM_16")
    return out


if __name__ == "__main__":
    for path in (make_face(), make_speech()):
        print(path.name, path.stat().st_size, "bytes")
