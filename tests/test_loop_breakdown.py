"""benchmarks/loop_breakdown.py: SAC, TD3, PPO and PQN Atari scripts, run unchanged with timed calls, report every
phase."""

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
# A script with the definitions the breakdown wraps and a loop that calls each of them once a step, each call on
# its own line.
FAKE_SCRIPT = """
from types import SimpleNamespace


def make_env():
    return SimpleNamespace(step=lambda action: action)


class ReplayBuffer:
    def add(self, transition):
        pass

    def sample(self):
        return None


def build_sac():
    return SimpleNamespace(**{name: lambda *args: None for name in ("policy", "update_critic", "update_actor",
                                                                     "update_targets")})


if __name__ == "__main__":
    env, replay_buffer, sac = make_env(), ReplayBuffer(), build_sac()
    for step in range(200):
        sac.policy(step)
        env.step(step)
        replay_buffer.add(step)
        replay_buffer.sample()
        sac.update_critic(step)
        sac.update_actor(step)
        sac.update_targets()
"""


ON_POLICY_PHASES = ("act", "env step", "bookkeeping", "advantages", "update", "sum")
# An on-policy script: 6 iterations (3 timed) of a 4-step rollout, the advantages, 2 updates.
FAKE_ON_POLICY_SCRIPT = """
from dataclasses import dataclass
from types import SimpleNamespace


@dataclass
class Args:
    num_envs: int = 1
    num_steps: int = 4


def make_envs():
    return SimpleNamespace(step=lambda action: action, close=lambda: None)


def build_ppo():
    return SimpleNamespace(**{name: lambda *args: None for name in ("policy", "gae", "update")})


if __name__ == "__main__":
    envs, ppo = make_envs(), build_ppo()
    for iteration in range(6):
        for step in range(4):
            ppo.policy(step)
            envs.step(step)
        ppo.gae(iteration)
        ppo.update(0)
        ppo.update(1)
    envs.close()
"""


def times_per_iteration(output):
    times = {}
    for line in output.splitlines():
        match = re.fullmatch(r"\s*(.+): +(\d+\.\d) ms per iteration \( *\d+%\)", line)
        if match:
            times[match[1]] = float(match[2])
        match = re.fullmatch(r"\s*sum: +(\d+\.\d) ms per iteration \(\d+ sps\)", line)
        if match:
            times["sum"] = float(match[1])
    return times


def times_per_step(output):
    times = {}
    for line in output.splitlines():
        match = re.fullmatch(r"\s*(.+): +(\d+) us per step", line)
        if match:
            times[match[1]] = int(match[2])
    return times


@pytest.mark.parametrize(
    "script",
    [
        "sac_continuous_action",
        "sac_continuous_action_torchcompile",
        "td3_continuous_action",
        "td3_continuous_action_torchcompile",
    ],
)
def test_every_phase_of_the_loop_is_timed(script, tmp_path):
    # 150 training steps, the first 100 and the last left out: 49 timed steps.
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
        [sys.executable, str(ROOT / "benchmarks" / "loop_breakdown.py"), script, *budget],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,  # the run's folders, if any, land here
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    times = times_per_step(finished.stdout)
    assert set(times) == set(PHASES), finished.stdout
    assert all(times[phase] > 0 for phase in ("env step", "critic update")), times
    assert times["sum"] == pytest.approx(sum(times[phase] for phase in PHASES[:-1]), abs=len(PHASES))


@pytest.mark.parametrize(
    "script, flags",
    [
        # the plain scripts' advantages are module functions, the twin's the agent's; gymnasium's vector env and envpool
        ("ppo_continuous_action", ("--env-id", "InvertedPendulum-v5", "--num-steps", "64", "--num-minibatches", "2")),
        ("ppo_atari_envpool_torchcompile", ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2")),
        ("pqn_atari_envpool", ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2")),
    ],
)
def test_every_phase_of_an_on_policy_loop_is_timed(script, flags, tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "loop_breakdown.py"), script, *flags, "--update-epochs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    times = times_per_iteration(finished.stdout)
    assert set(times) == set(ON_POLICY_PHASES), finished.stdout
    assert all(times[phase] > 0 for phase in ("act", "env step", "update")), times
    assert times["sum"] == pytest.approx(sum(times[phase] for phase in ON_POLICY_PHASES[:-1]), abs=0.1 * len(times))
    # 6 iterations ran (the budget the tool sets), 3 of them timed
    assert "steps on" in finished.stdout and f" {6 * 2 * 16 if 'atari' in script else 6 * 64} steps" in finished.stdout


OFF_POLICY_PHASE_CALLS = [
    ("sac.policy", "agent.policy"),
    ("env.step", "env.step"),
    ("replay_buffer.add", "ReplayBuffer.add"),
    ("replay_buffer.sample", "ReplayBuffer.sample"),
    ("sac.update_critic", "agent.update_critic"),
    ("sac.update_actor", "agent.update_actor"),
    ("sac.update_targets", "agent.update_targets"),
]
ON_POLICY_PHASE_CALLS = [
    ("ppo.policy", "agent.policy"),
    ("envs.step", "envs.step"),
    ("ppo.gae", "agent.gae"),
    ("ppo.update", "agent.update"),
]
# The fake scripts, by the name that says their family, with their phases, their table's reader and the training
# steps (iterations) they time: SAC's 200 less the first 100 and the last, 6 iterations less the first 3.
FAKES = {
    "sac_fake": (FAKE_SCRIPT, PHASES, times_per_step, 99),
    "ppo_atari_envpool_fake": (FAKE_ON_POLICY_SCRIPT, ON_POLICY_PHASES, times_per_iteration, 3),
}


@pytest.fixture
def write_fake_script(tmp_path, monkeypatch):
    """Writes a fake script's text under its name; the breakdown's changes to sys.argv, sys.path and sys.modules are
    undone."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))

    def write(name, text):
        monkeypatch.setitem(sys.modules, name, None)  # breakdown() registers the script's module under its name
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        return path

    return write


@pytest.mark.parametrize("name", FAKES)
def test_a_loop_that_calls_every_phase_gets_a_table(name, write_fake_script, capsys):
    text, phases, read_table, timed = FAKES[name]
    timings = loop_breakdown.breakdown(write_fake_script(name, text), [])
    assert set(read_table(capsys.readouterr().out)) == set(phases)
    assert timings.timed_steps == timed


@pytest.mark.parametrize(
    "name, call, missing",
    [("sac_fake", *case) for case in OFF_POLICY_PHASE_CALLS]
    + [("ppo_atari_envpool_fake", *case) for case in ON_POLICY_PHASE_CALLS],
)
def test_a_loop_without_a_phase_is_an_error_not_a_wrong_table(name, call, missing, write_fake_script, capsys):
    text = "\n".join(line for line in FAKES[name][0].splitlines() if f"{call}(" not in line)
    with pytest.raises(SystemExit, match=rf"^loop_breakdown.py: error: .*does not call {re.escape(missing)}\b[^\n]*$"):
        loop_breakdown.breakdown(write_fake_script(name, text), [])
    out = capsys.readouterr().out
    assert "us per step" not in out and "ms per iteration" not in out
