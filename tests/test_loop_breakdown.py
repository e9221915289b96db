"""benchmarks/loop_breakdown.py: the instrumented copy of each SAC and TD3 script runs and reports every phase."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import loop_breakdown  # noqa: E402

PHASES = ("act", "env step", "store", "sample", "critic update", "actor and target updates", "sum")


@pytest.mark.parametrize(
    "script",
    [
        "sac_continuous_action",
        "sac_continuous_action_torchcompile",
        "td3_continuous_action",
        "td3_continuous_action_torchcompile",
    ],
)
def test_instrumented_copy_reports_every_phase(script, tmp_path):
    copy = tmp_path / f"{script}.py"
    copy.write_text(loop_breakdown.instrumented_source((ROOT / "leanrl" / f"{script}.py").read_text()))
    # 150 training steps, the first 100 left out: 50 timed steps.
    budget = [
        "--learning-starts",
        "100",
        "--total-timesteps",
        "250",
        "--env-id",
        "Pendulum-v1",
        "--buffer-size",
        "1000",
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the CPU's loop, also on a machine with a GPU
    finished = subprocess.run(
        [sys.executable, str(copy), *budget], capture_output=True, text=True, timeout=300, env=env
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    times = {}
    for line in finished.stdout.splitlines():
        match = re.fullmatch(r"\s*(.+): +(\d+) us per step", line)
        if match:
            times[match[1]] = int(match[2])
    assert set(times) == set(PHASES), finished.stdout
    assert all(times[phase] > 0 for phase in ("env step", "critic update")), times
    assert times["sum"] == pytest.approx(sum(times[phase] for phase in PHASES[:-1]), abs=len(PHASES))


def test_a_changed_loop_is_an_error_not_a_wrong_table():
    source = (ROOT / "leanrl" / "sac_continuous_action.py").read_text()
    with pytest.raises(SystemExit, match="the script's loop changed"):
        loop_breakdown.instrumented_source(source.replace("replay_buffer.add(", "replay_buffer.store("))
