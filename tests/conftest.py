"""Helpers shared by the tests of every script pair.

Scripts are addressed by name, with or without ".py": "sac_continuous_action" is leanrl/sac_continuous_action.py.
Three ways to exercise a script, all through its stable interface:
- load_script(name): import it as a module (module level holds definitions only) to call Args, build_* ...
- run_script(name, *flags): run it as a user would, in a subprocess; returns the CompletedProcess.
- run_in_process(name, *flags): run its `__main__` block in this process; returns its globals
  (e.g. `episode_returns`).
Both run on the CPU unless the caller passes cuda=True, also on a machine with a GPU: the generic checks (results
line, determinism, learning thresholds) are written for the CPU. The CUDA cases are marked `requires_cuda`.
"""

import ast
import contextlib
import copy
import dataclasses
import importlib.util
import io
import itertools
import json
import math
import os
import re
import runpy
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS_DIR = REPO_ROOT / "leanrl"
# A script imports its sibling run_utils as `python leanrl/<script>.py` does: from the scripts' folder.
sys.path.insert(0, str(SCRIPTS_DIR))

# Generous limits: the CI and dev machines are small and noisy; a limit only turns a hang into a failure.
DEFAULT_TIMEOUT_S = 900

RESULT_FIELDS = (
    "script",
    "algo",
    "env_id",
    "seed",
    "compile",
    "cudagraphs",
    "device",
    "torch_version",
    "total_timesteps",
    "sps",
    "compile_seconds",
    "wall_seconds",
    "final_return",
)

_module_counter = itertools.count()


def script_path(name):
    """The path of a script from its name ("sac_continuous_action" or "sac_continuous_action.py")."""
    path = SCRIPTS_DIR / (name if name.endswith(".py") else f"{name}.py")
    if not path.is_file():
        raise FileNotFoundError(f"no script {path}")
    return path


def load_script(name):
    """Import a script by file path and return the module.

    Every call executes the file again and returns a new module, so nothing is shared between callers:
    in particular torch.compile's caches (keyed on code objects) start empty for each loaded module.
    """
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


def run_script(name, *flags, timeout=DEFAULT_TIMEOUT_S, env=None, cuda=False):
    """Run a script in a subprocess from the repository root; returns the CompletedProcess (text, captured).

    Without cuda=True the subprocess sees no GPU (CUDA_VISIBLE_DEVICES=""), so it runs on the CPU on any machine.
    """
    full_env = dict(os.environ)
    if not cuda:
        full_env["CUDA_VISIBLE_DEVICES"] = ""
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(script_path(name)), *map(str, flags)],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def _time_limit(seconds, what):
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
def _command_line(argv):
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


def _run_main(name, flags, timeout, cuda):
    """Run a script's `__main__` block in this process with these flags (and --no-cuda without cuda=True); returns
    its command line and its globals. A SystemExit of the script goes through, its command line in .argv."""
    path = script_path(name)
    argv = [str(path), *map(str, flags), *(() if cuda else ("--no-cuda",))]
    try:
        with _command_line(argv), _time_limit(timeout, " ".join(argv)):
            return argv, runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exit_:
        exit_.argv = argv
        raise


def run_in_process(name, *flags, timeout=DEFAULT_TIMEOUT_S, cuda=False):
    """Run a script's `__main__` block in this process with these flags; returns the script's globals.

    Without cuda=True the run gets --no-cuda: it runs on the CPU on any machine.
    A script that exits (bad flags, non-finite loss) fails the calling test with its exit code.
    """
    try:
        _, run_globals = _run_main(name, flags, timeout, cuda)
    except SystemExit as exit_:
        pytest.fail(f"{' '.join(exit_.argv)} exited with {exit_.code!r}")
    if "run" in run_globals:  # the returns the run's mechanics collected, where the tests look for them
        run_globals["episode_returns"] = run_globals["run"].episode_returns
    return run_globals


def run_script_in_process(name, *flags, env=None, timeout=DEFAULT_TIMEOUT_S):
    """run_script's run, in this process and on the CPU (--no-cuda): no interpreter to start and nothing to import
    again, seconds less a run. Returns a CompletedProcess: exit status 0, or the code of the run's SystemExit, and what
    the run printed from Python. env: OMP_NUM_THREADS alone, taken as torch's thread count for the run."""
    env = dict(env or {})
    threads = int(env.pop("OMP_NUM_THREADS", torch.get_num_threads()))
    assert not env, f"a run in this process cannot take these environment variables: {sorted(env)}"
    stdout, stderr, returncode = io.StringIO(), io.StringIO(), 0
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            argv, _ = _run_main(name, flags, timeout, cuda=False)
    except SystemExit as exit_:
        argv, returncode = exit_.argv, exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        torch.set_num_threads(saved_threads)
    return subprocess.CompletedProcess(argv, returncode, stdout.getvalue(), stderr.getvalue())


