"""Write the verifier table of docs/verifiers.md from the scorer registry's facts (`ppo.scorers`).

    python scripts/gen_verifier_table.py          # rewrite the table in docs/verifiers.md in place
    python scripts/gen_verifier_table.py --check  # exit 1 when docs/verifiers.md is out of date
"""
import sys

from scripts.doc_tables import table_main


def main(argv=None):
    from ppo.scorers import verifier_table

    return table_main("verifiers.md", "VERIFIERS", verifier_table, argv)


if __name__ == "__main__":
    sys.exit(main())
