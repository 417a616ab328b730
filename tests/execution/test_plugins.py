"""day0.execution.plugins: loading target plugins by module name or file path, and every way it can fail."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from day0.errors import PluginError
from day0.execution.plugins import apply_plugins, load_plugin

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def _write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def test_load_by_file_path_and_apply():
    model = torch.nn.Linear(2, 2)
    assert apply_plugins(model, [str(PLUGINS / "noop.py")]) == [str(PLUGINS / "noop.py")]


def test_load_by_module_name(tmp_path, monkeypatch):
    _write(tmp_path, "my_day0_plugin.py", """
        def apply(model):
            model.touched = True
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = torch.nn.Linear(2, 2)
    apply_plugins(model, ["my_day0_plugin"])
    assert model.touched is True


def test_plugins_apply_in_order(tmp_path):
    for name, value in (("first.py", 1), ("second.py", 2)):
        _write(tmp_path, name, f"""
            def apply(model):
                model.order = getattr(model, "order", []) + [{value}]
        """)
    model = torch.nn.Linear(2, 2)
    apply_plugins(model, [str(tmp_path / "second.py"), str(tmp_path / "first.py")])
    assert model.order == [2, 1]


def test_same_file_name_in_two_folders_does_not_clash(tmp_path):
    for sub, value in (("a", 1), ("b", 2)):
        (tmp_path / sub).mkdir()
        _write(tmp_path / sub, "plugin.py", f"""
            def apply(model):
                model.value = {value}
        """)
    model = torch.nn.Linear(2, 2)
    apply_plugins(model, [str(tmp_path / "a" / "plugin.py")])
    assert model.value == 1
    apply_plugins(model, [str(tmp_path / "b" / "plugin.py")])
    assert model.value == 2


def test_missing_module_names_it():
    with pytest.raises(PluginError, match="plugin module 'no_such_day0_plugin' not found") as err:
        load_plugin("no_such_day0_plugin")
    assert err.value.fix and "PYTHONPATH" in err.value.fix


def test_missing_file_suggests_close_name(tmp_path):
    _write(tmp_path, "perturb.py", "def apply(model):\n    pass\n")
    with pytest.raises(PluginError, match="not found") as err:
        load_plugin(str(tmp_path / "perturbb.py"))
    assert err.value.file == str(tmp_path / "perturbb.py")
    assert "perturb.py" in err.value.fix


def test_plugin_importing_missing_dependency_is_not_reported_as_missing_plugin(tmp_path):
    _write(tmp_path, "needs_dep.py", "import definitely_not_installed_dep\n")
    with pytest.raises(PluginError, match="failed to import: ModuleNotFoundError.*"
                                          "definitely_not_installed_dep"):
        load_plugin(str(tmp_path / "needs_dep.py"))


def test_syntax_error_in_plugin(tmp_path):
    _write(tmp_path, "broken.py", "def apply(model)\n    pass\n")
    with pytest.raises(PluginError, match="failed to import: SyntaxError"):
        load_plugin(str(tmp_path / "broken.py"))


def test_no_apply_suggests_close_name(tmp_path):
    _write(tmp_path, "typo.py", "def aply(model):\n    pass\n")
    with pytest.raises(PluginError, match="has no apply\\(model\\) function") as err:
        load_plugin(str(tmp_path / "typo.py"))
    assert "aply" in err.value.fix


def test_apply_not_callable(tmp_path):
    _write(tmp_path, "notfn.py", "apply = 3\n")
    with pytest.raises(PluginError, match="apply is a int, not a function"):
        load_plugin(str(tmp_path / "notfn.py"))


def test_apply_with_wrong_signature(tmp_path):
    _write(tmp_path, "twoargs.py", "def apply(model, extra):\n    pass\n")
    with pytest.raises(PluginError, match="cannot be called with one argument"):
        load_plugin(str(tmp_path / "twoargs.py"))


def test_exception_in_apply_names_plugin(tmp_path):
    _write(tmp_path, "raises.py", "def apply(model):\n    raise ValueError('boom')\n")
    with pytest.raises(PluginError, match="plugin '.*raises.py' apply\\(model\\) raised "
                                          "ValueError: boom"):
        apply_plugins(torch.nn.Linear(2, 2), [str(tmp_path / "raises.py")])


def test_all_plugins_load_before_any_applies(tmp_path):
    _write(tmp_path, "marks.py", "def apply(model):\n    model.marked = True\n")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(PluginError):
        apply_plugins(model, [str(tmp_path / "marks.py"), str(tmp_path / "missing.py")])
    assert not hasattr(model, "marked")


def test_empty_spec():
    with pytest.raises(PluginError, match="empty"):
        load_plugin("  ")


def test_crash_plugin_kills_its_process():
    code = ("import torch; from day0.execution.plugins import apply_plugins; "
            f"apply_plugins(torch.nn.Linear(1, 1), [{str(PLUGINS / 'crash.py')!r}]); "
            "print('survived')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert "survived" not in proc.stdout
