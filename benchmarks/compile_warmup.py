"""Compile warm-up of each _torchcompile twin: seconds from process start to the end of its first training iteration.

Each twin runs three times with a budget that ends right after its first update (every function it compiles has
been compiled and run once): without --compile, then with --compile and an empty inductor cache (cold), then
again with the cache the cold run filled (warm). The cache lives in a temporary directory, so the user's own
cache is neither used nor touched. Wall times are of the whole process, Python start-up and imports included.

    python benchmarks/compile_warmup.py                      # every twin
    python benchmarks/compile_warmup.py --scripts sac_continuous_action --out warmup.md
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from speedup_table import cpu_name  # benchmarks/ is on the path when this file runs

ROOT = Path(__file__).resolve().parent.parent
# plain script name -> the flags of a run that ends right after its first training iteration
FIRST_UPDATE = {
    # learning starts at an even step, so the first two steps update the critic alone and with the actor
    "sac_continuous_action": ["--learning-starts", "1000", "--total-timesteps", "1002"],
    "td3_continuous_action": ["--learning-starts", "1000", "--total-timesteps", "1002"],
    "ppo_continuous_action": ["--total-timesteps", "2048"],  # one rollout of 2048 steps, one round of updates
    "ppo_atari_envpool": ["--total-timesteps", "1024"],  # one rollout of 8 envs x 128 steps, one round of updates
}


def timed_run(script, flags, cache_dir):
    """Wall seconds of one run of leanrl/<script>_torchcompile.py; stops everything if the run fails."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    command = [sys.executable, str(ROOT / "leanrl" / f"{script}_torchcompile.py"), *flags]
    start = time.perf_counter()
    finished = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if finished.returncode != 0:
        sys.exit(f"compile_warmup.py: error: {' '.join(command)} failed:\n{finished.stderr[-2000:]}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", default=list(FIRST_UPDATE), choices=list(FIRST_UPDATE))
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table to this file")
    args = parser.parse_args()

    lines = [
        f"CPU: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}; seconds from process start to the end"
        " of the first training iteration",
        "",
        "| script | no --compile | --compile, cold cache | --compile, warm cache | compile cost cold "
        "| compile cost warm |",
        "|---|---|---|---|---|---|",
    ]
    for script in args.scripts:
        flags = [*FIRST_UPDATE[script], "--cuda" if torch.cuda.is_available() else "--no-cuda"]
        with tempfile.TemporaryDirectory(prefix="leanrl-inductor-cache-") as cache_dir:
            print(f"{script}: no --compile, --compile cold, --compile warm", flush=True)
            eager = timed_run(script, flags, cache_dir)
            cold = timed_run(script, [*flags, "--compile"], cache_dir)
            warm = timed_run(script, [*flags, "--compile"], cache_dir)
        lines.append(
            f"| {script}_torchcompile.py | {eager:.1f} | {cold:.1f} | {warm:.1f} | {cold - eager:.1f} "
            f"| {warm - eager:.1f} |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
