"""Per-position measures of the engine and the control against the reference, from what the
API can give: the logprob of the actual next token and the top-k.

Truncated KL over a top-k set (the engine returns k tokens per position, not the vocabulary):
for a side x with top-k set S (the engine: the tokens it returns with rank <= k, so a tie at
rank k may add one; the control: its k most likely tokens),

    p_S(t) = p_ref(t) / sum_{u in S} p_ref(u),    x_S(t) = p_x(t) / sum_{u in S} p_x(u)
    KL_S(ref || x) = sum_{t in S} p_S(t) * (log p_S(t) - log x_S(t))

i.e. KL between the reference and the side, both renormalized over the side's own top-k. It is
0 when x ranks and weighs S as the reference does; it is blind to mass outside S and to a
constant shift of x's logprobs (the perplexity, read from the actual token's logprob, sees
both). Engine and control use the same k and each its own top-k, so their ratio is fair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

COLUMNS = ("kl_e", "kl_c", "top1_e", "top1_c", "nll_r", "nll_e", "nll_c", "mass_e",
           "window", "position")


def truncated_kl(log_r: torch.Tensor, idx: torch.Tensor, log_x: torch.Tensor,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: KL_S(ref || x) over the set S = idx[mask] (see the module docstring), and the
    reference's mass inside S. log_r [P, V] reference log-probs; idx [P, m] token ids;
    log_x [P, m] the side's log-probs of those tokens; mask [P, m] which entries are in S."""
    neg = torch.tensor(-torch.inf, dtype=torch.float64)
    lr = torch.where(mask, log_r.gather(1, idx), neg)
    lx = torch.where(mask, log_x, neg)
    lr_s = lr - torch.logsumexp(lr, dim=1, keepdim=True)
    lx_s = lx - torch.logsumexp(lx, dim=1, keepdim=True)
    terms = torch.where(mask, lr_s.exp() * (lr_s - lx_s), torch.zeros_like(lr_s))
    # NaN from the side stays NaN (a finding), never hidden by the mask
    terms = torch.where(mask & torch.isnan(log_x), log_x, terms)
    return terms.sum(1), torch.logsumexp(lr, dim=1).exp()


@dataclass
class Measures:
    """Columns over every scored position of every window (scored: past the context positions,
    with a next token)."""

    cols: dict[str, list[torch.Tensor]] = field(
        default_factory=lambda: {k: [] for k in COLUMNS})
    reference_nonfinite: int = 0

    def add(self, w: int, ids: list[int], score_from: int, start: int, logits_r: torch.Tensor,
            logits_c: torch.Tensor, engine, k: int, sub: int = 128) -> None:
        """One chunk of a window: logits_r/logits_c [m, V] (reference, control) at positions
        start..start+m-1; engine: the window's api.WindowLogprobs (positions 0..n-2). Float64
        in sub-chunks of positions: a top-k KL of a good port is ~1e-5, and sub-chunks bound
        the memory of a large vocabulary."""
        first, last = max(start, score_from), min(start + logits_r.shape[0], len(ids) - 1)
        for lo in range(first, last, sub):
            pos = torch.arange(lo, min(lo + sub, last))
            lr = torch.log_softmax(logits_r[pos - start].double(), dim=-1)
            lc = torch.log_softmax(logits_c[pos - start].double(), dim=-1)
            self._positions(w, ids, pos, lr, lc, engine, k)

    def _positions(self, w: int, ids: list[int], pos: torch.Tensor, lr: torch.Tensor,
                   lc: torch.Tensor, engine, k: int) -> None:
        self.reference_nonfinite += int((~torch.isfinite(lr)).sum())
        nxt = torch.tensor(ids)[pos + 1]
        ref_top1 = lr.argmax(-1)
        # engine side: its top-k sets, padded to one width
        tops = [engine.top[p] for p in pos.tolist()]
        m = max(len(t) for t in tops)
        idx = torch.zeros(len(pos), m, dtype=torch.long)
        val = torch.zeros(len(pos), m, dtype=torch.float64)
        mask = torch.zeros(len(pos), m, dtype=torch.bool)
        for row, top in enumerate(tops):
            idx[row, :len(top)] = torch.tensor(list(top.keys()))
            val[row, :len(top)] = torch.tensor(list(top.values()), dtype=torch.float64)
            mask[row, :len(top)] = True
        kl_e, mass_e = truncated_kl(lr, idx, val, mask)
        # control side: its own top-k, same k
        c_val, c_idx = lc.topk(min(k, lc.shape[-1]), dim=-1)
        kl_c, _ = truncated_kl(lr, c_idx, c_val, torch.ones_like(c_idx, dtype=torch.bool))
        # top-1: the reference's argmax is among the side's most likely tokens (ties count)
        top1_e = torch.tensor([int(r) in engine.rank1[p] for r, p in zip(ref_top1.tolist(),
                                                                         pos.tolist())])
        top1_c = (lc.gather(1, ref_top1[:, None])[:, 0] == lc.max(-1).values) & \
            torch.isfinite(lc).all(-1)
        nll_e = -torch.tensor([engine.actual[p] for p in pos.tolist()], dtype=torch.float64)
        for key, value in (("kl_e", kl_e), ("kl_c", kl_c), ("top1_e", top1_e),
                           ("top1_c", top1_c), ("mass_e", mass_e),
                           ("nll_r", -lr.gather(1, nxt[:, None])[:, 0]), ("nll_e", nll_e),
                           ("nll_c", -lc.gather(1, nxt[:, None])[:, 0]),
                           ("window", torch.full((len(pos),), w)), ("position", pos)):
            self.cols[key].append(value)

    def column(self, key: str) -> torch.Tensor:
        return torch.cat(self.cols[key]) if self.cols[key] else torch.zeros(0)

    def __len__(self) -> int:
        return int(sum(len(v) for v in self.cols["window"]))


def bucket_index(positions: torch.Tensor, span: int, n_buckets: int) -> torch.Tensor:
    """Bucket of each position when [0, span) is cut into n_buckets equal parts."""
    return (positions * n_buckets // max(span, 1)).clamp(max=n_buckets - 1)


def bucket_bounds(span: int, n_buckets: int) -> list[tuple[int, int]]:
    """[start, end) positions of each bucket."""
    edges = [-(-b * span // n_buckets) for b in range(n_buckets + 1)]
    return [(edges[b], edges[b + 1]) for b in range(n_buckets)]


__all__ = ["Measures", "truncated_kl", "bucket_index", "bucket_bounds", "COLUMNS"]
