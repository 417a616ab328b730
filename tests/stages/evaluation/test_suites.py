"""Named task suites (data/suites.yaml): every category of the mission, sized by the gates'
power analysis, a setting given next to the suite wins, an unknown suite says what is near."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from day0.stages.evaluation import benchmarks, tasks
from day0.stages.evaluation.config import BUNDLED, Config, suites
from day0.stages.evaluation.preflight import check_gates
from day0.verdict.gates import load_gates
from tests.conftest import ROOT

GATES = load_gates(ROOT / "gates.yaml").gates
MISSION = {"knowledge", "commonsense", "math", "code", "long_context"}


@pytest.mark.parametrize("name", ["quick", "full"])
def test_a_suite_covers_every_category_with_tasks_day0_knows(name):
    config = Config(suite=name)
    known = {*BUNDLED, *benchmarks.standard_tasks()}
    assert set(config.tasks) <= known
    assert MISSION <= {tasks.category_of(t) for t in config.tasks}
    assert check_gates(config.model_dump(), GATES) == []


def test_quick_has_the_fewest_items_its_gates_can_judge():
    config = Config(suite="quick")
    assert config.limit == suites()["quick"]["settings"]["limit"]
    fewer = check_gates({"suite": "quick", "limit": config.limit - 1}, GATES)
    assert [p.field for p in fewer] == ["gate eval-math.paired.allowed_drop"], fewer
    assert "it needs 26 items" in fewer[0].message


def test_full_runs_every_item_at_the_models_context():
    config = Config(suite="full")
    assert config.limit is None and config.long_context_max_tokens >= 131072
    planned = tasks.planned(config)
    assert planned["math"] == 1319 and planned["code"] == 664 and planned["knowledge"] == \
        14042 + 2376 + 1172


def test_a_setting_next_to_the_suite_wins_and_an_unknown_suite_is_named():
    assert Config(suite="quick", limit=100).limit == 100
    assert Config(suite="quick", tasks=["piqa"]).tasks == ["piqa"]
    with pytest.raises(ValidationError, match="did you mean 'quick'"):
        Config(suite="quik")
