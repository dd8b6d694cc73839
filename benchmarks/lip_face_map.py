"""The output lip check with the dubbed face's own map: the prior calibrated on the face's other lines.

For each committed head X (tests/data/talking/head1-9), halves of its clip: the map fitted without X and the
dub's head (`tests.test_content_speaker.map_without`), then that map calibrated (`ContentMap.calibrated`,
strength 3000) on X's one half (X's "source lines"), and the real output check (`tasks.perception.lip_check`)
run on X's other half under its own words and under each other head's words (the same time range of their
clip), with the prior and with the face's map.  Not shipped (benchmarks/RESULTS.md): it halves the false
reviews but lets one more mismatched half pass.

    PYTHONPATH=. .venv/bin/python benchmarks/lip_face_map.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.fit_content_prior import speech_mask
from tasks.perception.content import audio_features
from tasks.perception.lip_check import lip_check
from tasks.perception.vad import RATE
from tests.speaker_cases import FPS, SR, seed_audio, seed_frames
from tests.test_content_speaker import heads, map_without

FACE = (40, 40, 216, 216)


def main() -> None:
    own_flagged = {"prior": 0, "face": 0}
    other_pass = {"prior": 0, "face": 0}
    n_own = n_other = 0
    for h in range(1, 10):
        _, shapes = heads()[h]
        n = len(shapes)
        half = n // 2
        speech = speech_mask(h, n)
        for cal, test in (((0, half), (half, n)), ((half, n), (0, half))):
            src = seed_audio(h)[round(cal[0] / FPS * SR) : round(cal[1] / FPS * SR)]
            feats = audio_features(src, RATE, cal[1] - cal[0], FPS)
            sel = speech[cal[0] : cal[1]] & np.isfinite(shapes[cal[0] : cal[1]]).all(axis=1)
            frames = seed_frames(h)[test[0] : test[1]]
            for voice in range(1, 10):
                prior = map_without(h, voice)
                face = prior.calibrated(feats[sel], shapes[cal[0] : cal[1]][sel], 3000.0)
                dub = seed_audio(voice)[round(test[0] / FPS * SR) : round(test[1] / FPS * SR)]
                m = min(len(frames), len(dub) * FPS // SR)
                if m < 40:
                    continue
                fits = {}
                for label, cmap in (("prior", prior), ("face", face)):
                    got = lip_check(iter(frames[:m]), m, float(FPS), dub, FACE, 0.1, cmap)
                    fits[label] = got.fit
                    if voice == h:
                        own_flagged[label] += got.flagged
                    else:
                        other_pass[label] += not got.flagged
                n_own += voice == h
                n_other += voice != h
                if voice == h:
                    print(f"head{h} frames {test}: own words, prior {fits['prior']}, face map {fits['face']}")
    print(f"own words flagged: prior {own_flagged['prior']} / face map {own_flagged['face']} of {n_own}")
    print(f"other words passing: prior {other_pass['prior']} / face map {other_pass['face']} of {n_other}")


if __name__ == "__main__":
    main()
