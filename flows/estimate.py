"""`dubflow estimate`: what a film will cost before any GPU work, and the chunk price groups are sized by.

Probes the film, finds its shots, plans their chunks and runs the dub gate on each shot (speech in the
dub track's slice; for shots with speech, the face analysis: who on screen speaks, `tasks.decision.shot_decision`),
then prices the dubbed shots' chunks with the benchmark figures of the config's `estimate` section:

    GPU s = load_s + sum over chunks of (steps run x guidance branches x dit_forward_s + vae_chunk_s) x scale

`scale` is the chunk's latent frames over a full chunk's (a short last chunk costs less; attention makes
the real saving a little larger). A shot with a two-speaker segment adds one `load_s` (the multi DiT is
loaded in its place, `tasks.infinitetalk.multi`; its second audio stream is ~free). Figures that are
not measured yet (null) are reported as missing and the total is then a lower bound. TeaCache savings are not modelled (the estimate is an upper bound then).
Per-chunk CPU work (frame decode, colour, composite, FFV1 encode: ~3.5 s per 480P chunk in
benchmarks/bench_shot.py) is not counted either.

The price is the backend's (`tasks.render.backend.backend_price` / `backend_shot_price`; InfiniteTalk's:
`tasks.infinitetalk.cost`), the one pricing rule: the film run sizes its shot groups (`flows.groups.GpuCost`)
with the same hooks, filling unmeasured figures with the `cost.fallback_*` stand-ins.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.prepare import LocalSteps, prepare_film
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.decision.cast import check_cast
from tasks.errors import ConfigError
from tasks.media.probe import VideoInfo
from tasks.render.backend import backend_price, backend_shot_price
from tasks.render.cost import ChunkPrice, seconds_text
from tasks.timeline.plan import ShotPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShotEstimate:
    """One shot: the gate's decision and its chunks' GPU seconds (0 when not dubbed)."""

    index: int
    start_frame: int
    end_frame: int
    dub: bool
    reason: str
    chunks: int
    gpu_s: float
    # dubbed regions: [{"start_frame", "end_frame" (film frames), "box" (display pixels), "speaker", "score"}]
    regions: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class FilmEstimate:
    """The whole film: shots, the figures used, and the expected GPU time."""

    source: str
    frames: int
    fps: str
    display_width: int
    display_height: int
    mode: str
    precision: str
    steps: int
    branches: int
    dit_forward_s: float | None
    vae_chunk_s: float | None
    load_s: float | None
    shots: tuple[ShotEstimate, ...]
    missing: tuple[str, ...]  # figures that are not measured (null in the config)
    characters: tuple[dict[str, Any], ...] = ()  # the film's characters (tasks.decision.cast), when linked
    reference_gpu: str = ""  # the GPU the figures were measured on (`estimate.reference_gpu`)
    # the film-level verdict (`tasks.decision.film_speakers`): calibrated_s, lines, voice_lines, bound,
    # bound_lines, shots_changed; None when `speaker.film` is off
    film_speakers: dict[str, Any] | None = None

    @property
    def priced(self) -> bool:
        """False in tiny mode: tiny random weights have no GPU figures (a pipeline check, not a dub)."""
        return self.mode != "tiny"

    @property
    def dubbed(self) -> list[ShotEstimate]:
        return [s for s in self.shots if s.dub]

    @property
    def total_s(self) -> float:
        dubbed = self.dubbed
        return (self.load_s or 0.0) * bool(dubbed) + sum(s.gpu_s for s in dubbed)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shots"] = [{**dataclasses.asdict(s), "regions": list(s.regions)} for s in self.shots]
        d["missing"] = list(self.missing)
        d["dubbed_shots"] = len(self.dubbed)
        d["passthrough_shots"] = len(self.shots) - len(self.dubbed)
        d["dubbed_chunks"] = sum(s.chunks for s in self.dubbed)
        d["total_s"] = round(self.total_s, 1) if self.priced else None
        d["lower_bound"] = bool(self.missing) and self.priced
        if not self.priced:
            d["note"] = TINY_NOTE
            for shot in d["shots"]:
                shot["gpu_s"] = None
        return d

    def format(self) -> str:
        """The human-readable report `dubflow estimate` prints."""
        dubbed = self.dubbed
        chunks = sum(s.chunks for s in dubbed)
        lines = [
            f"{self.source}: {len(self.shots)} shots, {self.frames} frames at {self.fps} fps",
            f"mode {self.mode} ({self.precision}), {self.steps} steps x {self.branches} guidance branches",
            "",
            f"{'shot':>4}  {'frames':>10}  {'chunks':>6}  {'dub':>3}  {'GPU':>8}  reason",
        ]
        for s in self.shots:
            span = f"{s.start_frame}-{s.end_frame}"
            gpu = (_hms(s.gpu_s) if self.priced else "n/a") if s.dub else "-"
            lines.append(
                f"{s.index:04d}  {span:>10}  {s.chunks:>6}  {'yes' if s.dub else 'no':>3}  {gpu:>8}  {s.reason}"
            )
        lines += [
            "",
            f"dubbed: {len(dubbed)} shots ({sum(s.end_frame - s.start_frame for s in dubbed)} frames, {chunks} chunks); "
            f"passthrough: {len(self.shots) - len(dubbed)} shots",
        ]
        if not self.priced:
            lines.append(f"expected GPU time: not estimated: {TINY_NOTE}")
        else:
            lines.append(
                f"expected GPU time on {self.reference_gpu or 'the reference GPU'}: "
                f"{'at least ' if self.missing else ''}{_hms(self.total_s)} "
                f"(model load {seconds_text(self.load_s)}, DiT forward {seconds_text(self.dit_forward_s)}, "
                f"VAE per chunk {seconds_text(self.vae_chunk_s)}; other GPUs scale with their speed)"
            )
            if self.missing:
                lines.append(f"not measured (null in estimate:): {', '.join(self.missing)}")
        for c in self.characters:
            lines.append(f"character {c['id']}{' = ' + c['name'] if c['name'] else ''}: shots {c['shots']}")
        f = self.film_speakers
        if f is not None:
            lines.append(
                f"who speaks, over the film: {f['lines']} confident single-face line(s), content map calibrated on "
                f"{f['calibrated_s']} s, voices bound: {', '.join(f['bound']) or 'none'} ({f['bound_lines']} "
                f"line(s) settled), shots changed {f['shots_changed'] or 'none'}"
            )
        return "\n".join(lines)


TINY_NOTE = (
    "tiny mode (infinitetalk.mode tiny) runs tiny random weights, a pipeline check, not a dub, and has no GPU "
    "figures; set infinitetalk.mode to infinitetalk-480 or infinitetalk-720 for what the real model costs"
)


def _hms(seconds: float) -> str:
    s = round(seconds)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h}:{m:02d}:{s:02d}"


def estimate_film(
    source: str | Path,
    audio: str | Path,
    cfg: PipelineConfig,
    stems: dict[str, str] | None = None,
    *,
    work_dir: str | Path | None = None,
) -> FilmEstimate:
    """Shots, gate decisions, chunks and expected GPU seconds of dubbing `source` with `audio` (and the
    per-character dub ``stems`` {NAME: file}: characters and who speaks when, `tasks.decision.cast`): the
    film preparation (`flows.prepare.prepare_film`) as plain calls, then the price of each dubbed shot.
    The face analyses and embeddings are kept under ``work_dir`` (default: a temporary folder), where a
    later estimate finds them."""
    # the one pricing rule, shared with shot-group sizing (checks the options first)
    price, priced = _price(cfg)
    check_cast(cfg, stems)  # stills exist, stems name characters: before any decoding
    with tempfile.TemporaryDirectory(prefix="dubflow-estimate-") as scratch:
        steps = LocalSteps(cfg, Path(scratch), Path(work_dir) if work_dir else None)
        film = prepare_film(str(source), str(audio), cfg, steps, stems=stems)
    out = []
    for r in film.records:
        plan, d = ShotPlan.from_dict(r["plan"]), r["decision"]
        regions = tuple(d["regions"])
        gpu = backend_shot_price(priced, price, plan, regions) if d["dub"] else 0.0
        out.append(
            ShotEstimate(
                r["index"],
                plan.start_frame,
                plan.end_frame,
                d["dub"],
                d["reason"],
                len(plan.chunks),
                gpu,
                regions,
            )
        )
    width, height = VideoInfo.from_dict(film.video).display_size
    return FilmEstimate(
        source=str(source), frames=film.shots["frame_count"], fps=str(film.shots["fps"]), display_width=width,
        display_height=height, mode=price.mode, precision=price.precision, steps=price.steps,
        branches=price.branches, dit_forward_s=price.dit_forward_s, vae_chunk_s=price.vae_chunk_s,
        load_s=price.load_s, shots=tuple(out), missing=price.missing,
        characters=film.cast.characters if film.cast is not None else (), reference_gpu=cfg.estimate.reference_gpu,
        film_speakers=film.speakers,
    )  # fmt: skip


def _price(cfg: PipelineConfig) -> tuple[ChunkPrice, str]:
    """The chunk price of `cfg`'s backend and that backend's name. A backend that prices no GPU work (the
    passthrough dry run) is priced as the default config's backend with no options of its own: what a real
    run of the same settings would cost."""
    price = backend_price(cfg)
    if price is not None:
        return price, cfg.backend.name
    dubbing = dataclasses.replace(cfg.backend, name=load_config().backend.name, options={})
    price = backend_price(dataclasses.replace(cfg, backend=dubbing))
    if price is None:
        raise ConfigError(
            "backend.name", f"neither {cfg.backend.name!r} nor {dubbing.name!r} prices GPU work"
        )
    return price, dubbing.name