@contextlib.contextmanager
def one_torch_thread():
    """torch on one thread in this process (a run in process included), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# --- Running the suite on several workers (pytest-xdist: `-n auto`) --------------------------------------------
#
# Most tests keep one core busy (compiling, stepping an env, small matmuls): a worker per core runs the suite about
# twice as fast on 2 cores. Each worker, and every run it starts, gets its share of the cores as threads: more
# threads than cores make OpenMP's threads wait for one another, several times slower.
# The workers share the tests as pytest-xdist's `worksteal` mode does (pyproject.toml sets it): each worker starts
# with an equal contiguous share of the collected order, and a worker that runs out takes half of the tests another
# has not started. A test already started cannot move, so the longest ones (learning runs, run.sh, every flag
# combination; matched by these name prefixes) are dealt out to the workers in turn, at the front of their shares: no
# worker starts with most of them, and none is left with one at the end. run.sh's tiny run comes after the twins'
# flag combinations, which compile the twins with the same tiny budgets: its compilations then find their kernels in
# inductor's cache (a twin's first compilation costs about 4 times a cached one on this CPU, 60 s against 15).
LONGEST_FIRST = ("test_learns", "test_twin_runs_with_every_flag_combination", "test_tiny_run_end_to_end")


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the runs this worker starts inherit it
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    for item in items:  # every CUDA case is marked `cuda`: `pytest -m cuda` runs them alone on a GPU machine
        if any(mark.kwargs.get("reason") == NEEDS_CUDA for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cuda)

    def rank(item):
        prefixes = [index for index, prefix in enumerate(LONGEST_FIRST) if item.name.startswith(prefix)]
        return prefixes[0] if prefixes else None

    longest = sorted((item for item in items if rank(item) is not None), key=rank)  # stable: file order within a rank
    others = [item for item in items if rank(item) is None]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # The share sizes worksteal gives out at the start: worker i gets len(rest) // (workers - i) of the rest.
    sizes, left = [], len(items)
    for worker in range(workers):
        sizes.append(left // (workers - worker))
        left -= sizes[-1]
    # Dealt back and forth (0, 1, 1, 0, 0, 1, ... for two workers), so that the slower of each pair of similar tests
    # (a plain script and its twin) does not always go to the same worker.
    shares = [[] for _ in range(workers)]
    for index, item in enumerate(longest):
        turn, seat = divmod(index, workers)
        shares[seat if turn % 2 == 0 else workers - 1 - seat].append(item)
    for share, size in zip(shares, sizes, strict=True):
        while len(share) < size and others:
            share.append(others.pop(0))
    items[:] = [item for share in shares for item in share] + others


@pytest.fixture(autouse=True)
def _fresh_compiler_state():
    """Each test compiles as a fresh process would, and changes it makes to torch.compile's global settings are undone.

    Dynamo remembers, by function name and line, the shapes a function was compiled for, across the runs of a process:
    a script run in this process after another test's run at another batch size got graphs with dynamic shapes, which
    a user's run never compiles (and no other test's run could take from inductor's cache: 14 graphs against 11 for
    the SAC, TD3 and num-envs tests)."""
    import torch._dynamo.config
    import torch._inductor.config

    configs = (torch._dynamo.config, torch._inductor.config)
    saved = [config.get_config_copy() for config in configs]
    torch._dynamo.reset()
    yield
    for config, before in zip(configs, saved, strict=True):
        after = config.get_config_copy()
        for key, value in before.items():
            if after.get(key) is not value and after.get(key) != value:
                setattr(config, key, value)


def read_results(path):
    """The JSON objects of a --results-path file, one per line."""
    lines = Path(path).read_text().splitlines()
    assert all(line.strip() for line in lines), f"blank line in {path}: {lines!r}"
    return [json.loads(line) for line in lines]


def output_lines(completed):
    """All lines a finished subprocess printed (stdout then stderr), split on newlines and tqdm's carriage returns."""
    text = (completed.stdout or "") + "\n" + (completed.stderr or "")
    return [line.strip() for line in text.replace("\r", "\n").split("\n") if line.strip()]


def describe(completed):
    """A short account of a finished subprocess for assertion messages."""
    return (
        f"exit status {completed.returncode}\n--- stdout (tail) ---\n{completed.stdout[-3000:]}"
        f"\n--- stderr (tail) ---\n{completed.stderr[-3000:]}"
    )


def args_fields(module):
    """{name: dataclasses.Field} of a script's Args, in declaration order."""
    return {field.name: field for field in dataclasses.fields(module.Args)}


def field_default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


# --- Devices ------------------------------------------------------------------------------------------------------

NEEDS_CUDA = "needs a CUDA device"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
# The equivalence tests run on each device: `@pytest.mark.parametrize("device", DEVICES)`.
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]


@pytest.fixture(autouse=True)
def _float32_on_cuda():
    """Full float32 matmuls and convolutions on CUDA (cuDNN uses TF32 by default): the equivalence tests compare
    float32 computations; TF32 keeps 10 bits of mantissa, which two convolution algorithms would round differently."""
    if not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# --- Generic helpers for the tests of a script pair (the update functions, flags and runs of any algorithm) ---


