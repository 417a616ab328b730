"""Correct stack (must PASS): the target's forwards run single-threaded (torch.set_num_threads(1)).

A different thread count changes the reduction order inside matmuls, a legitimate source of
rounding differences that a sound gate must tolerate. The previous thread count is restored
after each forward.
"""

import functools

import torch


def apply(model) -> None:
    forward = model.forward

    @functools.wraps(forward)
    def single_threaded(*args, **kwargs):
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return forward(*args, **kwargs)
        finally:
            torch.set_num_threads(previous)

    model.forward = single_threaded
