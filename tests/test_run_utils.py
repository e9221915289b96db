"""leanrl/run_utils.py, the run mechanics every script shares, tested once: outputs checked before the first step,
the ensemble's optimizer state in the plain layout and back, the evaluation loop, the checkpoint schedule, the RNG
state. (Each pair's tests cover the rest through its scripts: refusals, resume, signals, results line, video.)"""

import argparse
import copy
import functools
import random
import runpy
import signal
import sys
import types

import gymnasium as gym
import numpy as np
import pytest
import run_utils
import torch
import twin_utils
from checks import assert_same_state, check_bad_input_in_process
from helpers import SCRIPTS_DIR, command_line
from tensordict import from_modules

SCRIPTS = sorted(path.stem for path in SCRIPTS_DIR.glob("*.py") if not path.stem.endswith("_utils"))
# The cheapest valid run of each pair: the check under test must stop it before anything else happens.
TINY = {
    "sac": ("--env-id", "Pendulum-v1"),
    "td3": ("--env-id", "Pendulum-v1"),
    "dqn": (),
    "ppo_continuous": ("--env-id", "InvertedPendulum-v5"),
    "ppo_atari": (),
    "pqn": (),  # pqn (CartPole-v1) and pqn_atari_envpool (Breakout-v5) at their defaults
}


def tiny_flags(name):
    return next(flags for prefix, flags in TINY.items() if name.startswith(prefix))


