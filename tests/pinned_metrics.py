"""Metrics of end-to-end runs pinned at fixed steps to recorded values.

A test that trains the tiny models for a few steps can check more than "finite and moving": the
same code, data and seed give the same numbers, so a change that moves them (a loss's sign, a
reduction, a mask, the order of a sum) shows up even when the run still learns.

`tests/fixtures/pinned_metrics.json` holds, per run name, every logged metric (wall-clock ones
left out) at the pinned steps, recorded on a 2-core AVX2 AMD CPU (paddle 3.3.1, paddlenlp
3.0.0b4) with the suite's settings: `MKL_DEBUG_CPU_TYPE=5` (tests/conftest.py) and one
OpenMP/MKL thread (Paddle's default).

    assert_pinned("rdpo", rows, rtol=..., atol=...)

checks `|observed - pinned| <= atol + rtol * |pinned|` for every pinned step and metric and lists
every miss at once. A test's tolerance sits a little above the spread measured over repeated
runs, 2 OpenMP/MKL threads instead of 1 and MKL's generic code path instead of its AVX2 one
(`MKL_DEBUG_CPU_TYPE=` empty); the test says what that spread was.

After an intended change of the numbers, record and write them again:

    PIN_RECORD=/tmp/pins.jsonl .venv/bin/python -m pytest tests/test_preference_families.py ...
    .venv/bin/python tests/pinned_metrics.py /tmp/pins.jsonl

Under `PIN_RECORD` each `assert_pinned` call appends its run's metrics to that file and checks
nothing; the command then rewrites the pinned steps of every run the file holds (a run not
pinned yet needs its steps: `--steps NAME=1,3`).
"""
import argparse
import json
import math
import os

RECORD_ENV = "PIN_RECORD"
PINS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "pinned_metrics.json")
VOLATILE = ("timing_s/", "perf/", "runtime", "per_second")  # wall-clock measurements


def rows_by_step(rows):
    """`{step: {metric: value}}` of metrics.jsonl rows (rows of one step merged; numbers only,
    wall-clock metrics left out)."""
    merged = {}
    for row in rows:
        if "step" not in row:
            continue
        merged.setdefault(int(row["step"]), {}).update({
            k: v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and not any(s in k for s in VOLATILE)
        })
    return merged


def load_pins(name, path=PINS_FILE):
    """`{step: {metric: value}}` pinned for `name` (empty when none)."""
    with open(path) as f:
        pins = json.load(f).get(name, {})
    return {int(step): metrics for step, metrics in pins.items()}


def assert_pinned(name, rows, rtol, atol):
    """`rows` (metrics.jsonl's dicts) hold the values pinned for `name` within
    `atol + rtol * |value|`; under `PIN_RECORD` the rows are recorded instead."""
    if os.environ.get(RECORD_ENV):
        with open(os.environ[RECORD_ENV], "a") as f:
            f.write(json.dumps({"name": name, "rows": rows_by_step(rows)}) + "\n")
        return
    pins = load_pins(name)
    assert pins, f"{name}: nothing pinned in {PINS_FILE}"
    observed = rows_by_step(rows)
    misses = []
    for step, metrics in sorted(pins.items()):
        for key, pinned in sorted(metrics.items()):
            value = observed.get(step, {}).get(key)
            if value is None:
                misses.append(f"step {step} {key}: not logged (pinned {pinned!r})")
            elif not (math.isfinite(value) and abs(value - pinned) <= atol + rtol * abs(pinned)):
                misses.append(f"step {step} {key}: {value!r}, pinned {pinned!r} (off by {abs(value - pinned):.3g}, "
                              f"allowed {atol + rtol * abs(pinned):.3g})")
    assert not misses, (f"{name}: metrics moved from their recorded values (intended? record them again, "
                        f"see tests/pinned_metrics.py):\n  " + "\n  ".join(misses))


def updated_pins(pins, records, new_steps):
    """`pins` with the runs of `records` (`{name: {step: metrics}}`) written at their pinned steps
    (or at `new_steps[name]` for a run not pinned yet)."""
    out = dict(pins)
    for name, rows in records.items():
        steps = new_steps.get(name) or sorted(int(s) for s in pins.get(name, {}))
        if not steps:
            raise SystemExit(f"{name} is not pinned yet: give its steps with --steps {name}=STEP,STEP")
        missing = [s for s in steps if s not in rows]
        if missing:
            raise SystemExit(f"{name}: the record has no step {missing} (logged: {sorted(rows)})")
        out[name] = {str(s): dict(sorted(rows[s].items())) for s in steps}
    return dict(sorted(out.items()))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write the runs recorded under PIN_RECORD into " + PINS_FILE)
    parser.add_argument("record", help="the file PIN_RECORD named")
    parser.add_argument("--steps", action="append", default=[], metavar="NAME=STEP,STEP",
                        help="the steps to pin for a run not pinned yet (or to pin instead)")
    args = parser.parse_args(argv)
    new_steps = {}
    for item in args.steps:
        name, steps = item.split("=", 1)
        new_steps[name] = [int(s) for s in steps.split(",")]
    records = {}
    with open(args.record) as f:
        for line in f:
            entry = json.loads(line)
            records[entry["name"]] = {int(s): m for s, m in entry["rows"].items()}
    with open(PINS_FILE) as f:
        pins = json.load(f)
    pins = updated_pins(pins, records, new_steps)
    with open(PINS_FILE, "w") as f:
        json.dump(pins, f, indent=1)
        f.write("\n")
    print(f"wrote {', '.join(sorted(records))} into {PINS_FILE}")


if __name__ == "__main__":
    main()
