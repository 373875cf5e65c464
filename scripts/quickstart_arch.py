"""The quickstart's model families (`scripts/quickstart.py --arch`): which tiny base model is built,
where its run goes, and the few settings a family's stages change.

The tokenizer's characters, the demo data, the prompt template and the held-out evaluation are the
same for every family; only the base model differs (`ppo.tiny.factory.ARCHS`: Llama, Qwen3,
Qwen3-MoE, Qwen2-MoE, Mixtral, ERNIE 4.5, ERNIE 4.5 MoE). `ARCH_OVERRIDES` holds, per family and
stage, the command-line flags added after the stage's `config/tiny/*.json` (the configs were tuned
on the Llama); a family absent from it runs the configs as they are.
"""
from ppo.tiny.factory import ARCHS

DEFAULT_ARCH = "llama"
ARCH_OVERRIDES = {
    # The tiny Qwen3-MoE (docs/quickstart_families.md has the runs). PPO: its validation accuracy
    # peaked by step 20 and then drifted down (seed 42: 0.980 -> 0.967-0.970, held out 0.953); twice
    # the Llama's KL penalty keeps the policy nearer the SFT model. DPO: each expert sees only the
    # tokens routed to it (top-2 of 4), and at the Llama's 450 steps the reward margin and the
    # validation accuracy were still rising (seed 43: held out 0.967 at 450 steps, 0.987 at 700).
    "qwen3_moe": {"ppo": {"kl_coeff": 0.1}, "dpo": {"max_steps": 700}},
}
"""`{arch: {stage: {argument: value}}}`: a family's changes to the tiny configs, with the reason
beside each entry (docs/quickstart_families.md has the measured runs)."""


def arch_problem(arch):
    """Why `arch` cannot be built (None when it can): one line naming the choices."""
    if arch in ARCHS:
        return None
    return f"--arch {arch!r} is not a tiny model family; choose one of: {', '.join(ARCHS)}"


def default_output_root(base, arch, seed):
    """`base` (outputs/tiny), `base-<arch>` for another family, then `-seed<N>` when a seed is given:
    outputs/tiny, outputs/tiny-seed43, outputs/tiny-qwen3, outputs/tiny-qwen3_moe-seed43."""
    root = base if arch == DEFAULT_ARCH else f"{base}-{arch}"
    return root if seed is None else f"{root}-seed{seed}"


def factory_flags(arch):
    """The `ppo.tiny.factory` flags that build `arch` (none for the default Llama)."""
    return [] if arch == DEFAULT_ARCH else ["--arch", arch]


def stage_flags(arch, stage):
    """The flags `arch` adds to `stage`'s command (`ARCH_OVERRIDES`), in a fixed order."""
    flags = []
    for key, value in ARCH_OVERRIDES.get(arch, {}).get(stage, {}).items():
        flags += [f"--{key}", str(value)]
    return flags