@contextlib.contextmanager
def default_dtype(dtype):
    """torch's default dtype (of new parameters and of float results of integer inputs) set to dtype in the block."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


@pytest.fixture
def inductor_fallback_random(monkeypatch):
    """Random ops inside compiled code draw from the eager generator, so seeded samples match eager ones.

    Also where a script passes fallback_random in torch.compile's own options (TD3's twin turns it off on CUDA):
    those options would override the global setting.
    """
    import torch._inductor.config as inductor_config

    compile_ = torch.compile

    def compile_with_fallback_random(*args, options=None, **kwargs):
        if options and "fallback_random" in options:
            options = {**options, "fallback_random": True}
        return compile_(*args, options=options, **kwargs)

    monkeypatch.setattr(torch, "compile", compile_with_fallback_random)
    with inductor_config.patch(fallback_random=True):
        yield


# float32 tolerances for "the same computation, differently fused".
RTOL, ATOL = 1e-4, 1e-5


def leaves(tensordict):
    """{flattened key: detached clone} of every leaf of a TensorDict (parameters or losses)."""
    return {
        ".".join(key) if isinstance(key, tuple) else key: value.detach().clone()
        for key, value in tensordict.items(include_nested=True, leaves_only=True)
    }


def assert_leaves_close(actual, expected, what, rtol=RTOL, atol=ATOL):
    """Two {name: tensor} dicts have the same keys and tensors equal within rtol and atol."""
    assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(actual)} vs {sorted(expected)}"
    for key in expected:
        torch.testing.assert_close(
            actual[key], expected[key], rtol=rtol, atol=atol, msg=lambda m, k=key: f"{what} {k}: {m}"
        )


def assert_changed(before, after, what):
    """At least one tensor of a group moved: the update is not a no-op."""
    assert any(not torch.equal(before[key], after[key]) for key in before), f"{what} did not change"


def random_batch(batch_size, obs_dim, action_dim, seed, device="cpu"):
    """A replay batch (TensorDict) of random transitions, a quarter of them terminations; actions in [-1, 1]."""
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        observations=torch.randn(batch_size, obs_dim, generator=generator),
        next_observations=torch.randn(batch_size, obs_dim, generator=generator),
        actions=torch.rand(batch_size, action_dim, generator=generator) * 2 - 1,
        rewards=torch.randn(batch_size, generator=generator),
        terminations=(torch.rand(batch_size, generator=generator) < 0.25).float(),
        batch_size=[batch_size],
    ).to(device)


# --- Two implementations of one update, compared on any CPU, GPU and thread count (issue 13) ---------------------
#
# Two correct implementations of an update (plain and twin, eager and compiled, captured and not) sum in different
# orders, so their gradients differ in the last bits. Adam's step, lr * m / (sqrt(v) + eps), is normalised: where a
# gradient is a near-cancelling sum, at the level of its own rounding noise, its sign and size are noise, and so is
# the step of that entry, which can differ by up to about 2 lr between the two sides, although the gradients agree to
# float32 precision (1 entry of 131072 of SAC's Q networks on an AMD EPYC). So the checks compare, each round, from
# bit-identical parameters:
# - the losses and the gradients (left in .grad by the update), with tight float32 tolerances;
# - the step of every entry whose gradients have stayed well above their rounding noise (they agree to NOISE_LEVEL
#   relative, so their Adam moments do, and so does the step: to STEP_ATOL * lr, a hundredth of a step);
# - the other entries (at most MAX_NOISY_FRACTION of a group) within Adam's largest step, 2 lr between two sides;
# then copy the reference side's parameters into the other side, in place, so that no round starts from a drift.
# A wrong twin fails: a wrong loss or gradient at once; a wrong optimizer (learning rate, eps, a missing step) in the
# steps of the bulk of the entries, which must agree to a hundredth of a step.

GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5  # GRAD_ATOL is relative to the tensor's largest gradient (its scale)
NOISE_LEVEL = 1e-3  # two gradients of an entry further apart than this, relatively, are at their rounding noise
STEP_ATOL = 1e-2  # times the learning rate: how far the steps of two matching updates may differ
PARAM_RTOL = 2e-6  # the rounding of the parameter itself (two ulps of float32) when the step is added
MAX_NOISY_FRACTION = 1e-2  # the share of a group's entries allowed to be at their noise: the bulk must match


def named_tensors(source):
    """{name: tensor}, the tensors themselves (not copies): a module's parameters, a TensorDict's leaves, a dict."""
    if isinstance(source, TensorDictBase):  # first: TensorDictParams is a module too
        return {
            ".".join(key) if isinstance(key, tuple) else key: value
            for key, value in source.items(include_nested=True, leaves_only=True)
        }
    if isinstance(source, torch.nn.Module):
        return dict(source.named_parameters())
    return dict(source)


def sync_(actual, expected):
    """Copy expected's values into actual's tensors, in place (a captured graph reads those very tensors)."""
    actual, expected = named_tensors(actual), named_tensors(expected)
    assert actual.keys() == expected.keys(), f"keys differ: {sorted(actual)} vs {sorted(expected)}"
    with torch.no_grad():
        for key, tensor in actual.items():
            tensor.copy_(expected[key])


class SameUpdates:
    """Checks, round after round, that two agents made the same optimizer update of one group of parameters.

    Call check(actual, expected, lr, what) right after both made the update, from bit-identical parameters (this
    object re-syncs them after each check); actual and expected: the live parameters (a module, a TensorDict of
    nn.Parameters or a {name: parameter} dict), whose .grad holds the gradients the optimizer used. lr: the
    learning rate of the step, a float or {name: float}. grads=False where actual's .grad cannot be read: at the
    call that records a CUDA graph, .grad holds the buffers the graph will write, not written yet (the recording
    does not run the kernels); the steps are then checked against the entries found at their noise so far.
    """

    def __init__(self, group):
        self.group = group
        self.noisy = {}  # {name: bool tensor}: entries whose gradient has been at its rounding noise in some round

    def check(self, actual, expected, lr, what, grads=True):
        actual, expected = named_tensors(actual), named_tensors(expected)
        what = f"{what} {self.group}"
        assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(actual)} vs {sorted(expected)}"
        for name, param in expected.items():
            other = actual[name]
            lr_ = lr[name] if isinstance(lr, dict) else float(lr)
            if not grads or (param.grad is None and other.grad is None):
                noisy = torch.zeros_like(param, dtype=torch.bool)
            elif param.grad is None or other.grad is None:
                raise AssertionError(f"{what} {name}: a gradient on one side only")
            else:
                grad, other_grad = param.grad.detach(), other.grad.detach()
                scale = grad.abs().max().item()
                torch.testing.assert_close(
                    other_grad, grad, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale,
                    msg=lambda m, n=name: f"{what} gradient of {n}: {m}",
                )  # fmt: skip
                noisy = (other_grad - grad).abs() > NOISE_LEVEL * torch.maximum(other_grad.abs(), grad.abs())
            self.noisy[name] = noisy | self.noisy.get(name, torch.zeros_like(noisy))
            gap = (other.detach() - param.detach()).abs()
            allowed = STEP_ATOL * lr_ + PARAM_RTOL * param.detach().abs()
            wrong = (gap > allowed) & ~self.noisy[name]
            if wrong.any():
                index = torch.where(wrong, gap - allowed, -1).argmax()
                raise AssertionError(
                    f"{what} {name}: {int(wrong.sum())} of {param.numel()} entries with matching gradients made "
                    f"other steps; greatest gap {gap.flatten()[index]:.3g} where {allowed.flatten()[index]:.3g} is "
                    f"allowed (lr {lr_:.3g})"
                )
            assert gap.max() <= 2 * lr_ + allowed.max(), (
                f"{what} {name}: an entry at its gradient's rounding noise moved {gap.max():.3g} from the other "
                f"side's, more than Adam's two steps of {lr_:.3g}"
            )
        noisy = sum(int(mask.sum()) for mask in self.noisy.values())
        total = sum(mask.numel() for mask in self.noisy.values())
        assert noisy <= MAX_NOISY_FRACTION * total, f"{what}: {noisy} of {total} gradients at their rounding noise"
        sync_(actual, expected)


def assert_params_close_after_steps(actual, expected, lrs, what):
    """The parameters of two agents after the same optimizer steps (learning rates lrs), from the same start, their
    gradients unseen (the end of a run): the bulk of the entries agree to a hundredth of the steps' total, and the
    few that went through a gradient at its rounding noise (at most MAX_NOISY_FRACTION) within Adam's steps."""
    actual, expected = named_tensors(actual), named_tensors(expected)
    assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(actual)} vs {sorted(expected)}"
    loose, total = 0, 0
    for name, param in expected.items():
        gap = (actual[name].detach() - param.detach()).abs()
        loose += int((gap > STEP_ATOL * sum(lrs) + PARAM_RTOL * param.detach().abs()).sum())
        total += param.numel()
        assert gap.max() <= 2 * sum(lrs), f"{what} {name}: {gap.max():.3g} apart, more than Adam's steps allow"
    assert loose <= MAX_NOISY_FRACTION * total, f"{what}: {loose} of {total} entries further apart than the bulk's"


def args_docstrings(name):
    """{field: docstring} of a script's Args class, read from the source (the string right after each field), with
    those of the fields it inherits from run_utils.RunArgs (the flags every script has) that it does not set again."""
    docs = class_docstrings(SCRIPTS_DIR / "run_utils.py", "RunArgs")
    docs.update(class_docstrings(script_path(name), "Args"))
    return docs


