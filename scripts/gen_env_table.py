"""Write the environment settings table of docs/agent_tools.md from the environment registry's
declarations (`ppo.agents`: each environment's `env_kwargs` keys as `ppo.algos.Setting`s).

    python scripts/gen_env_table.py          # rewrite the table in docs/agent_tools.md in place
    python scripts/gen_env_table.py --check  # exit 1 when docs/agent_tools.md is out of date
"""
import sys

from scripts.doc_tables import table_main


def main(argv=None):
    from ppo.agents import environment_settings_table

    return table_main("agent_tools.md", "ENV_SETTINGS", environment_settings_table, argv)


if __name__ == "__main__":
    sys.exit(main())
