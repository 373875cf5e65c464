"""The parts of the online loop (PPO, GRPO, RLOO, REINFORCE++ and online DPO), each built from its
slice of the arguments (`settings`): the experience maker (`experience_maker`, with `rollout`,
`scoring` and `advantages`), the scored objectives and the combiner (`objectives`), the PPO-family
updater (`updater`), the run state (`run_state`) and the loop that only orchestrates (`loop`,
with `report`, `evaluator` and `watch`). docs/architecture.md draws them."""
