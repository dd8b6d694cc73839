"""Who speaks, replayed: record the composed cases' analysis once, then try the speaker rules on it in seconds.

``record`` puts each composed case of `tests/av_cases.py` (``--splits``) through the same steps as
`bench_av_speaker.py` (encode as a film, `decide_shot`, the gate's turns, `judge`) and keeps, per case, what the
rules after the expensive analysis read: the agreement route's segments, the network's scores and sync leads
per face and frame, the still-picture test's rows, the speech probability, the source sound the voice check
embeds, and the shot's analysis (`ShotFaces` JSON).  ``replay`` re-runs from there (`find_asd_speakers`,
`fuse_asd` with its doubt rules, the voice rule, `name_likeliest`, the gate's turns, `judge`) and prints
right / uncertain / wrong over the recorded cases, first with every rule (it must equal the recorded verdicts),
then each variant asked for, with the cases that change: rules left out, or an extra rule on the confident
segments (a bar on a second face's network score, a box on both routes' margins).  ``--set speaker.KEY=VALUE``
applies to the replayed rules only (the analysis and the agreement route are as recorded).  Records are JSON +
npz (no pickle), the JSON written last and atomically (a case without it is recorded again), read back only by
this tool.  CPU only: recording takes ~7 s a case (210 in 12 min as two processes on 2 cores), replaying all 210
about a minute.  Must not be imported by the pipeline.

    PYTHONPATH=. python benchmarks/speaker_replay.py record --splits tune,held_out --dir /tmp/speaker_rec
    PYTHONPATH=. python benchmarks/speaker_replay.py replay --dir /tmp/speaker_rec \
        [--without shot --without shot,out_of_sync ...] [--second-face-bar 0.5,1.0] [--margin-box 1.1:0.21] \
        [--set speaker.KEY=VALUE ...] [--detail]

``--detail`` adds, per run, right / uncertain / wrong per kind of case and the turn-taking cases' dubbed switches
(`switch_of`); ``record --splits still_listener`` records `tests/av_cases.py`'s speaker-beside-a-still-listener set.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tasks.perception.asd_speaker as asd_speaker
import tasks.perception.face_analysis as face_analysis
from scripts.fit_content_prior import load_heads
from tasks.config.pipeline import load_config
from tasks.decision.gate import speaker_turns
from tasks.decision.shot_decision import decide_shot
from tasks.files import atomic_write_bytes
from tasks.media.probe import probe
from tasks.perception.content import ContentMap, audio_features, fit, load_prior
from tasks.perception.content_fusion import ContentEvidence
from tasks.perception.face_analysis import ShotFaces
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.vad import RATE
from tasks.perception.verdict import STAGES, VerdictInputs, speaker_verdict
from tests.av_cases import SETS, STILL_LISTENER, _builders, beside_still, close_up, judge
from tests.speaker_cases import FPS, SEEDS, SR, encode

RULES = {"shot", "out_of_sync", *STAGES}  # what --without can leave out
# a variant's extra rule: (confident segments, network scores (n_tracks, T), agreement (n_tracks, steps), step)
Hook = Callable[[list[SpeakerSegment], np.ndarray, np.ndarray, int], list[SpeakerSegment]]


@dataclasses.dataclass(frozen=True)
class LiteCase:
    """What `judge` reads of a case: its length, sound, truth and onsets (no frames kept)."""

    frames: np.ndarray  # (T, 0): only the length is read
    audio: np.ndarray
    truth: tuple[tuple[int, int, int | None], ...]
    onsets: tuple[int, ...]


def _file(root: Path, name: str) -> Path:
    return root / name.replace("/", "_")


def _seeds() -> list[int]:
    """The seeds whose clip is present (heads 1-9 are committed, 10-26 re-cut by tests/data/README.md)."""
    return sorted(int(p.stem[4:]) for p in SEEDS.glob("head*.mp4") if p.stem[4:].isdigit())


def record(splits: list[str], root: Path, cfg: Any) -> None:
    """Each case through the bench's steps, its rule inputs written to ``root`` (existing records kept)."""
    root.mkdir(parents=True, exist_ok=True)
    seen: dict[str, Any] = {}
    real = face_analysis.speaker_verdict

    def verdict(
        inputs: VerdictInputs, cfg_sp, skip=()
    ):  # the stages' inputs, as the pipeline hands them over
        seen.update(inputs=inputs)
        return real(inputs, cfg_sp, skip)

    def analyse(*args, **kw):  # the source's sound as the voice check embeds it, whether or not it runs
        audio = kw.get("audio", args[7] if len(args) > 7 else None)
        if audio is not None:
            seen.update(voice=np.asarray(audio, np.float32))
        return real_analyse(*args, **kw)

    real_analyse = face_analysis.analyse_frames
    face_analysis.speaker_verdict, face_analysis.analyse_frames = verdict, analyse
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for split in splits:
                if split == "close_up":  # a lone face saying its own line, every seed present
                    made = {f"close_up/close_up_{i}": functools.partial(close_up, i) for i in _seeds()}
                elif split == "still_listener":  # a speaker beside a still listener (committed seeds)
                    made = {f"still_listener/s{a}_l{b}_{side}": functools.partial(beside_still, a, b, side)
                            for a, b, side in STILL_LISTENER}  # fmt: skip
                else:
                    made = {f"{split}/{k}": build for k, build in _builders(split, SETS[split]).items()}
                for name, build in made.items():
                    if _file(root, name).with_suffix(".json").is_file():
                        continue
                    seen.clear()
                    case = build()  # one case's frames at a time (a set's are ~1.3 GB)
                    info = probe(encode(Path(tmp) / "case.mp4", case.frames, case.audio))
                    shot = decide_shot(0, 0, info.frame_count, info, case.audio, SR, cfg).faces
                    who = {t.id: case.who(t.boxes[0]) for t in shot.tracks}
                    turns = [
                        (t.start, t.end, None if t.track is None else who[t.track], t.status)
                        for t in speaker_turns(shot, cfg.speaker.uncertain, cfg.speaker.min_score)
                    ]
                    verdict = judge(case, turns)
                    arrays = _arrays(seen.get("inputs"), seen.get("voice"))
                    np.savez_compressed(_file(root, name).with_suffix(".npz"), audio=case.audio, **arrays)
                    meta = {
                        "name": name, "n": int(case.frames.shape[0]), "onsets": [int(v) for v in case.onsets],
                        "truth": [(int(a), int(b), None if k is None else int(k)) for a, b, k in case.truth],
                        "who": {str(k): int(v) for k, v in who.items()}, "shot": shot.to_dict(),
                        "agreed": None if "inputs" not in seen else [d.to_dict() for d in seen["inputs"].agreed],
                        "n_frames": None if "inputs" not in seen else seen["inputs"].n_frames,
                        "fps": None if "inputs" not in seen else seen["inputs"].fps,
                        "verdict": verdict.result, "why": verdict.why,
                    }  # fmt: skip
                    atomic_write_bytes(_file(root, name).with_suffix(".json"), json.dumps(meta).encode())
                    print(f"{name}: {verdict.result} ({verdict.why})", flush=True)
    finally:
        face_analysis.speaker_verdict, face_analysis.analyse_frames = real, real_analyse


