"""Importing a module of one's own named by an argument (`module.path:NAME`: an environment, a
tool, a scorer, an advantage estimator, a policy loss; `find_entry`).

Such a module is the user's code: its import may fail in any way, not only with ImportError (a
SyntaxError, a RuntimeError raised by its top-level code, a missing environment variable).
`import_plugin_module` turns every such failure into ONE line naming the module, what it was
imported for, the error and the place in the module's own files where it was raised, as a
ValueError that the start-up checks report before any model loads (exit status 2, no traceback).
"""
import importlib
import os
import traceback


def error_place(error):
    """`(file, line)` where `error` was raised in the user's code: a SyntaxError's own position,
    else the innermost traceback frame outside the import machinery; None when there is none."""
    if isinstance(error, SyntaxError) and error.filename:
        return error.filename, error.lineno
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<")]
    frames = [f for f in frames if os.path.abspath(f.filename) != os.path.abspath(__file__)]
    if not frames:
        return None
    return frames[-1].filename, frames[-1].lineno


def describe_import_error(error):
    """`ErrorType: message (file, line N)` of an exception raised while importing a module (an
    ImportError's own message alone: it names the missing module)."""
    if isinstance(error, ImportError) and not isinstance(error, SyntaxError):
        return str(error)
    message = error.msg if isinstance(error, SyntaxError) else str(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    place = error_place(error)
    return f"{text} ({place[0]}, line {place[1]})" if place else text


def import_plugin_module(module_name, what, importer=importlib.import_module):
    """The module `module_name` (imported by `importer`) for `what` (e.g. "environment 'a.b:Env'").
    Any exception its import raises becomes ValueError("cannot import module ... for what: ...")."""
    try:
        return importer(module_name)
    except Exception as error:  # noqa: BLE001 - the user's module: any failure is the problem to report
        raise ValueError(f"cannot import module {module_name!r} for {what}: {describe_import_error(error)}") from None


def find_entry(name, registry, kind, what):
    """The entry `name` of `registry` (a dict name -> entry), or the `kind` instance that
    `module.path:NAME` names in a module of one's own (imported here). ValueError naming the
    choices when neither."""
    name = str(name)
    module_name, _, attr = name.partition(":")
    if name in registry:
        return registry[name]
    if not (module_name and attr):
        raise ValueError(f"Unknown {what} {name!r}; valid choices: {list(registry)}")
    module = import_plugin_module(module_name, f"{what} {name!r}")
    try:
        entry = getattr(module, attr)
    except AttributeError as err:
        raise ValueError(f"{what} {name!r}: {err}") from None
    if not isinstance(entry, kind):
        raise ValueError(f"{what} {name!r} is a {type(entry).__name__}, not a {kind.__module__}.{kind.__name__}")
    return entry
