"""Documents a user hands in (config, cast and shot plan files, `--set` values): read one way, bounded.

A document is a regular file (a FIFO, a device or a folder is refused at once: never waited on, never
read without end) of at most `MAX_DOCUMENT` bytes, and its YAML may not use aliases (``*name``): a
few hundred bytes of nested aliases expand to millions of nodes in whatever walks the loaded value
(merging, hashing a config), so a small document could cost unbounded time and memory. No dubflow
document needs them. Errors are `ConfigError`, one line naming the file. No Prefect here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tasks.errors import ConfigError
from tasks.files import NotRegular, read_regular

MAX_DOCUMENT = 4 << 20  # a config, cast or plan file of a long film is tens of KB


class _NoAliases(yaml.SafeLoader):
    """The safe loader, refusing aliases (anchors alone are harmless)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(
                f"aliases (*name) are not allowed in a dubflow document (line {mark.line + 1})"
            )
        return super().compose_node(parent, index)


def parse_yaml(text: str | bytes, where: str | os.PathLike[str], what: str = "YAML") -> Any:
    """`text` as YAML without aliases; ConfigError naming `where` when it is not."""
    try:
        return yaml.load(text, Loader=_NoAliases)
    except yaml.YAMLError as ex:
        raise ConfigError(where, f"invalid {what}: {' '.join(str(ex).split())}") from ex


def read_document(path: str | os.PathLike[str], what: str = "file") -> bytes:
    """The bytes of the document at `path`: a regular file of at most `MAX_DOCUMENT` bytes (ConfigError)."""
    p = Path(path)
    try:
        return read_regular(p, MAX_DOCUMENT)
    except FileNotFoundError as ex:
        raise ConfigError(p, f"{what} not found") from ex
    except NotRegular as ex:
        raise ConfigError(p, f"cannot read the {what}: {ex}") from ex
    except OSError as ex:
        raise ConfigError(p, f"cannot read the {what} ({ex.strerror or ex})") from ex


def load_yaml(path: str | os.PathLike[str], what: str = "file") -> Any:
    """The YAML document at `path` (`read_document`, then `parse_yaml`)."""
    return parse_yaml(read_document(path, what), path)
