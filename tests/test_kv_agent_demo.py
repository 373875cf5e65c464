"""The second agent demo's task (ppo/tiny/kv_task.py): the data splits and their mix of calls, the
per-record `lookup` tool, the environment's reward (the run's only reward) on hand-written
trajectories, and scripts/kv_agent_demo.py's held-out evaluation settings."""
import json

import pytest

from ppo.agents.environment import environment_problems
from ppo.tiny.kv_task import KV_ENV, KVEnvironment, build_kv_data, demonstration, final_answer, record_answer

RECORD = {"src": "add c and k", "tgt": "1209", "store": {"c": 347, "k": 862, "q": 511, "x": 104}, "keys": ["c", "k"]}


def call(tool, arg):
    return f"<tool_call>{tool} {arg}</tool_call>"


def play(env, record, turns):
    """`(observations, rewards, done flags)` of `turns` played in `env` from `record`."""
    env.reset(record)
    out = [env.step(turn) for turn in turns]
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


def test_the_environment_rewards_only_the_records_sum():
    env = KVEnvironment()
    chain = [call("lookup", "c"), call("lookup", "k"), call("calculator", "347+862"), "1209</s>"]
    obs, rewards, done = play(env, RECORD, chain)
    assert obs == ["347", "862", "1209", None] and rewards == [0.0, 0.0, 0.0, 1.0] and done == [False] * 3 + [True]
    # a wrong sum, a sum of other keys, nothing after the tool's answer: 0
    assert play(env, RECORD, [call("lookup", "c"), call("lookup", "k"), "1208"])[1] == [0.0, 0.0, 0.0]
    assert play(env, RECORD, [call("calculator", "347+511"), "858"])[1] == [0.0, 0.0]
    assert play(env, RECORD, ["</s>"])[1] == [0.0]
    assert play(env, RECORD, [" 1209 "])[1] == [1.0]  # the environment rates the answer, not the way to it
    env.close()


def test_the_lookup_tool_reads_each_records_own_store():
    first, second = KVEnvironment(), KVEnvironment()
    other = {**RECORD, "store": {"c": 100, "k": 200}, "tgt": "300"}
    assert play(first, RECORD, [call("lookup", "c")])[0] == ["347"]
    assert play(second, other, [call("lookup", "c")])[0] == ["100"]
    assert first.step(call("lookup", "k"))[0] == "862"  # its own store still, after the other's reset
    obs, rewards, done = play(second, other, [call("lookup", "q"), "300"])
    assert obs[0].startswith("Error: lookup raised KeyError") and "'q'" in obs[0] and rewards == [0.0, 1.0]
    assert first.states.instances["lookup"].calls == 2
    first.close()
    assert first.states.instances == {}  # released
    with pytest.raises(ValueError, match="the record has no store"):
        KVEnvironment().reset({"src": "add c and k", "keys": ["c", "k"]})
    with pytest.raises(ValueError, match="keys must be two keys of its store"):
        record_answer({**RECORD, "keys": ["c", "z"]})


def test_tools_off_leave_only_a_guess():
    env = KVEnvironment(tools=[])
    obs, rewards, _ = play(env, RECORD, [call("lookup", "c"), "1209"])
    assert obs[0].startswith("Error: there is no tool 'lookup'") and rewards == [0.0, 1.0]
    assert env.tools == []
    assert environment_problems(KV_ENV, {"tools": []}) == [] and environment_problems(KV_ENV, {}) == []
    assert "do not fit" in environment_problems(KV_ENV, {"store": {}})[0]


def test_final_answer():
    assert final_answer("<tool_response>12</tool_response>12</s>") == "12"
    assert final_answer(" 12 ") == "12" and final_answer("<tool_response>12</tool_response>") == ""


def test_the_data_splits_and_their_mix_of_calls(tmp_path):
    paths = build_kv_data(str(tmp_path), seed=3, n_sft=800, n_prompts=100, n_test=50)
    rows = {name: [json.loads(line) for line in open(path)] for name, path in paths.items()}
    assert [len(rows[n]) for n in ("sft", "prompts", "test")] == [800, 100, 50]
    ident = {n: {json.dumps([r["store"], r["keys"]], sort_keys=True) for r in rows[n]} for n in ("prompts", "test")}
    assert len(ident["test"]) == 50 and not ident["test"] & ident["prompts"]
    for r in rows["test"] + rows["prompts"]:
        store, (a, b) = r["store"], r["keys"]
        assert len(store) == 4 and a != b and a in store and b in store
        assert all(100 <= v <= 999 for v in store.values())
        assert r["tgt"] == [str(store[a] + store[b])] == [str(record_answer(r))]
        assert r["src"] == [f"add {a} and {b}"] and str(store[a]) not in r["src"][0]
    kinds = {"tools": 0, "lookups": 0, "direct": 0}
    for r in rows["sft"]:
        text = r["tgt"][0]
        kind = "tools" if "calculator" in text else "lookups" if text.startswith("<tool_call>lookup") else "direct"
        kinds[kind] += 1
        if kind == "direct":
            assert text.isdigit() and 200 <= int(text) <= 1998
        else:
            assert text.count("<tool_call>lookup ") == 2 and text.count("<tool_response>") == (3 if kind == "tools" else 2)
    assert 0.45 < kinds["tools"] / 800 < 0.55 and 0.2 < kinds["lookups"] / 800 < 0.3 and 0.2 < kinds["direct"] / 800 < 0.3
    assert demonstration(RECORD, "tools") == (
        "<tool_call>lookup c</tool_call><tool_response>347</tool_response><tool_call>lookup k</tool_call>"
        "<tool_response>862</tool_response><tool_call>calculator 347+862</tool_call><tool_response>1209</tool_response>1209")
    with pytest.raises(ValueError, match="shares summing to at most 1"):
        build_kv_data(str(tmp_path), tool_frac=0.8, lookup_frac=0.3)


