"""README stays true: the generated argument reference (docs/arguments.md) is current, the two
commands it documents exist, CI runs the test command README gives, README stays a short front
door whose links resolve, and its Layout names every directory and ppo/ module."""
import os
import re

from scripts.gen_args_doc import PAGES, main as gen_args_doc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_argument_reference_is_current():
    assert gen_args_doc(["--check"]) == 0, "run: python scripts/gen_args_doc.py"


def test_argument_reference_covers_every_stage():
    texts = [open(page).read() for page in PAGES]  # docs/arguments.md, docs/arguments_rl.md
    section = "".join(text[text.index("<!-- ARGS:BEGIN -->"):text.index("<!-- ARGS:END -->")] for text in texts)
    for name in ("kl_coeff", "clip_range_ratio", "rollout_n", "adv_estimator", "loss_agg_mode", "normalizer_type",
                 "loss_type", "sft_loss_ratio", "use_lora", "train_datasets", "long_answer_tokens"):
        assert f"| `{name}` |" in section, name


def test_documented_commands_exist_and_ci_runs_the_test_command():
    text = open(os.path.join(ROOT, "README.md")).read()
    assert "bash scripts/quickstart.sh" in text and os.path.isfile(os.path.join(ROOT, "scripts", "quickstart.sh"))
    test_cmd = "bash scripts/setup.sh && .venv/bin/python -m pytest"
    assert test_cmd in text
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "bash scripts/setup.sh" in ci and re.search(r"^\.venv/bin/python -m pytest\s*$", ci, re.M)


FRONT_DOOR = os.path.join(ROOT, "README.md")


def layout_block():
    text = open(FRONT_DOOR).read()
    section = text[text.index("## Layout"):]
    return section[section.index("```") + 3:section.index("```", section.index("```") + 3)]


def test_readme_is_a_front_door_and_its_links_resolve():
    text = open(FRONT_DOOR).read()
    assert len(text.splitlines()) < 250, "README.md: keep reference material in docs/"
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not link.startswith("http") and not os.path.exists(os.path.join(ROOT, link))]
    assert not missing, missing
    docs = sorted(f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    unlinked = [f for f in docs if f"docs/{f}" not in links]
    assert not unlinked, f"README.md does not link {unlinked}"


def test_layout_names_every_directory_and_ppo_module():
    """Every top-level directory, every package of ppo/ and every module directly in ppo/ is
    named in README's Layout block (by itself, or inside a `dir/{a,b}/` or `dir/ a/ b/` group)."""
    block = layout_block()
    words = set(re.findall(r"[\w.\-]+", block))
    top = [d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith((".", "_"))
           and d not in ("outputs", "build", "dist", "log", "runs", "checkpoints") and not d.endswith(".egg-info")]
    ppo_dir = os.path.join(ROOT, "ppo")
    ppo = [n for n in os.listdir(ppo_dir) if not n.startswith("_") and (n.endswith(".py") or os.path.isdir(os.path.join(ppo_dir, n)))]
    missing = [n for n in top if n not in words] + [n for n in ppo if n not in words and n.replace(".py", "") not in words]
    assert not missing, f"README Layout omits {missing}"
