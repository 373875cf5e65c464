"""Training curves from `metrics.jsonl` to PNG: reward, KL, losses, entropy, evaluation.

    python scripts/plot_metrics.py outputs/tiny/ppo                # -> outputs/tiny/ppo/metrics.png
    python scripts/plot_metrics.py outputs/tiny/ppo outputs/tiny/grpo --output rl.png   # runs side by side
    python scripts/plot_metrics.py outputs/tiny-seed4{2,3}/ppo --labels seed42 seed43 --output seeds.png
    python scripts/plot_metrics.py outputs/tiny/dpo --metrics rewards/margins,loss/dpo  # these only

A run is a directory holding `metrics.jsonl` (what every entry point writes in its `output_dir`)
or the file itself. The panels are those of `PANELS` with at least one of their metrics in some
run, so one command draws any entry point's run: PPO/GRPO (`objective/*`, `loss/*`, `policy/*`),
SFT (`loss/sft`), the reward model (`rm/*`), DPO (`rewards/*`) and their `eval/*` metrics.
Several runs share every panel: one colour per run, one line style per metric. The x-axis is the
logged `step`; a row without a metric leaves no point for it.

Beside each PNG a JSON file (`<name>.lines.json`) holds every plotted line, `{"panels": [{"title",
"lines": [{"run", "metric", "step", "value"}]}]}`, which is what was drawn, point for point.
"""
import argparse
import json
import math
import os


PANELS = (
    ("reward", ("objective/scores", "objective/rlhf_reward", "objective/non_score_reward", "rewards/chosen",
                "rewards/rejected", "rewards/margins")),
    ("KL", ("objective/kl", "policy/approxkl_avg", "loss/kl")),
    ("loss", ("loss/policy_avg", "loss/value_avg", "loss/cost_value_avg", "loss/ptx", "loss/sft", "loss/dpo",
              "loss/total", "rm/loss", "cost/loss")),
    ("entropy", ("objective/entropy", "policy/entropy_avg", "actor/entropy")),
    ("clip fraction", ("policy/clipfrac_avg", "val/clipfrac_avg")),
    ("preference accuracy (training)", ("rewards/accuracies",)),
    ("evaluation accuracy", ("eval/accuracy", "eval/accuracy_long", "eval/accuracy_short", "eval/preference_accuracy",
                             "rm/accuracy", "cost/accuracy", "cost/sign_accuracy")),
    ("evaluation score", ("eval/score", "eval/reward_margin", "rm/margin", "cost/margin")),
    ("evaluation loss", ("eval/loss", "rm/eval_loss", "cost/eval_loss")),
    ("cost (Safe RLHF)", ("objective/cost", "lagrange/episode_cost", "lagrange/lambda")),
    ("response length", ("response_length/mean", "eval/response_length")),
    ("learning rate", ("lr",)),
)
"""`(title, metric names)` of every panel a run may fill, in drawing order."""

COLUMNS = 3
DPI = 90
LINE_STYLES = ("-", "--", ":", "-.")


