"""Write the verifier table and the scorer settings table of docs/verifiers.md from the scorer
registry's facts and settings (`ppo.scorers`).

    python scripts/gen_verifier_table.py          # rewrite the table in docs/verifiers.md in place
    python scripts/gen_verifier_table.py --check  # exit 1 when docs/verifiers.md is out of date
"""
import sys

from scripts.doc_tables import table_main


def main(argv=None):
    from ppo.scorers import scorer_settings_table, verifier_table

    return max(table_main("verifiers.md", "VERIFIERS", verifier_table, argv),
               table_main("verifiers.md", "SCORER_SETTINGS", scorer_settings_table, argv))


if __name__ == "__main__":
    sys.exit(main())
