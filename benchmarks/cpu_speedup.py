"""Steady-state training speed on CPU: each plain script against its torch.compile twin, side by side.

For every algorithm it runs the plain script, the twin with no flag and the twin with --compile, in turn, for
several repeats (interleaved, so a slow spell of a shared machine hits every variant alike), and prints the
median steady-state sps of each variant with its ratio to the plain script, as a markdown table.

    python benchmarks/cpu_speedup.py                      # all algorithms, 3 repeats
    python benchmarks/cpu_speedup.py --algos sac --repeats 5 --steps 3000
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

# algorithm -> its plain script, its twin, the flags every variant gets, the steps before the measure starts
# (off-policy: learning_starts, on-policy: measure_burnin rollouts) and the default steps measured after them.
ALGOS = {
    "sac": dict(
        plain="sac_continuous_action.py",
        twin="sac_continuous_action_torchcompile.py",
        flags=["--env-id", "HalfCheetah-v5"],
        warmup_steps=5000,
        steps=3000,
    ),
    "td3": dict(
        plain="td3_continuous_action.py",
        twin="td3_continuous_action_torchcompile.py",
        flags=["--env-id", "HalfCheetah-v5"],
        warmup_steps=25000,
        steps=3000,
    ),
    "ppo_continuous": dict(
        plain="ppo_continuous_action.py",
        twin="ppo_continuous_action_torchcompile.py",
        flags=["--env-id", "HalfCheetah-v5"],
        warmup_steps=3 * 2048,  # measure_burnin (3) rollouts of 2048 steps
        steps=6 * 2048,
    ),
}
VARIANTS = [("plain", "plain", []), ("twin", "twin", []), ("twin --compile", "twin", ["--compile"])]


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_variant(script, flags, results_path, log_path):
    cmd = [sys.executable, str(ROOT / "leanrl" / script), *flags, "--results-path", str(results_path)]
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed with status {proc.returncode}; see {log_path}")
    return json.loads(Path(results_path).read_text().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, default=None, help="steps measured after the warm-up (default: per algorithm)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table to this file")
    args = parser.parse_args()
    if args.repeats <= 0 or (args.steps is not None and args.steps <= 0):
        parser.error("--repeats and --steps must be positive")

    workdir = Path(tempfile.mkdtemp(prefix="leanrl-bench-"))
    header = (
        f"CPU: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {args.repeats} repeats; sps = steady-state env steps per second "
        "(after learning starts or the burn-in rollouts), median (min-max)"
    )
    lines = [
        header,
        "",
        "| algorithm | env | variant | sps | speed-up vs plain | compile s |",
        "|---|---|---|---|---|---|",
    ]
    for algo in args.algos:
        spec = ALGOS[algo]
        budget = spec["warmup_steps"] + (args.steps or spec["steps"])
        flags = [*spec["flags"], "--total-timesteps", str(budget), "--seed", str(args.seed)]
        results = {name: [] for name, _, _ in VARIANTS}
        for repeat in range(args.repeats):
            for name, which, extra in VARIANTS:
                script = spec[which]
                tag = f"{algo}-{name.replace(' ', '').replace('--', '-')}-{repeat}"
                print(f"[{algo}] repeat {repeat + 1}/{args.repeats}: {script} {' '.join(extra)}", flush=True)
                row = run_variant(script, [*flags, *extra], workdir / f"{tag}.jsonl", workdir / f"{tag}.log")
                results[name].append(row)
                print(f"    {row['sps']:.1f} sps, compile/warm-up {row['compile_seconds']:.1f} s", flush=True)
        plain_sps = statistics.median(r["sps"] for r in results["plain"])
        for name, _, _ in VARIANTS:
            sps = [r["sps"] for r in results[name]]
            compile_s = statistics.median(r["compile_seconds"] for r in results[name])
            lines.append(
                f"| {algo} | {results[name][0]['env_id']} | {name} | {statistics.median(sps):.1f} "
                f"({min(sps):.1f}-{max(sps):.1f}) | {statistics.median(sps) / plain_sps:.2f}x | {compile_s:.1f} |"
            )
    table = "\n".join(lines)
    print("\n" + table)
    print(f"\nlogs and results: {workdir}")
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
