"""A client waits through a Prefect outage (refused or dropped connections, 5xx), backing off,
for at most its limit in a row; then PrefectDown: exit 3 and one line naming the server."""

from __future__ import annotations

import httpx
import pytest

from day0.orchestration.outage import Outage, PrefectDown, outage_s


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def refused() -> Exception:
    return httpx.ConnectError("[Errno 111] Connection refused")


def test_an_outage_shorter_than_the_limit_is_waited_through():
    t, said, answers = FakeTime(), [], iter([refused()] * 6 + ["run"])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    outage = Outage("http://127.0.0.1:4200/api", "following a run", limit_s=60, say=said.append,
                    clock=t.clock, sleep=t.sleep)
    assert outage.call(call) == "run"
    assert 10 < t.now < 60  # backed off, not spinning
    assert "does not answer" in said[0] and "answers again" in said[-1]


def test_an_outage_past_the_limit_names_the_server_with_exit_3():
    t = FakeTime()
    outage = Outage("http://127.0.0.1:4200/api", "waiting for the run of s3://models/m",
                    limit_s=60, clock=t.clock, sleep=t.sleep)

    def down():
        raise refused()

    with pytest.raises(PrefectDown) as caught:
        outage.call(down)
    assert caught.value.exit_code == 3 and 60 <= t.now < 75
    line = str(caught.value)
    assert "http://127.0.0.1:4200/api" in line and "did not answer for 6" in line
    assert "\n" not in line and "day0 stack up" in line


def test_a_5xx_is_an_outage_a_4xx_is_not():
    t = FakeTime()
    outage = Outage("u", "x", limit_s=5, clock=t.clock, sleep=t.sleep)
    request = httpx.Request("GET", "http://127.0.0.1/api/x")
    bad_gateway = httpx.HTTPStatusError("502", request=request,
                                        response=httpx.Response(502, request=request))
    outage.failed(bad_gateway)  # waited
    assert t.now > 0
    missing = httpx.HTTPStatusError("404", request=request,
                                    response=httpx.Response(404, request=request))
    with pytest.raises(httpx.HTTPStatusError):
        outage.failed(missing)
    with pytest.raises(KeyError):  # a bug is no outage
        outage.failed(KeyError("x"))


def test_the_limit_is_data():
    assert outage_s() >= 60
