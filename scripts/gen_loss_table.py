"""Write the preference-loss table of docs/algorithms.md from the registry `ppo.algos.PREFERENCE_LOSSES`.

    python scripts/gen_loss_table.py          # rewrite the table in docs/algorithms.md in place
    python scripts/gen_loss_table.py --check  # exit 1 when docs/algorithms.md is out of date
"""
import sys

from scripts.doc_tables import table_main


def main(argv=None):
    from ppo.algos import preference_loss_table

    return table_main("algorithms.md", "LOSSES", preference_loss_table, argv)


if __name__ == "__main__":
    sys.exit(main())
