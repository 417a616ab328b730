"""Meta-device scanning rules: shadows for input-derived values, assumptions for the rest."""

from __future__ import annotations

import torch

from day0.stages.scan.meta import SHADOW, MetaScanRecorder


def shadowed(values: torch.Tensor) -> torch.Tensor:
    meta = values.to("meta")
    setattr(meta, SHADOW, values)
    return meta


def test_input_derived_values_are_real():
    ids = shadowed(torch.tensor([[5, 6, 7]]))
    with MetaScanRecorder() as rec:
        positions = torch.arange(3, device="meta").unsqueeze(0)
        packed = (torch.diff(positions, dim=-1) != 1).cumsum(-1)
        assert bool((packed[:, -1] == 0).all()) is True          # the real answer, not assumed
        assert (ids + 1).cpu().tolist() == [[6, 7, 8]]
        assert ids.nonzero().shape == (3, 2)                      # exact data-dependent shape
    assert rec.assumptions == set()
    assert rec.ops["aten.nonzero.default"].count == 1


def test_weight_dependent_values_get_documented_assumptions():
    weight = torch.empty(16, 8, device="meta")
    with MetaScanRecorder(nonzero_rows=3) as rec:
        hits = (weight.sum(-1) > 0).nonzero()
        assert hits.shape == (3, 1)
        assert [int(h[0]) for h in hits] == [1, 1, 1]             # .item() of a count -> 1
        assert bool((weight > 0).any()) is False                  # condition -> False
        assert weight[weight > 0].shape == (3,)
        assert (weight.sum(-1) > 0).long().cpu().tolist() == [1] * 16
    ops = {op for op, _ in rec.assumptions}
    assert {"aten.nonzero.default", "aten._local_scalar_dense.default", "aten.index.Tensor",
            "aten._to_copy.default"} <= ops


def test_stale_shadow_is_dropped_after_weight_dependent_write():
    weight = torch.empty(3, device="meta")
    with MetaScanRecorder():
        x = torch.arange(3, device="meta")
        x.add_(weight.long())                                     # now depends on weights
        assert not hasattr(x, SHADOW)
        assert x.sum().item() == 1                                # assumed, not the stale 3


def test_picky_meta_kernel_gets_a_bfloat16_shape():
    a = torch.empty(8, 16, device="meta")
    b = torch.empty(4, 16, 32, device="meta")
    offs = torch.empty(4, dtype=torch.int32, device="meta")
    with MetaScanRecorder() as rec:
        out = torch._grouped_mm(a, b, offs=offs)
    assert out.shape == (8, 32) and out.dtype == torch.float32
    assert any("bfloat16" in text for _, text in rec.assumptions)
