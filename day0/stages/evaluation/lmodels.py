"""The models lm-eval talks to, through lm-eval's own registry.

* ``day0`` (registered here): the checkpoint loaded the way a torch target loads it (day0's
  loader, the target's device, dtype and plugins applied), handed to lm-eval's HFLM as an
  already-built model: lm-eval's own request batching, tokenization and scoring, no copy.
* engine targets: lm-eval's ``local-completions`` against the engine's /v1/completions, token
  ids sent as the prompt (tokenized_requests), the checkpoint's tokenizer counting them.
"""

from __future__ import annotations

import inspect
import os

from lm_eval.api.registry import get_model, register_model
from lm_eval.models.huggingface import HFLM

from day0.execution.budget import stage_memory_bytes
from day0.engines.settings import Endpoint
from day0.checkpoint.modeling import load_pretrained
from day0.execution.plugins import apply_plugins
from day0.stages.evaluation import prefix
from day0.stages.evaluation.fit import RowFitter, prior_per_token
from day0.execution.targets import Target
from day0.torchkit.evaltext import load_tokenizer


@register_model("day0")
class Day0LM(HFLM):
    """lm-eval's HF model over a checkpoint loaded like a day0 torch target.

    model_args: pretrained (checkpoint folder), device, dtype, plugins ('|'-separated plug-in
    specs, applied in order), trust_remote_code, batch_size, max_length, share_context (score a
    shared context once for all its continuations: day0.stages.evaluation.prefix), share_from
    (only contexts of at least this many tokens; share_context means 2), fit_to_budget (a batch
    runs in chunks of rows that fit the stage's memory budget: day0.stages.evaluation.fit)."""

    def __init__(self, pretrained: str, device: str = "cpu", dtype: str = "float32",
                 plugins: str = "", trust_remote_code: bool = False, batch_size: int = 8,
                 max_length: int | None = None, share_context: bool = False,
                 share_from: int | None = None, fit_to_budget: bool = True,
                 **kwargs) -> None:
        model = load_pretrained(pretrained, device=device, dtype=dtype,
                                trust_remote_code=trust_remote_code)
        specs = [p for p in str(plugins).split("|") if p]
        if specs:
            apply_plugins(model, specs)
        super().__init__(pretrained=model, tokenizer=load_tokenizer(pretrained, trust_remote_code),
                         batch_size=int(batch_size), device=device, max_length=max_length,
                         trust_remote_code=trust_remote_code, **kwargs)
        # transformers' causal LMs compute only the last positions' logits when asked: a batch
        # scores its continuations only, so the rest of the [batch, len, vocab] logits (3 GB
        # at 8 x 2048 x 49152 fp32) and their log-softmax are never computed
        self._keeps_tail = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._scored_from: dict[tuple[int, ...], int] | None = None
        # a context's cache is repeated for its choices: plain attention layers only (a
        # sliding-window or recurrent layer's cache of a padded prefix is not the prefix's)
        if str(share_context).lower() in ("1", "true"):
            share_from = 2
        share_from = int(share_from) if share_from not in (None, "", "None") else None
        self._share_from = share_from if prefix.plain_attention(model.config) else None
        fit = str(fit_to_budget).lower() not in ("0", "false")
        self._fitter = RowFitter(stage_memory_bytes() if fit else None,
                                 prior_per_token(model.config))

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        if self._share_from is None:
            return self._whole(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        import torch

        def score(contexts, continuations):
            return prefix.score_batch(self.model, contexts, continuations,
                                      softmax_dtype=self.softmax_dtype,
                                      autocast_dtype=self.mixed_precision_dtype,
                                      pad_id=self.tokenizer.pad_token_id or 0)

        def cached(request, answer):  # lm-eval's request cache, as its own path fills it
            if request[0] is not None:
                self.cache_hook.add_partial("loglikelihood", request[0], answer)

        dtype = self.softmax_dtype or self.mixed_precision_dtype or self.model.dtype
        return prefix.loglikelihoods(
            requests, max_length=self.max_length, min_context=self._share_from, score=score,
            on_answer=cached,
            batch_tokens=int(self.batch_size) * self.max_length,
            # a bf16 forward rounds: SmolLM2's 2,040-token context scored shared and whole
            # differs by up to 0.17 nats (5.5 % of the sum); a broken cache is nats off
            resolution=16 * torch.finfo(dtype).eps,
            whole=lambda subset: self._whole(subset, disable_tqdm=True, override_bs=override_bs))

    def _whole(self, requests, disable_tqdm: bool = False, override_bs=None):
        """lm-eval's own path: one forward per request (batched), the scored tail only."""
        # per model input (lm-eval's own left truncation), the first position whose logits
        # any request scores; requests that share an input (lm-eval's context cache) take the min
        window = self.max_length + 1
        scored_from: dict[tuple[int, ...], int] = {}
        for _, context, continuation in requests:
            inp = tuple((context + continuation)[-window:][:-1])
            first = len(inp) - len(continuation)
            scored_from[inp] = min(first, scored_from.get(inp, first))
        self._scored_from = scored_from
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm,
                                                 override_bs=override_bs)
        finally:
            self._scored_from = None

    def _model_call(self, inps, attn_mask=None, labels=None):
        if attn_mask is not None or labels is not None:  # a seq2seq model: lm-eval's own call
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        keep = (scored_tail(inps.tolist(), self._scored_from)
                if self._keeps_tail and self._scored_from else None)
        # the batch's rows in chunks that fit the stage's memory budget (one chunk when they do)
        parts = self._fitter.run(inps.shape[0], inps.shape[1],
                                 lambda start, stop: self._forward(inps[start:stop], keep))
        if len(parts) == 1:
            return parts[0]
        import torch

        return torch.cat(parts, dim=0)

    def _forward(self, inps, keep: int | None):
        if keep is None:
            return super()._model_call(inps)
        import torch

        # lm-eval slices each row by the logits' length (its virtual-token offset): the tail is
        # scored exactly like the full sequence; HFLM's autocast kept (mixed_precision_dtype)
        with torch.no_grad(), torch.autocast(device_type=self.device.type,
                                             dtype=self.mixed_precision_dtype,
                                             enabled=self.mixed_precision_dtype is not None):
            return self.model(inps, logits_to_keep=keep).logits


