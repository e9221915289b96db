"""The speed-up table: how much faster each _torchcompile twin trains than its plain script, from a results file.

    python benchmarks/speedup_table.py runs/2025-01-31_12-00-00/results.jsonl [--out DIR]

The results file holds one JSON line per run, as written by a script's --results-path (run.sh collects them).
Writes to DIR (default: the results file's folder):
- speedup.md: per algorithm and env, the steady-state sps of each variant (plain script; twin with no flag,
  --compile, --cudagraphs, both) as median [min, max] over seeds, the speed-up of the fastest variant over
  the plain script, then the final return and the time to the steady state of each variant;
- sps.png and final_return.png: the same numbers per variant, one panel per algorithm and env.

The machine goes in the header: run.sh records it beside the results file (machine.json, written by
`--record-machine FILE`); without that file, the machine running this tool is described, and the header says so.
Runs listed in failed.txt beside the results file (run.sh writes it) are named in the notes under the tables.
"""

import argparse
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

import matplotlib
from common import describe_machine, fail, machine_text, read_results, table_head, table_row, variant  # on the path

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402

VARIANTS = ("plain", "twin", "twin+compile", "twin+cudagraphs", "twin+compile+cudagraphs")
STEADY = (
    "seconds from the first training step to the measured part (compile and warm-up; longer with a cold compile "
    "cache, the first compiled run of a machine)"
)
# The three tables of speedup.md: (results field, title, what a number means).
TABLES = (
    ("sps", "Training speed", "steady-state environment steps per second"),
    ("final_return", "Final return", "mean return of the last 20 episodes: speed should not cost learning"),
    ("compile_seconds", "Time to the steady state", STEADY),
)


def values(rows, field):
    return [row[field] for row in rows if row[field] is not None]


def cell(rows, field):
    """median [min, max] of a field over runs; "n/a" counts the runs that have no value (e.g. too short for sps)."""
    if not rows:
        return "not run"
    found = values(rows, field)
    parts = []
    if found:
        low, high = min(found), max(found)
        parts.append(f"{statistics.median(found):.1f}" + (f" [{low:.1f}, {high:.1f}]" if low != high else ""))
    if missing := len(rows) - len(found):
        parts.append("n/a" if not found and missing == 1 else f"{missing}x n/a")
    return ", ".join(parts)


def speedup(runs):
    """(ratio, variant) of the fastest twin variant over the plain script, by median sps; None if either is missing."""
    medians = {name: statistics.median(values(rows, "sps")) for name, rows in runs.items() if values(rows, "sps")}
    if "plain" not in medians or len(medians) < 2:
        return None
    best = max((name for name in medians if name != "plain"), key=medians.get)
    return medians[best] / medians["plain"], best


def table(groups, variants, field, title, meaning):
    header = ["algorithm", "env", "steps", "seeds", *variants] + (["speed-up"] if field == "sps" else [])
    lines = [f"### {title}", "", f"{meaning}; median [min, max] over seeds.", ""]
    lines += table_head(*header)
    for (algo, env_id), runs in groups.items():
        rows = [row for variant_rows in runs.values() for row in variant_rows]
        steps = ", ".join(str(steps) for steps in sorted({row["total_timesteps"] for row in rows}))
        cells = [algo, env_id, steps, str(len({row["seed"] for row in rows}))]
        cells += [cell(runs.get(name, []), field) for name in variants]
        if field == "sps":
            found = speedup(runs)
            cells.append(f"{found[0]:.2f}x ({found[1]})" if found else "–")
        lines.append(table_row(*cells))
    return lines


def notes(rows):
    """Lines for what a reader of the table should know: runs with no sps, repeated runs of a variant and seed."""
    lines = []
    if no_sps := [f"{row['algo']} {variant(row)} seed {row['seed']}" for row in rows if row["sps"] is None]:
        lines.append(f"- {len(no_sps)} run(s) too short to measure sps (n/a above): {', '.join(no_sps)}")
    repeats = Counter((row["algo"], row["env_id"], variant(row), row["seed"]) for row in rows)
    for (algo, env_id, name, seed), count in repeats.items():
        if count > 1:
            lines.append(
                f"- {algo} on {env_id}, {name}, seed {seed}: {count} runs, all counted (a --cudagraphs run "
                "without CUDA records cudagraphs off, so it counts as the run without that flag)"
            )
    return lines


