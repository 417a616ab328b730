"""Evidence stored for replay cannot move a verdict (issue 27): a tampered reference bank is
detected, never replayed, and the run recomputes to the verdict of an untampered one; with a
shared secret, a bank sealed without it is never replayed. Each case fails with the
verification removed (the tampered values would be replayed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from day0.execution.contract import StageInputs
from day0.execution.targets import Target
from day0.stages.alignment.core import Config, run
from day0.store import seal

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
PLUGINS = ROOT / "tests" / "plugins"
SMALL = dict(max_windows=2, seq_len=64, generation_prompts=2, new_tokens=6, op_tokens=16)
FAULTY = Target(name="cpu-bf16-scaled", device="cpu", dtype="bfloat16",
                plugins=[str(PLUGINS / "scale_layer.py")])  # a layer's output x 1.05
CORRECT = Target(name="cpu-bf16-noop", device="cpu", dtype="bfloat16",
                 plugins=[str(PLUGINS / "noop.py")])


def _run(bank: Path, target: Target):
    return run(Config(**SMALL, reference_bank_uri=str(bank)),
               StageInputs(source=str(MODELS / "tiny-llama"), target=target))


def _judged(result) -> dict:
    """What the gates read: the metrics (NaN equal to NaN) and the checkpoint's problems."""
    return {"metrics": {k: "nan" if isinstance(v, float) and math.isnan(v) else v
                        for k, v in result.metrics().items()},
            "problems": result.checkpoint_problems}


def _part(bank: Path, result, part: str) -> Path:
    return bank / result.reference_bank.rsplit("/", 1)[1] / part


def _rewrite(part: Path, change) -> None:
    """Every shard's tensors through change(name, tensor), saved in place (bank.json as it was)."""
    for shard in part.glob("*.safetensors"):
        tensors = load_file(shard)
        save_file({name: change(name, t) for name, t in tensors.items()}, str(shard))


def _redigest(part: Path) -> None:
    """An adversary who knows the format but not the key: bank.json's digests made to match."""
    record = json.loads((part / "bank.json").read_text())
    record["files"] = {name: seal.file_digest(part / name) for name in record["files"]}
    (part / "bank.json").write_text(json.dumps(record))


@pytest.fixture
def untampered(tmp_path):
    """A bank built by the correct target, and each target's verdict inputs without tampering."""
    bank = tmp_path / "bank"
    first = _run(bank, CORRECT)
    clean = {"faulty": _judged(_run(bank, FAULTY)), "correct": _judged(_run(bank, CORRECT))}
    return bank, first, clean


@pytest.mark.parametrize("redigest", [False, True], ids=["shard-only", "digests-rewritten"])
def test_a_scaled_control_shard_is_not_replayed(untampered, capsys, redigest):
    """Was: control x 1.05 turned a faulty target (a layer x 1.05) from FAIL into PASS."""
    bank, first, clean = untampered
    part = _part(bank, first, "control-bfloat16")
    _rewrite(part, lambda name, t: t * 1.05 if t.is_floating_point() else t)
    if redigest:
        _redigest(part)
    capsys.readouterr()
    again = _run(bank, FAULTY)
    log = capsys.readouterr().out
    assert f"{part} fails verification" in log, log
    assert again.reference_bank_parts["control-bfloat16"].startswith("computed here")
    assert _judged(again) == clean["faulty"]  # the untampered verdict: still FAIL


def test_reference_values_in_the_control_part_are_not_replayed(untampered):
    """Was: the reference's float32 values in the bf16 control part failed a correct target."""
    bank, first, clean = untampered
    reference = load_file(next(_part(bank, first, "reference").glob("*.safetensors")))
    control = _part(bank, first, "control-bfloat16")
    _rewrite(control, lambda name, t: reference[name])
    _redigest(control)
    again = _run(bank, CORRECT)
    assert "not replayed" in again.reference_bank_parts["control-bfloat16"]
    assert _judged(again) == clean["correct"]


def test_a_forged_weight_problem_is_not_replayed(untampered):
    """Was: a made-up weight_problems entry in reference/bank.json made a healthy checkpoint
    BROKEN (the weight scan is taken from the bank)."""
    bank, first, clean = untampered
    meta = _part(bank, first, "reference") / "bank.json"
    record = json.loads(meta.read_text())
    record["weight_problems"] = ["model.layers.0.mlp.down_proj.weight is all zeros"]
    meta.write_text(json.dumps(record))
    again = _run(bank, CORRECT)
    assert again.checkpoint_problems == [] and not again.reference_bank_hit
    assert "its seal does not verify" in again.reference_bank_parts["reference"]
    assert _judged(again) == clean["correct"]


