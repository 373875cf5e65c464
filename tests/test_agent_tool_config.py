"""Tools declared in a file (ppo/agents/tool_config.py): verl's YAML shape and a flat JSON form,
functions of a user's module or an HTTP server, the schema shown to the model through the chat
template's `tools` argument, a GRPO run through ppo/run_ppo.py driven by such a file, and one
clear message per mistake (file, entry, key) before any model loads."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ppo.agents import ChatTemplateFormat, ToolEnvironment, environment_problems
from tests.agent_outside import OUTSIDE_ENV, agent_row, run_outside

VERL_YAML = """
tools:
  - class_name: user_env.lookup
    config:
      type: native
      timeout_s: 5
    tool_schema:
      type: function
      function:
        name: kv_get
        description: Read the value stored under a key.
        parameters:
          type: object
          properties:
            key: {type: string, description: the key to read}
          required: [key]
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_env.py").write_text(OUTSIDE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OUTSIDE_TOOL_LOG", str(tmp_path / "log.jsonl"))
    return tmp_path


def test_a_verl_yaml_tool_config_declares_a_tool_and_the_chat_template_shows_its_schema(user_module, tmp_path):
    from ppo.tiny.bpe_tokenizers import build_qwen2_tokenizer

    path = tmp_path / "tools.yaml"
    path.write_text(VERL_YAML)
    env = ToolEnvironment(tool_config=str(path))
    assert list(env.specs) == ["kv_get"] and env.specs["kv_get"].timeout_s == 5.0
    first = env.reset({"src": "What is stored under a?"})
    obs, _, done, info = env.step('<tool_call>{"name": "kv_get", "arguments": {"key": "a"}}</tool_call>')
    assert (obs, done, info["tool_calls"][0]["error"]) == ("11", False, None)
    assert env.step("<tool_call>kv_get b</tool_call>")[0] == "22"
    fmt = ChatTemplateFormat(build_qwen2_tokenizer(str(tmp_path / "qwen"), tool_calls=True))
    prompt = fmt.prompt_segments(first, env.tools)[0].text
    expected = {"type": "function", "function": {"name": "kv_get", "description": "Read the value stored under a key.",
                "parameters": {"type": "object", "properties": {"key": {"type": "string",
                                                                        "description": "the key to read"}},
                               "required": ["key"]}}}
    start = prompt.index("<tools>\n") + len("<tools>\n")
    listed = prompt[start: prompt.index("\n</tools>", start)].splitlines()
    assert [json.loads(line) for line in listed] == [expected]


class _ToolServer(BaseHTTPRequestHandler):
    seen = []

    def do_POST(self):  # noqa: N802 - the http.server name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((body, self.headers.get("Authorization")))
        reply = json.dumps({"text": f"{body['arguments']['city']}: sunny"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_a_json_tool_config_declares_a_tool_served_over_http(tmp_path, monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _ToolServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("WEATHER_TOKEN", "s3cret")
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": [{
        "server": {"url": f"http://127.0.0.1:{server.server_port}/call", "token_env": "WEATHER_TOKEN"},
        "name": "weather", "description": "Today's weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]}))
    try:
        for isolation in ("thread", "process"):
            env = ToolEnvironment(tool_config=str(path), tools=["calculator"], tool_isolation=isolation)
            env.reset({"src": "q"})
            assert env.step("<tool_call>weather Paris</tool_call>")[0] == "Paris: sunny"
            assert env.step("<tool_call>calculator 6*7</tool_call>")[0] == "42"
    finally:
        server.shutdown()
    assert _ToolServer.seen[-1] == ({"name": "weather", "arguments": {"city": "Paris"}}, "Bearer s3cret")


@pytest.mark.parametrize("config,message", [
    ({"tools": []}, "needs a non-empty list under the key tools"),
    ({"tools": [{"function": "user_env.lookup"}]}, "tools[0].name: must be a name without spaces, got None"),
    ({"tools": [{"function": "user_env:nothing", "name": "x"}]}, "tools[0].function: cannot import 'user_env:nothing'"),
    ({"tools": [{"function": "user_env:ScriptEnv", "name": "x"}]}, "tools[0].function: 'user_env:ScriptEnv' is a type"),
    ({"tools": [{"name": "x"}]}, "tools[0]: needs exactly one of function, class_name, server (has none)"),
    ({"tools": [{"function": "user_env.lookup", "name": "x", "colour": 1}]}, "tools[0]: unknown key colour"),
    ({"tools": [{"function": "user_env.lookup", "name": "x", "parameters": {"type": "object", "required": ["k"]}}]},
     "tools[0].parameters: required must list keys of properties, got ['k']"),
    ({"tools": [{"server": {"url": "ftp://x"}, "name": "x"}]}, "tools[0].server.url: must be an http(s) URL"),
    ({"tools": [{"tool_schema": {"type": "function"}, "function": "user_env.lookup"}]},
     "tools[0].tool_schema.function: missing"),
    ({"tools": [{"function": "user_env.lookup", "name": "x", "config": {"timeout_s": 0}}]},
     "tools[0].config.timeout_s: must be a number > 0, got 0"),
    ({"tools": [{"server": {"url": "http://x", "token_env": "NO_SUCH_TOKEN_VAR"}, "name": "x"}]},
     "tools[0].server.token_env: the environment variable NO_SUCH_TOKEN_VAR is not set"),
])
def test_each_mistake_in_a_tool_config_is_named_before_models_load(user_module, tmp_path, config, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    problems = environment_problems("tools", {"tool_config": str(path)})
    assert len(problems) == 1 and f"tool_config {path}: " in problems[0] and message in problems[0], problems


def test_a_tool_config_that_is_not_yaml_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("tools: [unclosed")
    assert f"tool_config {path}: not valid YAML" in environment_problems("tools", {"tool_config": str(path)})[0]


@pytest.mark.slow
def test_a_verl_tool_config_drives_a_grpo_run(tiny_model_dir, tiny_data_dir, tmp_path):
    """ppo/run_ppo.py with the tools environment's tools declared in the YAML file only: every
    row's call of `kv_get` runs the user's function (8 calls, their answers read)."""
    path = tmp_path / "tools.yaml"
    path.write_text(VERL_YAML)
    kwargs = {"script": ["<tool_call>kv_get b</tool_call>"], "tool_config": str(path)}
    proc, metrics, tools, samples = run_outside(tmp_path, tiny_model_dir, tiny_data_dir, "cfg", kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = agent_row(metrics)
    assert row["tool/kv_get/calls"] == 8.0 and row["tool/kv_get/errors"] == 0.0
    assert [t["key"] for t in tools] == ["b"] * 8
    assert samples and all("<tool_response>22</tool_response>" in s["response"] for s in samples)
