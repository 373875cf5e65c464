"""JSON-lines run traces (`metrics.jsonl`, `samples.jsonl`) read and written whole lines at a time.

A run killed mid-write (or a full disk) can leave the last line of a trace cut short. Reading
tolerates exactly that: a torn last line is cut off the file with a warning naming it, so a
resume goes on from the rows that were complete. A damaged line anywhere else is not a torn
write; it is refused with an error naming the file and the line number.
"""
import json
import logging
import os

logger = logging.getLogger("ppo")


class TraceFileError(ValueError):
    """A JSON-lines trace with a damaged line that is not its last."""


def _parse_lines(path, text):
    """`(rows, torn)`: the parsed rows of `text` and whether its last line was torn (unparseable,
    or parseable but never finished with a newline and therefore still open for appends)."""
    lines = text.split("\n")
    ends_whole = lines[-1] == ""
    if ends_whole:
        lines = lines[:-1]
    rows, torn = [], False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            if number == len(lines):
                torn = True
                break
            raise TraceFileError(f"{path}: line {number} is not a complete JSON object ({err}); "
                                 f"only a torn last line is repaired automatically") from None
        rows.append(row)
    if not ends_whole and not torn and lines:
        torn = None  # the last row parsed; only its newline is missing
    return rows, torn


def read_rows(path, repair=True):
    """The rows (dicts) of the JSON-lines file `path`; [] when it does not exist.

    A torn last line (a kill or a full disk mid-write) is dropped with a warning naming the file
    and, with `repair`, cut off the file (a complete last row missing only its newline gets the
    newline). A damaged line before the last raises TraceFileError naming file and line."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    rows, torn = _parse_lines(path, text)
    if torn:
        logger.warning(f"{path}: the last line was cut short (a run stopped mid-write); dropped it and kept {len(rows)} rows")
    if repair and torn is not False:
        write_rows(path, rows)
    return rows


def write_rows(path, rows):
    """Replace `path` with `rows`, one JSON object per line, through a temporary file and a
    rename (a kill leaves either the old or the new file)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_rows(path, rows):
    """Append `rows` to `path`, each line in one write and flushed at once, so a kill leaves at
    most the line being written torn (which `read_rows` repairs)."""
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            f.flush()
