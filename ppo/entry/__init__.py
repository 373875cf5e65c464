"""What the entry points share above the library: the PPO entry's run builder (`ppo_trainer`) and
arguments (`ppo_arguments`, their checks `ppo_argument_checks`, PaddleNLP's RL keys
`paddlenlp_rl_arguments`), the argument groups their dataclasses are built from
(`argument_groups`, `*_arguments`), and the glue of the PaddleNLP `Trainer`-based entry points
(SFT, reward model, DPO): run set-up and resume (`run_setup`, `trainer_resume`), callbacks
(`trainer_callbacks`) and their argument checks (`trainer_entry_checks`). Importing the package
imports nothing."""
