"""Per-stage overhead of the docker runner vs the process runner, measured side by side.

    .venv/bin/python bench/bench_docker_runner.py [--repeat 5] [--image day0:local]

Needs the Docker engine and the day0 image (`make images`). For each stage (analysis, scan,
alignment on tiny-llama) it runs the same StageSpec with both runners, alternating, and prints
median wall seconds and the difference. A bare container (`python -c pass` in the image) is then
timed phase by phase: create (incl. mounts), start, run, wait, remove.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.execution.contract import StageInputs  # noqa: E402
from day0.execution.runners import run_on_target  # noqa: E402
from day0.execution.stage import StageSpec  # noqa: E402
from day0.execution.targets import Target  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "tiny-llama"
TEXT = ROOT / "tests" / "fixtures" / "text" / "heldout.txt"


def specs(process: Target, docker: Target) -> list[tuple[str, StageSpec, StageSpec]]:
    """Analysis first (its facts size the others' budgets), then scan and alignment."""
    from day0 import stages

    out = []
    facts: dict = {}
    for stage, config in (("analysis", {}), ("scan", {}), ("alignment", {"text_file": str(TEXT)})):
        pair = [StageSpec(stage=stage, config=config, facts=facts, inputs=StageInputs(
            source=str(MODEL), target=t)) for t in (process, docker)]
        if stage == "analysis":
            facts = stages.get("analysis").facts(run_on_target(pair[0], process).result)
        out.append((stage, *pair))
    return out


def bare_container_phases(image: str, repeat: int) -> dict[str, float]:
    import docker

    client = docker.from_env()
    phases: dict[str, list[float]] = {"create (2 mounts)": [], "start": [], "run + wait": [], "remove": []}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(repeat):
            t0 = time.perf_counter()
            c = client.containers.create(image, ["python", "-c", "pass"], network_mode="none",
                                         user="10001:10001", volumes={str(MODEL): {"bind": str(MODEL), "mode": "ro"},
                                                                      scratch: {"bind": scratch, "mode": "rw"}})
            t1 = time.perf_counter()
            c.start()
            t2 = time.perf_counter()
            c.wait()
            t3 = time.perf_counter()
            c.remove(force=True)
            t4 = time.perf_counter()
            for key, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[key].append(value)
    return {k: statistics.median(v) for k, v in phases.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--image", default="day0:local")
    args = parser.parse_args()
    process = Target(name="bench-process", device="cpu", dtype="bfloat16")
    docker_t = Target(name="bench-docker", device="cpu", dtype="bfloat16", runner="docker",
                      container={"image": args.image})
    print(f"tiny-llama, {args.repeat} runs per stage and runner (alternating), median wall seconds")
    print(f"{'stage':<10} {'process':>9} {'docker':>9} {'overhead':>9} {'ratio':>7}")
    for stage, in_process, in_docker in specs(process, docker_t):
        times = {"process": [], "docker": []}
        for _ in range(args.repeat):
            for name, spec, target in (("process", in_process, process), ("docker", in_docker, docker_t)):
                started = time.perf_counter()
                outcome = run_on_target(spec, target)
                times[name].append(time.perf_counter() - started)
                if not outcome.ok:
                    print(f"{stage} failed with the {name} runner: {outcome.error}", file=sys.stderr)
                    return 1
        p, d = statistics.median(times["process"]), statistics.median(times["docker"])
        print(f"{stage:<10} {p:9.2f} {d:9.2f} {d - p:+9.2f} {d / p:7.2f}")
    print("\nbare container (`python -c pass` in the image), median seconds per phase:")
    for phase, seconds in bare_container_phases(args.image, args.repeat).items():
        print(f"  {phase:<18} {seconds:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
