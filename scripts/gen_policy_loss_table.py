"""Write the policy-loss table of docs/algorithms.md from the registry `ppo.algos.POLICY_LOSSES`.

    python scripts/gen_policy_loss_table.py          # rewrite the table in docs/algorithms.md in place
    python scripts/gen_policy_loss_table.py --check  # exit 1 when docs/algorithms.md is out of date

The table sits between `<!-- POLICY_LOSSES:BEGIN -->` and `<!-- POLICY_LOSSES:END -->`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "algorithms.md")
BEGIN, END = "<!-- POLICY_LOSSES:BEGIN -->", "<!-- POLICY_LOSSES:END -->"


def rendered(text):
    """`text` (docs/algorithms.md) with the table between the markers regenerated."""
    from ppo.algos import policy_loss_table

    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{policy_loss_table()}\n{END}{tail}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    text = open(DOC).read()
    new = rendered(text)
    if "--check" in argv:
        return 0 if new == text else 1
    with open(DOC, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
