"""Checks that a figure of `scripts/plot_metrics.py` shows what its runs' `metrics.jsonl` hold,
read back from the drawn lines (the Figure's Line2D data, or the `.lines.json` written beside the
PNG), never by comparing images. Shared by tests/test_plot_metrics.py and the demo guard."""
import json
import os

import numpy as np

from scripts.plot_metrics import PANELS, sidecar_path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PANEL_METRICS = {name for _, names in PANELS for name in names}


def expected_series(metrics_file, name):
    """`(steps, values)` of `name` read straight from the file: every row holding a number for it."""
    steps, values = [], []
    with open(metrics_file) as f:
        for line in f:
            row = json.loads(line)
            value = row.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                steps.append(row["step"])
                values.append(float(value))
    return steps, values


def panel_metrics_of(metrics_file):
    """The metrics of the file that some panel draws."""
    with open(metrics_file) as f:
        return {name for line in f for name in json.loads(line) if name in PANEL_METRICS}


def assert_same(steps, values, want_steps, want_values, what):
    assert list(steps) == list(want_steps), f"{what}: steps {list(steps)[:8]}... != {list(want_steps)[:8]}..."
    np.testing.assert_allclose(np.asarray(values, dtype=float), np.asarray(want_values, dtype=float),
                               rtol=0, atol=0, equal_nan=True, err_msg=what)


def assert_png_lines_match(png, run_files):
    """The PNG exists and its `.lines.json` holds, for every run (`{label: metrics.jsonl path}`),
    every panel metric of that run with exactly its rows. Returns the drawn JSON."""
    with open(png, "rb") as f:
        assert f.read(8) == PNG_MAGIC, f"{png} is not a PNG"
    drawn = json.load(open(sidecar_path(png)))
    seen = set()
    for panel in drawn["panels"]:
        for line in panel["lines"]:
            want = expected_series(run_files[line["run"]], line["metric"])
            assert_same(line["step"], line["value"], *want, f"{png}: {line['run']} {line['metric']}")
            seen.add((line["run"], line["metric"]))
    wanted = {(label, name) for label, path in run_files.items() for name in panel_metrics_of(path)}
    assert seen == wanted, f"{png}: drawn {sorted(seen ^ wanted)} differ from metrics.jsonl"
    return drawn


def assert_figure_matches(fig, run_files):
    """Every Line2D of `fig` (labelled `metric`, or `run: metric` for several runs) holds exactly
    its run's rows, and every panel metric of every run is drawn. Returns `{axes title: [labels]}`."""
    several = len(run_files) > 1
    seen, titles = set(), {}
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        titles[ax.get_title()] = []
        for line in ax.get_lines():
            label = line.get_label()
            run, metric = label.split(": ", 1) if several else (next(iter(run_files)), label)
            want = expected_series(run_files[run], metric)
            assert_same(line.get_xdata(), line.get_ydata(), *want, f"{ax.get_title()}: {label}")
            seen.add((run, metric))
            titles[ax.get_title()].append(label)
    wanted = {(label, name) for label, path in run_files.items() for name in panel_metrics_of(path)}
    assert seen == wanted, f"drawn {sorted(seen ^ wanted)} differ from metrics.jsonl"
    return titles


def run_files_of(root, names):
    """`{name: <root>/<name>/metrics.jsonl}`."""
    return {name: os.path.join(root, name, "metrics.jsonl") for name in names}
