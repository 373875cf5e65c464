"""Faster start-up: PaddleNLP's packages this toolkit never uses are executed on first use.

`import paddlenlp` (3.0.0b4) runs every subpackage's `__init__` eagerly: the task flows, data
augmentation, the serving package and the metrics pull in scikit-learn, SciPy's statistics and
seqeval, about a third of the CPU time of starting any entry point. `defer_on_import()`,
called by `ppo/__init__.py`, waits for the import of PaddleNLP (nothing is registered in a
process that never imports it) and then registers those subpackages as deferred modules: a deferred module runs its real `__init__` the first time code outside
PaddleNLP's own import reads one of its names, and from then on it is the real module. Submodules
(`paddlenlp.metrics.squad`) import as usual. While PaddleNLP itself is being imported, a name
read from a deferred package (`from .taskflow import Taskflow`, `from ..metrics import
ChunkEvaluator`) is bound to a forwarding stand-in that loads the package when called or read.

Only PaddleNLP versions in `VERSIONS` are touched; `PPO_EAGER_PADDLENLP=1` turns it off.
"""
import importlib.machinery
import importlib.util
import os
import sys

DEFERRED = ("metrics", "dataaug", "taskflow", "server", "prompt", "experimental", "embeddings", "seq2vec", "mergekit")
"""Subpackages of `paddlenlp` whose `__init__` waits for first use (nothing PaddleNLP's trainer,
transformers or PEFT import at module level needs their names as classes)."""

VERSIONS = ("3.0.0b4",)


class _ForwardingName:
    """What `from paddlenlp.<deferred> import NAME` binds during PaddleNLP's import: calling it or
    reading an attribute loads the package and forwards to the real object."""

    def __init__(self, load, name):
        self._load, self._name = load, name

    def _real(self):
        return getattr(self._load(), self._name)

    def __call__(self, *args, **kwargs):
        return self._real()(*args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self._real(), attr)

    def __repr__(self):
        return f"<deferred paddlenlp name {self._name!r}>"


def _paddlenlp_importing():
    spec = getattr(sys.modules.get("paddlenlp"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _deferred_module(package_dir, sub):
    """A module for `paddlenlp.<sub>` whose `__init__.py` runs on the first read of a name."""
    init = os.path.join(package_dir, sub, "__init__.py")
    spec = importlib.util.spec_from_file_location(f"paddlenlp.{sub}", init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)

    def load():
        if module.__dict__.get("__getattr__") is first_read:  # not yet run
            del module.__getattr__
            spec.loader.exec_module(module)
        return module

    def first_read(name):
        if name.startswith("__"):
            raise AttributeError(name)
        if _paddlenlp_importing():
            return _ForwardingName(load, name)
        return getattr(load(), name)

    module.__getattr__ = first_read
    return module


def _installed_version():
    try:
        from importlib.metadata import version

        return version("paddlenlp")
    except Exception:  # not installed, or no metadata: leave the import alone
        return None


def defer_unused_packages():
    """Register the `DEFERRED` subpackages before PaddleNLP is imported; a no-op once it is, for
    other versions, or with `PPO_EAGER_PADDLENLP=1`. Returns the names deferred."""
    if "paddlenlp" in sys.modules or os.environ.get("PPO_EAGER_PADDLENLP") == "1":
        return []
    spec = importlib.machinery.PathFinder.find_spec("paddlenlp")
    if spec is None or spec.origin is None or _installed_version() not in VERSIONS:
        return []
    package_dir = os.path.dirname(spec.origin)
    names = []
    for sub in DEFERRED:
        if os.path.isfile(os.path.join(package_dir, sub, "__init__.py")):
            sys.modules[f"paddlenlp.{sub}"] = _deferred_module(package_dir, sub)
            names.append(f"paddlenlp.{sub}")
    return names


class _DeferWhenPaddleNLPImports:
    """A `sys.meta_path` entry that runs `defer_unused_packages()` when `paddlenlp` is first
    imported, then removes itself and lets the usual finders import it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "paddlenlp":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            defer_unused_packages()
        return None


def defer_on_import():
    """Defer PaddleNLP's unused subpackages when it is first imported (a `sys.meta_path` hook;
    nothing happens in a process that never imports it, or when it is already imported)."""
    if "paddlenlp" not in sys.modules and not any(isinstance(f, _DeferWhenPaddleNLPImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferWhenPaddleNLPImports())
