"""The one adapter between the engine and Prefect: nothing else in day0 imports prefect, flows
or tasks (an import-linter contract in pyproject.toml holds this; see tests/test_layers.py).

* :mod:`day0.orchestration.submit`: Prefect's client side (start, wait for, cancel flow runs of
  a deployment; API URL; events), for the stage runner on a work pool and the release receiver;
* :mod:`day0.orchestration.local`: the ``validate`` flow itself (in this process, on a served
  deployment, or served from here), for the CLI.
"""
