"""Receiver under load: deliveries/s, status codes, exactly-once runs and no loss across a kill -9.

Run: ``.venv/bin/python bench/bench_receiver.py [--total 1200 --unique 200 --concurrency 50]``

Starts a temporary Prefect server (prefect_test_harness) with the `validate` deployment
registered but not served (its runs stay SCHEDULED, so only submission is measured), starts
``day0 hooks serve`` as a child process on a fresh journal, then sends --total signed release
webhooks from --concurrency concurrent senders: each unique release once plus duplicates, bad
signatures, stale timestamps, malformed JSON, schema errors and oversize bodies mixed in and
shuffled (tests/receiver/loadgen.py). Half-way through, the receiver is killed with SIGKILL and
started again on the same journal; senders retry connection errors as webhook senders do.
Prints deliveries by class, status codes (no 5xx allowed), unique valid releases vs flow runs
created (must be equal, no key twice), accepted releases without a run (lost, must be 0) and the
p50/p99 latency of acknowledged requests. Exit status 1 if an invariant fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

SECRET, ADMIN = "bench-secret", "bench-admin"


def pending_releases(journal: Path) -> int:
    """Accepted but not yet submitted releases in a (dead) receiver's journal."""
    import sqlite3

    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM releases WHERE status = 'pending'").fetchone()[0]
    finally:
        db.close()


def run(total: int, unique: int, concurrency: int, kill: bool, work: Path) -> int:
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    from day0.receiver.launch import ReceiverProcess, write_config
    from tests.receiver.loadgen import (flow_run_keys, make_deliveries, send_all, summarize,
                                        wait_drained)

    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120):
        api = PREFECT_API_URL.value()
        from flows.validate import validate

        deployment_id = validate.to_deployment(name="bench-receiver").apply()
        config = write_config(work / "receiver.yaml", {
            "journal": str(work / "journal.sqlite"), "deployment": "validate/bench-receiver",
            "prefect_api_url": api, "secrets": {"release_hmac": SECRET, "admin_token": ADMIN},
            "submit": {"concurrency": 8, "backoff_initial_s": 0.5, "backoff_max_s": 5}})
        receiver = ReceiverProcess(config, admin_token=ADMIN, log=work / "receiver.log").start()
        print(f"prefect server {api} + receiver {receiver.url} up in {time.perf_counter() - t0:.1f} s")
        deliveries = make_deliveries(total, unique, SECRET, prefix="bench")
        restart: dict[str, float] = {}

        async def on_done(done: int) -> None:
            if kill and done == total // 2 and "at" not in restart:
                restart["at"] = done

                def bounce() -> None:
                    started = time.perf_counter()
                    receiver.kill()
                    restart["pending"] = pending_releases(work / "journal.sqlite")
                    receiver.start()
                    restart["seconds"] = time.perf_counter() - started

                asyncio.get_running_loop().run_in_executor(None, bounce)

        sent = time.perf_counter()
        asyncio.run(send_all(receiver.url, deliveries, concurrency, deadline_s=300, on_done=on_done))
        send_s = time.perf_counter() - sent
        while kill and "seconds" not in restart and time.perf_counter() - sent < 120:
            time.sleep(0.1)
        stats = wait_drained(receiver.url, ADMIN, timeout_s=120)
        keys = flow_run_keys(deployment_id, "day0:bench/")
        receiver.stop()

    s = summarize(deliveries)
    runs_by_release = {k.split(":", 1)[1].rsplit(":", 1)[0] for k in keys}
    lost = [r for r in s.acknowledged if f"{r[0]}@{r[1]}" not in runs_by_release]
    fivexx = sum(n for code, n in s.by_status.items() if code and code >= 500)
    print(f"deliveries: {len(deliveries)} in {send_s:.1f} s ({len(deliveries) / send_s:.0f}/s) "
          f"at concurrency {concurrency}; retried after connection errors: {s.retried}")
    print("  by class:   " + ", ".join(f"{k}={v}" for k, v in sorted(s.by_class.items())))
    print("  by status:  " + ", ".join(f"{k}={v}" for k, v in sorted(s.by_status.items(), key=str)))
    print(f"  wrong answers: {len(s.wrong)} {s.wrong[:5]}   5xx: {fivexx}   unanswered: "
          f"{s.by_status.get(None, 0)}")
    if kill:
        print(f"receiver killed (SIGKILL) after {restart.get('at')} answers with "
              f"{restart.get('pending')} accepted releases not yet submitted; back in "
              f"{restart.get('seconds', float('nan')):.1f} s")
    print(f"unique valid releases: {len(s.unique_valid)}, acknowledged: {len(s.acknowledged)}, "
          f"flow runs created: {sum(keys.values())} ({len(keys)} distinct keys, "
          f"{sum(1 for v in keys.values() if v > 1)} keys twice)")
    print(f"lost accepted releases: {len(lost)}   journal: {stats}")
    print(f"acknowledged-request latency (sender side): p50 {s.percentile(0.5) * 1000:.1f} ms, "
          f"p99 {s.percentile(0.99) * 1000:.1f} ms, max {max(s.latencies) * 1000:.1f} ms; "
          f"inside the receiver (Server-Timing): p50 {s.percentile(0.5, True) * 1000:.1f} ms, "
          f"p99 {s.percentile(0.99, True) * 1000:.1f} ms")
    ok = (not s.wrong and not fivexx and len(s.acknowledged) == len(s.unique_valid)
          == sum(keys.values()) == len(keys) and not lost)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=1200, help="deliveries to send (>= 1000)")
    parser.add_argument("--unique", type=int, default=200, help="unique valid releases among them")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--no-kill", action="store_true", help="do not kill the receiver mid-way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="day0-bench-receiver-") as work:
        sys.exit(run(args.total, args.unique, args.concurrency, not args.no_kill, Path(work)))


if __name__ == "__main__":
    main()
