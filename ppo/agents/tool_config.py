"""Tools declared in a file, without Python changes: a JSON or YAML tool config, as verl's.

    tools:
      - function: my_pkg.tools:lookup          # or verl's class_name: my_pkg.tools.lookup
        config: {timeout_s: 5}                 # optional: timeout_s, options (keyword-only options)
        tool_schema:                           # verl's shape; or name / description / parameters
          type: function
          function:
            name: lookup
            description: Look a key up in the store.
            parameters:
              type: object
              properties: {key: {type: string, description: the key}}
              required: [key]
      - server: {url: "http://127.0.0.1:8100/tools", token_env: TOOL_TOKEN}
        name: weather
        description: Today's weather in a city.
        parameters: {type: object, properties: {city: {type: string}}, required: [city]}

Each entry gives the tool's name, description and JSON-schema parameters (the schema the chat
template's ``tools`` argument shows the model, ``ToolSpec.function_schema()``) and what runs it:
``function`` (``module.path:function`` or a dotted path, a plain or async function) or
``server`` (a URL that answers ``POST {"name": ..., "arguments": {...}}`` with ``{"text": ...}``
or plain text; ``token_env`` names an environment variable holding a bearer token, read when
the file is loaded). The tools
environment takes the file as ``tool_config`` in ``env_kwargs``. Every problem raises one
ValueError that names the file, the entry and the key (``tools.yaml: tools[1].server.url: ...``).
"""
import functools
import importlib
import inspect
import json
import os
import urllib.error
import urllib.request

from .tool_results import ToolTimeout
from .tools import DEFAULT_TIMEOUT_S, ToolSpec

ENTRY_KEYS = ("function", "class_name", "server", "config", "tool_schema", "name", "description", "parameters")


class HttpTool:
    """A tool served over HTTP (see the module docstring); picklable, so it also runs with
    ``tool_isolation`` "process"."""

    def __init__(self, url, name, token=None, timeout_s=DEFAULT_TIMEOUT_S):
        self.url, self.name, self.token, self.timeout_s = url, name, token, float(timeout_s)

    def __repr__(self):  # never the token
        return f"HttpTool({self.url!r}, {self.name!r})"

    def __call__(self, **arguments):
        headers = {"Content-Type": "application/json"}
        token = self.token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        body = json.dumps({"name": self.name, "arguments": arguments}).encode()
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read().decode("utf-8", "replace")
                kind = response.headers.get_content_type()
        except TimeoutError as err:
            raise ToolTimeout(f"its server did not answer within {self.timeout_s:g} s") from err
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"its server answered HTTP {err.code}: {err.read()[:200].decode('utf-8', 'replace')}")
        if kind == "application/json":
            data = json.loads(raw)
            return data["text"] if isinstance(data, dict) and "text" in data else data
        return raw


def read_config_file(path):
    """The parsed file (YAML by extension .yaml/.yml, else JSON); ValueError naming the file."""
    if not os.path.isfile(path):
        raise ValueError(f"tool_config {path}: no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            return yaml.safe_load(text)
        return json.loads(text)
    except Exception as err:  # noqa: BLE001 - yaml and json raise their own types
        raise ValueError(f"tool_config {path}: not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'}: "
                         f"{str(err).splitlines()[0]}") from None


def _import_function(where, spec):
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{where}: must be 'module.path:function', got {spec!r}")
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{where}: cannot import {spec!r} ({type(err).__name__}: {err})") from None
    if inspect.isclass(obj) or not callable(obj):
        raise ValueError(f"{where}: {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def _schema_fields(where, entry):
    """(name, description, parameters) of an entry: verl's tool_schema or the flat keys."""
    if "tool_schema" in entry:
        schema = entry["tool_schema"]
        function = schema.get("function") if isinstance(schema, dict) else None
        if not isinstance(function, dict):
            raise ValueError(f"{where}.tool_schema.function: missing (verl's shape: type: function, function: "
                             "{name, description, parameters})")
        where, source = f"{where}.tool_schema.function", function
    else:
        source = entry
    name, params = source.get("name"), source.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"{where}.name: must be a name without spaces, got {name!r}")
    problem = parameters_problem(params)
    if problem:
        raise ValueError(f"{where}.parameters: {problem}")
    return name, str(source.get("description", "")), params


def parameters_problem(params):
    """Why `params` is not a JSON schema of an object of arguments (None when it is)."""
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        return "must be a JSON schema with type: object"
    props = params.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
        return "properties must map each argument to its schema"
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        return f"required must list keys of properties, got {required!r}"
    return None


def _runner(where, entry, name, timeout_s):
    runs = [k for k in ("function", "class_name", "server") if k in entry]
    if len(runs) != 1:
        raise ValueError(f"{where}: needs exactly one of function, class_name, server (has {runs or 'none'})")
    if runs[0] != "server":
        return _import_function(f"{where}.{runs[0]}", entry[runs[0]])
    server = entry["server"]
    if not isinstance(server, dict) or not str(server.get("url", "")).startswith(("http://", "https://")):
        raise ValueError(f"{where}.server.url: must be an http(s) URL, got {server!r}")
    token_env = server.get("token_env")
    if token_env and not os.environ.get(token_env):
        raise ValueError(f"{where}.server.token_env: the environment variable {token_env} is not set")
    return HttpTool(server["url"], name, os.environ[token_env] if token_env else None, timeout_s)


def tool_spec_from_entry(where, entry):
    """The ToolSpec of one entry of a tool config (see the module docstring)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {', '.join(unknown)} (keys: {', '.join(ENTRY_KEYS)})")
    config = entry.get("config") or {}
    extra = sorted(set(config) - {"timeout_s", "options", "type"}) if isinstance(config, dict) else ["?"]
    if extra:
        raise ValueError(f"{where}.config: unknown key {', '.join(extra)} (keys: timeout_s, options, type)")
    timeout_s = config.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"{where}.config.timeout_s: must be a number > 0, got {timeout_s!r}")
    name, description, params = _schema_fields(where, entry)
    fn = _runner(where, entry, name, timeout_s)
    options = config.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"{where}.config.options: must be a mapping of keyword arguments, got {options!r}")
    fn = functools.partial(fn, **options) if options else fn
    return ToolSpec(name, fn, params, description, float(timeout_s), dict(options))


def load_tool_config(path):
    """The ToolSpecs of the tool config file `path`, in the file's order."""
    data = read_config_file(path)
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list) or not data["tools"]:
        raise ValueError(f"tool_config {path}: needs a non-empty list under the key tools")
    specs, names = [], set()
    for i, entry in enumerate(data["tools"]):
        spec = tool_spec_from_entry(f"tool_config {path}: tools[{i}]", entry)
        if spec.name in names:
            raise ValueError(f"tool_config {path}: tools[{i}].name: {spec.name!r} is declared twice")
        names.add(spec.name)
        specs.append(spec)
    return specs
