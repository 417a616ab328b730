"""The engine of an engine target, around a validation's waves.

Attach mode hands the stages the running engine's endpoint; launch mode starts the plain
configuration (day0.engines.process) before the first wave, streams its log into the flow
run's log and stops it when the waves end, whatever happened. An engine that does not come up
is not an exception of the flow: the stages that needed it end ERROR with its last log lines.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

from day0.engines.settings import Endpoint
from day0.errors import Day0Error
from day0.execution.targets import Target


@dataclass
class EngineSession:
    endpoint: Endpoint | None = None
    error: str | None = None  # why the engine is not there (its last log lines included)


@contextmanager
def engine_session(target: Target, source: str, needed: bool, logger) -> Iterator[EngineSession]:
    if target.kind != "engine" or not needed:
        yield EngineSession()
        return
    from day0.engines.process import endpoint_for
    from day0.store.sources import local_checkpoint

    with ExitStack() as stack:
        try:
            endpoint = stack.enter_context(endpoint_for(target.engine, local_checkpoint(source),
                                                        target.dtype, log=logger.info))
        except Day0Error as exc:
            logger.error("engine of %s did not come up: %s", target.name, exc)
            yield EngineSession(error=f"the engine did not come up: {exc}")
            return
        logger.info("engine of %s answers at %s as %r (%s)", target.name, endpoint.base_url,
                    endpoint.served_name, endpoint.mode)
        yield EngineSession(endpoint=endpoint)  # the engine stops when the stack closes
