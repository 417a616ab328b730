"""Where day0 keeps state a user owns: ``${XDG_STATE_HOME:-~/.local/state}/day0``.

The hand-run stack (day0.stack) and the receiver's default journal live here, never under
/var/lib (root only); deployments that need another place name it explicitly.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_home() -> Path:
    """``$XDG_STATE_HOME/day0``, else ``~/.local/state/day0`` (not created here)."""
    base = os.path.expanduser(os.environ.get("XDG_STATE_HOME") or "")
    # the XDG spec says to ignore a relative value
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "day0"


def server_home() -> Path:
    """Where the kept Prefect server (`day0 server`) and its kept stage hosts keep their state:
    ``$DAY0_SERVER_DIR``, else ``state_home()/server``."""
    root = os.environ.get("DAY0_SERVER_DIR")
    return Path(root).expanduser().resolve() if root else state_home() / "server"
