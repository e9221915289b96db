"""Rules every script keeps, checked script by script: every numeric flag has a domain, and a value outside it is
refused before the first step; a resume keeps the budget its schedule is computed from, logs are counted in
iterations (not env steps), a twin's sps clock starts after its CUDA graphs are recorded with a burn-in of 5
iterations, the small-network twins' compiled functions keep the guards on values (twin_utils.value_guards), and a
signal after the last step is told truthfully.

The resumed checkpoints are the old ones of tests/old_checkpoints (see test_old_checkpoints.py), given the budget a
checkpoint now records: a refusal happens before anything is built, so each case costs an import and the flags.
"""

import gzip
import json
import os
import signal
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import run_utils
import torch
import twin_utils
from checks import check_bad_input_in_process
from helpers import (
    REPO_ROOT,
    SCRIPTS_DIR,
    describe,
    load_checkpoint,
    load_script,
    read_results,
    requires_cuda,
    run_in_process,
    run_script_in_process,
    script_path,
)

OLD = Path(__file__).parent / "old_checkpoints"
SCHEDULED = {  # the scripts whose schedule is computed from --total-timesteps, and what it is
    "dqn": "epsilon decay",
    "ppo_continuous_action": "learning-rate anneal",
    "ppo_atari_envpool": "learning-rate anneal",
    "ppo_atari_envpool_distributed": "learning-rate anneal",
    "pqn": "learning-rate anneal and the epsilon decay",
    "pqn_atari_envpool": "learning-rate anneal and the epsilon decay",
}
SCRIPTS = [plain + twin for plain in SCHEDULED for twin in ("", "_torchcompile")]


ALL_SCRIPTS = sorted(path.stem for path in SCRIPTS_DIR.glob("*.py") if not path.stem.endswith("_utils"))


def outside(domain, kind):
    """Values just outside a domain, one beyond each bound it has: the bound itself where it is open, else a step
    past it (1 for an int flag, 0.5 for a float one)."""

    low, high, low_closed, high_closed = run_utils.domain_bounds(domain)
    step = 1 if kind is int else 0.5
    values = [kind(low - step if low_closed else low)]
    if high != float("inf"):
        values.append(kind(high + step if high_closed else high))
    assert not any(run_utils.in_domain(value, domain) for value in values), (domain, values)
    return values


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_every_numeric_flag_has_a_domain_and_values_outside_are_refused(name, tmp_path, capsys):
    """A numeric Args field with no domain fails here; each value outside a domain gets exit status 2 and one line
    naming the flag, the value and the domain, before anything is made or written (a run that trained instead would
    stop after one rollout at most: --total-timesteps 1)."""

    module = load_script(name)
    domains = {**run_utils.RUN_DOMAINS, **module.DOMAINS}
    # Each field's types: int, float | None, ... (bool is a type of its own here: `int in (bool,)` is false).
    kinds = {field: typing.get_args(hint) or (hint,) for field, hint in typing.get_type_hints(module.Args).items()}
    numeric = {field: next(kind for kind in (int, float) if kind in kinds[field])
               for field in kinds if {int, float} & set(kinds[field])}  # fmt: skip
    missing, extra = set(numeric) - set(domains), set(domains) - set(numeric)
    assert not missing and not extra, f"without a domain: {missing}; not a numeric flag: {extra}"
    for field, kind in numeric.items():
        for value in outside(domains[field], kind):
            flag = f"--{field.replace('_', '-')}"
            check_bad_input_in_process(name, ("--total-timesteps", 1, flag, value, "--save-model", "--model-path",
                                              tmp_path / "agent.pt"), [flag, domains[field], f"got {value}"],
                                       tmp_path, capsys)  # fmt: skip
            assert not (tmp_path / "agent.pt").exists()