@pytest.mark.slow
def test_the_demo_pipeline_at_reduced_size(tmp_path):
    """scripts/kv_agent_demo.py end to end (SFT -> GRPO with the environment's reward alone ->
    held-out success with the tools on and off), at a size that only checks the wiring."""
    from scripts.kv_agent_demo import main

    sizes = {"n_sft": 64, "n_prompts": 16, "n_test": 8}
    extra = {"sft": ["--max_steps", "4", "--save_steps", "4", "--warmup_steps", "0"],
             "grpo": ["--max_steps", "2", "--per_device_prompt_batch_size", "2", "--rollout_n", "2",
                      "--per_device_train_batch_size", "4", "--eval_steps", "2", "--save_steps", "2",
                      "--per_device_eval_batch_size", "8"]}
    summary = main(["--seeds", "7", "--output_root", str(tmp_path / "kv")], data_sizes=sizes, extra=extra, max_rows=8)
    rows = summary["rows"]
    assert [(r["model"], r["seed"], r["tools"]) for r in rows] == [("sft", None, "on"), ("grpo", 7, "on"), ("grpo", 7, "off")]
    assert all(r["success"] * 8 == int(r["success"] * 8) and 0 <= r["success"] <= 1 for r in rows)
    metrics = [json.loads(line) for line in open(tmp_path / "kv" / "grpo-seed7" / "metrics.jsonl")]
    evals = [m for m in metrics if "eval/agent/success" in m]
    assert len(evals) == 2 and rows[1]["trainer_eval_last"] == evals[-1]["eval/agent/success"]
    trains = [m for m in metrics if "objective/scores" in m]
    assert len(trains) == 2
    for m in trains:  # the environment's reward is the score: 0/1 per trajectory, its mean as logged
        assert m["objective/scores"] == pytest.approx(m["agent/env_reward_mean"])
    assert (tmp_path / "kv" / "kv_agent_summary.json").is_file()


def test_the_start_up_prompt_check_resets_each_record_with_its_own_data(tmp_path, tiny_model_dir):
    """The prompt-room check (ppo/agents/prompt_room.py) resets every record as the rollout does:
    with its own fields (the store here) and in its own environment (a record's env_kwargs);
    before, it passed src and tgt only and the run stopped at start-up ("the record has no store")."""
    from ppo.agents import AgentArguments
    from ppo.agents.prompt_room import prompt_room_problems
    from ppo.data import PromptOnlyDataset
    from ppo.models.loading import load_tokenizer

    paths = build_kv_data(str(tmp_path), seed=1, n_sft=2, n_prompts=6, n_test=2)
    rows = [json.loads(line) for line in open(paths["prompts"])]
    rows[0]["env_kwargs"] = {"tools": [], "system_prompt": "answer at once " * 8}  # the longest first prompt
    with open(paths["prompts"], "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    tokenizer = load_tokenizer(tiny_model_dir)
    dataset = PromptOnlyDataset([f"Jsonfile:1.0:{paths['prompts']}"], tokenizer, max_prompt_len=24,
                                prompt_template="USER: {input} ASSISTANT:")
    args = AgentArguments(env_name=KV_ENV, max_total_len=400)
    assert prompt_room_problems(args, dataset, tokenizer) == []
    args.max_total_len = 100  # fits every record but the one with the long system prompt
    problems = prompt_room_problems(args, dataset, tokenizer)
    assert len(problems) == 1 and "prompt 0 of train_datasets" in problems[0], problems


def test_the_held_out_evaluation_samples_as_the_grpo_run_does(tmp_path):
    """scripts/kv_agent_demo.py rates the policy with the GRPO config's own rollout settings (the
    training temperature, response length, turn and length limits): one home for them, so the
    table's "sampled" column cannot drift from training; and the config keeps the settings the
    measured table rests on (learning rate 1e-4: at 3e-4 GRPO made the copying of numbers worse)."""
    import scripts.kv_agent_demo as demo

    args = json.load(open(demo.ROOT + "/" + demo.GRPO_CONFIG))
    assert demo.rollout_settings() == {"temperature": 1.0, "max_dec_len": 24, "max_turns": 4,
                                       "max_tool_response_len": 8, "max_total_len": 104}
    assert args["learning_rate"] == 1e-4 and args["lr_scheduler_type"] == "constant"
    assert args["eval_steps"] == args["max_steps"] == 100 and args["env_name"] == KV_ENV and args["kl_loss_coeff"] == 0
    other = tmp_path / "grpo.json"
    other.write_text(json.dumps({**args, "temperature": 0.7, "max_turns": 3}))
    assert demo.rollout_settings(str(other)) == {**demo.rollout_settings(), "temperature": 0.7, "max_turns": 3}
