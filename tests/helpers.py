"""Running and loading the scripts (by name: "sac_continuous_action" is leanrl/sac_continuous_action.py), and reading
what a run leaves. load_script imports a script as a module; run_script runs it in a subprocess, run_in_process runs
its `__main__` in this process; both on the CPU unless cuda=True. Importing this module puts leanrl/ on sys.path."""

import contextlib
import dataclasses
import importlib.util
import inspect
import io
import itertools
import json
import math
import os
import re
import runpy
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict.nn import CudaGraphModule

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS_DIR = REPO_ROOT / "leanrl"
# A script imports its sibling run_utils as `python leanrl/<script>.py` does: from the scripts' folder.
sys.path.insert(0, str(SCRIPTS_DIR))

# Generous limits: the CI and dev machines are small and noisy; a limit only turns a hang into a failure.
DEFAULT_TIMEOUT_S = 900

RESULT_FIELDS = tuple(
    "script algo env_id seed compile cudagraphs device torch_version total_timesteps sps compile_seconds wall_seconds"
    " final_return".split()
)

_module_counter = itertools.count()


def script_path(name):
    """The path of a script from its name ("sac_continuous_action" or "sac_continuous_action.py")."""
    path = SCRIPTS_DIR / (name if name.endswith(".py") else f"{name}.py")
    if not path.is_file():
        raise FileNotFoundError(f"no script {path}")
    return path


def load_script(name):
    """Import a script as a new module each call: nothing shared between callers, torch.compile's caches included."""
    path = script_path(name)
    module_name = f"leanrl_test_{path.stem}_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses, pickling and torch.compile look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def built(agent, name):
    """What a script's build function made under `name` (a network, an optimizer), found in the closures of its
    namespace's functions and of their closures' functions, through CudaGraphModule's and torch.compile's wrappers."""
    functions, seen = list(vars(agent).values()), set()
    while functions:
        function = functions.pop(0)
        function = function.module if isinstance(function, CudaGraphModule) else function  # the function it records
        function = inspect.unwrap(function) if inspect.isfunction(function) else function  # torch.compile's original
        if not inspect.isfunction(function) or function in seen:
            continue
        seen.add(function)
        for variable, cell in zip(function.__code__.co_freevars, function.__closure__ or (), strict=True):
            if variable == name:
                return cell.cell_contents
            with contextlib.suppress(ValueError):  # a cell not filled (yet)
                functions.append(cell.cell_contents)
    raise AttributeError(f"no function of the namespace reaches a {name!r}")


def expose(agent, *names):
    """agent, with what its build function made under each name (see built) as an attribute too."""
    for name in names:
        setattr(agent, name, built(agent, name))
    return agent