def test_every_script_is_covered():
    assert len(SCRIPTS) == 16 and all(any(name.startswith(prefix) for prefix in TINY) for name in SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_unwritable_checkpoint_stops_the_run_before_it_starts(name, tmp_path, capsys):
    """--save-model to a path under a file: one line, exit 2, before any env is made or step taken."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    flags = (*tiny_flags(name), "--save-model", "--model-path", blocker / "run" / "agent.pt")
    check_bad_input_in_process(name, flags, ["cannot write the checkpoint", "agent.pt"], tmp_path, capsys)


@pytest.mark.parametrize("name", SCRIPTS)
def test_unwritable_results_file_stops_the_run_before_it_starts(name, tmp_path, capsys):
    """--results-path that is a directory: one line, exit 2, nothing written."""
    path = SCRIPTS_DIR / f"{name}.py"
    argv = [str(path), *tiny_flags(name), "--no-cuda", "--results-path", str(tmp_path)]
    with command_line(argv), pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(path), run_name="__main__")
    stdout, stderr = capsys.readouterr()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, (exit_.value.code, stdout, stderr)
    assert lines[0].startswith(f"{name}.py: error: cannot write the results file"), lines
    assert list(tmp_path.iterdir()) == []


def test_check_writable_leaves_nothing_behind(tmp_path):
    run_utils.check_writable(str(tmp_path / "new" / "agent.pt"), "checkpoint")
    assert [path.name for path in tmp_path.iterdir()] == ["new"] and not any((tmp_path / "new").iterdir())


def test_video_folder_that_is_a_file_is_refused(tmp_path, capsys, monkeypatch):
    (tmp_path / "videos").write_text("")
    with pytest.raises(SystemExit) as exit_:
        run_utils.check_writable(str(tmp_path / "videos" / "eval-episode-0.mp4"), "video")
    assert exit_.value.code == 2 and "cannot write the video" in capsys.readouterr().err


def adam_steps(optimizer, params, steps=3):
    for _ in range(steps):
        optimizer.zero_grad()
        sum((p**2).sum() for p in params).backward()
        optimizer.step()


def test_ensemble_optimizer_state_is_the_plain_layout_and_back():
    """Adam over two networks' parameters (a plain script) and over a stacked copy of them (a twin) take the same
    steps; the twin's state written in the plain layout is the plain optimizer's, and it reads back unchanged."""
    torch.manual_seed(0)
    nets = [torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)]
    stacked = from_modules(*copy.deepcopy(nets), as_module=True)
    plain_params = [p for net in nets for p in net.parameters()]
    plain_optimizer = torch.optim.Adam(plain_params, lr=0.1)
    twin_optimizer = torch.optim.Adam(list(stacked.values(True, True)), lr=0.1)
    adam_steps(plain_optimizer, plain_params)
    adam_steps(twin_optimizer, list(stacked.values(True, True)))

    saved = twin_utils.optimizer_state(twin_optimizer, members=2)
    assert_same_state(saved, plain_optimizer.state_dict())
    reloaded = torch.optim.Adam(list(stacked.values(True, True)), lr=0.1)
    twin_utils.load_optimizer_state(reloaded, saved, members=2)
    assert_same_state(reloaded.state_dict(), twin_optimizer.state_dict())


def test_optimizer_state_settings_are_swapped():
    params = [torch.nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.Adam(params, lr=0.1, foreach=True)
    adam_steps(optimizer, params)
    saved = twin_utils.optimizer_state(optimizer, foreach=None)
    assert saved["param_groups"][0]["foreach"] is None
    twin_utils.load_optimizer_state(optimizer, saved, foreach=True)
    assert optimizer.param_groups[0]["foreach"] is True


def test_evaluate_plays_whole_episodes_and_stops_on_a_signal():
    """CartPole gives 1 a step: the mean return is the mean episode length; a policy that always pushes left ends
    each episode in about ten steps. A signal received stops the evaluation: no return."""
    env = gym.make("CartPole-v1")
    lengths = []

    def act(obs):
        lengths[-1] += 1
        return 0

    class Counting(gym.Wrapper):
        def reset(self, **kwargs):
            lengths.append(0)
            return super().reset(**kwargs)

    result = run_utils.evaluate(Counting(env), act, 3, seed=5, video_folder=None, stop_signals=[])
    assert len(lengths) == 3  # a reset per episode
    assert result == pytest.approx(np.mean(lengths)) and 5 < result < 20
    assert run_utils.evaluate(gym.make("CartPole-v1"), lambda obs: 0, 3, 5, None, stop_signals=[2]) is None


def test_evaluate_leaves_the_run_generators_as_they_were():
    torch.manual_seed(3)
    expected = torch.rand(1)
    torch.manual_seed(3)
    run_utils.evaluate(gym.make("CartPole-v1"), lambda obs: int(torch.rand(1) < 0.5), 1, 9, None, [])
    assert torch.equal(torch.rand(1), expected)


@pytest.mark.parametrize(
    ("every", "steps_per_iteration", "due"),
    [(0, 1, []), (3, 1, [3, 6, 9]), (100, 64, [128, 256, 320, 448, 512]), (64, 64, list(range(64, 640, 64)))],
)
def test_checkpoint_schedule(every, steps_per_iteration, due):
    """After the iteration in which the step count reaches a multiple of --checkpoint-every, the last excepted."""
    run = run_utils.Run.__new__(run_utils.Run)  # the schedule alone, without a run's checks and side effects
    run.args, run.total_steps = argparse.Namespace(checkpoint_every=every), 640 if steps_per_iteration > 1 else 10
    steps = range(steps_per_iteration, run.total_steps + 1, steps_per_iteration)
    assert [step for step in steps if run.checkpoint_due(step, steps_per_iteration)] == due


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = run_utils.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    run_utils.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


@pytest.mark.parametrize("under_torchrun", [False, True])
def test_a_second_signal_kills_the_run_but_under_torchrun(under_torchrun, monkeypatch):
    """A run ends after the step in which it got Ctrl-C or SIGTERM. A second signal is the user's "now": the default
    handler, which kills; but under torchrun, which passes a signal on to workers that may have had it already."""
    if under_torchrun:
        monkeypatch.setenv("RANK", "0")
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    run = types.SimpleNamespace(stop_signals=[])
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, functools.partial(run_utils.Run.on_signal, run))
            run_utils.Run.on_signal(run, signum, None)
            handler = signal.getsignal(signum)
            assert isinstance(handler, functools.partial) if under_torchrun else handler is signal.SIG_DFL
        assert run.stop_signals == [signal.SIGTERM, signal.SIGINT]
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def test_a_mistake_is_one_line_and_status_2(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["some_script.py"])
    with pytest.raises(SystemExit) as exit_:
        run_utils.exit_with_error("--thing must be positive")
    assert exit_.value.code == 2 and capsys.readouterr().err == "some_script.py: error: --thing must be positive\n"


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "vendor", "fast"),
    [(True, True, "GenuineIntel", True), (False, True, "AuthenticAMD", True), (False, True, "GenuineIntel", False),
     (False, False, "AuthenticAMD", False), (False, True, "", False)],
    ids=["intel-amx", "amd-avx512-bf16", "intel-avx512-bf16-without-amx", "avx2", "unknown-vendor"],
)  # fmt: skip
def test_bf16_is_fast_on_amx_and_on_amds_avx512_bf16_only(amx, avx512_bf16, vendor, fast, monkeypatch):
    """--bf16 is on where bf16 is faster than fp32: AMX, or AVX512-BF16 on an AMD CPU. An Intel CPU's AVX512-BF16
    without AMX computes bf16 natively, but slower than fp32 (docs/speed_cpu.md): off there, as where it is emulated."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(run_utils, "cpu_vendor", lambda: vendor)
    assert run_utils.fast_bf16(torch.device("cpu")) is fast


def test_cpu_vendor_is_the_cpus_own_name():
    assert run_utils.cpu_vendor() in ("GenuineIntel", "AuthenticAMD", "")  # the x86 makers; "" without /proc/cpuinfo


@pytest.mark.parametrize(
    ("domain", "inside", "outside"),
    [("> 0", [1e-9, 3.0], [0, -1.0]), (">= 0", [0, 0.5], [-1e-9]), (">= 1", [1, 8], [0, -1]),
     ("[0, 1]", [0, 0.5, 1], [-0.1, 1.5]), ("(0, 1]", [1e-9, 1], [0, 1.1]),
     ("[0, 2147483647]", [0, 2**31 - 1], [-1, 2**31]), ("[0, 1)", [0, 0.5], [1, 1.5])],
)  # fmt: skip
def test_a_domain_holds_its_bounds_as_written(domain, inside, outside):
    assert all(run_utils.in_domain(value, domain) for value in inside), inside
    assert not any(run_utils.in_domain(value, domain) for value in outside), outside


# Run in a fresh interpreter: MuJoCo prints its warnings from C, to the process's own stderr.
MAKE_HALFCHEETAH = """
import json, os, sys
import gymnasium as gym, mujoco, numpy as np, run_utils

def model_bytes(env):  # the whole compiled model, every array and option, as MuJoCo saves it
    model = env.unwrapped.model
    saved = np.zeros(mujoco.mj_sizeModel(model), np.uint8)
    mujoco.mj_saveModel(model, None, saved)
    return saved.tobytes()

ours = run_utils.make_gym_env("HalfCheetah-v5")
log_written = os.path.exists("MUJOCO_LOG.TXT")
sys.stdout.flush(), sys.stderr.write("--- gymnasium's own env from here ---\\n"), sys.stderr.flush()
theirs = gym.make("HalfCheetah-v5")
a, b = ours.unwrapped.model, theirs.unwrapped.model
arrays = [name for name in dir(a) if isinstance(getattr(a, name), np.ndarray)]
differ = [name for name in arrays if getattr(a, name).tobytes() != getattr(b, name).tobytes()]
differ += [f"stat.{name}" for name in ("meanmass", "meaninertia") if getattr(a.stat, name) != getattr(b.stat, name)]
obs_ours, obs_theirs = ours.reset(seed=3)[0], theirs.reset(seed=3)[0]
same_steps = obs_ours.tobytes() == obs_theirs.tobytes()
for action in np.random.default_rng(3).uniform(-1, 1, (300, 6)).astype(np.float32):
    step_ours, step_theirs = ours.step(action), theirs.step(action)
    same_steps &= step_ours[0].tobytes() == step_theirs[0].tobytes() and step_ours[1:4] == step_theirs[1:4]
print(json.dumps({"arrays": len(arrays), "differ": differ, "same_model": model_bytes(ours) == model_bytes(theirs),
                  "same_steps": bool(same_steps), "log_written": log_written}))
"""


def test_halfcheetah_is_made_with_no_settotalmass_warning_and_same_model(tmp_path):
    """gymnasium's HalfCheetah XML sets <compiler settotalmass>, which MuJoCo 4 warns about on every env made:
    make_gym_env makes it silently, and its compiled model is gymnasium's own bit for bit (300 steps agree too)."""
    import json
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS_DIR), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", MAKE_HALFCHEETAH], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours, _, theirs = done.stderr.partition("--- gymnasium's own env from here ---\n")
    assert "deprecated" not in ours + done.stdout, ours
    # The check above means something only while gymnasium's own env warns (its XML or MuJoCo may change one day).
    assert "'settotalmass' is deprecated" in theirs, "gymnasium's HalfCheetah no longer warns: the workaround can go"
    result = json.loads(done.stdout)
    assert result["arrays"] > 400 and result["differ"] == [] and result["same_model"] and result["same_steps"]
    assert not result["log_written"]  # nor is the warning appended to MUJOCO_LOG.TXT in the working folder