def read_metrics(path):
    """The rows of a run's `metrics.jsonl` (`path` is the file or its directory), in file order;
    a last line cut short by a kill is left out (the file is not changed)."""
    from ppo.common.jsonl_trace import read_rows

    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no metrics.jsonl (pass a run's output_dir or its metrics.jsonl)")
    return read_rows(file, repair=False)


def series(rows, name):
    """`(steps, values)` of metric `name`: every row holding a number for it, in file order."""
    steps, values = [], []
    for row in rows:
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and "step" in row:
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


def choose_panels(runs, metrics=None):
    """`[(title, [names])]` to draw for `runs` (`{label: rows}`): the `PANELS` with at least one
    metric present (only the present ones kept), or one panel per name of `metrics`."""
    present = {name for rows in runs.values() for row in rows for name in row}
    if metrics:
        missing = [m for m in metrics if m not in present]
        if missing:
            raise ValueError(f"no run logged {missing}; logged: {sorted(present - {'step'})}")
        return [(name, [name]) for name in metrics]
    return [(title, [n for n in names if n in present]) for title, names in PANELS if any(n in present for n in names)]


def run_labels(paths):
    """A short label per run path: its directory name, or the path below the runs' common
    folder when directory names repeat (`tiny-seed42/ppo`, `tiny-seed43/ppo`)."""
    dirs = [os.path.abspath(p if os.path.isdir(p) else os.path.dirname(p) or ".") for p in paths]
    names = [os.path.basename(d) for d in dirs]
    if len(set(names)) == len(names):
        return names
    common = os.path.commonpath(dirs)
    return [os.path.relpath(d, common) if d != common else os.path.basename(d) for d in dirs]


def plot_runs(runs, output, metrics=None, title=None, dpi=DPI):
    """Draw `runs` (`{label: rows}`, rows as `read_metrics` gives) into the PNG `output` and its
    `.lines.json`; returns the matplotlib Figure (one Axes per panel, one Line2D per run and
    metric present in it, labelled `metric` for one run and `run: metric` for several)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    panels = choose_panels(runs, metrics)
    if not panels:
        raise ValueError(f"none of the runs {list(runs)} logged a metric that a panel draws (pass --metrics)")
    rows_n = math.ceil(len(panels) / COLUMNS)
    cols_n = min(COLUMNS, len(panels))
    fig = Figure(figsize=(4.6 * cols_n, 3.0 * rows_n), dpi=dpi)
    height = 3.0 * rows_n  # margins in inches (a constrained layout would cost a second drawing pass)
    fig.subplots_adjust(left=0.3 / cols_n, right=1 - 0.05 / cols_n, bottom=0.45 / height,
                        top=1 - (0.6 if title else 0.3) / height, hspace=0.45, wspace=0.22)
    axes = fig.subplots(rows_n, cols_n, squeeze=False).flatten()
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = [draw_panel(ax, runs, panel_title, names, colours) for ax, (panel_title, names) in zip(axes, panels)]
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    write_figure(fig, output, {"runs": list(runs), "panels": drawn})
    return fig


def draw_panel(ax, runs, title, names, colours):
    """Draw the metrics `names` of every run on `ax`; returns `{"title", "lines"}` of what was drawn.
    One run: a colour per metric; several: a colour per run and a line style per metric."""
    lines, several = [], len(runs) > 1
    for r, (label, rows) in enumerate(runs.items()):
        for m, name in enumerate(names):
            steps, values = series(rows, name)
            if not steps:
                continue
            ax.plot(steps, values, color=colours[(r if several else m) % len(colours)],
                    linestyle=LINE_STYLES[m % len(LINE_STYLES)] if several else "-",
                    marker="." if len(steps) < 30 else None, label=f"{label}: {name}" if several else name)
            lines.append({"run": label, "metric": name, "step": steps, "value": values})
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    return {"title": title, "lines": lines}


def write_figure(fig, output, drawn):
    """Save `fig` as the PNG `output` and `drawn` beside it (`sidecar_path`)."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output)
    with open(sidecar_path(output), "w") as f:
        json.dump(drawn, f)


def sidecar_path(png):
    """The JSON file holding the lines drawn in `png`."""
    return (png[:-4] if png.endswith(".png") else png) + ".lines.json"


def default_output(paths):
    """`<run>/metrics.png` for one run; `metrics_comparison.png` in the runs' common folder for several."""
    dirs = [os.path.abspath(p if os.path.isdir(p) else os.path.dirname(p) or ".") for p in paths]
    if len(dirs) == 1:
        return os.path.join(dirs[0], "metrics.png")
    return os.path.join(os.path.commonpath(dirs), "metrics_comparison.png")


def plot_each(runs, output_dir, metrics=None, dpi=DPI):
    """One figure per run of `runs` (`{label: rows}`): `<output_dir>/<label>.png` (and its
    `.lines.json`), titled with the label; returns the PNG paths."""
    paths = []
    for label, rows in runs.items():
        path = os.path.join(output_dir, label.replace(os.sep, "_") + ".png")
        plot_runs({label: rows}, path, metrics=metrics, title=label, dpi=dpi)
        paths.append(path)
    return paths


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("runs", nargs="+", help="run output directories (or their metrics.jsonl files)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--output", default=None,
                       help="PNG to write (default: <run>/metrics.png, or metrics_comparison.png in the runs' common folder)")
    where.add_argument("--output_dir", default=None, help="one figure per run instead, as <output_dir>/<label>.png")
    parser.add_argument("--labels", nargs="+", default=None, help="a legend label per run (default: the directory names)")
    parser.add_argument("--metrics", default=None, help="comma-separated metric names: one panel each instead of the defaults")
    parser.add_argument("--title", default=None, help="a title over the panels (one figure only)")
    parser.add_argument("--dpi", type=int, default=DPI, help="resolution of the PNG (default %(default)s)")
    args = parser.parse_args(argv)
    args.labels = args.labels or run_labels(args.runs)
    if len(args.labels) != len(args.runs):
        parser.error(f"--labels: {len(args.labels)} labels for {len(args.runs)} runs")
    if len(set(args.labels)) != len(args.labels):
        parser.error(f"two runs share a label in {args.labels}: pass --labels")
    return parser, args


def main(argv=None):
    """Plot the runs as the command line says; returns the PNG paths written."""
    parser, args = parse_args(argv)
    try:
        runs = {label: read_metrics(path) for label, path in zip(args.labels, args.runs)}
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
        if args.output_dir:
            written = plot_each(runs, args.output_dir, metrics=metrics, dpi=args.dpi)
        else:
            written = [args.output or default_output(args.runs)]
            plot_runs(runs, written[0], metrics=metrics, title=args.title, dpi=args.dpi)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"plot_metrics.py: error: {err}\n")
    for path in written:
        print(f"[plot_metrics] {path} (its lines in {sidecar_path(path)})")
    return written


if __name__ == "__main__":
    main()
