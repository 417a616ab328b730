"""day0: Day-0 adaptation pipeline for large language models on heterogeneous accelerators."""

__version__ = "0.1.0"
