"""The hand-run stack without Docker (`day0 stack up|restart|down|status|upload`, `make stack`):
Prefect server, release receiver, SeaweedFS and `day0 serve` as processes of this user, with
state, secrets, data and logs under one folder (default ``${XDG_STATE_HOME:-~/.local/state}/
day0/stack``). What runs and why in this order: day0.stack.core.

Torch-free: nothing here imports the stages; the processes it starts do.
"""

from day0.stack.control import down, restart, status, summary, up, upload

__all__ = ["up", "down", "restart", "status", "upload", "summary"]
