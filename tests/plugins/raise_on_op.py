"""Fault: the target raises NotImplementedError on one aten op, like a backend missing a kernel.

Op: env DAY0_RAISE_OP (an aten overload-packet name, default "mm"). Only the target model's own
forward is affected (a dispatch mode around model.forward), never the reference.
"""

import os

from torch.utils._python_dispatch import TorchDispatchMode


class _Raise(TorchDispatchMode):
    def __init__(self, op_name: str):
        super().__init__()
        self.op_name = op_name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == self.op_name:
            raise NotImplementedError(f"aten::{self.op_name} is not implemented on this backend "
                                      "(injected by raise_on_op plugin)")
        return func(*args, **(kwargs or {}))


def apply(model) -> None:
    op_name = os.environ.get("DAY0_RAISE_OP", "mm")
    forward = model.forward

    def raising_forward(*args, **kwargs):
        with _Raise(op_name):
            return forward(*args, **kwargs)

    model.forward = raising_forward
