"""Where a training step of SAC or TD3 spends its time, inside the real training loop.

A copy of the script is made with timers around each phase of its loop (acting, the env step, storing the
transition, sampling, the critic update, the actor and target updates), run, and its microseconds per training
step printed for each phase, leaving out the first 100 training steps (compilation). The copy is written to a
temporary directory; leanrl/ is not touched. Phases timed in isolation (benchmarks/micro_benchmark.py) look
faster: between updates the CPU caches are cold, which slows the small phases of the loop.

    python benchmarks/loop_breakdown.py sac_continuous_action                     # the plain script
    python benchmarks/loop_breakdown.py sac_continuous_action_torchcompile --compile
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_STEPS = 100  # training steps left out at the start: compilation and warm-up
# (pattern in the script, text inserted before each match); every pattern must match exactly once.
TIMERS = [
    (
        r"\n    for step in pbar:\n",
        "\n    from collections import defaultdict\n    phase_seconds = defaultdict(float)\n    clock = time.perf_counter\n",
    ),
    (r"\n        if step == train_step:\n", "\n        tick = clock()"),
    (r"\n        next_obs, reward, terminated, truncated, _ = env.step", "\n        tick = lap('act', tick)"),
    (r"\n        replay_buffer.add\(", "\n        tick = lap('env step', tick)"),
    (r"\n        episode_return \+= float\(reward\)", "\n        tick = lap('store', tick)"),
    (r"\n            data = replay_buffer.sample\(", "\n            tick = clock()"),
    (r"\n            losses = \w+.update_critic\(data\)", "\n            tick = lap('sample', tick)"),
    (r"\n            if step % args.policy_frequency == 0:", "\n            tick = lap('critic update', tick)"),
    (r"\n            if step % LOG_EVERY == 0:", "\n            tick = lap('actor and target updates', tick)"),
]


def instrumented_source(source):
    for pattern, inserted in TIMERS:
        matches = list(re.finditer(pattern, source))
        if len(matches) != 1:
            sys.exit(f"loop_breakdown.py: error: the script's loop changed: {pattern!r} matches {len(matches)} times")
        source = source[: matches[0].start()] + inserted + source[matches[0].start() :]
    lap = (
        "def lap(phase, start):\n"
        "    now = time.perf_counter()\n"
        f"    if step >= args.learning_starts + {SKIPPED_STEPS}:\n"
        "        phase_seconds[phase] += now - start\n"
        "    return now\n"
    )
    report = (
        f"    steps = args.total_timesteps - args.learning_starts - {SKIPPED_STEPS}\n"
        "    for phase, seconds in phase_seconds.items():\n"
        '        print(f"{phase:>26}: {seconds / steps * 1e6:7.0f} us per step")\n'
        "    print(f\"{'sum':>26}: {sum(phase_seconds.values()) / steps * 1e6:7.0f} us per step\")\n"
    )
    source = source.replace('\nif __name__ == "__main__":\n', "\n" + lap + '\n\nif __name__ == "__main__":\n', 1)
    return source.replace("\n    pbar.close()\n    env.close()\n", "\n    pbar.close()\n    env.close()\n" + report, 1)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    script, flags = sys.argv[1], sys.argv[2:]
    path = ROOT / "leanrl" / f"{script}.py"
    if not script.startswith(("sac_", "td3_")) or not path.exists():
        sys.exit(f"loop_breakdown.py: error: {script!r} is not a SAC or TD3 script of leanrl/")
    budget = ["--learning-starts", "1000", "--total-timesteps", "3000"]  # 1,900 timed training steps
    with tempfile.TemporaryDirectory() as directory:
        copy = Path(directory) / path.name  # the same file name: exp_name and the results say which script ran
        copy.write_text(instrumented_source(path.read_text()))
        sys.exit(subprocess.run([sys.executable, str(copy), *budget, *flags]).returncode)


if __name__ == "__main__":
    main()