def old_checkpoint(plain, tmp_path, **entries):
    """The old checkpoint of a pair in tmp_path, with these entries changed, and the flags of its run."""
    meta = json.loads((OLD / f"{plain}.json").read_text())
    with gzip.open(OLD / f"{plain}.pt.gz", "rb") as packed:
        checkpoint = torch.load(packed, map_location="cpu", weights_only=True)
    path = tmp_path / "old.pt"
    torch.save({**checkpoint, **entries}, path)
    return path, meta


@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_with_another_budget_is_refused_where_a_schedule_uses_it(name, tmp_path, capsys):
    plain = name.removesuffix("_torchcompile")
    path, meta = old_checkpoint(plain, tmp_path, total_timesteps=1000)
    flags = (*meta["flags"], "--resume", path, "--save-model", "--eval-episodes", "0")
    check_bad_input_in_process(
        name, (*flags, "--total-timesteps", "2000"), ["--total-timesteps 1000", SCHEDULED[plain]], tmp_path, capsys
    )


def test_a_checkpoint_records_its_budget_and_sac_extends_a_run(tmp_path, capsys):
    """A budget is saved with the agent; SAC has no schedule, so a resume may go past it (TD3 alike, no schedule)."""
    path, meta = old_checkpoint("sac_continuous_action", tmp_path, total_timesteps=400)
    more = meta["global_step"] + 100
    run_in_process("sac_continuous_action", *meta["flags"], "--resume", path, "--save-model", "--total-timesteps",
                   more, "--eval-episodes", "0")  # fmt: skip
    assert "total-timesteps" not in capsys.readouterr().err
    extended = load_checkpoint(path)
    assert (extended["global_step"], extended["total_timesteps"]) == (more, more)


@pytest.mark.parametrize("name", ["sac_continuous_action", "td3_continuous_action_torchcompile"])
def test_many_envs_log_once_every_log_every_iterations(name, monkeypatch):
    """16 envs, 250 iterations: logs at iterations 100 and 200 (counting env steps, 16 of every 100 would log)."""

    logged = []
    real_log = run_utils.Run.log
    monkeypatch.setattr(
        run_utils.Run, "log", lambda run, step, *rest: logged.append(step) or real_log(run, step, *rest)
    )
    run_in_process(name, "--env-id", "Pendulum-v1", "--num-envs", "16", "--total-timesteps", 16 * 250,
                   "--learning-starts", "32", "--batch-size", "16")  # fmt: skip
    assert logged == [16 * 100, 16 * 200]


# Each twin with flags that record all its graphs within a few iterations, then measure a few more. The burn-in is the
# one docs/running.md gives a --cudagraphs measurement (10 iterations): the twins' CudaGraphModule(warmup=5) records a
# graph at the 5th call of its function, each is called at least once an iteration (DQN: once a gradient step, its
# burn-in's unit) but TD3's and SAC's actor updates, every 2nd: recorded by the 10th.
CUDA_GRAPHS_BURN_IN = ("--cudagraphs", "--measure-burnin", "10")
TWINS_ON_CUDA = {
    "sac_continuous_action_torchcompile": ("--env-id", "Pendulum-v1", "--total-timesteps", "150", "--learning-starts",
                                           "100", "--batch-size", "32"),
    "td3_continuous_action_torchcompile": ("--env-id", "Pendulum-v1", "--total-timesteps", "150", "--learning-starts",
                                           "100", "--batch-size", "32"),
    "dqn_torchcompile": ("--total-timesteps", "400", "--learning-starts", "200", "--batch-size", "32"),
    "ppo_continuous_action_torchcompile": ("--env-id", "InvertedPendulum-v5", "--num-envs", "2", "--num-steps", "16",
                                           "--num-minibatches", "2", "--total-timesteps", "448"),
    "ppo_atari_envpool_torchcompile": ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
                                       "--total-timesteps", "448"),
    "pqn_atari_envpool_torchcompile": ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
                                       "--total-timesteps", "448"),
}  # fmt: skip


