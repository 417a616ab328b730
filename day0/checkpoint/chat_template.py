"""The checkpoint's chat template, rendered once under limits before any stage trusts it.

A chat template is code from the checkpoint. transformers renders it in jinja2's sandbox, which
refuses ``range(10**9)`` but not ``range(99999)`` nested twice: a template like that spins the
CPU or grows by tens of MB a second until the stage's budget kills it, and the advice is to
raise a limit. Here each template (tokenizer_config.json's ``chat_template``, a string or named
list, ``chat_template.jinja``, ``chat_template.json``) renders a short conversation as
transformers would, in a forked child with a time limit, a memory ceiling and an output cap. One
that does not finish within them is a checkpoint finding (BROKEN: no stage could serve it). A
template that raises (its own ``raise_exception``, an unsupported role) is not: that is the
smoke stage's finding to make.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import time

TIME_LIMIT_S = 3.0  # real templates render a conversation in milliseconds
MEMORY_LIMIT_BYTES = 512 << 20  # above what the process already holds
OUTPUT_LIMIT_CHARS = 4 << 20  # a real prompt of this conversation is a few hundred characters
CONVERSATION = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "And of Italy?"}]
FIX = "restore the chat template from the model's release"


def templates(reader) -> list[tuple[str, str]]:
    """(where, template text) of every chat template the checkpoint ships (a Reader of
    day0.checkpoint.files)."""
    names = set(reader.names())
    found: list[tuple[str, str]] = []

    def read_json(name):
        try:
            return json.loads(reader.read_range(name, 0, reader.size(name)))
        except (ValueError, OSError):
            return None  # not this check's finding: the loaders say so

    def add(where, value):
        if isinstance(value, str):
            found.append((where, value))
        elif isinstance(value, list):  # [{"name": "default", "template": "..."}, ...]
            for item in value:
                if isinstance(item, dict) and isinstance(item.get("template"), str):
                    found.append((f"{where}[{item.get('name')}]", item["template"]))

    if "tokenizer_config.json" in names:
        config = read_json("tokenizer_config.json")
        if isinstance(config, dict):
            add("tokenizer_config.json chat_template", config.get("chat_template"))
    if "chat_template.json" in names:
        config = read_json("chat_template.json")
        if isinstance(config, dict):
            add("chat_template.json chat_template", config.get("chat_template"))
    if "chat_template.jinja" in names:
        raw = reader.read_range("chat_template.jinja", 0, reader.size("chat_template.jinja"))
        add("chat_template.jinja", raw.decode("utf-8", errors="replace"))
    return found


def _render(text: str) -> int:
    """Characters the template renders for CONVERSATION, as transformers' sandbox renders it;
    -1 past OUTPUT_LIMIT_CHARS; 0 for a template that raises (not this check's finding)."""
    from datetime import datetime

    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        chunks = env.from_string(text).generate(
            messages=CONVERSATION, add_generation_prompt=True, bos_token="<s>",
            eos_token="</s>", tools=None, documents=None)
        total = 0
        for chunk in chunks:
            total += len(chunk)
            if total > OUTPUT_LIMIT_CHARS:
                return -1
        return total
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError):
        return 0


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def probe(text: str) -> str | None:
    """Why the template cannot be rendered within the limits, or None."""
    import jinja2.sandbox  # noqa: F401 - imported before the fork: the child only renders

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render under a memory ceiling, report, leave at once
        code = 3
        try:
            os.close(read_end)
            ceiling = _vm_bytes() + MEMORY_LIMIT_BYTES
            resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
            rendered = _render(text)
            os.write(write_end, str(rendered).encode())
            code = 0
        except MemoryError:
            code = 4
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + TIME_LIMIT_S
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        return (f"it did not finish rendering a four-message conversation within "
                f"{TIME_LIMIT_S:g} s (a loop that never ends, or one of billions of steps)")
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode() or "?"
    code = os.waitstatus_to_exitcode(status)
    if code == 4 or code < 0:
        return (f"rendering a four-message conversation took over "
                f"{MEMORY_LIMIT_BYTES >> 20} MiB of memory")
    if answer == "-1":
        return (f"it renders over {OUTPUT_LIMIT_CHARS} characters for a four-message "
                "conversation")
    return None


def problems(reader) -> list[str]:
    """Checkpoint findings of its chat templates: one line each, naming where the template is,
    never its text."""
    out = []
    for where, text in templates(reader):
        if (why := probe(text)) is not None:
            out.append(f"the chat template ({where}) cannot be served: {why} (fix: {FIX})")
    return out


__all__ = ["templates", "probe", "problems", "TIME_LIMIT_S"]
