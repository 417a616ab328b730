"""The HTTP client of an OpenAI-compatible engine (httpx), and its one exception tree.

``EngineError`` (a StageError: the stage could not finish, verdict ERROR) has three kinds:
``EngineUnreachable`` (refused, reset, timed out: the engine is down or hung),
``EngineHTTPError`` (an error status; ``status`` and a short ``body``), ``EngineProtocolError``
(an answer that is not the API's shape), plus ``EngineStartError`` for a launch that never
answered. A stage that wants to look at an error status itself (an over-long prompt must get a
4xx) calls :meth:`EngineClient.send`, which returns the status instead of raising.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

import httpx

from day0.errors import StageError


class EngineError(StageError):
    """The engine could not answer as the API says (the stage ends ERROR)."""


class EngineStartError(EngineError):
    """A launched engine exited or did not answer in time (the message has its last log lines)."""


class EngineUnreachable(EngineError):
    """Connection refused, reset or timed out: the engine is down or hung."""


class EngineHTTPError(EngineError):
    def __init__(self, message: str, status: int, body: str):
        super().__init__(message)
        self.status, self.body = status, body


class EngineProtocolError(EngineError):
    """An answer that is not the OpenAI-compatible API's shape."""


_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: sum over its label sets} (counters keep `_total`)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE_RE.match(line)
        if not match or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[match.group(1)] = totals.get(match.group(1), 0.0) + value
    return totals


class EngineClient:
    """Requests to one engine; every failure is an EngineError naming the request."""

    def __init__(self, base_url: str, *, api_key_env: str | None = None,
                 timeout_s: float = 120.0):
        self.base_url = base_url.rstrip("/")
        headers = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise EngineError(f"engine.api_key_env names ${api_key_env}, which is not set; "
                                  "export it (the key is never written to a config)")
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers,
                                  timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False)

    @classmethod
    def of(cls, endpoint, timeout_s: float = 120.0) -> "EngineClient":
        return cls(endpoint.base_url, api_key_env=endpoint.api_key_env, timeout_s=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------
    def send(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        """(status, parsed JSON or text); raises only EngineUnreachable."""
        try:
            response = self._http.request(method, path, json=body)
        except httpx.TimeoutException as exc:
            raise EngineUnreachable(f"{method} {path}: no answer from {self.base_url} "
                                    f"({type(exc).__name__}); the engine is hung or overloaded") from None
        except httpx.TransportError as exc:
            raise EngineUnreachable(f"{method} {path}: cannot reach {self.base_url} "
                                    f"({type(exc).__name__}: {exc}); the engine is down") from None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def _ok(self, method: str, path: str, body: dict | None = None) -> Any:
        status, answer = self.send(method, path, body)
        if status >= 400:
            text = answer if isinstance(answer, str) else json.dumps(answer)
            raise EngineHTTPError(f"{method} {path}: HTTP {status}: {text[:300]}", status, text)
        return answer

    def _shape(self, answer: Any, path: str, key: str) -> Any:
        if not isinstance(answer, dict) or key not in answer:
            raise EngineProtocolError(f"{path}: answer has no '{key}': {str(answer)[:200]}")
        return answer

    # -- API ---------------------------------------------------------------------------------
    def models(self) -> list[str]:
        answer = self._shape(self._ok("GET", "/v1/models"), "/v1/models", "data")
        return [m.get("id") for m in answer["data"] if isinstance(m, dict)]

    def only_model(self) -> str:
        names = self.models()
        if len(names) != 1:
            raise EngineError(f"{self.base_url} serves {len(names)} models ({', '.join(names)}); "
                              "name one in engine.served_name")
        return names[0]

    def completion(self, body: dict) -> dict:
        return self._shape(self._ok("POST", "/v1/completions", body), "/v1/completions", "choices")

    def chat(self, body: dict) -> dict:
        return self._shape(self._ok("POST", "/v1/chat/completions", body),
                           "/v1/chat/completions", "choices")

    def stream(self, path: str, body: dict) -> list[dict]:
        """The chunks of a streamed (SSE) completion or chat completion, until [DONE]."""
        chunks: list[dict] = []
        try:
            with self._http.stream("POST", path, json={**body, "stream": True}) as response:
                if response.status_code >= 400:
                    text = response.read().decode("utf-8", "replace")
                    raise EngineHTTPError(f"POST {path} (stream): HTTP {response.status_code}: "
                                          f"{text[:300]}", response.status_code, text)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return chunks
                    try:
                        chunks.append(json.loads(data))
                    except ValueError:
                        raise EngineProtocolError(f"POST {path} (stream): not JSON: {data[:200]}") from None
        except httpx.TimeoutException:
            raise EngineUnreachable(f"POST {path} (stream): no answer from {self.base_url}") from None
        except httpx.TransportError as exc:
            raise EngineUnreachable(f"POST {path} (stream): {type(exc).__name__}: {exc}") from None
        raise EngineProtocolError(f"POST {path} (stream): ended without 'data: [DONE]'")

    def tokenize(self, body: dict) -> list[int]:
        """Token ids of {"prompt": ...} or {"messages": ...} (vLLM/SGLang /tokenize)."""
        return self._shape(self._ok("POST", "/tokenize", body), "/tokenize", "tokens")["tokens"]

    def metrics(self) -> dict[str, float]:
        status, text = self.send("GET", "/metrics")
        if status >= 400 or not isinstance(text, str):
            raise EngineHTTPError(f"GET /metrics: HTTP {status}", status, str(text)[:300])
        return parse_metrics(text)

    def healthy(self) -> bool:
        try:
            return self.send("GET", "/v1/models")[0] == 200
        except EngineUnreachable:
            return False


def counter(metrics: dict[str, float], name: str) -> float | None:
    """A counter by name, with or without Prometheus' `_total` suffix."""
    for candidate in (name, f"{name}_total", name.removesuffix("_total")):
        if candidate in metrics:
            return metrics[candidate]
    return None


__all__ = ["EngineClient", "EngineError", "EngineStartError", "EngineUnreachable",
           "EngineHTTPError", "EngineProtocolError", "parse_metrics", "counter"]