@requires_cuda
@pytest.mark.parametrize("name", TWINS_ON_CUDA)
def test_the_sps_clock_starts_after_every_cuda_graph_is_recorded_with_their_burn_in(name, monkeypatch):
    from tensordict.nn import CudaGraphModule

    recorded_when_measured = []
    real_clock = run_utils.Run.clock

    def clock(run, *args, **kwargs):
        started = run.measure_start
        real_clock(run, *args, **kwargs)
        if started is None and run.measure_start is not None:  # this call started the sps clock
            script_globals = sys._getframe(1).f_globals
            graphs = [graph for value in script_globals.values() if isinstance(value, SimpleNamespace)
                      for graph in vars(value).values() if isinstance(graph, CudaGraphModule)]  # fmt: skip
            recorded_when_measured.append((len(graphs), all(graph.counter >= graph._warmup for graph in graphs)))

    monkeypatch.setattr(run_utils.Run, "clock", clock)
    run_globals = run_in_process(name, *TWINS_ON_CUDA[name], *CUDA_GRAPHS_BURN_IN, cuda=True)
    assert run_globals["run"].sps is not None, "the run ended before its sps was measured: give it more steps"
    ((graph_count, all_recorded),) = recorded_when_measured
    assert graph_count >= 2 and all_recorded, recorded_when_measured


CPU = torch.device("cpu")
ONES = np.ones(2, dtype=np.float32)
SMALL_NETWORK_TWINS = {  # the twins whose compiled functions skip the guards on structure, and a small build of each
    "sac_continuous_action_torchcompile": lambda module, args: module.build_sac(3, 2, -ONES, ONES, args, CPU),
    "td3_continuous_action_torchcompile": lambda module, args: module.build_td3(3, 2, -ONES, ONES, args, CPU),
    "ppo_continuous_action_torchcompile": lambda module, args: module.build_ppo(3, 2, args, CPU),
    "dqn_torchcompile": lambda module, args: module.build_dqn(3, 2, args, CPU),
}


@pytest.mark.parametrize("name", SMALL_NETWORK_TWINS)
def test_every_compiled_function_of_a_small_network_twin_gets_the_value_guard_filter(name, monkeypatch):
    """torch.compile pops guard_filter_fn from the options it is given: with one dict shared by the calls, every call
    but the first kept every guard. Each must get the filter (compiling is lazy: nothing is compiled here)."""
    module = load_script(name)
    compile_ = torch.compile
    options_given = []

    def recording_compile(fn, *args, options=None, **kwargs):
        options_given.append(dict(options or {}))
        return compile_(fn, *args, options=options, **kwargs)

    monkeypatch.setattr(torch, "compile", recording_compile)
    SMALL_NETWORK_TWINS[name](module, module.Args(compile=True))
    assert len(options_given) >= 2, options_given
    filters = [options.get("guard_filter_fn") for options in options_given]
    assert all(f is twin_utils.value_guards for f in filters), options_given


# --- A signal after the last step ---------------------------------------------------------------------------------
# The end of a run is run_utils' (Run.finish), the same for every script: one script's tiny run checks each moment, the
# signal sent from inside the run at that moment by a patched function, so no test races the run.
END_FLAGS = ("--total-timesteps", "300", "--learning-starts", "200", "--batch-size", "32", "--train-frequency", "2",
             "--save-model", "--eval-episodes", "3")  # fmt: skip


def signal_self(signum):
    os.kill(os.getpid(), signum)  # its handler runs before the next line of Python in this thread


def at_the_last_step(run_utils, monkeypatch, signum):
    real_clock = run_utils.Run.clock

    def clock(run, iteration, **kwargs):  # at the top of the last iteration (DQN's, of one step)
        real_clock(run, iteration, **kwargs)
        if kwargs["global_step"] + 1 >= run.total_steps:
            signal_self(signum)

    monkeypatch.setattr(run_utils.Run, "clock", clock)


def in_the_final_save(run_utils, monkeypatch, signum):
    real_save = run_utils.Run.save_checkpoint

    def save_checkpoint(run, **agent):
        signal_self(signum)
        real_save(run, **agent)

    monkeypatch.setattr(run_utils.Run, "save_checkpoint", save_checkpoint)


