"""Final assembly: frame-exact concat, one encode, metadata kept, audio muxed, atomic output."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tasks.config.pipeline import load_config
from tasks.errors import DecodeError, OutputError
from tasks.media.assemble import AudioSource, assemble, build_encode_args, check_output_path
from tasks.media.audio import decode_audio
from tasks.media.frames import LosslessWriter, iter_frames
from tasks.media.probe import probe, read_header
from tests.media import decode_all, make_audio, make_clip, psnr


def _intermediates(info, frames: np.ndarray, cuts: list[int], work: Path) -> list[str]:
    paths = []
    edges = [0, *cuts, frames.shape[0]]
    for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        p = work / f"shot_{i:04d}.mkv"
        with LosslessWriter(p, frames.shape[1:3], info.fps) as w:
            w.write(frames[a:b])
        paths.append(str(p))
    return paths


def test_encode_args_are_built_from_the_source(tmp_path: Path):
    info = probe(make_clip(tmp_path / "r.mp4", rotation=90, sar="4/3", audio_channels=6))
    enc = load_config(overrides=["encode.audio_language=spa", "encode.keep_source_audio=true"]).encode
    args = build_encode_args(info, Path("l.txt"), AudioSource("d.wav", pad=True), enc, Path("o.mp4"), "mp4")
    joined = " ".join(args)
    assert args[args.index("-display_rotation") + 1] == "90" and "-noautorotate" in args
    assert "setsar=4/3" in joined and "settb=1001/24000,setpts=N" in joined and "-r 24000/1001" in joined
    assert "language=spa" in joined and "apad=whole_dur=1.001000,atrim=end=1.001000" in joined
    assert "-map 2:a" in joined and "-c:a:1 copy" in joined  # the source's audio kept after the dub
    plain = build_encode_args(
        info, Path("l.txt"), AudioSource("d.wav"), load_config().encode, Path("o.mkv"), "matroska"
    )
    assert "apad" not in " ".join(plain) and "-movflags" not in plain


def test_assemble_keeps_frames_timing_rotation_sar_and_tags_audio(tmp_path: Path):
    src = make_clip(tmp_path / "src.mp4", (10, 14), fps="30000/1001", rotation=270, sar="4/3")
    info = probe(src)
    frames = np.stack(list(iter_frames(info)))
    dub = make_audio(tmp_path / "dub.flac", info.video_duration_s + 0.02, rate=44100)
    enc = load_config(overrides=["encode.audio_language=spa"]).encode
    out = tmp_path / "out" / "dubbed.mp4"
    got = assemble(
        info,
        _intermediates(info, frames, [10], tmp_path),
        out,
        enc,
        audio=AudioSource(str(dub)),
        workdir=tmp_path / "w",
    )
    assert got == str(out)
    o = probe(out)
    assert (o.frame_count, o.fps, o.rotation, o.sar, o.width, o.height) == (
        24,
        Fraction(30000, 1001),
        270,
        Fraction(4, 3),
        128,
        72,
    )
    assert o.audio[0].language == "spa"
    head = read_header(out)
    assert head.video[0].codec == "h264" and head.video[0].pix_fmt == "yuv420p"
    audio = decode_audio(out, sample_rate=48000, channels=1)
    assert abs(audio.shape[0] / 48000 - info.video_duration_s) <= 1 / float(info.fps)
    assert psnr(decode_all(out), frames) > 35
    assert not list(out.parent.glob(".*tmp*"))


def test_output_path_checks(tmp_path: Path):
    src = make_clip(tmp_path / "s.mp4")
    with pytest.raises(OutputError, match="s.mp4: output would overwrite an input file"):
        check_output_path(src, src)
    with pytest.raises(OutputError, match="unsupported output extension .avi"):
        check_output_path(tmp_path / "o.avi", src)
    (tmp_path / "d.mp4").mkdir()
    with pytest.raises(OutputError, match="directory"):
        check_output_path(tmp_path / "d.mp4", src)


def test_failed_assembly_leaves_nothing_and_keeps_old_output(tmp_path: Path):
    info = probe(make_clip(tmp_path / "s.mp4", (8,)))
    frames = np.stack(list(iter_frames(info)))
    paths = _intermediates(info, frames, [], tmp_path)
    out = tmp_path / "o.mp4"
    out.write_bytes(b"previous result")
    enc = load_config().encode
    dub = make_audio(tmp_path / "d.wav", info.video_duration_s)
    with pytest.raises(DecodeError, match="missing.mkv: shot intermediate is missing"):
        assemble(
            info,
            [*paths, str(tmp_path / "missing.mkv")],
            out,
            enc,
            audio=AudioSource(str(dub)),
            workdir=tmp_path / "w",
        )
    with pytest.raises(DecodeError, match="o.mp4: final encode failed"):  # the encoder itself fails
        bad = load_config(overrides=["encode.preset=no-such-preset"]).encode
        assemble(info, paths, out, bad, audio=AudioSource(str(dub)), workdir=tmp_path / "w")
    assert out.read_bytes() == b"previous result" and not list(tmp_path.glob(".o.*"))
    # a frame count mismatch (a shot missing) is caught before the output is replaced
    short = _intermediates(info, frames[:5], [], tmp_path / "short")
    with pytest.raises(DecodeError, match="encoded 5 frames, expected 8"):
        assemble(info, short, out, enc, audio=AudioSource(str(dub)), workdir=tmp_path / "w")
    assert out.read_bytes() == b"previous result"