def scored_tail(rows: list[list[int]], scored_from: dict[tuple[int, ...], int]) -> int | None:
    """How many last positions of a right-padded (with 0) batch hold every logit its requests
    score; None when a row is not one of the requests (then the whole sequence is computed)."""
    width = len(rows[0])
    keep = 1
    for row in rows:
        end = len(row)
        while end > 0 and row[end - 1] == 0:
            end -= 1
        # an input may itself end in token 0: the shortest unpadded form that is a request wins
        first = None
        for length in range(max(end, 1), width + 1):
            first = scored_from.get(tuple(row[:length]))
            if first is not None:
                break
        if first is None:
            return None
        keep = max(keep, width - first)
    return keep


def torch_side(source: str, side: Target, *, batch_size: int, max_length: int,
               trust_remote_code: bool, share_from: int | None = None,
               fit_to_budget: bool = True):
    """The lm-eval model of a torch side (reference or target), from lm-eval's registry."""
    return get_model("day0").create_from_arg_obj({
        "pretrained": source, "device": side.device, "dtype": side.dtype,
        "plugins": "|".join(side.plugins), "trust_remote_code": trust_remote_code,
        "batch_size": batch_size, "max_length": max_length, "share_from": share_from,
        "fit_to_budget": fit_to_budget})


def engine_side(source: str, endpoint: Endpoint, target: Target, *, max_length: int,
                concurrency: int, max_gen_toks: int):
    """lm-eval's local-completions client on the engine's OpenAI-compatible completions."""
    key = os.environ.get(endpoint.api_key_env or "", "") if endpoint.api_key_env else ""
    timeout = int(target.engine.request_timeout_s) if target.engine else 120
    return get_model("local-completions").create_from_arg_obj({
        "base_url": endpoint.base_url.rstrip("/") + "/v1/completions",
        "model": endpoint.served_name, "tokenizer": str(source),
        "tokenizer_backend": "huggingface", "tokenized_requests": True,
        "max_length": max_length, "num_concurrent": concurrency, "max_retries": 2,
        "timeout": timeout, "max_gen_toks": max_gen_toks,
        **({"auth_token": key} if key else {})})
