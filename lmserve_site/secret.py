"""The installation's secret key: generated once, kept in the data directory, readable by the
owner only. Used when ``LMSERVE_SECRET_KEY`` is unset, so that no key known to everyone who
has read the source signs sessions and CSRF tokens."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def installation_secret(path: Path) -> str:
    """The key stored at ``path``, created (mode 0600) on first use. Two processes starting at
    once agree: the file is created exclusively, and the loser reads the winner's key."""
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    # One temporary name per caller (process and thread), so concurrent first starts never collide.
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    try:
        os.link(temp, path)  # fails if another process got there first: keep its key
    except FileExistsError:
        pass
    finally:
        temp.unlink()
    return _read(path)


def _read(path: Path) -> str:
    key = path.read_text().strip()
    if not key:
        raise RuntimeError(f"{path} is empty; delete it to have a new secret key generated")
    return key
