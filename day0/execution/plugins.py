"""Target plugins: Python code that changes the target model before it is checked.

A plugin is a module name (``my_pkg.kernels``) or a ``.py`` file path that exposes
``apply(model: torch.nn.Module) -> None``. Plugins run on the target side only, after the
weights are loaded and before any check: ported kernels, monkey patches, or faults injected on
purpose to prove the checks catch them. The reference model never sees them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable

from day0.errors import PluginError, did_you_mean

FIELD = "plugins"


def is_file_plugin(spec: str) -> bool:
    """A plugin given as a .py file path (else a module name)."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _import_error(spec: str, exc: BaseException) -> PluginError:
    # The last frame tells the user where in their plugin the import failed.
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {frame.filename}:{frame.lineno}" if frame else ""
    return PluginError(f"plugin '{spec}' failed to import: {type(exc).__name__}: {exc}{where}",
                       field=FIELD, fix="fix the error in the plugin or remove it from the target")


def _load_file(spec: str) -> ModuleType:
    path = Path(spec).expanduser()
    if not path.is_file():
        siblings = [p.name for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
        hint = did_you_mean(path.name, siblings).strip()
        raise PluginError(f"plugin file '{spec}' not found", file=str(path), field=FIELD,
                          fix=hint or "check the path (relative paths start at the working "
                                      "directory)")
    path = path.resolve()
    # Unique module name per file so two plugins both called noop.py do not clash.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"day0_plugin_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"plugin file '{spec}' cannot be imported as Python", file=str(path),
                          field=FIELD, fix="plugins must be .py files")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _import_error(spec, exc) from None
    return module


def _load_module(spec: str) -> ModuleType:
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        # Distinguish "the plugin does not exist" from "the plugin imports something missing".
        if exc.name and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise PluginError(f"plugin module '{spec}' not found", field=FIELD,
                              fix="install the package that provides it, add its folder to "
                                  "PYTHONPATH, or give a .py file path") from None
        raise _import_error(spec, exc) from None
    except Exception as exc:
        raise _import_error(spec, exc) from None


def load_plugin(spec: str) -> Callable:
    """The ``apply`` function of one plugin; PluginError if it cannot be used."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin spec {spec!r} is empty", field=FIELD,
                          fix="give a module name or a .py file path")
    spec = spec.strip()
    module = _load_file(spec) if is_file_plugin(spec) else _load_module(spec)
    apply = getattr(module, "apply", None)
    origin = getattr(module, "__file__", None)
    if apply is None:
        public = [n for n in vars(module) if not n.startswith("_")]
        hint = did_you_mean("apply", public).strip()
        raise PluginError(f"plugin '{spec}' has no apply(model) function", file=origin,
                          field=FIELD, fix=hint or "define def apply(model) -> None in the plugin")
    if not callable(apply):
        raise PluginError(f"plugin '{spec}': apply is a {type(apply).__name__}, not a function",
                          file=origin, field=FIELD, fix="define def apply(model) -> None")
    try:
        inspect.signature(apply).bind(object())
    except TypeError:
        raise PluginError(f"plugin '{spec}': apply{inspect.signature(apply)} cannot be called "
                          "with one argument (the model)", file=origin, field=FIELD,
                          fix="define def apply(model) -> None") from None
    except ValueError:
        pass  # builtins without a signature: let the call decide
    return apply


def apply_plugins(model, specs: Iterable[str]) -> list[str]:
    """Load every plugin first (fail before touching the model), then apply them in order.

    Returns the specs applied. An exception inside a plugin's apply becomes a PluginError
    naming the plugin.
    """
    specs = list(specs or [])
    loaded = [(spec, load_plugin(spec)) for spec in specs]
    for spec, apply in loaded:
        try:
            apply(model)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"plugin '{spec}' apply(model) raised {type(exc).__name__}: {exc}",
                              field=FIELD, fix="fix the plugin or remove it from the target"
                              ) from exc
    return specs


__all__ = ["load_plugin", "apply_plugins", "is_file_plugin"]
