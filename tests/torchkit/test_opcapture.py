"""OpRecorder: counts, dtypes, modules, replayable examples under a byte cap."""

from __future__ import annotations

import pytest
import torch

from day0.torchkit.opcapture import OpRecorder


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x):
        q = self.proj(x).view(1, 1, 4, 8)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_counts_dtypes_modules_and_composites():
    block = Block()
    with torch.no_grad(), OpRecorder() as rec:
        block(torch.randn(4, 8))
        block(torch.randn(4, 8))
    assert rec.ops["aten.mm.default"].count == 2
    assert rec.ops["aten.mm.default"].dtypes == {"float32"}
    assert rec.ops["aten.mm.default"].module == "Block"          # Linear is a torch.nn built-in
    sdpa = rec.ops["aten.scaled_dot_product_attention.default"]
    assert sdpa.count == 2 and sdpa.packet == "aten.scaled_dot_product_attention"
    kernels = [n for n in rec.ops if "scaled_dot_product" in n and n != sdpa.name]
    assert kernels, "the device kernel under SDPA is recorded too"
    assert [r["name"] for r in rec.rows()] == sorted(rec.ops)


def test_examples_are_detached_cpu_clones_and_replay():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with OpRecorder(record_examples=True) as rec:
        out = torch.mm(a, b)
        a.add_(1.0)                                   # in-place: example holds the input before
    args, kwargs = rec.examples["aten.mm.default"]
    assert args[0] is not a and torch.equal(torch.ops.aten.mm.default(*args, **kwargs), out)
    before, _ = rec.examples["aten.add_.Tensor"]
    assert torch.equal(before[0] + 1.0, a)


def test_sdpa_example_replays_as_aten_op():
    block = Block()
    with torch.no_grad(), OpRecorder(record_examples=True) as rec:
        expected = block(torch.randn(4, 8))
    args, kwargs = rec.examples["aten.scaled_dot_product_attention.default"]
    got = torch.ops.aten.scaled_dot_product_attention.default(*args, **kwargs)
    torch.testing.assert_close(got, expected)


def test_example_byte_cap():
    big, small = torch.randn(256, 256), torch.randn(2, 2)
    with OpRecorder(record_examples=True, max_example_bytes=1024) as rec:
        big.sum()
        small.sum(dim=0)
    assert "aten.sum.default" in rec.examples_skipped and "aten.sum.default" not in rec.examples
    assert "aten.sum.dim_IntList" in rec.examples and rec.example_bytes <= 1024


def test_override_call_and_failing_op_still_counted():
    class Refuse(OpRecorder):
        def call(self, func, args, kwargs):
            if func is torch.ops.aten.mm.default:
                raise NotImplementedError("no mm here")
            return func(*args, **kwargs)

    with pytest.raises(NotImplementedError), Refuse() as rec:
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    assert rec.ops["aten.mm.default"].count == 1 and rec.last_op == "aten.mm.default"
    # hooks and modes are gone after an exception
    with OpRecorder() as again:
        torch.ones(2) + 1
    assert "aten.mm.default" not in again.ops
