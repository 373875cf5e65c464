"""A generated table inside a hand-written page: the text between `<!-- NAME:BEGIN -->` and
`<!-- NAME:END -->` is rewritten from a registry's facts (scripts/gen_loss_table.py,
gen_policy_loss_table.py, gen_verifier_table.py)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spliced(text, marker, table):
    """`text` with the table between `<!-- {marker}:BEGIN -->` and `<!-- {marker}:END -->` replaced."""
    begin, end = f"<!-- {marker}:BEGIN -->", f"<!-- {marker}:END -->"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def table_main(doc, marker, make_table, argv=None):
    """Rewrite the table in `doc` (a path under docs/) in place; with `--check` in `argv`, return 1
    when the page is out of date instead. `make_table()` returns the table's markdown."""
    argv = sys.argv[1:] if argv is None else argv
    path = os.path.join(ROOT, "docs", doc)
    text = open(path).read()
    new = spliced(text, marker, make_table())
    if "--check" in argv:
        return 0 if new == text else 1
    with open(path, "w") as f:
        f.write(new)
    return 0
