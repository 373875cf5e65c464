"""Write the policy-loss table of docs/algorithms.md from the registry `ppo.algos.POLICY_LOSSES`.

    python scripts/gen_policy_loss_table.py          # rewrite the table in docs/algorithms.md in place
    python scripts/gen_policy_loss_table.py --check  # exit 1 when docs/algorithms.md is out of date
"""
import sys

from scripts.doc_tables import table_main


def main(argv=None):
    from ppo.algos import policy_loss_table

    return table_main("algorithms.md", "POLICY_LOSSES", policy_loss_table, argv)


if __name__ == "__main__":
    sys.exit(main())
