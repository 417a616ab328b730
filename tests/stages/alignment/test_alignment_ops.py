"""Per-operator replay (day0.torchkit.replay) on ops recorded by the real OpRecorder."""

from __future__ import annotations

import pytest
import torch

from day0.torchkit.replay import check_ops, replay_recorded
from day0.torchkit.tolerances import load_tolerances
from day0.errors import ConfigError
from day0.checkpoint.modeling import load_pretrained
from day0.torchkit.opcapture import OpRecorder

TOL = load_tolerances()


def _replay(fn, dtype="bfloat16", reference_inputs="rounded"):
    with torch.no_grad(), OpRecorder(record_examples=True, track_modules=False) as rec:
        fn()
    rows = replay_recorded(rec, device="cpu", dtype=dtype, tolerances=TOL,
                           reference_inputs=reference_inputs)
    return {row.op: row for row in rows}


def test_well_conditioned_ops_pass_in_every_dtype():
    x = torch.randn(32, 48)
    w = torch.randn(48, 16)
    for dtype in ("bfloat16", "float16", "float32"):
        rows = _replay(lambda: (torch.mm(x, w), torch.softmax(x, -1), torch.nn.functional.silu(x),
                                x.sum(-1), x * 2 + 1), dtype)
        bad = {k: r.reason for k, r in rows.items() if r.status != "ok"}
        assert not bad, (dtype, bad)
        assert rows["aten.mm.default"].kind == "accumulate"
        assert rows["aten.mul.Tensor"].kind == "elementwise"


def test_fp16_overflow_fails_the_op():
    x = torch.tensor([1.0, 5.0, 12.0])  # exp(12) = 162755 > fp16 max 65504 -> inf
    rows = _replay(lambda: torch.exp(x), "float16")
    row = rows["aten.exp.default"]
    assert row.status == "failed" and row.mismatched == 1
    assert row.tolerance_ratio == float("inf")
    assert _replay(lambda: torch.exp(x), "bfloat16")["aten.exp.default"].status == "ok"


def test_discrete_ops_are_exact_and_accept_ties():
    # Values equal after rounding to bfloat16 make ties; any tied index is correct.
    x = torch.tensor([[1.0, 1.0001, 0.5], [3.0, 2.0, 3.0004]])
    rows = _replay(lambda: (torch.argmax(x, -1), torch.topk(x, 2, -1), torch.sort(x, -1),
                            torch.gt(x, 1.0), torch.max(x, -1)))
    for name in ("aten.argmax.default", "aten.topk.default", "aten.sort.default",
                 "aten.gt.Scalar", "aten.max.dim"):
        assert rows[name].kind == "discrete", name
        assert rows[name].status == "ok", (name, rows[name].reason)


def test_target_that_cannot_run_an_op_is_an_error_not_a_skip(monkeypatch):
    """An op the target cannot run is the target's error. Only torch's own "no kernel for this
    dtype" (CPU cholesky in bfloat16) is replayed in float32, as a model that runs the op on
    that target upcasts it (a model that does not fails its whole forward on the target)."""
    from day0.torchkit import replay

    a = torch.eye(4) * 2
    row = _replay(lambda: torch.linalg.cholesky_ex(a))["aten.linalg_cholesky_ex.default"]
    assert row.status == "ok" and "no bfloat16 kernel: replayed in float32" in row.reason
    real = replay.resolve_op

    def failing_on_the_target(name):
        func = real(name)

        def call(*args, **kwargs):
            if any(isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 for x in args):
                raise RuntimeError("kernel launch failed on the target")
            return func(*args, **kwargs)
        return call

    monkeypatch.setattr(replay, "resolve_op", failing_on_the_target)
    row = _replay(lambda: torch.linalg.cholesky_ex(a))["aten.linalg_cholesky_ex.default"]
    assert row.status == "error" and "kernel launch failed on the target" in row.reason


