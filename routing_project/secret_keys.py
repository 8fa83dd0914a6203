"""A SECRET_KEY kept on disk for a checkout that runs without one given (the local settings)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def kept_secret_key(path: Path) -> str:
    """This checkout's own SECRET_KEY: made on first use, kept in `path` (readable by its owner
    alone), the same for every process of the checkout (`make run`'s web, workers and beat,
    and the `manage.py` commands an operator runs beside them). The settings' development
    default is public: with it anyone who can reach the server could forge a rep's accept link
    or an admin session. Written whole under another name and linked into place, so two
    processes starting at once agree on one key and none reads half of it."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f"{path.name}.{secrets.token_hex(8)}.new")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(50) + "\n")
    try:
        os.link(draft, path)  # fails if another process made it first: its key stands
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return path.read_text().strip()
