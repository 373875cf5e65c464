"""Flags that run `config/tiny/ppo_argument.json` and `grpo_argument.json` as they were before the
demo's PPO took 4 samples per prompt and both kept the best evaluated policy: tests that shrink
those runs (few prompts, no evaluation) put them right after the config path, so their own
flags still override them."""

PPO_AS_BEFORE = ("--rollout_n", "1", "--per_device_train_batch_size", "32", "--load_best_model_at_end", "false")
GRPO_AS_BEFORE = ("--load_best_model_at_end", "false")