def test_unreplayable_ops_are_skipped_with_reason_and_factories_compared():
    rows = _replay(lambda: (torch.empty(3), torch.arange(5), torch.zeros(2, 2),
                            torch.full((2,), 7.0)))
    assert rows["aten.empty.memory_format"].status == "skipped"
    assert "uninitialized" in rows["aten.empty.memory_format"].reason
    for name in ("aten.arange.default", "aten.zeros.default", "aten.full.default"):
        assert rows[name].status == "ok", name


def test_inplace_ops_replay_from_their_inputs():
    x = torch.randn(8)

    def fn():
        x.clone().mul_(3.0).add_(1.0)
        torch.zeros(3).index_add_(0, torch.tensor([0, 0, 2]), torch.ones(3))

    # float32 too: there a dtype cast is a no-op, so only explicit copies protect the example
    # that both sides replay from.
    for dtype in ("bfloat16", "float32"):
        rows = _replay(fn, dtype)
        for name in ("aten.mul_.Tensor", "aten.add_.Tensor", "aten.index_add_.default"):
            assert rows[name].status == "ok", (dtype, name, rows[name].reason)
        assert rows["aten.index_add_.default"].max_abs_error == 0.0


def test_rounded_reference_inputs_isolate_kernel_error():
    # sin of large angles: the input rounding alone moves the result far beyond bf16's rtol.
    x = torch.linspace(20, 200, 64)
    assert _replay(lambda: torch.sin(x))["aten.sin.default"].status == "ok"
    unrounded = _replay(lambda: torch.sin(x), reference_inputs="float32")["aten.sin.default"]
    assert unrounded.status == "failed"


def test_check_ops_on_a_model_covers_its_ops(tiny_llama):
    model = load_pretrained(tiny_llama)
    rows = check_ops(model, torch.arange(16).unsqueeze(0), device="cpu", dtype="bfloat16",
                     tolerances=TOL)
    names = {r.op for r in rows}
    assert {"aten.mm.default", "aten.embedding.default"} <= names
    assert all(r.status in ("ok", "skipped") for r in rows), \
        [(r.op, r.reason) for r in rows if r.status not in ("ok", "skipped")]
    assert all(r.reason for r in rows if r.status == "skipped")


def test_bad_tolerance_file_is_a_config_error(tmp_path):
    bad = tmp_path / "tol.yaml"
    bad.write_text("ops: {kinds: {}, tolerances: {}}\nlayer: {}\n")
    with pytest.raises(ConfigError) as err:
        load_tolerances(bad)
    assert str(bad) in str(err.value) and "layer" in str(err.value)


def test_an_op_without_a_kernel_at_the_target_dtype_replays_as_the_model_upcasts_it():
    """CPU has no bfloat16 triangular solve; qwen3_next's gated delta rule upcasts to float32
    before it, so its bf16 port runs: the replay does the same and says so, never an error."""
    a = torch.eye(8) + torch.randn(8, 8).tril(-1) * 0.1
    b = torch.randn(8, 4)
    rows = _replay(lambda: torch.linalg.solve_triangular(a, b, upper=False))
    row = rows["aten.linalg_solve_triangular.default"]
    assert row.status == "ok", row.reason
    assert "no bfloat16 kernel: replayed in float32" in row.reason
    # a kernel that fails for another reason is still the target's error
    rows = _replay(lambda: torch.mm(a, b))
    assert rows["aten.mm.default"].status == "ok" and rows["aten.mm.default"].reason is None


