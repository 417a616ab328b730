"""day0.rendering.plots.warm_up: matplotlib imported and a figure drawn off the caller's thread."""

from __future__ import annotations

import subprocess
import sys

# matplotlib's import is held until the caller has got control back: warm_up must not wait for it
WARM_UP = """
import sys, threading
from day0.rendering import plots

release, reached = threading.Event(), threading.Event()

class HoldMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib":
            reached.set()
            assert release.wait(30)
        return None

assert "matplotlib" not in sys.modules
sys.meta_path.insert(0, HoldMatplotlib())
plots.warm_up()  # returns while the import is held
warm = [t for t in threading.enumerate() if t.name == "day0-plots-warm-up"]
assert len(warm) == 1 and warm[0].daemon
assert reached.wait(60) and "matplotlib.figure" not in sys.modules
release.set()
warm[0].join(60)
assert not warm[0].is_alive()
assert {"matplotlib.figure", "matplotlib.backends.backend_agg"} <= set(sys.modules)
print("warmed")
"""


def test_warm_up_imports_matplotlib_in_a_daemon_thread_without_waiting_for_it():
    # a fresh interpreter: this session may have imported matplotlib already
    done = subprocess.run([sys.executable, "-c", WARM_UP], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "warmed" in done.stdout, done.stderr[-2000:]
