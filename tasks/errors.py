"""Domain exceptions of the media layer: one line each, naming the file and the problem."""

from __future__ import annotations

from pathlib import Path


class DubflowError(Exception):
    """Base of every error dubflow reports to a user: `str(err)` is `"<file>: <problem>"`."""

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else str(path)
        self.problem = " ".join(str(problem).split())  # always one line
        super().__init__(f"{self.path}: {self.problem}" if self.path else self.problem)


class ConfigError(DubflowError):
    """A config file or `--set` override is invalid (unknown key, wrong type, bad value)."""


class MediaError(DubflowError):
    """A media file cannot be used as given."""


class MediaNotFound(MediaError):
    """The file does not exist or is not a regular file."""


class NotAMediaFile(MediaError):
    """ffmpeg cannot open the file as any known container."""


class NoVideoStream(MediaError):
    """The container has no video stream."""


class NoAudioStream(MediaError):
    """The container has no audio stream."""


class TruncatedMedia(MediaError):
    """The container's index promises more than the file holds."""


class DecodeError(MediaError):
    """ffmpeg failed while decoding or encoding."""


class AudioLengthError(MediaError):
    """The dubbed audio does not match the picture's duration under the configured policy."""


class OutputError(MediaError):
    """The output path is unusable (e.g. it would overwrite the source)."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal (`tasks.render.interrupts`): what finished is kept, the same command resumes.

    A KeyboardInterrupt, so every layer that cleans up after Ctrl-C (Prefect's engine, the chunk loop's
    pending writes, locks, ffmpeg children) does so for SIGTERM too."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
