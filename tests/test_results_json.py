"""The validate flow's result is JSON under day0's cache dir and is read back as plain JSON:
nothing is pickled (task results included), nothing is unpickled."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import cloudpickle
import pytest
import yaml

from day0.errors import StageError
from tests import breakers

pytestmark = pytest.mark.integration


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else set()


def test_flow_result_is_json_and_never_unpickled(prefect_server, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    from flows.results import RESULTS_FOLDER, read_report
    from flows.validate import validate

    prefect_default = Path(get_current_settings().results.local_storage_path).expanduser()
    before = files_under(prefect_default)
    ckpt = breakers.copy_fixture(tmp_path / "tiny-llama")
    breakers.edit_config(ckpt, num_hidden_layers=0)  # quick: analysis only, verdict BROKEN
    tfile = tmp_path / "t.yaml"
    tfile.write_text(yaml.safe_dump({"name": "cpu-bf16-json", "device": "cpu", "dtype": "bfloat16"}))
    state = validate(source=str(ckpt), target_file=str(tfile), return_state=True)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)

    key = Path(run.state.data.storage_key)
    assert key.parent == Path(os.environ["DAY0_CACHE_DIR"]).resolve() / RESULTS_FOLDER
    assert run.state.data.serializer.type == "json"
    assert json.loads(key.read_bytes())["verdict"] == "BROKEN"  # the file is the report's JSON
    assert files_under(prefect_default) == before, "something was persisted with Prefect's default"

    def no_unpickling(*args, **kwargs):
        raise AssertionError("a result was unpickled")

    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(cloudpickle, "loads", no_unpickling)
    report = read_report(run)  # what `day0 validate --deployment` does
    assert report["verdict"] == "BROKEN" and report["stages"]["analysis"]["ok"]

    # a planted record that names another serializer is refused, never deserialized
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps({"metadata": {"serializer": {"type": "pickle"}},
                                    "result": "gASVAAAAAAAAAAAu"}))
    forged = run.model_copy(update={"state": run.state.model_copy(update={
        "data": run.state.data.model_copy(update={"storage_key": str(tampered)})})})
    with pytest.raises(StageError, match="not JSON"):
        read_report(forged)
