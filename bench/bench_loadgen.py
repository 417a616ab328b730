"""The load generator's own ceiling on this machine: vLLM's benchmark client (the one the
performance and soak stages use) against a server that answers at once.

    python bench/bench_loadgen.py [--requests 600] [--concurrency 1,8,64] [--output-tokens 16]

A minimal OpenAI-compatible streaming server (asyncio, in this process: every request gets
`max_tokens` SSE chunks with no model behind them) stands in for an engine with no cost, so
what is measured is the client: the most requests/s and output tokens/s it can drive per
concurrency, and the CPU it takes to do so (cores busy: 1.0 = one core). A stage's run whose
client kept `client_bound_share` (0.8) cores busy is flagged client-bound in its report: its
figures measure the client as much as the engine. Needs `make engine`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.engines.loadgen import LoadRun, TraceEntry, replay  # noqa: E402
from day0.engines.process import engine_python, free_port  # noqa: E402
from day0.engines.settings import Endpoint  # noqa: E402
from day0.execution.targets import resolve_target  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "tiny-llama"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next((int(h.split(":", 1)[1]) for h in lines
                           if h.lower().startswith("content-length:")), 0)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if lines[0].startswith("GET"):
                data = json.dumps({"data": [{"id": "bench"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
                await writer.drain()
                continue
            n = int(body.get("max_tokens") or 1)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            events = [json.dumps({"choices": [{"index": 0, "text": " x"}]}) for _ in range(n)]
            prompt = body.get("prompt")
            events.append(json.dumps({"choices": [], "usage": {
                "prompt_tokens": len(prompt) if isinstance(prompt, list) else 1,
                "completion_tokens": n}}))
            for event in [*events, "[DONE]"]:
                chunk = f"data: {event}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        writer.close()


def serve(port: int, ready: threading.Event) -> None:
    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--output-tokens", type=int, default=16)
    args = parser.parse_args()
    port, ready = free_port(), threading.Event()
    threading.Thread(target=serve, args=(port, ready), daemon=True).start()
    ready.wait(10)
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}", served_name="bench", mode="attach")
    trace = [TraceEntry(input_length=32, output_length=args.output_tokens, hash_ids=[i, i + 1])
             for i in range(0, 2 * args.requests, 2)]
    python = engine_python(resolve_target("vllm-cpu-bf16").engine)
    print(f"vllm bench serve against an instant server, {args.requests} requests of "
          f"{args.output_tokens} output tokens each")
    print(f"{'concurrency':>11} {'requests/s':>11} {'out tok/s':>10} {'client cores':>13}")
    for level in (int(c) for c in args.concurrency.split(",")):
        run = LoadRun(id=f"ceiling-c{level}", trace=trace, concurrency=level, max_duration_s=600)
        with tempfile.TemporaryDirectory() as tmp:
            [outcome], _ = replay([run], endpoint, tokenizer=str(MODEL), python=python,
                                      folder=Path(tmp))
        result = outcome.result or {}
        share = outcome.client_cores or 0.0  # while it sent this run (not its ~8 s start)
        print(f"{level:>11} {result.get('request_throughput', 0):>11.1f} "
              f"{result.get('output_throughput', 0):>10.0f} {share:>13.2f}"
              + ("" if not outcome.error else f"  ({outcome.error[:80]})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
