"""One conversion of dtype names to torch dtypes (day0.torchkit.dtypes)."""

from __future__ import annotations

import pytest
import torch

from day0.errors import ConfigError
from day0.execution.targets import Target
from day0.torchkit.dtypes import torch_dtype


@pytest.mark.parametrize("name,expected", [
    ("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
    ("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_names_and_short_spellings(name, expected):
    assert torch_dtype(name) is expected


def test_every_target_dtype_converts():
    names = Target.model_fields["dtype"].annotation.__args__
    assert {torch_dtype(name) for name in names} == {torch.float32, torch.bfloat16, torch.float16}


@pytest.mark.parametrize("bad", ["float64", "int8", "", "Float32"])
def test_another_name_is_refused_with_the_choices(bad):
    with pytest.raises(ConfigError, match="unknown dtype") as caught:
        torch_dtype(bad)
    assert caught.value.fix == "use one of float32, bfloat16, float16 (or fp32, bf16, fp16)"
