"""What `benchmarks/film_gpu.py` reads back after its two film runs, the figures it reports and its checks.

`collect` reads the Prefect API (the two film runs and their task runs, every `dub-group` run of the film's
workspace and their per-shot task runs, the shot table / groups / summary artifacts) and the workspace
(attempts.jsonl, each shot's done.json) into plain dicts. `figures` and `run_checks` are pure functions of
those. Definitions (also in benchmarks/README.md):
* GPU seconds: the sum over group runs of their Running span (flow run start -> end; the killed group run's
  span ends at the kill), one GPU each: the time a GPU was held by a group process;
* model loads: per group process (pid of its attempts), its group's warmed load before the first shot
  (`groups/loads.jsonl`: models + compile warm-up at the planned sizes) plus the largest `load` stage of
  its shots (what a shot still loaded itself, e.g. without a planned size); `--tiny` counts loads over
  0.05 s, a GPU run over 1 s; the group lead-in is stated without the warmed loads;
* H200-s per second of dubbed dialogue = (GPU seconds - model loads) / seconds of the shots the run dubbed
  (it includes what the kill cost: the lost chunk, the second group process's start); per second of film
  likewise over the film's length; both also with the loads; and over the Completed shot task runs alone
  (no group lead-in, no gaps, no lost chunk); and "uninterrupted": those shot task runs plus the gaps
  between shots and every group run's lead-in and tail, i.e. the run less its loads and less the work the
  kill threw away (the killed attempt of its shot): what the film costs a worker that is not killed;
* GPU idle between shots = the gaps between consecutive shot task runs inside a group run / (GPU seconds -
  model loads); the group's lead-in (process start, imports, flow load) and tail are stated apart;
  NVML utilisation (sampled by the driver every 0.1 s) is reported over the same windows when available;
* planning = film run start -> its first group task's start; assembly = its last group task's end -> end.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def _t(value: Any) -> float | None:
    return value.timestamp() if value is not None else None


def _run(r: Any) -> dict[str, Any]:
    state = r.state
    return {
        "id": str(r.id),
        "name": r.name,
        "state_type": state.type.value if state else None,
        "state_name": state.name if state else None,
        "message": state.message if state else None,
        "start": _t(r.start_time),
        "end": _t(r.end_time),
        "flow_run_id": str(getattr(r, "flow_run_id", "") or ""),
        "task_key": getattr(r, "task_key", None),  # task runs: run_deployment's stand-in for a child run
    }


def workspace_of(root: Path) -> Any:
    from tasks.files import read_json
    from tasks.run.workspace import Workspace

    (path,) = root.glob("film-*")
    manifest = read_json(path / "workspace.json")
    return Workspace(root=str(root), key=manifest["key"], incarnation=manifest["incarnation"])


def _artifact(client: Any, key: str) -> Any:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    if not found:
        return None
    data = max(found, key=lambda a: a.created).data
    return json.loads(data) if isinstance(data, str) and data[:1] in "[{" else data


def collect(stack: Any, manifest: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Everything the figures and checks use, as plain data (see the module doc)."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId

    from flows.film_tasks import film_tag
    from flows.shot_task import QC_RECORD
    from tasks.media.intermediates import read_marker
    from tasks.run.workspace import read_attempts, read_group_loads, read_shot_done

    ws = workspace_of(stack.workspace)
    tag = film_tag(manifest["film"])
    ids = [result[k]["flow_run_id"] for k in ("first_run", "resume_run") if k in result]
    with stack.client() as client:
        films = [_run(client.read_flow_run(i)) for i in ids]
        groups = [
            _run(g)
            for g in client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["dub-group"])))
            if g.parameters.get("ws", {}).get("key") == ws.key
        ]
        groups.sort(key=lambda g: g["start"] or float("inf"))
        by_flow = FlowRunFilter(
            id=FlowRunFilterId(any_=[g["id"] for g in groups] or ["00000000-0000-0000-0000-000000000000"])
        )
        shot_tasks = [_run(t) for t in client.read_task_runs(flow_run_filter=by_flow, limit=200)]
        film_tasks = [
            _run(t)
            for t in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=200
            )
        ]
        table = _artifact(client, f"{tag}-shots")
        groups_table = _artifact(client, f"{tag}-groups")
        summary = _artifact(client, f"{tag}-summary")
    attempts = read_attempts(ws)
    keys = {a["shot"]: a["key"] for a in attempts}
    done = {i: (read_shot_done(ws, i, k) or {}).get("result") for i, k in keys.items()}
    qc = {i: read_marker(ws.shot_dir(i, k) / QC_RECORD) for i, k in keys.items()}  # written beside renders
    return {
        "workspace": str(ws.path), "films": films, "groups": groups,
        "shot_tasks": [t for t in shot_tasks if t["name"].startswith("shot-")],
        "film_tasks": film_tasks, "table": table, "groups_table": groups_table, "summary": summary,
        "attempts": attempts, "done": done, "qc": qc, "group_loads": read_group_loads(ws),
    }  # fmt: skip


def _index(task: dict[str, Any]) -> int:
    return int(task["name"][5:9])


def _windows(data: dict[str, Any], kill: dict[str, Any] | None) -> list[tuple[float, float, dict[str, Any]]]:
    out = []
    for g in data["groups"]:
        end = kill["time"] if kill and g["id"] == kill["group_run_id"] else g["end"]
        if g["start"] and end:
            out.append((g["start"], end, g))
    return out


def _nvml_idle(samples: list[list[float]], spans: list[tuple[float, float]]) -> float | None:
    """Mean idle % (100 - utilisation, averaged over GPUs) of the samples inside `spans`."""
    vals = [
        100.0 - statistics.fmean(s[1:])
        for s in samples
        if len(s) > 1 and any(a <= s[0] <= b for a, b in spans)
    ]
    return round(statistics.fmean(vals), 1) if vals else None


def figures(data: dict[str, Any], manifest: dict[str, Any], result: dict[str, Any],
            samples: list[list[float]], *, tiny: bool) -> dict[str, Any]:  # fmt: skip
    kill = result.get("kill")
    windows = _windows(data, kill)
    gpu_s = sum(e - s for s, e, _ in windows)
    pid_of = {a["shot"]: a.get("pid") for a in data["attempts"] if a["status"] == "done"}
    loads: dict[Any, float] = {}
    for shot, res in data["done"].items():
        load = ((res or {}).get("timings_s") or {}).get("load")
        if isinstance(load, int | float):
            loads[pid_of.get(shot)] = max(loads.get(pid_of.get(shot), 0.0), float(load))
    warmed: dict[Any, float] = {}  # the groups' loads before their first shot (in their lead-in)
    for rec in data.get("group_loads", []):  # readbacks from before the warmed load have none
        warmed[rec.get("pid")] = warmed.get(rec.get("pid"), 0.0) + float(rec.get("total_s") or 0.0)
    for pid, seconds in warmed.items():
        loads[pid] = loads.get(pid, 0.0) + seconds
    loads = {p: v for p, v in loads.items() if v >= (0.05 if tiny else 1.0)}
    span = {s["index"]: s["end_s"] - s["start_s"] for s in manifest["shots"]}
    dubbed = sorted(i for i, r in data["done"].items() if r and r.get("dubbed"))
    dubbed_s = sum(span[i] for i in dubbed)
    work_s = gpu_s - sum(loads.values())
    rendered = [t for t in data["shot_tasks"] if t["state_name"] == "Completed" and t["start"] and t["end"]]
    in_shots = sum(v - warmed.get(p, 0.0) for p, v in loads.items())  # the loads inside shot task runs
    shots_s = sum(t["end"] - t["start"] for t in rendered) - in_shots  # no lead-in, gaps, lost chunk
    gaps, leads, tails, gap_spans = 0.0, 0.0, 0.0, []
    for start, end, g in windows:
        tasks = sorted((t for t in data["shot_tasks"] if t["flow_run_id"] == g["id"] and t["start"]),
                       key=lambda t: t["start"])  # fmt: skip
        if not tasks:
            continue
        leads += tasks[0]["start"] - start
        for a, b in zip(tasks, tasks[1:], strict=False):
            if a["end"] and b["start"] > a["end"]:
                gaps += b["start"] - a["end"]
                gap_spans.append((a["end"], b["start"]))
        if tasks[-1]["end"] and end > tasks[-1]["end"]:
            tails += end - tasks[-1]["end"]
    leads -= sum(warmed.values())  # stated as model loads
    per_film = {}
    for label, film in zip(("first_run", "resume_run"), data["films"], strict=False):
        groups = [
            t for t in data["film_tasks"] if t["flow_run_id"] == film["id"] and t["name"].startswith("group-")
        ]
        starts = [t["start"] for t in groups if t["start"]]
        ends = [t["end"] for t in groups if t["end"]]
        steps = {t["name"]: round(t["end"] - t["start"], 2) for t in data["film_tasks"]
                 if t["flow_run_id"] == film["id"] and t["start"] and t["end"] and not t["name"].startswith("group-")
                 and "run_deployment" not in (t.get("task_key") or "")}  # fmt: skip
        per_film[label] = {
            "state": film["state_name"],
            "wall_s": round(film["end"] - film["start"], 1) if film["start"] and film["end"] else None,
            "planning_s": round(min(starts) - film["start"], 1) if starts and film["start"] else None,
            "assembly_s": round(film["end"] - max(ends), 1) if ends and film["end"] and film["state_type"] == "COMPLETED" else None,
            "steps_s": steps,
        }  # fmt: skip
    per_shot = []  # where a shot's GPU time went: its Completed task run's wall and its render's stages
    for t in sorted(rendered, key=_index):
        res = data["done"].get(_index(t)) or {}
        per_shot.append({"shot": _index(t), "wall_s": round(t["end"] - t["start"], 1),
                         "s": round(span.get(_index(t), 0.0), 3), "dubbed": bool(res.get("dubbed")),
                         "chunks": res.get("chunks"), "timings_s": res.get("timings_s") or {},
                         "qc_s": (data.get("qc", {}).get(_index(t)) or {}).get("seconds")})  # fmt: skip
    first, last = data["films"][0], data["films"][-1]
    group_name = {g["id"]: g["name"] for g in data["groups"]}
    kill_attempts = [
        f"{group_name.get(t['flow_run_id'], '?')} ({t['flow_run_id'][:8]}): {t['state_name']}"
        for t in sorted(data["shot_tasks"], key=lambda t: t["start"] or 0)
        if kill and _index(t) == kill["shot"]
    ]
    return {
        "group_states": [f"{g['name']} ({g['id'][:8]}): {g['state_name']}" for g in data["groups"]],
        "kill_shot_task_runs": kill_attempts,
        "kill_shot_chunks_resumed": (data["done"].get(kill["shot"]) or {}).get("chunks_resumed") if kill else None,
        "film_s": manifest["film_s"], "shots": len(manifest["shots"]), "dubbed_shots": dubbed,
        "dubbed_dialogue_s": round(dubbed_s, 2),
        "film_wall_s": round(last["end"] - first["start"], 1) if last["end"] and first["start"] else None,
        "runs": per_film,
        "gpu_s": round(gpu_s, 1), "group_runs": len(windows),
        "model_loads": len(loads), "model_load_s": sorted(round(v, 1) for v in loads.values()),
        "gpu_s_per_dialogue_s": round(work_s / dubbed_s, 2) if dubbed_s else None,
        "gpu_s_per_dialogue_s_with_loads": round(gpu_s / dubbed_s, 2) if dubbed_s else None,
        "gpu_s_per_dialogue_s_shot_tasks": round(shots_s / dubbed_s, 2) if dubbed_s else None,
        "gpu_s_per_dialogue_s_uninterrupted": round((shots_s + gaps + leads + tails) / dubbed_s, 2)
        if dubbed_s else None,
        "gpu_s_per_film_s": round(work_s / manifest["film_s"], 2),
        "gpu_s_per_film_s_with_loads": round(gpu_s / manifest["film_s"], 2),
        "idle_between_shots_s": round(gaps, 2),
        "idle_between_shots_pct": round(100 * gaps / work_s, 2) if work_s > 0 else None,
        "group_lead_in_s": round(leads, 1), "group_tail_s": round(tails, 1),
        "nvml_idle_pct_group_runs": _nvml_idle(samples, [(s, e) for s, e, _ in windows]),
        "nvml_idle_pct_between_shots": _nvml_idle(samples, gap_spans),
        "nvml_idle_pct_in_shots": _nvml_idle(samples, [(t["start"], t["end"]) for t in rendered]),
        "per_shot": per_shot,
    }  # fmt: skip


def run_checks(
    data: dict[str, Any], manifest: dict[str, Any], result: dict[str, Any], out: Path
) -> list[str]:
    """One line per failed check (empty: every check passed); mismatches of the composition's
    expectations go to data["warnings"]."""
    from tasks.media.probe import probe

    fail: list[str] = []
    kill, n = result["kill"], len(manifest["shots"])
    first, resume = (data["films"] + [None, None])[:2]
    retried = first is not None and first["state_type"] == "COMPLETED"  # the lost group re-run in it
    if first is None or first["state_type"] not in ("FAILED", "COMPLETED"):
        fail.append(f"the killed film run ended {first and first['state_name']}, not Failed or Completed")
    if resume is None or resume["state_type"] != "COMPLETED":
        fail.append(
            f"the resumed film run ended {resume and resume['state_name']}: {resume and resume['message']}"
        )
    first_end = kill.get("attempts_after_first_run")
    if retried and first_end is not None:
        again = [a["shot"] for a in data["attempts"][first_end:] if a["status"] == "done"]
        if again:
            fail.append(f"the film run completed after the kill, yet the re-run rendered shots {again}")
    done_lines = [a for a in data["attempts"] if a["status"] == "done"]
    counts = {i: sum(a["shot"] == i for a in done_lines) for i in range(n)}
    if any(c != 1 for c in counts.values()):
        fail.append(f"attempts.jsonl: done lines per shot {counts} (each shot must render once)")
    after = {a["shot"] for a in data["attempts"][kill["attempts_at_kill"] :] if a["status"] == "done"}
    rerendered = sorted(set(range(n)) - set(kill["done_at_kill"]))
    if sorted(after) != rerendered or kill["shot"] not in rerendered:
        fail.append(f"shots rendered after the kill {sorted(after)}, expected the unfinished {rerendered}")
    tasks: dict[int, list[dict[str, Any]]] = {}
    for t in data["shot_tasks"]:
        tasks.setdefault(_index(t), []).append(t)
    completed = {i: sum(t["state_name"] == "Completed" for t in tasks.get(i, [])) for i in range(n)}
    if any(c != 1 for c in completed.values()):
        fail.append(f"Completed shot task runs per shot {completed} (each shot: exactly one)")
    killed = [t for t in tasks.get(kill["shot"], []) if t["id"] == kill["task_run_id"]]
    later = [
        t
        for t in tasks.get(kill["shot"], [])
        if t["state_name"] == "Completed" and t["flow_run_id"] != kill["group_run_id"]
    ]
    if not killed or killed[0]["state_name"] == "Completed" or not later:
        fail.append(
            f"shot {kill['shot']:04d}: no two attempts (killed task run {killed and killed[0]['state_name']}, a later Completed one: {bool(later)})"
        )
    lost = next((g for g in data["groups"] if g["id"] == kill["group_run_id"]), None)
    if lost is None or lost["state_type"] not in ("CRASHED", "FAILED"):
        fail.append(f"the killed group run ended {lost and lost['state_name']}, not Crashed")
    if not data["groups"] or data["groups"][-1]["state_type"] != "COMPLETED":
        fail.append(
            f"the last group run ended {data['groups'][-1]['state_name'] if data['groups'] else None}"
        )
    rows = {int(r["shot"]): r for r in data["table"] or []}
    if sorted(rows) != list(range(n)) or any(r["status"] not in ("done", "copied") for r in rows.values()):
        fail.append(f"shot table artifact: {[(i, r['status']) for i, r in sorted(rows.items())]}")
    if out.exists():
        o, src = probe(out), probe(manifest["film"])
        if (o.frame_count, o.fps, o.width, o.height) != (src.frame_count, src.fps, src.width, src.height):
            fail.append(
                f"output {out}: {o.frame_count} frames {o.width}x{o.height}, source {src.frame_count}"
            )
    elif resume is not None:
        fail.append(f"no output {out}")
    if manifest["cuts_on_keyframes"]:
        fail.append(f"cuts on keyframes: {manifest['cuts_on_keyframes']}")
    warnings = []
    for s in manifest["shots"]:
        status = rows.get(s["index"], {}).get("status")
        if status is not None and (status == "done") != (s["expect"] == "dub"):
            reason = rows[s["index"]].get("reason") or ""
            warnings.append(
                f"shot {s['index']:04d} ({s['kind']}): {status}, expected {s['expect']} ({reason})"
            )
    data["warnings"] = warnings
    return fail


def render_report(result: dict[str, Any]) -> str:
    """The human-readable summary (quoted in benchmarks/RESULTS.md)."""
    f, film = result.get("figures") or {}, result["film"]
    lines = [
        f"film_gpu on {result['device']}, {result['gpus']} gpu worker(s)",
        f"film: {film['size']} @ {film['fps']} fps, {film['film_s']} s, {len(film['shots'])} shots "
        f"({', '.join(s['kind'] for s in film['shots'])}), cuts {film['cuts']}, keyframes {film['keyframes']}",
        f"weights root written in {result['root'].get('write_s')} s; stack started in {result.get('stack_start_s')} s",
    ]
    kill = result.get("kill")
    if kill:
        lines.append(f"kill: {kill['worker']} SIGKILLed in shot {kill['shot']:04d} at {kill['progress_pct']:.0f} % "
                     f"(shots done then: {kill['done_at_kill']}); restarted as {kill.get('restart')}")  # fmt: skip
    for label in ("first_run", "resume_run"):
        if label in result:
            r, fr = result[label], (f.get("runs") or {}).get(label, {})
            lines.append(f"{label}: rc {r['rc']}, {fr.get('state')}, CLI wall {r['wall_s']} s, planning "
                         f"{fr.get('planning_s')} s, assembly {fr.get('assembly_s')} s")  # fmt: skip
    if f:
        lines += [
            f"film wall (first submit -> resumed film done) {f['film_wall_s']} s; dubbed shots {f['dubbed_shots']} "
            f"= {f['dubbed_dialogue_s']} s of {f['film_s']} s",
            f"GPU time {f['gpu_s']} s over {f['group_runs']} group run(s); model loads {f['model_loads']} "
            f"({f['model_load_s']} s)",
            f"GPU-s per second of dubbed dialogue {f['gpu_s_per_dialogue_s']} without loads "
            f"({f['gpu_s_per_dialogue_s_with_loads']} with; {f['gpu_s_per_dialogue_s_shot_tasks']} over the Completed "
            f"shot task runs alone; {f.get('gpu_s_per_dialogue_s_uninterrupted')} uninterrupted: those runs with the "
            f"gaps, lead-ins and tails, without the kill's lost work); per second of film {f['gpu_s_per_film_s']} "
            f"({f['gpu_s_per_film_s_with_loads']})",
            f"idle between shots {f['idle_between_shots_s']} s = {f['idle_between_shots_pct']} % of GPU time "
            f"without loads; group lead-in {f['group_lead_in_s']} s, tail {f['group_tail_s']} s; NVML idle "
            f"{f['nvml_idle_pct_group_runs']} % in group runs, {f['nvml_idle_pct_between_shots']} % between shots",
        ]
        lines.append(f"NVML idle inside the Completed shot task runs: {f.get('nvml_idle_pct_in_shots')} %")
        for r in f.get("per_shot", []):
            stages = ", ".join(f"{k} {v}" for k, v in r["timings_s"].items())
            lines.append(f"  shot {r['shot']:04d} ({r['s']} s, {'dubbed' if r['dubbed'] else 'copied'}, "
                         f"{r['chunks']} chunk(s)): {r['wall_s']} s = {r['wall_s'] / max(r['s'], 1e-9):.2f} s/s; {stages}; "
                         f"QC beside the next render {r.get('qc_s')} s")  # fmt: skip
        lines.append(f"group runs: {f['group_states']}")
        lines.append(f"kill shot's task runs: {f['kill_shot_task_runs']}; chunks resumed from its checkpoints: "
                     f"{f['kill_shot_chunks_resumed']}")  # fmt: skip
        for label, r in f["runs"].items():
            lines.append(f"{label} steps (s): {r['steps_s']}")
    checks = result.get("checks") or {}
    lines += [f"warning: {w}" for w in checks.get("warnings", [])]
    lines.append("checks: " + ("passed" if result.get("ok") else f"FAILED: {result.get('failed')}"))
    return "\n".join(lines) + "\n"
