"""Write the verifier table of docs/verifiers.md from the scorer registry's facts (`ppo.scorers`).

    python scripts/gen_verifier_table.py          # rewrite the table in docs/verifiers.md in place
    python scripts/gen_verifier_table.py --check  # exit 1 when docs/verifiers.md is out of date

The table sits between `<!-- VERIFIERS:BEGIN -->` and `<!-- VERIFIERS:END -->`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "verifiers.md")
BEGIN, END = "<!-- VERIFIERS:BEGIN -->", "<!-- VERIFIERS:END -->"


def rendered(text):
    """`text` (docs/verifiers.md) with the table between the markers regenerated."""
    from ppo.scorers import verifier_table

    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{verifier_table()}\n{END}{tail}"


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