def test_an_op_the_model_upcasts_is_replayed_as_the_model_runs_it():
    """histc of expert ids, upcast to float32 as transformers' MoE code does on CPU: counts
    above 256 are not exact in bfloat16, so a bf16 replay fails a correct port. The dtypes of
    a forward at the target dtype say how the model runs it: in float32, and so the replay."""
    from day0.torchkit.replay import dtypes_at

    class Counts(torch.nn.Module):
        def forward(self, ids):
            x = torch.nn.functional.embedding(ids, torch.randn(16, 4, dtype=torch.bfloat16))
            experts = x.float().argmax(-1).reshape(-1).repeat(300)  # 4,800 ids in [0, 4)
            return torch.histc(experts.float(), bins=4, min=0, max=3)

    ids = torch.arange(16)[None]
    reference = Counts()
    with torch.no_grad(), OpRecorder(record_examples=True, track_modules=False) as rec:
        reference(ids)
    run_dtypes = dtypes_at(Counts(), ids)
    assert run_dtypes["aten.histc.default"] == {"float32"}
    as_bf16 = replay_recorded(rec, device="cpu", dtype="bfloat16", tolerances=TOL)
    as_run = replay_recorded(rec, device="cpu", dtype="bfloat16", tolerances=TOL,
                             run_dtypes=run_dtypes)
    [naive] = [r for r in as_bf16 if r.op == "aten.histc.default"]
    [faithful] = [r for r in as_run if r.op == "aten.histc.default"]
    assert naive.status == "failed"  # what a bf16 replay of a float32 op gets wrong
    assert faithful.status == "ok" and "runs it in float32 at bfloat16" in faithful.reason
    mm = [r for r in as_run if r.op == "aten.embedding.default"][0]
    assert mm.status == "ok" and mm.reason is None  # bf16 ops still replayed in bf16


def test_a_mask_fill_of_the_float32_minimum_replays_at_the_target_dtype_minimum():
    """A float32 model fills masks with finfo(float32).min, a bf16 one with finfo(bf16).min
    (doge): the recorded scalar is clamped to the target dtype's range on both sides."""
    x = torch.randn(4, 4)
    mask = torch.eye(4, dtype=torch.bool)
    rows = _replay(lambda: x.masked_fill(mask, torch.finfo(torch.float32).min))
    row = rows["aten.masked_fill.Scalar"]
    assert row.status == "ok", row.reason


def test_a_layer_no_side_ran_is_not_compared_one_the_target_skipped_diverges():
    """Mllama's cross-attention layers skip text without an image on every side: nothing to
    compare, never a diverged layer. A layer the reference ran and the target did not is one."""
    from day0.stages.alignment.layers import LayerAccumulator
    from day0.torchkit.paired import Blocks

    n = 64
    scored = torch.ones(n, dtype=torch.bool)
    acc = LayerAccumulator(3)
    hidden = torch.randn(1, n, 8)
    slot = acc.open(scored)
    acc.fill(slot, 0, hidden, hidden * 1.001, hidden * 1.001, scored)
    acc.fill(slot, 1, None, None, None, scored)  # skipped on every side
    acc.fill(slot, 2, hidden, hidden * 1.001, None, scored)  # skipped by the target only
    blocks = Blocks.build(torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long), 8)
    rows = acc.rows(blocks, 1, floor=1e-6, bound=2.0)
    assert [(r.ran, r.diverged) for r in rows] == [(True, False), (False, False), (True, True)]


def test_layer_outputs_of_unusual_shapes_are_compared_or_named_missing():
    """DeepSeek-V4's layers output hyper-connection streams [1, n, 4, hidden]: compared over
    the flattened streams; an output without an axis of the chunk's positions is missing (its
    layer not compared), never a crash."""
    from day0.stages.alignment.layers import LayerAccumulator

    n = 6
    scored = torch.ones(n, dtype=torch.bool)
    acc = LayerAccumulator(2)
    streams = torch.randn(1, n, 4, 8)
    slot = acc.open(scored)
    acc.fill(slot, 0, streams, streams * 1.001, streams * 1.002, scored)
    acc.fill(slot, 1, torch.randn(1, 3, 8), torch.randn(1, 3, 8), torch.randn(1, 3, 8), scored)
    assert acc.missing == {1} and not torch.isnan(acc.err_t[slot][:, 0]).any()
    acc.fill(acc.open(torch.ones(0, dtype=torch.bool)), 0, streams, streams, streams,
             torch.ones(0, dtype=torch.bool))  # a chunk with no position: nothing to add