def test_a_scaled_reference_is_not_replayed(untampered):
    bank, first, clean = untampered
    part = _part(bank, first, "reference")
    _rewrite(part, lambda name, t: t * 1.05 if t.is_floating_point() else t)
    again = _run(bank, FAULTY)
    assert not again.reference_bank_hit
    assert _judged(again) == clean["faulty"]
    assert _run(bank, FAULTY).reference_bank_hit  # recomputed, stored again, replayed next


def test_with_a_shared_secret_only_banks_sealed_with_it_are_replayed(tmp_path, monkeypatch):
    bank = tmp_path / "bank"
    monkeypatch.delenv(seal.ENV, raising=False)
    _run(bank, CORRECT)  # sealed with this machine's key
    monkeypatch.setenv(seal.ENV, "s3cret-of-the-platform-team")
    signed = _run(bank, CORRECT)
    assert not signed.reference_bank_hit  # another key: recomputed, stored sealed with it
    assert "does not verify with shared secret" in signed.reference_bank_parts["reference"]
    replayed = _run(bank, CORRECT)
    assert replayed.reference_bank_hit
    assert "verified with shared secret" in replayed.reference_bank_parts["reference"]
    monkeypatch.setenv(seal.ENV, "another-secret")
    assert not _run(bank, CORRECT).reference_bank_hit
    # an unsealed bank.json (the seal removed) is never replayed either
    record_path = next(bank.rglob("reference/bank.json"))
    record = json.loads(record_path.read_text())
    record.pop("seal")
    record_path.write_text(json.dumps(record))
    unsealed = _run(bank, CORRECT)
    assert "is not sealed" in unsealed.reference_bank_parts["reference"]


def test_stored_dtypes_must_be_the_declared_ones():
    """Behind the seal (a bank written by a day0 bug, or with the key): float32 values in a
    part declared bfloat16 are not that part's."""
    from day0.stages.alignment import bank

    meta = bank.BankMeta(format=bank.FORMAT, key="k", part="control-bfloat16", device="cpu",
                         dtype="bfloat16", windows=[], n_layers=1, built="resident",
                         wide=["w0/logits/0"])

    class Info:  # what a shard's header says of a tensor (day0.checkpoint.safetensors_header)
        def __init__(self, dtype):
            self.dtype = dtype

    bank._verify_dtypes(meta, {"w0/h0/0": Info("BF16"), "w0/logits/0": Info("F32"),
                               "w0/r.mlp/0": Info("I64")})
    for tensors in ({"w0/h0/0": Info("F32")}, {"w0/logits/0": Info("BF16")},
                    {"w0/r.mlp/0": Info("F32")}):
        with pytest.raises(ValueError, match="is stored as"):
            bank._verify_dtypes(meta, tensors)


def test_stored_evaluation_reference_results_are_replayed_only_when_sealed(tmp_path,
                                                                            monkeypatch):
    """A stored reference item flipped to wrong would pass a target that gets it wrong too."""
    from day0.stages.evaluation import refstore

    monkeypatch.delenv(seal.ENV, raising=False)
    where = str(tmp_path / "evaluation") + "/"
    records = {"knowledge": {"items": [{"doc_id": 0, "acc": 1.0}, {"doc_id": 1, "acc": 0.0}]}}
    refstore.save(where, "k", {"tasks": records, "lm_eval": "0.4"})
    assert refstore.load(where, "k")["tasks"] == records
    path = tmp_path / "evaluation" / "k.json"
    stored = json.loads(path.read_text())
    stored["tasks"]["knowledge"]["items"][1]["acc"] = 1.0
    path.write_text(json.dumps(stored))
    notes: list[str] = []
    assert refstore.load(where, "k", notes) is None
    assert notes and "not replayed: its seal does not verify" in notes[0]
    stored.pop("seal")
    path.write_text(json.dumps(stored))
    assert refstore.load(where, "k", notes) is None and "is not sealed" in notes[-1]


def test_a_forged_reference_score_never_judges_a_checkpoint(tmp_path, monkeypatch):
    """A stored reference perplexity lowered by hand would call the real weights changed."""
    from day0.checkpoint import sanity

    monkeypatch.setenv("DAY0_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(seal.ENV, raising=False)
    sanity.store_reference_perplexity("m@v1#a", 31.5)
    assert sanity.stored_reference_perplexity("m@v1#a") == 31.5
    [path] = (tmp_path / "reference-scores").iterdir()
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "perplexity": 3.0}))
    assert sanity.stored_reference_perplexity("m@v1#a") is None
    path.write_text(json.dumps({"model_key": "m@v1#a", "perplexity": 3.0}))  # unsealed
    assert sanity.stored_reference_perplexity("m@v1#a") is None