def in_the_evaluation(run_utils, monkeypatch, signum):
    real_evaluate = run_utils.evaluate

    def evaluate(env, act, *args):
        actions = []

        def act_then_signal(obs):  # the signal comes with the evaluation's second action
            actions.append(act(obs))
            if len(actions) == 2:
                signal_self(signum)
            return actions[-1]

        return real_evaluate(env, act_then_signal, *args)

    monkeypatch.setattr(run_utils, "evaluate", evaluate)


@pytest.mark.parametrize(
    ("moment", "signum"),
    [(at_the_last_step, signal.SIGINT), (in_the_final_save, signal.SIGTERM), (in_the_evaluation, signal.SIGTERM)],
    ids=["last-step", "final-save", "evaluation"],
)
def test_a_signal_after_the_training_cuts_the_evaluation_and_says_so(moment, signum, tmp_path, monkeypatch):
    """The training is whole and its checkpoint written whole; the evaluation is cut (not started, or stopped): the
    results line says "cut": "evaluation", the summary says it, and the exit status is 128 + the signal."""

    model, results = tmp_path / "agent.pt", tmp_path / "results.jsonl"
    moment(run_utils, monkeypatch, signum)
    completed = run_script_in_process("dqn", *END_FLAGS, "--model-path", model, "--results-path", results)
    assert completed.returncode == 128 + signum, describe(completed)
    assert "Traceback" not in completed.stderr, describe(completed)
    (result,) = read_results(results)
    assert (result["steps_done"], result["interrupted"], result["cut"]) == (300, True, "evaluation"), result
    assert result["eval_return"] is None, result
    assert load_checkpoint(model)["global_step"] == 300
    summary = completed.stdout.strip().splitlines()[-1]
    assert summary.startswith("dqn.py: 300 steps") and "interrupted" not in summary, summary
    assert summary.endswith(f"evaluation cut by {signal.Signals(signum).name} (--resume the checkpoint to evaluate it)")


def test_a_signal_after_the_results_line_cuts_nothing_and_says_so(tmp_path, monkeypatch):
    """Everything written, evaluation included: the run exits 0, its results line says nothing was cut, and one line
    on stderr says the signal came too late to cut anything."""

    def print_then_signal(*args, **kwargs):  # the signal comes with the summary, after the results line
        print(*args, **kwargs)
        if "file" not in kwargs:
            signal_self(signal.SIGTERM)

    monkeypatch.setattr(run_utils, "print", print_then_signal, raising=False)
    results = tmp_path / "results.jsonl"
    completed = run_script_in_process("dqn", *END_FLAGS, "--model-path", tmp_path / "agent.pt", "--results-path",
                                      results)  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    (result,) = read_results(results)
    assert (result["interrupted"], result["cut"]) == (False, None) and result["eval_return"] > 0, result
    assert completed.stderr.strip().splitlines()[-1] == "dqn.py: SIGTERM received as the run ended: nothing was cut"


def test_a_signal_as_the_process_exits_leaves_its_exit_status_0(tmp_path):
    """A signal after the run's last line of Python (at the interpreter's exit, from an atexit function) is ignored:
    the process is not killed by it, so its exit status agrees with its results line (nothing cut)."""
    results = tmp_path / "results.jsonl"
    code = ("import atexit, os, runpy, signal, sys; atexit.register(os.kill, os.getpid(), signal.SIGTERM); "
            "sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(sys.argv[0])); "
            "runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
    command = [sys.executable, "-c", code, str(script_path("dqn")), *END_FLAGS, "--eval-episodes", "0",
               "--model-path", str(tmp_path / "agent.pt"), "--results-path", str(results)]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                               capture_output=True, text=True, timeout=600)  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    (result,) = read_results(results)
    assert (result["interrupted"], result["cut"]) == (False, None), result
