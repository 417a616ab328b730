"""/healthz reports the store as it is (issue 28): its probe finds a store that is down although
no check has run since, asks at most once per cache period, never makes a caller wait for a
probe already in flight; the last check's failure still counts once the store is back."""

from __future__ import annotations

import threading

from day0.receiver.checks import StoreHealth, StoreProbe


def test_the_probe_is_cached_and_never_waited_for_twice():
    answers = iter([None, "cannot reach the S3 endpoint http://store:8333", None])
    asked = []
    in_flight, release = threading.Event(), threading.Event()

    def ask():
        asked.append(1)
        if len(asked) == 2:
            in_flight.set()
            release.wait(10)  # a probe stuck on a dead store
        return next(answers)

    probe = StoreProbe(ask, cache_s=0)
    first = probe.result()
    assert first.down is None and len(asked) == 1
    stuck = threading.Thread(target=probe.result)
    stuck.start()
    assert in_flight.wait(10)
    assert probe.result() is first  # the last answer, at once
    release.set()
    stuck.join(10)
    assert probe._last.down.startswith("cannot reach")  # what the stuck probe found
    again = probe.result()
    assert again.down is None and len(asked) == 3  # cache_s 0: asked each time it is free
    cached = StoreProbe(lambda: asked.append(1), cache_s=60)
    assert cached.result() is cached.result() and len(asked) == 4


def test_health_is_degraded_while_the_probe_finds_the_store_down():
    from day0.receiver.checks import ProbeResult

    health = StoreHealth(timeout_s=30)
    assert health.report(None, 0, 0, ProbeResult(None, 1.0, 1.0))["state"] == "ok"
    health.ok()  # the last check passed, before the outage
    down = health.report(None, 0, 0, ProbeResult("cannot reach the S3 endpoint http://s:1", 5.0,
                                                  4.0))
    assert down["state"] == "degraded" and "http://s:1" in down["detail"]
    assert down["since"] == 4.0 and down["probe"] == {"reachable": False, "at": 5.0}
    back = health.report(None, 0, 0, ProbeResult(None, 9.0, 9.0))
    assert back["state"] == "ok" and back["probe"]["reachable"]
    health.failed("check of s3://models/m failed: access denied")  # the store answers, no
    assert health.report(None, 0, 0, ProbeResult(None, 9.0, 9.0))["state"] == "degraded"
