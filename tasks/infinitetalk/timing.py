"""Where a shot's time goes: a stopwatch of seconds and calls per stage (device-synchronised with
`infinitetalk.profile: true`) and the DiT / VAE wrapped so that every call the sampler makes is timed.

Only measurement: the wrappers pass calls through unchanged; what the stages are is the session's.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Stopwatch:
    """Seconds and calls per stage; with `sync` the device is synchronised around each stage."""

    def __init__(self, device: str, sync: bool):
        self.device = device
        self.sync = sync and device.startswith("cuda")
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.sync:
            import torch

            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                import torch

                torch.cuda.synchronize(self.device)
            self.totals[name] += time.perf_counter() - t0
            self.calls[name] += 1


class TimedDiT:
    """The DiT as the sampler calls it, timed."""

    def __init__(self, dit: Any, watch: Stopwatch):
        self.dit, self.watch = dit, watch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.watch("dit"):
            return self.dit(*args, **kwargs)

    def timestep_modulation(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The DiT's own (e, e0) of t: lets the sampler prepare TeaCache decisions without host syncs."""
        with self.watch("dit"):
            return self.dit.timestep_modulation(t)


class TimedVAE:
    """The VAE as the sampler uses it, timed."""

    def __init__(self, vae: Any, watch: Stopwatch):
        self.vae, self.watch = vae, watch

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        with self.watch("vae"):
            return self.vae.encode(video)

    def encode_reference(self, reference: torch.Tensor, length: int) -> torch.Tensor:
        with self.watch("vae"):
            return self.vae.encode_reference(reference, length)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        with self.watch("vae"):
            return self.vae.decode(latent)