def run_script(name, *flags, timeout=DEFAULT_TIMEOUT_S, env=None, cuda=False):
    """Run a script in a subprocess from the repository root; returns the CompletedProcess (text, captured). Without
    cuda=True the subprocess sees no GPU."""
    full_env = {**os.environ, **({} if cuda else {"CUDA_VISIBLE_DEVICES": ""}), **(env or {})}
    argv = [sys.executable, str(script_path(name)), *map(str, flags)]
    return subprocess.run(argv, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def time_limit(seconds, what):
    """Raise TimeoutError in the main thread after `seconds` (no-op where SIGALRM is unavailable)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"{what} ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def command_line(argv):
    """sys.argv as a script run in this process sees it, restored afterwards, with sys.excepthook (a distributed
    script sets its own) and the handlers of SIGINT and SIGTERM (a run handles them, then ignores them at its end)."""
    saved_argv, saved_excepthook = sys.argv, sys.excepthook
    saved_handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv, sys.excepthook = saved_argv, saved_excepthook
        for signum, handler in saved_handlers.items():
            signal.signal(signum, handler)


def run_main(name, flags, timeout, cuda):
    """Run a script's `__main__` block in this process with these flags (and --no-cuda without cuda=True); returns
    its command line and its globals. A SystemExit of the script goes through, its command line in .argv."""
    path = script_path(name)
    argv = [str(path), *map(str, flags), *(() if cuda else ("--no-cuda",))]
    try:
        with command_line(argv), time_limit(timeout, " ".join(argv)):
            return argv, runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exit_:
        exit_.argv = argv
        raise


def run_in_process(name, *flags, timeout=DEFAULT_TIMEOUT_S, cuda=False):
    """Run a script's `__main__` block in this process (--no-cuda without cuda=True); returns the script's globals.
    A script that exits (bad flags, non-finite loss) fails the calling test with its exit code."""
    try:
        _, run_globals = run_main(name, flags, timeout, cuda)
    except SystemExit as exit_:
        pytest.fail(f"{' '.join(exit_.argv)} exited with {exit_.code!r}")
    if "run" in run_globals:  # the returns the run's mechanics collected, where the tests look for them
        run_globals["episode_returns"] = run_globals["run"].episode_returns
    return run_globals


def run_script_in_process(name, *flags, env=None, timeout=DEFAULT_TIMEOUT_S):
    """run_script's run, in this process on the CPU: a CompletedProcess with exit status 0 or the run's SystemExit
    code, and what it printed from Python. env: OMP_NUM_THREADS alone, taken as torch's thread count for the run."""
    env = dict(env or {})
    threads = int(env.pop("OMP_NUM_THREADS", torch.get_num_threads()))
    assert not env, f"a run in this process cannot take these environment variables: {sorted(env)}"
    stdout, stderr, returncode = io.StringIO(), io.StringIO(), 0
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            argv, _ = run_main(name, flags, timeout, cuda=False)
    except SystemExit as exit_:
        argv, returncode = exit_.argv, exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        torch.set_num_threads(saved_threads)
    return subprocess.CompletedProcess(argv, returncode, stdout.getvalue(), stderr.getvalue())


class _Reached(Exception):
    """Raised at the end of the episode with which a run in this process reached what a test waits for."""


def run_in_process_until(name, *flags, reached, timeout=DEFAULT_TIMEOUT_S):
    """The training episodes' returns of run_in_process(name, *flags), stopped at the end of the first episode after
    which reached(returns so far) holds; all the run's returns if it never does."""
    import run_utils  # the scripts' own module: leanrl/ is on the path

    episode = run_utils.Run.episode

    def episode_then_check(self, *args, **kwargs):
        episode(self, *args, **kwargs)
        if reached(self.episode_returns):
            if self.pbar:
                self.pbar.close()
            raise _Reached(list(self.episode_returns))

    run_utils.Run.episode = episode_then_check
    try:
        return run_in_process(name, *flags, timeout=timeout)["episode_returns"]
    except _Reached as stop:
        return stop.args[0]
    finally:
        run_utils.Run.episode = episode


@contextlib.contextmanager
def one_torch_thread():
    """torch on one thread in this process (a run in process included), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# --- Devices ------------------------------------------------------------------------------------------------------

NEEDS_CUDA = "needs a CUDA device"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]


@contextlib.contextmanager
def default_dtype(dtype):
    """torch's default dtype (of new parameters and of float results of integer inputs) set to dtype in the block."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


# --- What a run leaves and a script declares: output, results line, checkpoint, Args, --help ----------------------


def read_results(path):
    """The JSON objects of a --results-path file, one per line."""
    lines = Path(path).read_text().splitlines()
    assert all(line.strip() for line in lines), f"blank line in {path}: {lines!r}"
    return [json.loads(line) for line in lines]


def describe(completed):
    """A short account of a finished subprocess for assertion messages."""
    tails = (f"\n--- {key} (tail) ---\n{getattr(completed, key)[-3000:]}" for key in ("stdout", "stderr"))
    return f"exit status {completed.returncode}" + "".join(tails)


def args_fields(module):
    """{name: dataclasses.Field} of a script's Args, in declaration order."""
    return {field.name: field for field in dataclasses.fields(module.Args)}


def field_default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def is_number(value):
    """A finite int or float (not a bool): what a numeric field of the results line must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_checkpoint(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def optimizer_steps(checkpoint):
    """{optimizer: [its step count for each parameter]} of a checkpoint's agent."""
    return {
        name: [state["step"].item() for _, state in sorted(value["state"].items())]
        for name, value in checkpoint["agent"].items()
        if name.endswith("optimizer")
    }


# --- run.sh's budgets: the tiny run each pair's tests run ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TinyRun:
    """A run short enough for a test that still measures sps and finishes at least one episode."""

    flags: tuple  # every flag but --seed and --results-path; --env-id where not the script's default
    env_id: str
    total_timesteps: int  # the steps the results line reports
    return_range: tuple  # (low, high]: where the final return of such a run must lie
    env: dict | None = None  # environment variables for the run, on top of this process's


RUN_SH = REPO_ROOT / "run.sh"


def run_sh_budget(mode, script):
    """The budget flags run.sh gives the runs of a pair (named by its plain script) in a mode ("full", "quick" or
    "tiny"): run.sh's own budget() function, run by bash. LookupError where run.sh has no budget for it."""
    function = re.search(r"^budget\(\) \{.*?^\}$", RUN_SH.read_text(), re.DOTALL | re.MULTILINE)
    assert function, f"no budget() function in {RUN_SH}"
    completed = subprocess.run(["bash", "-c", f'{function.group(0)}\nbudget "$1" "$2"', "budget", mode, script],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
    if completed.returncode != 0:
        raise LookupError(f"run.sh has no {mode} budget for {script}: {completed.stderr.strip()}")
    return tuple(completed.stdout.split())


def run_sh_tiny_run(pair, env_id, return_range, env=None):
    """The TinyRun of run.sh's tiny budget for a pair (its plain script's name): the pairs' tests run every line of
    run.sh --tiny, so that run.sh's own test need not."""
    flags = run_sh_budget("tiny", pair)
    total = int(flags[flags.index("--total-timesteps") + 1])
    return TinyRun(flags=flags, env_id=env_id, total_timesteps=total, return_range=return_range, env=env)


# --- Tiny environments for the tests of DQN and PQN (registered by conftest's registered_counting_and_image_envs) ---


class CountingEnv(gym.Env):
    """Observation [episode, t]. Odd episodes terminate at t = 3; even ones run into the 5-step time limit."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.episode, self.t = -1, 0

    def obs(self):
        return np.array([self.episode, self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self.obs(), {}

    def step(self, action):
        self.t += 1
        return self.obs(), 1.0, self.episode % 2 == 1 and self.t == 3, False, {}


class ImageObsEnv(gym.Env):
    """Discrete actions, image observations: DQN's and PQN's MLPs cannot take them."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


# --- Atari runs, their envpool steps recorded (the PPO and PQN Atari tests) ------------------------------------------


class RecordingEnvs:
    """An envpool env that keeps a copy of what each step returned, and with epsilon_key the epsilon the training loop
    acted with: the loop runs at module level, so its variables are the globals of the frame that calls step."""

    def __init__(self, envs, epsilon_key=None):
        self._envs, self.steps, self.epsilon_key = envs, [], epsilon_key

    def __getattr__(self, name):
        return getattr(self._envs, name)

    def step(self, action):
        epsilon = sys._getframe(1).f_globals.get(self.epsilon_key) if self.epsilon_key else None
        obs, reward, terminated, truncated, info = self._envs.step(action)
        self.steps.append(dict(clipped_reward=reward.copy(), game_reward=info["reward"].copy(),
                               life_lost=terminated.copy(),  # episodic life: a lost life terminates the episode
                               truncated=truncated.copy(), game_over=info["terminated"].astype(bool),
                               epsilon=None if epsilon is None else float(epsilon)))  # fmt: skip
        return obs, reward, terminated, truncated, info


def recording_make(made, epsilon_key=None, **make_kwargs):
    """envpool.make, each env it makes wrapped in a RecordingEnvs and appended to `made`."""
    import envpool

    real_make = envpool.make

    def make(*args, **kwargs):
        made.append(RecordingEnvs(real_make(*args, **kwargs, **make_kwargs), epsilon_key))
        return made[-1]

    return make


def recorded_runs(default_flags, epsilon_key=lambda name: None):
    """recorded_run(name, seed, flags=default_flags, max_episode_steps=None) -> (the globals of a run on one thread,
    the envpool steps it made), each run made once; envpool's own time limit unless max_episode_steps is given."""
    import envpool

    cache = {}

    def run(name, seed, flags=default_flags, max_episode_steps=None):
        key = name, seed, flags, max_episode_steps
        if key not in cache:
            made, limit = [], {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
            with pytest.MonkeyPatch.context() as patch, one_torch_thread():
                patch.setattr(envpool, "make", recording_make(made, epsilon_key(name), **limit))
                run_globals = run_in_process(name, *flags, "--seed", seed)
            assert len(made) == 1, "a run without --save-model makes its training envs alone"
            cache[key] = run_globals, made[0].steps
        return cache[key]

    return run


def episode_sums(steps, reward_key, end_keys):
    """The sum of a reward over each episode, an episode ending where one of end_keys is true; in order of ending."""
    totals, finished = np.zeros(len(steps[0][reward_key])), []
    for step in steps:
        totals += step[reward_key]
        for env in np.flatnonzero(np.any([step[key] for key in end_keys], axis=0)):
            finished.append(float(totals[env]))
            totals[env] = 0.0
    return finished
