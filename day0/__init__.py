"""day0: Day-0 adaptation pipeline for large language models on heterogeneous accelerators."""

__version__ = "0.1.0"

from pathlib import Path

# shipped data: thresholds, op lists, workloads, metric declarations (never code)
DATA_DIR = Path(__file__).parent / "data"