def plot(groups, variants, field, ylabel, title, path):
    """One panel per algorithm and env: a bar (sps) or a point (return) at the median per variant, min-max whiskers,
    each seed a dot; on the sps plot, each bar is labelled with its speed-up over the plain script."""
    ncols = min(2, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.5 * nrows), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, ((algo, env_id), runs) in zip(axes.flat, groups.items(), strict=False):
        plain = values(runs.get("plain", []), "sps")
        for index, name in enumerate(variants):
            found = values(runs.get(name, []), field)
            if not found:
                ax.annotate("n/a" if runs.get(name) else "not run", (index, 0), xycoords=("data", "axes fraction"),
                            xytext=(0, 6), textcoords="offset points", ha="center", color="gray")  # fmt: skip
                continue
            median = statistics.median(found)
            if field == "sps":
                ax.bar(index, median, color=colors[index], alpha=0.85)
                if plain:
                    ax.annotate(f"{median / statistics.median(plain):.2f}x", (index, max(found)), xytext=(0, 3),
                                textcoords="offset points", ha="center", fontsize=9)  # fmt: skip
            else:
                ax.plot(index, median, "o", color=colors[index], markersize=9)
            whiskers = [[median - min(found)], [max(found) - median]]
            ax.errorbar(index, median, yerr=whiskers, color="black", capsize=4, linewidth=1)
            ax.plot([index] * len(found), found, ".", color="black", alpha=0.6)
        ax.set_xticks(range(len(variants)), [name.replace("+", "\n+") for name in variants], fontsize=8)
        ax.set(xlim=(-0.6, len(variants) - 0.4), title=f"{algo} on {env_id}", ylabel=ylabel)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes.flat[len(groups) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results_path, out_dir):
    rows = read_results(results_path)
    # (algo, env) -> variant -> runs, in the order they first appear in the results file
    groups = defaultdict(lambda: defaultdict(list))
    for row in rows:
        groups[row["algo"], row["env_id"]][variant(row)].append(row)
    # The five variants run.sh runs, then any bf16 ones the results hold (the twins' --bf16).
    variants = VARIANTS + tuple(sorted({variant(row) for row in rows} - set(VARIANTS)))

    machine_path = results_path.parent / "machine.json"
    recorded = machine_path.is_file()
    machine = machine_text(json.loads(machine_path.read_text()) if recorded else describe_machine())
    if not recorded:
        machine += " (not recorded with the results: the machine that made this table)"
    torch_versions = ", ".join(sorted({row["torch_version"] for row in rows}))
    devices = ", ".join(sorted({row["device"] for row in rows}))
    seeds = sorted({row["seed"] for row in rows})
    lines = [
        "## Speed-up of the torch.compile twins over the plain scripts",
        "",
        f"Machine: {machine}; torch {torch_versions}; runs on device {devices}.",
        f"Results: `{results_path.name}`, {len(rows)} runs, seeds: {', '.join(map(str, seeds))}.",
        "Variants: the plain script; its `_torchcompile` twin with no flag, `--compile`, `--cudagraphs` (CUDA only) "
        "and both. Speed-up: median sps of the fastest twin variant over median sps of the plain script.",
        "",
    ]
    for field, title, meaning in TABLES:
        lines += table(groups, variants, field, title, meaning) + [""]
    remarks = notes(rows)
    failed_path = results_path.parent / "failed.txt"  # run.sh lists there the runs that wrote no results line
    if failed_path.is_file():
        remarks += [f"- failed, not in the tables: {line}" for line in failed_path.read_text().splitlines() if line]
    if remarks:
        lines += ["Notes:", *remarks, ""]
    for line in remarks:
        print(f"speedup_table.py: note: {line[2:]}", file=sys.stderr)

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "speedup.md").write_text("\n".join(lines))
    spread = "median over seeds, whiskers: min-max, dots: seeds"
    plot(groups, variants, "sps", "steps per second (steady state)",
         f"Steady-state training speed per variant\n(bars: {spread})", out_dir / "sps.png")  # fmt: skip
    plot(groups, variants, "final_return", "final return (mean of last 20 episodes)",
         f"Final return per variant: speed should not cost learning\n({spread})",
         out_dir / "final_return.png")  # fmt: skip
    return out_dir / "speedup.md"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", type=Path, help="a results file: one JSON line per run")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: the results file's folder)")
    parser.add_argument("--record-machine", type=Path, metavar="FILE", help="only describe this machine, in FILE")
    args = parser.parse_args()

    if args.record_machine:
        machine = describe_machine()
        args.record_machine.write_text(json.dumps(machine, indent=1) + "\n")
        print(f"machine: {machine_text(machine)}, torch {machine['torch']}")
        return
    if args.results is None:
        parser.error("give a results file (or --record-machine FILE)")
    if not args.results.is_file():
        fail(f"no results file {args.results}")
    print(f"table: {write_report(args.results, args.out or args.results.parent)}")


if __name__ == "__main__":
    main()
