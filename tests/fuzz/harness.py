"""Run `day0 analyze` on many checkpoints in a small pool of tests.fuzz.worker processes.

Each worker imports day0, torch and transformers once and forks a child per checkpoint (memory
ceiling and timeout per child, see tests/fuzz/worker.py); the pool is as wide as the machine has
cores, at most ``workers``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    def __init__(self, warmup: list[Path]):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.worker", *map(str, warmup)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=ROOT, env=env)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"fuzz worker did not start (exit {self.proc.wait()})")

    def run(self, path: Path, timeout_s: float, mem_bytes: int) -> dict:
        self.proc.stdin.write(json.dumps({"path": str(path), "timeout_s": timeout_s,
                                          "mem_bytes": mem_bytes}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return {"rc": None, "stderr": "", "seconds": None, "rss_growth": None,
                    "killed": f"worker died (exit {self.proc.poll()})"}
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_all(jobs: list[tuple[str, Path]], *, warmup: list[Path], timeout_s: float, mem_bytes: int,
            workers: int = 2) -> dict[str, dict]:
    """{name: result} for every (name, checkpoint folder) job."""
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put(job)
    results: dict[str, dict] = {}

    def drain(worker: Worker) -> None:
        while True:
            try:
                name, path = todo.get_nowait()
            except queue.Empty:
                return
            results[name] = worker.run(path, timeout_s, mem_bytes)

    pool = [Worker(warmup) for _ in range(max(1, min(workers, os.cpu_count() or 1)))]
    try:
        threads = [threading.Thread(target=drain, args=(w,)) for w in pool]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for w in pool:
            w.close()
    return results
