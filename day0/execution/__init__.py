"""Execution: how one stage runs. The stage contract (contract), target profiles (targets) and
their plugins, the subprocess runner (stage), the warm stage host (stagehost), runners (process,
docker, deployment), budgets, lifecycle, memory, progress lines and the stage result cache."""
