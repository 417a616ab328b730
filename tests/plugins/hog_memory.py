"""Fault: allocate and touch 4 GiB, like a kernel that leaks or a far too large workspace.

Under a container memory limit the kernel's OOM killer ends the stage; never load it unbounded.
"""

GIB = 2**30


def apply(model) -> None:
    hog = []
    for _ in range(4):
        hog.append(bytearray(b"\x01") * GIB)  # repeated bytes: every page really written
    model._day0_hog = hog
