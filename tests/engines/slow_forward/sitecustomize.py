"""A slower batched decode, same answers: on PYTHONPATH of a vLLM for CPU's processes, every
forward of the Llama model over 2 to DAY0_SLOW_FORWARD_MAX_TOKENS tokens (decode steps of several
sequences) sleeps DAY0_SLOW_FORWARD - 1 times its own compute after it, as a batched kernel that
lost its fast path in a new software stack would. One sequence at a time, and prefills, run as
before. Unlike --max-num-seqs 1, which slows a median only where batching is nearly free (on a
compute-bound 2-core CPU the serialized engine measured 0.94-1.08x its baseline), this slows
concurrent decoding on every machine.

DAY0_SLOW_FORWARD_FILE instead names a file holding the factor, read again at most every 0.2 s:
one running engine is measured as it is (factor 1) and then slowed, without a second start."""

import importlib.abc
import os
import sys
import time

MODULE = "vllm.model_executor.models.llama"
FACTOR = float(os.environ.get("DAY0_SLOW_FORWARD", "4"))
MAX_TOKENS = int(os.environ.get("DAY0_SLOW_FORWARD_MAX_TOKENS", "8"))
FACTOR_FILE = os.environ.get("DAY0_SLOW_FORWARD_FILE")
_read = {"at": float("-inf"), "factor": 1.0}


def _factor() -> float:
    if not FACTOR_FILE:
        return FACTOR
    now = time.monotonic()
    if now - _read["at"] > 0.2:
        _read["at"] = now
        try:
            with open(FACTOR_FILE) as f:
                _read["factor"] = float(f.read().strip() or 1)
        except (OSError, ValueError):
            _read["factor"] = 1.0
    return _read["factor"]


def _slow_down(module) -> None:
    cls = module.LlamaForCausalLM
    forward = cls.forward

    def slow_forward(self, input_ids, positions, *args, **kwargs):
        start = time.perf_counter()
        out = forward(self, input_ids, positions, *args, **kwargs)
        factor = _factor()
        if factor > 1 and 1 < positions.shape[-1] <= MAX_TOKENS:  # one token per decoding sequence
            time.sleep((factor - 1) * (time.perf_counter() - start))
        return out

    cls.forward = slow_forward


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the model module right after it is executed (vLLM imports it lazily)."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_and_patch(module, exec_module=exec_module):
                    exec_module(module)
                    _slow_down(module)

                spec.loader.exec_module = exec_and_patch
                return spec
        return None


sys.meta_path.insert(0, _PatchOnImport())
