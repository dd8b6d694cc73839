"""The process-resident model holder (`ResidentModels`, its one instance `RESIDENT`) and, with
`gpus_per_shot > 1`, the process's shot worker (`model.runtime.shot_worker.ShotWorker` ranks set up by `chunk`).

`RESIDENT` is dubflow's one intentional process-level object (see `ResidentModels`). Callers look it up
as `resident.RESIDENT` at call time, never bind it at import, so a test can swap the holder. Nothing
else lives here: what to load is the options' `LoadSpec`, how a chunk runs is `chunk`'s.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import gc
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.runtime.shot_worker import ShotWorker, ShotWorkerError
from model.weights.loading import COMPONENTS, load_models
from tasks.infinitetalk.chunk import ChunkJob, rank_handle, rank_setup
from tasks.infinitetalk.options import VaeTiling

if TYPE_CHECKING:
    from model.weights.loading import LoadSpec


class ResidentModels:
    """Model components kept loaded for the life of a worker process, keyed by weights root + LoadSpec.

    THE ONE INTENTIONAL PROCESS-LEVEL OBJECT in dubflow (`RESIDENT` below): a worker runs many shots, one
    `render_shot` call each, and reloading ~50 GB of weights per shot would dominate. Components are
    loaded on first use (umT5 and wav2vec2 only when a per-film cache file is missing); asking for
    another root or spec drops the current set first. `loads` counts loads per component (tests).
    One DiT at a time: the spec's `multi` flag (the two-person checkpoint, `tasks.infinitetalk.multi`) is
    not part of the key; asking for the other DiT drops the resident one and loads it on demand, the
    other components stay.

    With `gpus_per_shot: N > 1` it also holds the process's `model.runtime.shot_worker.ShotWorker`: N rank processes
    started on the first dubbed shot, each with its share of the generation models resident, kept for
    later shots and closed by `close()` (registered with `atexit`). `loads["shot_worker"]` counts starts;
    `worker_stats` is rank 0's last answer: its pid and the jobs it has run since its setup.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the resident set's state
        self._load_lock = threading.Lock()  # one `load_models` at a time (held without `_lock`)
        self._key: tuple[str, Any] | None = None
        self._components: dict[str, Any] = {}
        self._multi = False  # whether the resident DiT is the multi (two-person) one
        self.loads: Counter[str] = Counter()
        self._worker: Any | None = None  # model.runtime.shot_worker.ShotWorker
        self._worker_key: tuple[str, Any, int, VaeTiling] | None = None
        self._worker_dit_config: Any | None = None
        self._warm: dict[Any, float] = {}  # warm-up key -> seconds it took, for the resident set
        self._atexit = False
        self.worker_stats: dict[str, int] = {}

    def get(self, root: Path, spec: LoadSpec, components: tuple[str, ...]) -> dict[str, Any]:
        """The requested components (loading the missing ones in one `load_models` call)."""

        key = (str(Path(root).resolve()), dataclasses.replace(spec, components=COMPONENTS, multi=False))
        with self._lock:
            missing = self._select(key, spec, components)
            if not missing:
                return {c: self._components[c] for c in components}
        # a load runs under `_load_lock` only: one load at a time, while a thread that asks for components
        # already resident gets them (the film's prep loads umT5 beside the compile warm-up)
        with self._load_lock:
            with self._lock:
                missing = self._select(key, spec, components)  # what another load left to do
            if missing:
                models = load_models(root, dataclasses.replace(spec, components=missing))
                with self._lock:
                    self._select(key, spec, components)
                    for c in missing:
                        self._components[c] = getattr(models, c)
                        self.loads[c] += 1
            with self._lock:
                return {c: self._components[c] for c in components}

    def _select(self, key: tuple[str, Any], spec: LoadSpec, components: tuple[str, ...]) -> tuple[str, ...]:
        """Make `key` the resident set (dropping another) and the DiT the one `spec` asks for; the
        components of `components` not resident. Called with `_lock` held."""
        if key != self._key:
            self._drop()
            self._key = key
        if "dit" in components and self._components.get("dit") is not None and self._multi != spec.multi:
            self._drop(("dit",))  # one DiT at a time: single or multi
        if "dit" in components:
            self._multi = spec.multi
        return tuple(c for c in components if c not in self._components)

    def warm(self, key: Any, run: Callable[[], float]) -> float | None:
        """Run the warm-up `run` once for `key` and the models now resident: its seconds, or None when the
        resident set is already warm for `key` (forgotten whenever the set is dropped)."""
        with self._lock:
            if key in self._warm:
                return None
        seconds = run()  # outside the lock: it asks `get` for the models
        with self._lock:
            self._warm[key] = seconds
        return seconds

    def is_warm(self, key: Any) -> bool:
        """Whether `warm` ran for `key` with the models now resident."""
        with self._lock:
            return key in self._warm

    def install(self, root: Path, spec: LoadSpec, components: Mapping[str, Any]) -> None:
        """Make already-built components resident for (root, spec), e.g. random real-size models in a
        benchmark; later `get` calls for that key return them without loading."""

        key = (str(Path(root).resolve()), dataclasses.replace(spec, components=COMPONENTS, multi=False))
        with self._lock:
            if key != self._key:
                self._drop()
                self._key = key
            self._components.update(components)
            self._multi = spec.multi if "dit" in components else self._multi

    def clear(self) -> None:
        """Unload everything and stop the shot worker (the next shot loads / starts again)."""
        with self._lock:
            self._drop()
            self._key = None
            self._close_worker()

    close = clear

    def shot_worker_config(
        self, root: Path, spec: LoadSpec, world_size: int, tiling: VaeTiling | None = None
    ) -> Any:
        """Start the ShotWorker for (root, spec, N, VAE tiling) unless it runs already; returns its DiT config."""

        tiling = tiling or VaeTiling()
        key = (
            str(Path(root).resolve()),
            dataclasses.replace(spec, components=COMPONENTS),
            world_size,
            tiling,
        )
        with self._lock:
            if self._worker is not None and (self._worker_key != key or not self._worker.alive):
                self._close_worker()  # another setting, or a rank died since the last shot: start afresh
            if self._worker is None:
                worker = ShotWorker(
                    world_size,
                    functools.partial(rank_setup, key[0], key[1], tiling),
                    rank_handle,
                    backend="gloo" if spec.device == "cpu" else "nccl",
                )
                worker.start()
                self._worker, self._worker_key = worker, key
                self.loads["shot_worker"] += 1
                if not self._atexit:
                    atexit.register(self.close)
                    self._atexit = True
                self._worker_dit_config = self._run_locked({"describe": True})
            return self._worker_dit_config

    def run_chunk(self, job: ChunkJob) -> dict[str, Any]:
        """One chunk on the running ShotWorker: {"index", "frames" uint8 (n, H, W, 3), "state" dict}."""
        with self._lock:
            if self._worker is None:
                raise RuntimeError("ResidentModels.run_chunk: no shot worker (shot_worker_config first)")
            return self._run_locked({"chunk": job})

    def _run_locked(self, job: dict[str, Any]) -> Any:

        try:
            out = self._worker.run(job)
        except ShotWorkerError:
            self._worker = self._worker_key = None  # it closed itself: the next shot starts a new one
            raise
        self.worker_stats = {"pid": out["pid"], "jobs": out["jobs"]}
        return out["result"]

    def _close_worker(self) -> None:
        worker, self._worker, self._worker_key = self._worker, None, None
        if worker is not None:
            worker.close()

    def _drop(self, components: tuple[str, ...] | None = None) -> None:
        """Unload `components` (default: all) and give their memory back; the warm-up is redone for any."""
        self._warm.clear()
        if not self._components:
            return
        for c in components or tuple(self._components):
            self._components.pop(c, None)
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


RESIDENT = ResidentModels()
