"""Serving engines as targets: an OpenAI-compatible endpoint that day0 attaches to or launches.

* :mod:`day0.engines.settings` - ``EngineSettings`` (a target's ``engine:`` section) and
  ``Endpoint`` (where a running engine answers: what stages receive);
* :mod:`day0.engines.process`  - launch an engine from its command template, wait until it
  answers, stream its log, always stop it (its whole process group);
* :mod:`day0.engines.client`   - the HTTP client (httpx): completions, chat, streaming,
  tokenize, Prometheus metrics; every failure is an :class:`~day0.engines.client.EngineError`.

Nothing here imports torch or transformers: the engine runs in its own venv or image.
"""
