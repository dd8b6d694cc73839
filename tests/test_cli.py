"""`dubflow` CLI and config: JSON commands, the dry run on awkward clips, one-line errors on bad inputs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import soundfile as sf

from flows.cli import main
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.errors import ConfigError
from tasks.media.probe import probe
from tests.media import decode_all, encoders, make_audio, make_clip, psnr, sha256

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ config


def test_config_layers_and_typed_overrides(tmp_path: Path):
    base = load_config()
    assert (
        (base.backend.name, base.sections["infinitetalk"]["mode"], base.sections["infinitetalk"]["weights"])
        == ("infinitetalk", "tiny", None)
        and base.frames.bucket == "480"
        and base.audio.length_policy == "error"
    )
    user = tmp_path / "user.yaml"
    user.write_text("color:\n  strength: 0.5\nencode:\n  crf: 23\n")
    cfg = load_config(
        user,
        [
            "frames.bucket=720",
            "shots.threshold=30",
            "encode.keep_source_audio=true",
            "backend.options.steps=8",
            "shots.threshold=null",
        ],
    )
    assert (cfg.color.strength, cfg.encode.crf, cfg.frames.bucket) == (0.5, 23, "720")
    assert cfg.shots.threshold is None and cfg.encode.keep_source_audio is True
    assert cfg.backend.options == {"steps": 8}
    assert PipelineConfig.from_dict(cfg.to_dict()) == cfg and cfg != base
    assert load_config(updates={"plan": {"frame_num": 33}}).plan.frame_num == 33


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["color.hue=1"], "--set: unknown key color.hue"),
        (["nope.x=1"], "--set: unknown key nope.x"),
        (["encode.crf=high"], "--set: encode.crf: expected an integer, got 'high'"),
        (
            ["audio.length_policy=stretch"],
            "audio.length_policy: 'stretch' is not one of error, pad, trim, fit",
        ),
        (["color"], "expected key.sub=value"),
    ],
)
def test_config_errors_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as ei:
        load_config(overrides=overrides)
    assert message in str(ei.value) and "\n" not in str(ei.value)


def test_config_file_errors_name_the_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("shots:\n  detektor: content\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key shots.detektor"):
        load_config(bad)
    with pytest.raises(ConfigError, match="missing.yaml: config file not found"):
        load_config(tmp_path / "missing.yaml")


# ------------------------------------------------------------------------------------- JSON commands


def test_shots_and_plan_print_json_without_prefect(tmp_path: Path):
    clip = make_clip(tmp_path / "c.mp4", (12, 30, 9), fps="24000/1001")
    dub = make_audio(tmp_path / "d.wav", float(51 / Fraction(24000, 1001)))
    code = (
        "import sys, io, contextlib, json\n"
        "from flows.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    assert main(['shots', {str(clip)!r}]) == 0\n"
        f"    assert main(['plan', {str(clip)!r}, '--audio', {str(dub)!r}]) == 0\n"
        "print(json.dumps({'out': buf.getvalue(), 'prefect': 'prefect' in sys.modules, 'torch': 'torch' in sys.modules}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["prefect"] is False and res["torch"] is False
    dec = json.JSONDecoder()
    shots, end = dec.raw_decode(res["out"])
    plan, _ = dec.raw_decode(res["out"][end:].lstrip())
    assert [(s["start_frame"], s["end_frame"]) for s in shots] == [(0, 12), (12, 42), (42, 51)]
    assert set(shots[0]) == {"index", "start_frame", "end_frame", "start_s", "end_s"}
    assert shots[1]["start_s"] == shots[0]["end_s"] == round(12 * 1001 / 24000, 6)
    assert [p["shot_index"] for p in plan] == [0, 1, 2] and plan[1]["fps"] == "24000/1001"
    assert plan[1]["chunks"][0]["src_end"] == 30 and plan[-1]["audio_samples"][1] == sf.info(str(dub)).frames


# ------------------------------------------------------------------------------ dry run on odd clips

_CLIPS = {
    "ntsc_multishot.mp4": {"lengths": (10, 7, 13), "fps": "30000/1001"},
    "rotated.mp4": {"rotation": 90},
    "anamorphic.mp4": {"sar": "4/3"},
    "vfr.mkv": {"lengths": (14, 14), "vfr_split": (14, "30")},
    "surround.mp4": {"audio_channels": 6},
    "silent.mp4": {"audio_channels": None},
    "hevc.mp4": {"codec": "libx265"},
    "vp9.webm": {"codec": "libvpx-vp9"},
    "av1.mp4": {"codec": "libsvtav1"},
}


@pytest.mark.parametrize("name", list(_CLIPS))
def test_dry_run_keeps_count_rate_rotation_aspect(tmp_path: Path, name: str, capsys):
    kw = _CLIPS[name]
    if "codec" in kw and kw["codec"] not in encoders():
        pytest.skip(f"bundled ffmpeg has no {kw['codec']} encoder")
    src = make_clip(tmp_path / name, **kw)
    info = probe(src)
    dub = make_audio(tmp_path / "dub.wav", info.video_duration_s, rate=22050)
    out = tmp_path / "out" / f"{Path(name).stem}.mp4"
    before = sha256(src)
    rc = main(["dub", str(src), "--audio", str(dub), "--out", str(out), "--backend", "passthrough", "--no-prefect",
               "--set", f"workspace.root={tmp_path / 'ws'}", "--set", "encode.preset=veryfast",
               "--set", "workspace.keep=false"])  # fmt: skip
    assert rc == 0 and capsys.readouterr().out.strip() == str(out)
    o = probe(out)
    assert (o.frame_count, o.rotation, o.dar) == (info.frame_count, info.rotation, info.dar)
    assert o.fps == info.fps and o.display_size == info.display_size
    assert psnr(decode_all(out), decode_all(src)) > 34
    # film work dir removed after success; the run's log stays
    assert sha256(src) == before and [p.name for p in (tmp_path / "ws").iterdir()] == [".logs"]
    report = json.loads(out.with_suffix(".report.json").read_text())  # the report next to the film
    assert report["frames"] == info.frame_count and report["outputs"]["film"] == str(out)
    assert [s["frames"][0] for s in report["shots"]][0] == 0 and report["shots"][-1]["frames"][
        1
    ] == info.frame_count
    assert report["workspace"] is None and Path(report["log"]).parent == tmp_path / "ws" / ".logs"
    assert out.with_suffix(".report.html").read_text().startswith("<!DOCTYPE html>")


# ----------------------------------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("good")
    src = make_clip(d / "film.mp4", (12, 12), faststart=True)
    info = probe(src)
    return {
        "dir": d,
        "src": src,
        "dub": make_audio(d / "dub.wav", info.video_duration_s),
        "short": make_audio(d / "short.wav", info.video_duration_s - 0.3),
        "long": make_audio(d / "long.wav", info.video_duration_s + 0.3),
    }


def _bad_case(case: str, good: dict[str, Path], tmp: Path) -> tuple[Path, Path, str]:
    src, dub = good["src"], good["dub"]
    if case == "missing":
        return tmp / "nope.mp4", dub, "nope.mp4: no such file"
    if case == "not_video":
        p = tmp / "notes.mp4"
        p.write_text("this is not a video\n" * 50)
        return p, dub, "notes.mp4: truncated or not a media file"
    if case == "truncated":
        p = tmp / "cut.mp4"
        p.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
        return p, dub, "cut.mp4: file is truncated"
    if case == "no_video":
        return make_audio(tmp / "voice.m4a", 1.0, codec="aac"), dub, "voice.m4a: no video stream"
    if case == "bad_audio":
        p = tmp / "dub.mp3"
        p.write_bytes(b"\x00garbage" * 100)
        return src, p, "dub.mp3: not a media file"
    if case == "empty_audio":
        p = tmp / "empty.wav"
        sf.write(p, [], 16000, subtype="PCM_16")
        return src, p, "empty.wav: audio stream contains no samples"
    if case == "short_audio":
        return src, good["short"], "short.wav: audio is"
    if case == "long_audio":
        return src, good["long"], "long.wav: audio is"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "not_video",
        "truncated",
        "no_video",
        "bad_audio",
        "empty_audio",
        "short_audio",
        "long_audio",
    ],
)
def test_bad_inputs_fail_with_one_line_and_leave_nothing(case: str, good, tmp_path: Path, capsys):
    src, dub, message = _bad_case(case, good, tmp_path)
    hashes = {p: sha256(p) for p in (src, dub) if p.exists()}
    out = tmp_path / "out" / "dubbed.mp4"
    rc = main(
        [
            "dub",
            str(src),
            "--audio",
            str(dub),
            "--out",
            str(out),
            "--no-prefect",
            "--set",
            f"workspace.root={tmp_path / 'ws'}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[-1].startswith("dubflow: error: ") and message in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert not out.parent.exists()  # not even the output's folder
    assert all(sha256(p) == h for p, h in hashes.items())


def test_console_script_error_exit_status(good, tmp_path: Path):
    junk = tmp_path / "junk.mov"
    junk.write_bytes(b"\x00" * 4096)
    r = subprocess.run(
        [str(Path(sys.executable).with_name("dubflow")), "dub", str(junk), "--audio", str(good["dub"]),
         "--out", str(tmp_path / "o.mp4")],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 1 and r.stdout == ""
    assert (
        r.stderr.strip().splitlines()[-1].startswith(f"dubflow: error: {junk}: ")
        and "Traceback" not in r.stderr
    )


def test_policy_allows_a_short_dub(good, tmp_path: Path):
    out = tmp_path / "padded.mp4"
    # the warning as logged: which root handler prints it (the CLI's or Prefect's, which may replace the
    # root handlers while the run imports it) depends on test order, so listen on the module's own logger
    records: list[logging.LogRecord] = []
    listener = logging.Handler(logging.WARNING)
    listener.emit = records.append
    logging.getLogger("tasks.media.audio").addHandler(listener)
    try:
        rc = main(["dub", str(good["src"]), "--audio", str(good["short"]), "--out", str(out), "--no-prefect",
                   "--set", "audio.length_policy=pad", "--set", f"workspace.root={tmp_path / 'ws'}"])  # fmt: skip
    finally:
        logging.getLogger("tasks.media.audio").removeHandler(listener)
    assert rc == 0
    assert any("padding with silence" in r.getMessage() for r in records)
    o = probe(out)
    assert o.frame_count == 24


def test_final_mix_is_muxed_with_the_language_tag(good, tmp_path: Path, capsys):
    info = probe(good["src"])
    mix = make_audio(tmp_path / "mix.m4a", info.video_duration_s, rate=48000, channels=2, codec="aac")
    out = tmp_path / "mixed.mkv"
    args = ["dub", str(good["src"]), "--audio", str(good["dub"]), "--mix", str(mix), "--out", str(out), "--no-prefect",
            "--set", f"workspace.root={tmp_path / 'ws'}"]  # fmt: skip
    assert main([*args, "--language", "Spanish"]) == 1 and not out.exists()
    assert capsys.readouterr().err.strip() == (
        "dubflow: error: --language: 'Spanish' is not an ISO 639-2 code (three letters: deu, fra, spa, jpn, ...)"
    )
    assert main([*args, "--language", "spa"]) == 0
    o = probe(out)
    assert [(a.channels, a.language) for a in o.audio] == [(2, "spa")] and o.frame_count == info.frame_count


def test_weights_verify_reports_problems(tmp_path: Path, capsys):
    pytest.importorskip("model.weights.layout")
    rc = main(["weights", "verify", str(tmp_path / "none")])
    captured = capsys.readouterr()
    assert rc == 1 and captured.err.strip().startswith(f"dubflow: error: {tmp_path / 'none'}")


# ----------------------------------------------------------------- the local command's output and errors


def _dub(good, out: Path, tmp: Path, *extra: str, src: Path | None = None) -> int:
    return main(["dub", str(src or good["src"]), "--audio", str(good["dub"]), "--out", str(out), "--no-prefect",
                 "--backend", "passthrough", "--set", f"workspace.root={tmp / 'ws'}", *extra])  # fmt: skip


def test_local_dub_writes_where_its_user_says(good, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    from tasks.run.outputs import ROOTS_ENV, output_tag

    roots = str(
        tmp_path / "deployment-root"
    )  # the deployment's confinement, which the shell user is not under
    monkeypatch.setenv(ROOTS_ENV, roots)
    out = tmp_path / "renders" / "new" / "film_de.mp4"
    assert _dub(good, out, tmp_path) == 0
    assert capsys.readouterr().out.strip() == str(out) and output_tag(out) is not None
    assert probe(out).frame_count == 24
    assert __import__("os").environ[ROOTS_ENV] == roots  # the roots of the process are restored
    # a file dubflow did not write is never replaced, --overwrite or not
    foreign = tmp_path / "renders" / "holiday.mp4"
    foreign.write_bytes(good["src"].read_bytes())
    for extra in ((), ("--overwrite",)):
        assert _dub(good, foreign, tmp_path, *extra) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith(
            "was not written by dubflow (or was changed since): refusing to overwrite it"
        ), err
    assert sha256(foreign) == sha256(good["src"])
    # another film's dubflow output: refused in the run (one line; the traceback in the run log), replaced with --overwrite
    other = make_clip(tmp_path / "other.mp4", (12, 12), seed=3)
    assert _dub(good, out, tmp_path, src=other) == 1
    err = capsys.readouterr().err.strip().splitlines()
    line = [e for e in err if e.startswith("dubflow: error: ")]
    assert len(line) == 1 and "pass --overwrite" in line[0] and "Traceback" not in "\n".join(err), err
    (log_file,) = (tmp_path / "ws" / ".logs").glob("dub-*-other.log")  # the run's log holds the traceback
    assert (
        "Traceback (most recent call last)" in log_file.read_text()
        and "pass --overwrite" in log_file.read_text()
    )
    assert _dub(good, out, tmp_path, "--overwrite", src=other) == 0


def test_a_bad_input_is_one_line_before_prefect_starts(tmp_path: Path):
    """On the sample film: a dub 1 s long fails the length check before Prefect is even imported."""
    film = REPO / "data" / "sample_film.mp4"
    short = make_audio(tmp_path / "short.wav", 1.0)
    out = tmp_path / "renders" / "x.mp4"
    code = (
        "import sys, json\n"
        "from flows.cli import main\n"
        f"rc = main(['dub', {str(film)!r}, '--audio', {str(short)!r}, '--out', {str(out)!r},"
        f" '--set', 'workspace.root={tmp_path / 'ws'}'])\n"
        "print(json.dumps({'rc': rc, 'prefect': 'prefect' in sys.modules, 'torch': 'torch' in sys.modules}))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "DUBFLOW_OUTPUT_ROOTS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == {"rc": 1, "prefect": False, "torch": False}
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith("dubflow: error: "), r.stderr
    assert f"{short}: audio is 1.000 s by its header, 11.012 s shorter than the picture" in r.stderr
    assert not out.parent.exists() and not (tmp_path / "ws").exists()  # nothing written