def _arrays(inputs: VerdictInputs | None, voice: np.ndarray | None) -> dict[str, np.ndarray]:
    """The stage inputs kept per case: Light-ASD's rows, the still test's, the speech, the mouth shapes, the
    source's sound as decoded (voices, the content's audio features)."""
    out = {} if voice is None else {"voice": voice}
    if inputs is None:
        return out
    out.update(change=inputs.change, speech_prob=inputs.speech_prob)
    if inputs.scores is not None and inputs.lead is not None:
        out.update(scores=inputs.scores, lead=inputs.lead)
    if inputs.content is not None:
        out.update(shapes=inputs.content.shapes.astype(np.float32), still=inputs.content.still)
    return out


class Replayer:
    """The rules after the analysis, on one directory of records; voice embeddings computed once per span."""

    def __init__(self, root: Path, cfg: Any, heads: Path | None = None, detail: bool = False) -> None:
        self.cfg = cfg
        self.detail = detail  # print each run's verdicts per kind of case and the turn-taking switches
        self.prior = load_prior()
        # with ``heads`` (scripts/fit_content_prior.py --cache): per case a map fitted without its own seeds
        self.heads = None if heads is None else load_heads(heads)
        self.cases = []
        for meta_path in sorted(root.glob("*.json")):
            meta = json.loads(meta_path.read_text())
            with np.load(meta_path.with_suffix(".npz"), allow_pickle=False) as z:
                meta["arrays"] = {k: z[k] for k in z.files}
            self.cases.append(meta)
        self._voices: dict[tuple[str, tuple[int, int]], np.ndarray] = {}
        self.turns: dict[str, list[tuple[int, int, int | None, str]]] = {}  # the last run's gate turns

    def _voices_of(self, meta: dict[str, Any]) -> Callable[[list[tuple[int, int]]], np.ndarray]:
        def embed(spans):
            missing = [s for s in spans if (meta["name"], s) not in self._voices]
            if missing:
                got = face_analysis._voices_of(meta["arrays"]["voice"], meta["fps"])(missing)
                self._voices.update({(meta["name"], s): e for s, e in zip(missing, got, strict=True)})
            return np.stack([self._voices[(meta["name"], s)] for s in spans])

        return embed

    @functools.cache  # noqa: B019 (one Replayer per run)
    def _map_without(self, seeds: frozenset[int]) -> ContentMap:
        assert self.heads is not None
        rest = [k for k in self.heads if k not in seeds]
        x = np.concatenate([self.heads[k][0] for k in rest])
        return fit(x, np.concatenate([self.heads[k][1] for k in rest]), self.prior.lam)

    def content_map(self, name: str) -> ContentMap:
        """The map a case is judged with: the shipped prior, or (``heads``) one fitted without the case's seeds."""
        if self.heads is None:
            return self.prior
        split, case = name.split("/")
        m = SETS.get(split)
        seeds = frozenset((m.a, m.b, m.c)) if m is not None else frozenset()
        if split == "close_up":
            seeds = frozenset({int(case.rsplit("_", 1)[1])})
        if split == "still_listener":  # "s<speaker>_l<listener>_<side>"
            speaker, listener, _side = case.split("_")
            seeds = frozenset({int(speaker[1:]), int(listener[1:])})
        return self._map_without(seeds & set(self.heads))

    def verdict(self, meta: dict[str, Any], without: set[str], hook: Hook | None) -> str:
        """One case's verdict with the named rules left out and ``hook`` run on the confident segments."""
        if meta["agreed"] is None:  # no stage ran (no face): as recorded
            return meta["verdict"]
        sp, arr, fps = self.cfg.speaker, meta["arrays"], meta["fps"]
        n = meta["n_frames"]
        content = None
        if "shapes" in arr and "voice" in arr:
            feats = audio_features(arr["voice"], RATE, n, fps)
            shot = meta["shot"]  # faces too small to judge: median side in analysis pixels
            to_analysis = shot["analysis_hw"][0] / shot["display_hw"][0]
            small = np.array([t["side_px"] * to_analysis < sp.content_min_px for t in shot["tracks"]], bool)
            still = (
                arr["still"] | small[: len(arr["still"])] if len(small) >= len(arr["still"]) else arr["still"]
            )
            content = ContentEvidence(
                self.content_map(meta["name"]).predict(feats),
                arr["shapes"],
                arr["speech_prob"] >= 0.5,
                fps,
                still,
            )
        voices = self._voices_of(meta) if "voice" in arr else None
        inputs = VerdictInputs(
            n, fps, [SpeakerSegment.from_dict(d) for d in meta["agreed"]], arr["change"], arr["speech_prob"],
            arr.get("scores"), arr.get("lead"), content, voices,
        )  # fmt: skip
        keep = asd_speaker.doubt_out_of_sync, asd_speaker.doubt_contradicted_shot
        if "out_of_sync" in without:
            asd_speaker.doubt_out_of_sync = lambda segs, sync: segs
        if "shot" in without:
            asd_speaker.doubt_contradicted_shot = lambda segs, *rest: segs
        stages = without & set(STAGES)
        if hook is not None:
            stages |= {"likeliest"}
        try:
            segs = speaker_verdict(inputs, sp, stages)
        finally:
            asd_speaker.doubt_out_of_sync, asd_speaker.doubt_contradicted_shot = keep
        if hook is not None:
            shot_d = meta["shot"]
            agree = np.array(
                [[np.nan if v is None else v for v in row] for row in shot_d.get("agreement") or []]
            )
            segs = hook(segs, arr["scores"], agree.reshape(len(agree), -1), int(shot_d["step_frames"]))
            if inputs.lead is not None and "likeliest" not in without:
                segs = asd_speaker.name_likeliest(segs, inputs.lead)
        shot = dataclasses.replace(ShotFaces.from_dict(meta["shot"]), segments=tuple(segs))
        who = {int(k): v for k, v in meta["who"].items()}
        turns = [
            (t.start, t.end, None if t.track is None else who[t.track], t.status)
            for t in speaker_turns(shot, sp.uncertain, sp.min_score)
        ]
        truth = tuple((a, b, k) for a, b, k in meta["truth"])
        case = LiteCase(np.empty((meta["n"], 0)), arr["audio"], truth, tuple(meta["onsets"]))
        self.turns[meta["name"]] = turns
        return judge(case, turns).result  # type: ignore[arg-type]

    def run(self, label: str, without: set[str] | None = None, hook: Hook | None = None,
            base: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
        """Every case's verdict, counted and printed with the cases that differ from ``base``."""
        got = {m["name"]: self.verdict(m, without or set(), hook) for m in self.cases}
        n = collections.Counter(got.values())
        print(f"{label}: {n['right']} right / {n['uncertain']} uncertain / {n['wrong']} wrong of {len(got)}")
        for name in sorted(got):
            if base is not None and got[name] != base[name]:
                print(f"  {name}: {base[name]} -> {got[name]}")
        if self.detail:
            self.report(got)
        return got

    def report(self, got: dict[str, str]) -> None:
        """Right / uncertain / wrong per kind of case, and the turn-taking cases' switches."""
        kinds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for name, result in got.items():
            kinds[kind_of(name)][result] += 1
        print("  per kind (right/uncertain/wrong): " + ", ".join(
            f"{k} {c['right']}/{c['uncertain']}/{c['wrong']}" for k, c in sorted(kinds.items())))  # fmt: skip
        metas = {m["name"]: m for m in self.cases}
        rows = [(name, switch_of(metas[name]["truth"], self.turns[name]))
                for name in sorted(got) if kind_of(name) == "turn_taking" and name in self.turns]  # fmt: skip
        if not rows:
            return
        for name, (dubbed, sure) in rows:
            print(f"  {name}: dubbed switch {_s(dubbed)}, both turns confident: {sure}")
        errs = np.array([abs(d) for _, (d, _s2) in rows if d is not None])
        both = np.array([abs(d) for _, (d, sure) in rows if d is not None and sure])
        for what, e in (("every case with a dubbed switch", errs), ("both turns confident", both)):
            if len(e):
                print(f"  switch error, {what}: {len(e)} of {len(rows)} cases, median {np.median(e):.2f} s, "
                      f"<= 0.2 s: {int((e <= 0.2 + 1e-9).sum())}, <= 0.4 s: {int((e <= 0.4 + 1e-9).sum())}, "
                      f"max {e.max():.2f} s")  # fmt: skip


def kind_of(name: str) -> str:
    """The kind of a case ("held_out_7/turn_taking" -> "turn_taking"; close-ups, a still listener: their set)."""
    split, case = name.split("/")
    return split if split in ("close_up", "still_listener") else case


def switch_of(
    truth: list[tuple[int, int, int | None]], turns: list[tuple[int, int, int | None, str]]
) -> tuple[float | None, bool]:
    """(dubbed switch minus the true one in seconds, both turns confident) of a two-turn case: the dubbed switch
    is the start of the first turn on the second speaker's face right after one on the first speaker's, whatever
    their status (what `speaker.uncertain: most_likely` dubs; None: no such switch); "both confident": each
    true turn has at least half of its frames in confident turns on its own face."""
    (a0, b0, k0), (a1, b1, k1) = truth[0], truth[1]
    on = [(a, k) for a, _b, k, _st in turns if k is not None]  # the dubbed turns
    pairs = zip(on, on[1:], strict=False)
    start = next((a for (_p, kp), (a, k) in pairs if kp == k0 and k == k1), None)
    dubbed = None if start is None else round((start - a1) / FPS, 2)

    def sure(a: int, b: int, k: int | None) -> bool:
        hit = sum(max(0, min(b, e) - max(a, s)) for s, e, kk, st in turns if kk == k and st != "uncertain")
        return 2 * hit >= b - a

    return dubbed, sure(a0, b0, k0) and sure(a1, b1, k1)


def _s(v: float | None) -> str:
    return "none" if v is None else f"{v:+.2f} s"


def _span_means(rows: np.ndarray, a: int, b: int) -> np.ndarray:
    """Each row's mean over columns [a, b), NaN where a row has none there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a face absent over the span: NaN
        return np.nanmean(rows[:, a:b], axis=1) if rows.size else np.zeros(0)


def _doubt(segs: list[SpeakerSegment], rival: Callable[[SpeakerSegment], int | None]) -> list[SpeakerSegment]:
    """Confident segments for which ``rival`` names a face made uncertain, that face the runner-up."""
    out = []
    for s in segs:
        other = rival(s) if s.status == "speaker" and s.speaker is not None else None
        if other is not None:
            s = dataclasses.replace(s, status="uncertain", score=round(0.5 * s.score, 3), runner_up=other)
        out.append(s)
    return out


def second_face_bar(bar: float) -> Hook:
    """A confident segment beside another scored face whose mean network score over it reaches ``bar``
    (two faces the network takes for speaking: the two-speaker case) becomes uncertain."""

    def hook(segs, scores, agree, step):
        def rival(s: SpeakerSegment) -> int | None:
            means = _span_means(scores, s.start_frame, s.end_frame)
            return next((j for j, m in enumerate(means) if j != s.speaker and m >= bar), None)

        return _doubt(segs, rival)

    return hook


def margin_box(net: float, agr: float) -> Hook:
    """A confident segment whose face leads every other scored face by at most ``net`` in mean network score,
    and every other face by at most ``agr`` in mean agreement, over it (close on both routes) is uncertain."""

    def hook(segs, scores, agree, step):
        def rival(s: SpeakerSegment) -> int | None:
            k, m = s.speaker, _span_means(scores, s.start_frame, s.end_frame)
            a = _span_means(agree, s.start_frame // step, -(-s.end_frame // step))
            scored = [j for j in range(len(m)) if j != k and not np.isnan(m[j])]
            agreed = [j for j in range(len(a)) if j != k and not np.isnan(a[j])]
            if k >= min(len(m), len(a)) or np.isnan(m[k]) or np.isnan(a[k]) or not scored or not agreed:
                return None
            j = max(scored, key=lambda j: m[j])
            return j if m[k] - m[j] <= net and a[k] - max(a[o] for o in agreed) <= agr else None

        return _doubt(segs, rival)

    return hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("record", "replay"))
    ap.add_argument("--dir", required=True, type=Path, help="the records' folder")
    ap.add_argument(
        "--splits",
        default="tune,held_out",
        help="record: comma-separated sets of tests/av_cases.py, close_up (every seed present alone, own line) "
        "or still_listener (tests/av_cases.py STILL_LISTENER)",
    )
    ap.add_argument(
        "--without",
        action="append",
        default=[],
        help="replay: also without these rules (comma-separated of shot, out_of_sync and the stages "
        + ", ".join(STAGES)
        + "; repeatable)",
    )
    ap.add_argument(
        "--second-face-bar", default="", help="replay: also with a second-face bar at these scores"
    )
    ap.add_argument(
        "--margin-box", action="append", default=[], metavar="NET:AGR", help="replay: also with a margin box"
    )
    ap.add_argument(
        "--heads",
        type=Path,
        help="replay: the heads' cache of scripts/fit_content_prior.py: "
        "each case judged by a content map fitted without its own seeds (no prior leak)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument(
        "--detail", action="store_true", help="replay: each run per kind of case, turn-taking's switches"
    )
    args = ap.parse_args()
    cfg = load_config(overrides=args.set)
    if args.step == "record":
        record(args.splits.split(","), args.dir, cfg)
        return
    rep = Replayer(args.dir, cfg, args.heads, args.detail)
    recorded = {m["name"]: m["verdict"] for m in rep.cases}
    n = collections.Counter(recorded.values())
    print(
        f"recorded: {n['right']} right / {n['uncertain']} uncertain / {n['wrong']} wrong of {len(recorded)}"
    )
    base = rep.run("replayed, every rule", base=recorded)
    for group in args.without:
        rules = set(group.split(","))
        if not rules <= RULES:
            raise SystemExit(f"--without {group}: the rules are {', '.join(sorted(RULES))}")
        rep.run(f"without {', '.join(sorted(rules))}", rules, base=base)
    for bar in filter(None, args.second_face_bar.split(",")):
        rep.run(f"second-face bar {bar}", hook=second_face_bar(float(bar)), base=base)
    for box in args.margin_box:
        net, agr = (float(v) for v in box.split(":"))
        rep.run(f"margin box {net}:{agr}", hook=margin_box(net, agr), base=base)


if __name__ == "__main__":
    main()
