"""Scoring: the scorer registry (`registry`: one signature, facts beside each entry, plug-ins
from `module.path:Name`) and a process reward model's step rewards (`process_reward`). The
catalogue of every scorer, which registers the built-in verifiers and the judge, is
`ppo.scorers`."""
