"""Per-shot segment encode (issue 27 item 2): after a one-shot plan edit only that shot is encoded again
and every frame of every other shot is bit-identical to the previous deliverable's (default encode,
H.264); timestamps are n / fps exactly and the dub is cut to the picture's duration to the sample."""

from __future__ import annotations

import logging
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np

from flows.dub_film import dub_film_inline
from tasks.media import ffmpeg
from tasks.media.probe import probe
from tests.test_plan_file import planned_clip


def frame_table(path: Path) -> tuple[list[int], list[str], Fraction]:
    """Presentation timestamps and per-frame MD5s (decoded, yuv420p) of the first video stream."""
    lines = list(
        ffmpeg.read_lines(["-v", "error", "-i", str(path), "-map", "0:v:0", "-f", "framemd5", "-"], path=path)
    )
    tb = next(Fraction(ln.split(":")[1].strip()) for ln in lines if ln.startswith("#tb 0"))
    rows = [[c.strip() for c in ln.split(",")] for ln in lines if ln and not ln.startswith("#")]
    return [int(r[2]) for r in rows], [r[5] for r in rows], tb


def audio_samples(path: Path, rate: int) -> int:
    """Decoded samples of the first audio stream at its own rate (encoder priming and padding trimmed)."""
    blocks = ffmpeg.read_blocks(
        ["-v", "error", "-i", str(path), "-map", "0:a:0", "-f", "s16le", "-ac", "1", "-"],
        2, path=path, partial_tail=True,
    )  # fmt: skip
    return sum(1 for _ in blocks)


def test_a_one_shot_edit_re_encodes_that_shot_only(tmp_path: Path, caplog):
    clip, dub, out, ws_root, plan, _ = planned_clip(tmp_path)
    # passthrough with the colour step on: a shot's colour_strength changes its pixels, and only its
    config = {
        "backend": {"name": "passthrough", "options": {"color": True}},
        "workspace": {"root": str(ws_root)},
    }
    caplog.set_level(logging.INFO, logger="tasks.media.assemble")
    dub_film_inline(str(clip), str(dub), str(out), config=config, plan=str(plan))
    assert "3 of 3 shot segment(s) encoded, 0 reused" in caplog.text
    before = tmp_path / "v1.mp4"
    shutil.copyfile(out, before)
    (segments,) = ws_root.glob("*/segments")
    first = sorted(p.name for p in segments.glob("*.mov"))  # each beside its record (issue 47)

    text = plan.read_text().split("- index: ")
    text[2] = text[2].replace("color_strength: null", "color_strength: 0.3")  # shot 1, frames 24-47
    plan.write_text("- index: ".join(text))
    caplog.clear()
    dub_film_inline(str(clip), str(dub), str(out), config=config, plan=str(plan))
    assert "1 of 3 shot segment(s) encoded, 2 reused" in caplog.text  # counted: one encode
    second = sorted(p.name for p in segments.glob("*.mov"))
    assert len(set(first) & set(second)) == 2 and len(second) == 3  # the old shot 1 segment was pruned

    pts0, md50, tb = frame_table(before)
    pts1, md51, tb1 = frame_table(out)
    info = probe(clip)
    assert tb == tb1 and len(md51) == info.frame_count == 72
    assert md51[:24] == md50[:24] and md51[48:] == md50[48:]  # shots 0 and 2: every frame bit-identical
    assert all(a != b for a, b in zip(md51[24:48], md50[24:48], strict=True))  # shot 1 changed
    assert sorted(pts1) == [round(Fraction(i) / info.fps / tb) for i in range(72)]  # n / fps, exactly
    assert [round(i / info.fps / tb) == i / info.fps / tb for i in range(72)] == [True] * 72
    o = probe(out)
    rate = o.audio[0].sample_rate
    want = round(Fraction(72) / info.fps * rate)
    assert abs(audio_samples(out, rate) - want) <= 1  # the dub cut to the picture, to one sample
    assert np.isclose(o.video_duration_s, 72 / float(info.fps))