def class_docstrings(path, class_name):
    tree = ast.parse(Path(path).read_text())
    (args_class,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    docs = {}
    body = args_class.body
    for index, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            following = body[index + 1] if index + 1 < len(body) else None
            is_doc = (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            )
            docs[node.target.id] = following.value.value.strip() if is_doc else ""
    return docs


def squash(text):
    """Text with tyro's box-drawing characters and runs of whitespace reduced to single spaces."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def is_number(value):
    """A finite int or float (not a bool): what a numeric field of the results line must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_cudagraphs_message(completed, asked_for_cudagraphs, on_cuda=False):
    """On the CPU, --cudagraphs gets exactly one line saying they are off; without it, no such line.

    On CUDA, no line says they are off (tensordict logs the setting up of each CudaGraphModule: that line is fine).
    """
    mentions = [line for line in output_lines(completed) if "cudagraph" in line.lower()]
    says_off = [line for line in mentions if re.search(r"\boff\b|disabl|needs? a cuda", line.lower())]
    if on_cuda:
        assert not says_off, says_off
    elif asked_for_cudagraphs:
        assert len(mentions) == 1, f"expected one line saying cudagraphs are off, got {mentions}"
        assert says_off == mentions, mentions[0]
    else:
        assert not mentions, mentions


# --- Checks every pair's tests run the same way: flags, bad input, determinism, the results line ----------------

TWIN_ONLY_FIELDS = {"compile", "cudagraphs"}
COMMON_FIELDS = ("exp_name", "seed", "torch_deterministic", "cuda", "track", "wandb_project_name", "wandb_entity",
                 "env_id", "total_timesteps", "measure_burnin", "results_path", "save_model", "model_path",
                 "checkpoint_every", "resume", "eval_episodes", "capture_video")  # fmt: skip


def check_args_of_the_pair_match(plain_name, twin_name, expected_defaults, speed_fields=None):
    """The twin has the plain script's fields (same order, types, defaults) plus compile and cudagraphs (False), and
    speed_fields ({field: default}: how a speed trick runs, not what the agent computes), after them.

    Both have the fields every script has (CONVENTIONS.md); expected_defaults: {field: CleanRL's default}.
    """
    plain, twin = args_fields(load_script(plain_name)), args_fields(load_script(twin_name))
    speed_fields = speed_fields or {}
    assert set(twin) - set(plain) == TWIN_ONLY_FIELDS | set(speed_fields)
    assert set(plain) <= set(twin)
    assert list(twin)[len(twin) - len(speed_fields) :] == list(speed_fields)
    assert [name for name in twin if name in plain] == list(plain), "shared fields in another order"
    for name, default in speed_fields.items():
        assert field_default(twin[name]) == default, name
    for name, field in plain.items():
        assert twin[name].type == field.type, f"{name}: type {twin[name].type} vs {field.type}"
        if name == "exp_name":  # defaults to the script's own name
            assert field_default(field) == plain_name and field_default(twin[name]) == twin_name
        else:
            assert field_default(twin[name]) == field_default(field), f"{name}: defaults differ"
    for name in TWIN_ONLY_FIELDS:
        assert twin[name].type in (bool, "bool") and field_default(twin[name]) is False, name

    for name in COMMON_FIELDS:
        assert name in plain, name
    assert field_default(plain["cuda"]) is True
    assert field_default(plain["track"]) is False
    assert field_default(plain["results_path"]) is None
    assert field_default(plain["wandb_project_name"]) == "leanrl"
    checkpoint_defaults = {"save_model": False, "model_path": None, "checkpoint_every": 0, "resume": None,
                           "eval_episodes": 10, "capture_video": False}  # fmt: skip
    assert {name: field_default(plain[name]) for name in checkpoint_defaults} == checkpoint_defaults
    assert {name: field_default(plain[name]) for name in expected_defaults} == expected_defaults


def check_every_flag_has_a_docstring_shown_by_help(name):
    docs = args_docstrings(name)
    assert set(docs) == set(args_fields(load_script(name)))
    missing = [field for field, doc in docs.items() if not doc]
    assert not missing, f"fields without a docstring: {missing}"

    help_text = squash(help_output(name))
    for field, doc in docs.items():
        assert f"--{field.replace('_', '-')}" in help_text, f"--help does not list {field}"
        assert squash(doc) in help_text, f"--help does not show the docstring of {field}: {doc!r}"


def help_output(name):
    """What `python leanrl/<name>.py --help` prints, 200 columns wide: the script's __main__ run in this process (a
    subprocess costs seconds of imports), which must exit with status 0."""
    out, columns = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"
    try:
        with _command_line([str(script_path(name)), "--help"]), contextlib.redirect_stdout(out):
            with pytest.raises(SystemExit) as exit_:
                runpy.run_path(str(script_path(name)), run_name="__main__")
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    assert exit_.value.code in (0, None), f"--help exited with {exit_.value.code!r}: {out.getvalue()[-2000:]}"
    return out.getvalue()


def check_bad_input(name, flags, expected_words, tmp_path):
    """Exit status 2, exactly one stderr line naming the problem, no traceback, no results written."""
    results = tmp_path / "results.jsonl"
    completed = run_script(name, *flags, "--results-path", results, timeout=300)
    assert completed.returncode == 2, describe(completed)
    assert "Traceback" not in completed.stderr + completed.stdout, describe(completed)
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, describe(completed)
    _check_error_line(lines[0], expected_words, results)


def _check_error_line(line, expected_words, results):
    """The one stderr line of a refused run names the problem; the run wrote no results."""
    message = line.replace("_", "-")
    for word in expected_words:
        assert word in message, f"{word!r} not in {line!r}"
    assert not results.exists(), "a failed run wrote results"


def check_bad_input_in_process(name, flags, expected_words, tmp_path, capsys):
    """check_bad_input for a run of the script's __main__ in this process: a subprocess per case costs seconds of
    imports. Anything but SystemExit (a traceback) propagates and fails the test."""
    results = tmp_path / "results.jsonl"
    path = script_path(name)
    with _command_line([str(path), *map(str, flags), "--no-cuda", "--results-path", str(results)]):
        with pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(path), run_name="__main__")
    stdout, stderr = capsys.readouterr()
    assert exit_.value.code == 2, (exit_.value.code, stdout, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{name}.py: error: "), lines
    _check_error_line(lines[0], expected_words, results)


def check_same_seed_same_returns(name):
    """The same seed twice gives the same episodic returns on Pendulum-v1 (4 episodes, 3 of them learning); another
    seed gives others."""
    flags = ("--env-id", "Pendulum-v1", "--learning-starts", "200", "--batch-size", "64")
    first = run_in_process(name, *flags, "--seed", "1", "--total-timesteps", "800")["episode_returns"]
    second = run_in_process(name, *flags, "--seed", "1", "--total-timesteps", "800")["episode_returns"]
    assert len(first) >= 4, first
    assert all(isinstance(value, float) for value in first), first
    assert second == first
    # Another seed gives other returns (a shorter run is enough to see it).
    other = run_in_process(name, *flags, "--seed", "2", "--total-timesteps", "400")["episode_returns"]
    assert len(other) == 2, other
    assert other != first[: len(other)]
    assert other[1] != first[1], "the first learning episode does not depend on the seed"


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
    """The TinyRun of run.sh's tiny budget for a pair (its plain script's name). Each pair's tests of the results line
    and of the twin's flag combinations run on it (the checks below assert so): they run every line of run.sh --tiny,
    in the plain script and in each CPU variant of the twin, so that run.sh's own test need not run every pair."""
    flags = run_sh_budget("tiny", pair)
    total = int(flags[flags.index("--total-timesteps") + 1])
    return TinyRun(flags=flags, env_id=env_id, total_timesteps=total, return_range=return_range, env=env)


def check_tiny_run_is_run_sh(name, tiny):
    """The tiny run a script's results-line test runs is run.sh's tiny budget of the script's pair."""
    pair = name.removesuffix(".py").removesuffix("_torchcompile")
    assert tiny.flags == run_sh_budget("tiny", pair), f"{name}: a tiny run other than run.sh's for {pair}"


# Off-policy (SAC, TD3): 300 steps > learning_starts (100) + measure_burnin (3 by default), so sps is measured; one
# 200-step Pendulum-v1 episode finishes, and a step's reward lies in [-16.3, 0]. run.sh's line for SAC and TD3.
TINY_RUN = run_sh_tiny_run("sac_continuous_action", "Pendulum-v1", (-3300, 0))


def check_result(result, name, algo, seed, compile_, tiny=TINY_RUN, device="cpu", cudagraphs=False):
    """One results line of a tiny run (on the CPU unless told): every field, with the right types and values."""
    assert set(RESULT_FIELDS) <= result.keys(), f"missing fields: {set(RESULT_FIELDS) - result.keys()}"
    assert result["script"] == f"{name}.py"
    assert result["algo"] == algo
    assert result["env_id"] == tiny.env_id
    assert result["seed"] == seed
    assert result["compile"] is compile_
    assert result["cudagraphs"] is cudagraphs, "cudagraphs recorded as asked for (on CUDA) or off (on the CPU)"
    assert result["device"] == device
    assert result["torch_version"] == torch.__version__
    assert result["total_timesteps"] == tiny.total_timesteps
    assert is_number(result["sps"]) and result["sps"] > 0, result["sps"]
    assert is_number(result["compile_seconds"]) and result["compile_seconds"] >= 0, result["compile_seconds"]
    assert is_number(result["wall_seconds"]) and result["wall_seconds"] > 0, result["wall_seconds"]
    low, high = tiny.return_range
    assert is_number(result["final_return"]) and low < result["final_return"] <= high, result["final_return"]


def check_plain_results_line_is_appended(plain, algo, tmp_path, tiny=TINY_RUN):
    """Two runs of the plain script, on run.sh's tiny budget of its pair, append two results lines, in order, and
    print a summary line. In this process (run_script_in_process)."""
    check_tiny_run_is_run_sh(plain, tiny)
    results = tmp_path / "results.jsonl"
    for count, seed in enumerate((1, 2), start=1):
        completed = run_script_in_process(plain, *tiny.flags, "--seed", seed, "--results-path", results, env=tiny.env)
        assert completed.returncode == 0, describe(completed)
        assert tiny.env_id in completed.stdout.strip().splitlines()[-1], "no summary line"
        lines = read_results(results)
        assert len(lines) == count, "the results file was not appended to"
        check_result(lines[-1], plain, algo, seed, compile_=False, tiny=tiny)
    assert [line["seed"] for line in read_results(results)] == [1, 2]


def check_twin_runs_with_every_flag_combination(twin, algo, tmp_path, tiny=TINY_RUN):
    """On the CPU, the twin runs with no flag, --compile, --cudagraphs and both, on run.sh's tiny budget of its pair;
    cudagraphs fall back with one line. In this process, as check_plain_results_line_is_appended."""
    check_tiny_run_is_run_sh(twin, tiny)
    results = tmp_path / "results.jsonl"
    combinations = [(), ("--compile",), ("--cudagraphs",), ("--compile", "--cudagraphs")]
    for count, flags in enumerate(combinations, start=1):
        completed = run_script_in_process(
            twin, *tiny.flags, "--seed", "1", "--results-path", results, *flags, env=tiny.env
        )
        assert completed.returncode == 0, f"flags {flags}: {describe(completed)}"
        assert "Traceback" not in completed.stderr, describe(completed)
        assert tiny.env_id in completed.stdout.strip().splitlines()[-1], "no summary line"
        check_cudagraphs_message(completed, "--cudagraphs" in flags)
        lines = read_results(results)
        assert len(lines) == count, "the results file was not appended to"
        check_result(lines[-1], twin, algo, 1, compile_="--compile" in flags, tiny=tiny)
    by_flags = dict(zip(combinations, read_results(results), strict=True))
    # Without CUDA, --cudagraphs is off: the run is the one without it, return for return (same seed).
    assert by_flags[("--cudagraphs",)]["final_return"] == by_flags[()]["final_return"]
    assert by_flags[("--compile", "--cudagraphs")]["final_return"] == by_flags[("--compile",)]["final_return"]


def check_twin_runs_with_cudagraphs_on_cuda(twin, algo, tmp_path, tiny=TINY_RUN):
    """On CUDA, --cudagraphs are on: recorded as such, no line says they are off, and the run is the one without
    them (same seed, same final return: a captured graph replays the same kernels and draws the same numbers).

    --compile --cudagraphs runs once (each compiled run costs its compile time); the pair without --compile is the
    one compared.
    """
    results = tmp_path / "results.jsonl"
    combinations = [(), ("--cudagraphs",), ("--compile", "--cudagraphs")]
    for count, flags in enumerate(combinations, start=1):
        completed = run_script(
            twin, *tiny.flags, "--seed", "1", "--results-path", results, *flags, env=tiny.env, cuda=True
        )
        assert completed.returncode == 0, f"flags {flags}: {describe(completed)}"
        assert "Traceback" not in completed.stderr, describe(completed)
        assert tiny.env_id in completed.stdout.strip().splitlines()[-1], "no summary line"
        check_cudagraphs_message(completed, "--cudagraphs" in flags, on_cuda=True)
        lines = read_results(results)
        assert len(lines) == count, "the results file was not appended to"
        check_result(
            lines[-1], twin, algo, 1, compile_="--compile" in flags, tiny=tiny, device="cuda",
            cudagraphs="--cudagraphs" in flags,
        )  # fmt: skip
    by_flags = dict(zip(combinations, read_results(results), strict=True))
    assert by_flags[("--cudagraphs",)]["final_return"] == pytest.approx(by_flags[()]["final_return"], rel=1e-5)


# --- Checkpoints, evaluation and interruption: --save-model, --resume, --eval-episodes, --capture-video --------


def assert_same_state(actual, expected, where="checkpoint"):
    """Two checkpoints (or parts of them) hold the same entries: tensors equal in dtype, shape and every value."""
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{where}: keys {sorted(actual)} vs {sorted(expected)}"
        for key in expected:
            assert_same_state(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{where}: length {len(actual)} vs {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_state(a, e, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual)}"
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), f"{where}: dtype or shape differ"
        assert torch.equal(actual.cpu(), expected.cpu()), f"{where}: values differ"
    else:
        assert actual == expected, f"{where}: {actual!r} vs {expected!r}"


def load_checkpoint(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture
def saved_checkpoints(monkeypatch):
    """Every checkpoint a run in this process passes to torch.save, copied when saved (a file is overwritten). Other
    objects are left out: torch.distributed's all_gather_object serialises through torch.save too."""
    saved = []
    real_save = torch.save

    def save(obj, *args, **kwargs):
        if isinstance(obj, dict) and "global_step" in obj:
            saved.append(copy.deepcopy(obj))
        return real_save(obj, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    return saved


def optimizer_steps(checkpoint):
    """{optimizer: [its step count for each parameter]} of a checkpoint's agent."""
    return {
        name: [state["step"].item() for _, state in sorted(value["state"].items())]
        for name, value in checkpoint["agent"].items()
        if name.endswith("optimizer")
    }


class _Reached(Exception):
    """Raised at the end of the episode with which a run in this process reached what a test waits for."""


def run_in_process_until(name, *flags, reached, timeout=DEFAULT_TIMEOUT_S):
    """The training episodes' returns of run_in_process(name, *flags), stopped at the end of the first episode after
    which reached(returns so far) holds: a test whose claim is that a run reaches something within its budget (not
    where it ends) need not play the rest of the budget. All the run's returns if it never does."""
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


def check_learns_pendulum(name, flags, total_timesteps, num_envs, resumed, tmp_path, threshold):
    """A SAC or TD3 script on Pendulum-v1 (episodes of 200 steps) reaches a mean of `threshold` over 10 consecutive
    training episodes within `total_timesteps`; the run stops at the episode that brings them there, since the rest
    of the budget could not change that. resumed: the run is saved at half the budget and resumed in a new run, and
    the episodes counted are the resumed run's (the second half's)."""
    flags = ("--env-id", "Pendulum-v1", *flags)
    if resumed:
        flags = (*flags, "--save-model", "--model-path", tmp_path / "agent.pt", "--eval-episodes", "0")
        run_in_process(name, *flags, "--total-timesteps", total_timesteps // 2)
        flags = (*flags, "--resume", tmp_path / "agent.pt")
    reached = lambda returns: len(returns) >= 10 and statistics.mean(returns[-10:]) > threshold  # noqa: E731
    returns = run_in_process_until(name, *flags, "--total-timesteps", total_timesteps, reached=reached)
    played = total_timesteps // 2 if resumed else total_timesteps
    episodes = num_envs * (played // num_envs // 200)
    stopped = reached(returns)  # stopped there: its episodes so far
    assert len(returns) <= episodes if stopped else len(returns) == episodes, (
        f"Pendulum-v1 episodes last 200 steps: {episodes} in {played} steps; got {len(returns)}"
    )
    print(
        f"{name} {' '.join(map(str, flags))}: {len(returns)} of {episodes} episodes; returns {[round(r) for r in returns]}"
    )
    assert len(returns) >= 10, returns
    best10 = max(statistics.mean(returns[i : i + 10]) for i in range(len(returns) - 9))
    assert best10 > threshold, f"best mean of 10 consecutive returns {best10:.1f}"


def check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps, same_as_shorter_run):
    """A run of 2 x `steps` with --checkpoint-every `steps`; a run resumed from its mid-run checkpoint ends with the
    uninterrupted run's step counter and optimizer step counts, and keeps the replay rows written before the resume
    (where there is a replay buffer). same_as_shorter_run: the mid-run checkpoint is, entry for entry, what a run of
    `steps` saves at its end (true where --total-timesteps sets no schedule)."""
    common = (*flags, "--save-model", "--eval-episodes", "0")
    run_in_process(name, *common, "--total-timesteps", 2 * steps, "--checkpoint-every", steps,
                   "--model-path", tmp_path / "full.pt")  # fmt: skip
    assert len(saved_checkpoints) == 2, "one checkpoint mid-run and one at the end"
    mid, full = saved_checkpoints
    assert (mid["global_step"], full["global_step"]) == (steps, 2 * steps)
    if same_as_shorter_run:
        run_in_process(name, *common, "--total-timesteps", steps, "--model-path", tmp_path / "short.pt")
        short = saved_checkpoints[2]
        assert (short["total_timesteps"], mid["total_timesteps"]) == (steps, 2 * steps)  # each run's own budget
        assert_same_state({**short, "total_timesteps": 2 * steps}, mid)
    torch.save(mid, tmp_path / "mid.pt")
    run_in_process(name, *common, "--total-timesteps", 2 * steps, "--resume", tmp_path / "mid.pt",
                   "--model-path", tmp_path / "resumed.pt")  # fmt: skip
    resumed = load_checkpoint(tmp_path / "resumed.pt")
    assert resumed["global_step"] == 2 * steps
    assert optimizer_steps(resumed) == optimizer_steps(full)
    assert all(optimizer_steps(mid).values()), "no update before the checkpoint: the check would prove little"
    if "replay_buffer" in mid:
        assert (resumed["replay_buffer"]["pos"], resumed["replay_buffer"]["full"]) == (
            full["replay_buffer"]["pos"],
            full["replay_buffer"]["full"],
        )
        for key, rows in mid["replay_buffer"].items():
            if isinstance(rows, torch.Tensor):
                assert torch.equal(resumed["replay_buffer"][key][: len(rows)], rows), f"replay {key} before resume"
                assert resumed["replay_buffer"][key].shape == full["replay_buffer"][key].shape, key
    return resumed


def check_checkpoints_load_across_the_pair(plain, twin, flags, tmp_path):
    """Each member evaluates the other's checkpoint with the same eval return (same seed), and saves back every entry
    it read unchanged: both read and write one layout, the plain script's."""
    for source, target in ((twin, plain), (plain, twin)):
        results = tmp_path / f"{source}.jsonl"
        run_in_process(source, *flags, "--save-model", "--model-path", tmp_path / f"{source}.pt",
                       "--eval-episodes", "2", "--results-path", results)  # fmt: skip
        run_in_process(target, *flags, "--resume", tmp_path / f"{source}.pt", "--save-model",
                       "--model-path", tmp_path / f"{target}_from_{source}.pt", "--eval-episodes", "2",
                       "--results-path", results)  # fmt: skip
        saved, evaluated = read_results(results)
        assert is_number(saved["eval_return"]), saved
        assert evaluated["eval_return"] == saved["eval_return"], f"{target} evaluating {source}'s checkpoint"
        assert evaluated["steps_done"] == saved["steps_done"], "a finished run resumed trains nothing"
        assert_same_state(
            load_checkpoint(tmp_path / f"{target}_from_{source}.pt"), load_checkpoint(tmp_path / f"{source}.pt")
        )


def check_bad_checkpoints_are_refused(name, flags, checkpoint, other_algo_checkpoint, changed_flag, tmp_path, capsys):
    """--resume with a missing, truncated, other-algorithm, other-env or other-hyper-parameter checkpoint: exit 2, one
    line that says which."""
    capsys.readouterr()  # what the run that saved the checkpoint printed
    truncated = tmp_path / "truncated.pt"
    data = Path(checkpoint).read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    flag, value = changed_flag
    cases = [
        (("--resume", tmp_path / "missing.pt"), ["no checkpoint", "missing.pt"]),
        (("--resume", truncated), ["cannot read", "truncated.pt"]),
        (("--resume", other_algo_checkpoint), ["not a", "checkpoint"]),
        (("--resume", checkpoint, "--seed", "7"), ["seed 7"]),
        (("--resume", checkpoint, flag, value), [flag, "hyper-parameters"]),
    ]
    for case_flags, words in cases:
        check_bad_input_in_process(name, (*flags, *case_flags), words, tmp_path, capsys)


def check_video_of_the_evaluation(
    name, flags, tmp_path, env_id="InvertedPendulum-v5", return_of_frames=lambda n: n - 1
):
    """--capture-video: one playable MP4 per evaluation episode beside the checkpoint, a frame per step.
    return_of_frames: an episode's return from its frame count. On InvertedPendulum-v5 the reward is 1 a step but 0
    on the step that drops the pole, which a briefly trained agent does early: the frame count less one. On
    CartPole-v1 every step, the last included, gives 1: the frame count."""
    import imageio.v3 as iio

    results = tmp_path / "results.jsonl"
    run_in_process(name, *flags, "--env-id", env_id, "--save-model", "--model-path",
                   tmp_path / "run" / "agent.pt", "--eval-episodes", "2", "--capture-video",
                   "--results-path", results)  # fmt: skip
    videos = sorted((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [video.name for video in videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    frame_counts = []
    for video in videos:
        frames = iio.imread(video)
        assert frames.ndim == 4 and frames.shape[-1] == 3 and frames.max() > 0, frames.shape
        frame_counts.append(len(frames))
    assert read_results(results)[0]["eval_return"] == pytest.approx(sum(map(return_of_frames, frame_counts)) / 2)


def check_signal_stops_the_run(name, flags, signum, tmp_path, total_timesteps=10**6):
    """SIGINT or SIGTERM to a running script: it stops at the end of a step, writes its checkpoint and a results line
    with "interrupted": true and the steps done, says so, exits 128 + the signal, no traceback; then the run resumes
    from that checkpoint to a finish. The signal waits for the run's first steps, and its budget is one no machine
    runs in the half second that follows: the signal always finds the run in its loop."""
    model, results, stderr_path = tmp_path / "agent.pt", tmp_path / "results.jsonl", tmp_path / "stderr.txt"
    command = [sys.executable, str(script_path(name)), *map(str, flags), "--total-timesteps", str(total_timesteps),
               "--save-model", "--model-path", str(model), "--results-path", str(results)]  # fmt: skip
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)  # fmt: skip
        try:
            with _time_limit(600, f"waiting for {name} to step"):
                # The progress bar shows steps done: the run is in its loop (PPO's total is rounded to whole rollouts).
                while not re.search(r"\b[1-9]\d*/\d+\b", stderr_path.read_text()):
                    assert process.poll() is None, stderr_path.read_text()
                    time.sleep(0.5)
            process.send_signal(signum)
            stdout, _ = process.communicate(timeout=300)
        finally:
            process.kill()
    error_output = stderr_path.read_text()
    assert process.returncode == 128 + signum, (process.returncode, stdout, error_output[-2000:])
    assert "Traceback" not in error_output + stdout, error_output[-2000:]
    assert f"interrupted by {signal.Signals(signum).name}" in stdout.strip().splitlines()[-1], stdout
    (result,) = read_results(results)
    assert (result["interrupted"], result["cut"], result["model_path"]) == (True, "training", str(model)), result
    assert 0 < result["steps_done"] < total_timesteps, result
    assert load_checkpoint(model)["global_step"] == result["steps_done"]

    # The resumed run ends 50 steps on, a budget other than the interrupted run's: a script whose schedule is computed
    # from the budget refuses that (test_run_rules.py), so the checkpoint is given it, as if the run had been made so.
    # It runs in this process: what it checks is the checkpoint, not the signal.
    finish = result["steps_done"] + 50
    torch.save({**load_checkpoint(model), "total_timesteps": finish}, model)
    completed = run_script_in_process(name, *flags, "--total-timesteps", finish, "--resume", model, "--save-model",
                                      "--eval-episodes", "1", "--results-path", results)  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    resumed = read_results(results)[-1]
    assert (resumed["interrupted"], resumed["cut"], resumed["model_path"]) == (False, None, str(model)), resumed
    assert resumed["steps_done"] >= finish and is_number(resumed["eval_return"]), resumed


# --- The Atari twins' envs in two halves ------------------------------------------------------------------------


class FixedActionPool:
    """An envpool pool whose envs play fixed actions, whatever the agent chose (each env its own sequence, by its
    index among the run's envs and its step count), and that records what each env returned, step by step."""

    def __init__(self, envs, first_env, record):
        self._envs, self.first_env, self.record = envs, first_env, record
        self.env_ids = first_env + np.arange(envs.config["num_envs"])
        self.steps = 0

    def __getattr__(self, name):
        return getattr(self._envs, name)

    def reset(self):
        obs, info = self._envs.reset()
        for env, frames in zip(self.env_ids, obs, strict=True):
            self.record.setdefault(int(env), []).append(dict(frames=frames.copy()))
        return obs, info

    def send(self, action):
        self._envs.send((self.env_ids * 5 + self.steps**2) % self._envs.action_space.n)
        self.steps += 1

    def recv(self):
        obs, reward, terminations, truncations, infos = self._envs.recv()
        for index, env in enumerate(self.env_ids):
            self.record[int(env)].append(dict(frames=obs[index].copy(), reward=reward[index],
                                              termination=terminations[index], truncation=truncations[index],
                                              game_reward=infos["reward"][index],
                                              game_over=infos["terminated"][index]))  # fmt: skip
        return obs, reward, terminations, truncations, infos


def _fixed_action_run(name, flags, max_episode_steps, keep_checkpoint=None):
    """A run of name in this process, its envs FixedActionPools with this time limit: (its globals, {env index: the
    steps it recorded}, the pools' sizes). keep_checkpoint=(step, path): the checkpoint of that step copied there."""
    import envpool

    real_make, real_save, record, pools = envpool.make, torch.save, {}, []

    def make(*args, seed, **kwargs):
        envs = real_make(*args, seed=seed, max_episode_steps=max_episode_steps, **kwargs)
        pools.append((seed, envs.config["num_envs"]))
        return FixedActionPool(envs, seed - pools[0][0], record)  # envpool seeds env i of a pool with seed + i

    def save(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        if keep_checkpoint and isinstance(obj, dict) and obj.get("global_step") == keep_checkpoint[0]:
            real_save(obj, keep_checkpoint[1])

    with pytest.MonkeyPatch.context() as patch, one_torch_thread():
        patch.setattr(envpool, "make", make)
        patch.setattr(torch, "save", save)
        run_globals = run_in_process(name, *flags, "--eval-episodes", "0")
    return run_globals, record, [size for _, size in pools]


def check_env_halves_play_the_games_of_one_pool(name, flags, tmp_path):
    """--env-halves on (two pools of 2 envs, stepped in turn) against off (one pool of 4), on Asterix with fixed actions
    and a time limit of 70 steps, in a run of 5 iterations of 4 x 32 steps and in that run resumed from its checkpoint
    after 2: each env's frames, rewards, terminations, truncations and game rewards are the same step by step, and so
    are the games' real returns the run reports and its last rollout's reset mask. flags: the run's, but for --env-id,
    --num-envs and the budget."""
    flags = ("--env-id", "Asterix-v5", "--num-envs", "4", *flags, "--total-timesteps", 5 * 4 * 32, "--save-model",
             "--checkpoint-every", 2 * 4 * 32)  # fmt: skip
    runs = {}
    for halves in ("on", "off"):
        run_flags = (*flags, "--model-path", tmp_path / halves / "agent.pt", "--env-halves", halves)
        resume_path = tmp_path / halves / "after-2.pt"
        runs[halves] = [
            _fixed_action_run(name, run_flags, max_episode_steps=70, keep_checkpoint=(2 * 4 * 32, resume_path)),
            _fixed_action_run(name, (*run_flags, "--resume", resume_path), max_episode_steps=70),
        ]
    lives_lost = 0
    for iterations, on_run, off_run in zip((5, 3), *runs.values(), strict=True):
        (on_globals, on_record, on_pools), (off_globals, off_record, off_pools) = on_run, off_run
        assert (on_pools, off_pools) == ([2, 2], [4])
        assert sorted(on_record) == sorted(off_record) == [0, 1, 2, 3]
        for env in off_record:
            assert len(on_record[env]) == len(off_record[env]) == 1 + iterations * 32  # the reset, then the steps
            for step, (on_step, off_step) in enumerate(zip(on_record[env], off_record[env], strict=True)):
                assert on_step.keys() == off_step.keys()
                for key in off_step:
                    np.testing.assert_array_equal(on_step[key], off_step[key], err_msg=f"env {env}, step {step}: {key}")
        steps = [step for env in off_record.values() for step in env[1:]]
        assert any(step["truncation"] for step in steps), "no time limit reached"
        lives_lost += sum(step["termination"] for step in steps)
        assert on_globals["episode_returns"] == off_globals["episode_returns"]
        assert any(episode_return > 0 for episode_return in off_globals["episode_returns"]), "no game scored"
        mask = off_globals["rollout"]["mask"]
        assert (mask == 0).any(), "no reset step in the last rollout: the mask proves nothing"
        torch.testing.assert_close(on_globals["rollout"]["mask"], mask, rtol=0, atol=0)
    assert lives_lost, "no life lost"


def check_an_odd_number_of_envs_steps_as_one_pool(name, flags):
    """--env-halves on with 3 envs, or 1: one pool, said in one line; with 2, two pools and no such line."""
    import envpool

    real_make, pools = envpool.make, []

    def make(*args, **kwargs):
        pools.append(kwargs["num_envs"])
        return real_make(*args, **kwargs)

    for num_envs, expected_pools in ((3, [3]), (1, [1]), (2, [1, 1])):
        pools.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(envpool, "make", make)
            completed = run_script_in_process(name, *flags, "--num-envs", num_envs, "--total-timesteps", num_envs * 8,
                                              "--env-halves", "on", "--eval-episodes", "0")  # fmt: skip
        assert completed.returncode == 0, describe(completed)
        assert pools == expected_pools
        said = [line for line in completed.stdout.splitlines() if "halves" in line]
        assert len(said) == (num_envs % 2), said
        for line in said:
            assert re.fullmatch(
                rf"\S+: {num_envs} envs( a process)? do not split in two halves: they step as one pool", line
            )
