"""The bundled ffmpeg binary and subprocess helpers that always clean up.

dubflow uses only `imageio_ffmpeg.get_ffmpeg_exe()` (no system ffmpeg, no ffprobe). Subprocesses
live in generators / context managers whose `finally:` kills and reaps them, so an exception or an
abandoned iterator never leaves an ffmpeg behind, and each child gets SIGKILL when the process that
started it dies, however it dies (`PR_SET_PDEATHSIG`): a film run killed during its final encode
leaves no ffmpeg writing on. Each child also runs in a session of its own, out of the terminal's line of
fire: a Ctrl-C reaches dubflow alone, which stops its work in order and kills its children itself.
Their stderr goes to a temporary file (no pipe deadlock) and its last lines become the message of a
`DecodeError`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from typing import IO, Any

from tasks.errors import DecodeError

log = logging.getLogger(__name__)

BASE_ARGS = ("-nostdin", "-hide_banner")
_PR_SET_PDEATHSIG = 1


@cache
def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary (`DUBFLOW_FFMPEG` overrides the bundled imageio-ffmpeg one)."""
    override = os.environ.get("DUBFLOW_FFMPEG")
    if override:
        return override
    import imageio_ffmpeg

    # imageio-ffmpeg checks its candidates by running them in our process group, where a Ctrl-C would kill
    # the check and read as "no ffmpeg found" (exit 1 instead of a stop): with SIGINT and SIGTERM blocked
    # in this thread the checks start with them blocked too (exec keeps the mask), and ours are delivered
    # once the lookup returns
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        return imageio_ffmpeg.get_ffmpeg_exe()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@cache
def _prctl() -> Any:
    """libc's prctl (Linux), resolved once in the parent: the child's hook then calls no Python import."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True).prctl


def _dies_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` making the ffmpeg child get SIGKILL when the thread that started it dies (so a
    killed film run leaves no ffmpeg writing on; PR_SET_PDEATHSIG), None where there is no prctl.

    Every call in this module waits for its child in the thread that started it, so that thread
    outlives the child; if the parent died before the hook ran, the child exits at once.
    """
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return hook


def _stderr_tail(fh: IO[bytes], limit: int = 4000) -> str:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - limit))
    return fh.read().decode("utf-8", "replace")


def last_error_line(stderr: str) -> str:
    """The most informative line of an ffmpeg stderr (last non-empty, without the `[x @ 0x..]` prefix)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return "ffmpeg failed without a message"
    line = lines[-1]
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return line


def run(
    args: Sequence[str], *, path: str | Path, what: str = "ffmpeg", check: bool = True
) -> tuple[int, str]:
    """Run ffmpeg to completion; return (returncode, stderr). Raise DecodeError naming `path` on failure."""
    cmd = [ffmpeg_exe(), *BASE_ARGS, *args]
    log.debug("run %s", " ".join(cmd))
    proc = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=_dies_with_parent(), start_new_session=True,
    )  # fmt: skip
    err = proc.stderr.decode("utf-8", "replace")
    if check and proc.returncode != 0:
        raise DecodeError(path, f"{what} failed: {last_error_line(err)}")
    return proc.returncode, err


def _finish(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:  # pragma: no cover - a kill that does not take is an OS problem
        log.error("ffmpeg pid %d did not exit after SIGKILL", proc.pid)


def read_lines(
    args: Sequence[str], *, path: str | Path, what: str = "ffmpeg", stderr_sink: list[str] | None = None
) -> Iterator[str]:
    """Yield ffmpeg's stdout line by line (text muxers such as framecrc); raise DecodeError on failure.

    If `stderr_sink` is given, the tail of ffmpeg's stderr is appended to it once ffmpeg exits 0
    (warnings such as "partial file" do not change the exit status).
    """
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [ffmpeg_exe(), *BASE_ARGS, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            preexec_fn=_dies_with_parent(), start_new_session=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                yield raw.decode("utf-8", "replace").rstrip("\n")
            rc = proc.wait()
            if rc != 0:
                raise DecodeError(path, f"{what} failed: {last_error_line(_stderr_tail(err))}")
            if stderr_sink is not None:
                stderr_sink.append(_stderr_tail(err))
        finally:
            _finish(proc)


def read_blocks(
    args: Sequence[str],
    block_size: int,
    *,
    path: str | Path,
    what: str = "decoding",
    partial_tail: bool = False,
) -> Iterator[bytes]:
    """Yield fixed-size blocks of ffmpeg's stdout (raw frames / PCM).

    A short last block is yielded when `partial_tail` (PCM), else it is an error (frames).
    """
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [ffmpeg_exe(), *BASE_ARGS, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            bufsize=0,
            preexec_fn=_dies_with_parent(),
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            while True:
                buf = _read_exact(proc.stdout, block_size)
                if len(buf) == block_size:
                    yield buf
                    continue
                rc = proc.wait()
                if rc != 0:
                    raise DecodeError(path, f"{what} failed: {last_error_line(_stderr_tail(err))}")
                if buf and partial_tail:
                    yield buf
                elif buf:
                    raise DecodeError(
                        path, f"{what} ended with a partial block ({len(buf)} of {block_size} bytes)"
                    )
                return
        finally:
            _finish(proc)


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < n:
        b = stream.read(n - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def start_encoder(args: Sequence[str], *, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """ffmpeg reading its stdin (a pipe) with `args`, for a writer that streams frames over several calls
    (the QC preview); like every child here it dies with the thread that starts it, which must wait for
    it (`write_pipe` is the one-block form)."""
    return subprocess.Popen(
        [ffmpeg_exe(), "-hide_banner", *args], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=stderr, preexec_fn=_dies_with_parent(), start_new_session=True,
    )  # fmt: skip


@contextmanager
def write_pipe(args: Sequence[str], *, path: str | Path, what: str = "encoding") -> Iterator[IO[bytes]]:
    """Context manager yielding ffmpeg's stdin (e.g. rawvideo in, FFV1 out).

    On normal exit stdin is closed and ffmpeg must exit 0; on an exception it is killed.
    """
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [ffmpeg_exe(), *BASE_ARGS, *args], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
            preexec_fn=_dies_with_parent(), start_new_session=True,
        )  # fmt: skip
        ok = False
        try:
            assert proc.stdin is not None
            try:
                yield proc.stdin
            except BrokenPipeError as ex:
                raise DecodeError(path, f"{what} failed: {last_error_line(_stderr_tail(err))}") from ex
            with suppress(BrokenPipeError):
                proc.stdin.close()
            rc = proc.wait()
            if rc != 0:
                raise DecodeError(path, f"{what} failed: {last_error_line(_stderr_tail(err))}")
            ok = True
        finally:
            if not ok:
                _finish(proc)
