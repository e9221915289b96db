"""Rules every script keeps, checked script by script: a resume keeps the budget its schedule is computed from,
logs are counted in iterations (not env steps), and a twin's sps clock starts after its CUDA graphs are recorded.

The resumed checkpoints are the old ones of tests/old_checkpoints (see test_old_checkpoints.py), given the budget a
checkpoint now records: a refusal happens before anything is built, so each case costs an import and the flags.
"""

import gzip
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import check_bad_input_in_process, load_checkpoint, requires_cuda, run_in_process

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


def old_checkpoint(plain, tmp_path, **entries):
    """The old checkpoint of a pair in tmp_path, with these entries changed, and the flags of its run."""
    meta = json.loads((OLD / f"{plain}.json").read_text())
    with gzip.open(OLD / f"{plain}.pt.gz", "rb") as packed:
        checkpoint = torch.load(packed, map_location="cpu", weights_only=True)
    path = tmp_path / "old.pt"
    torch.save({**checkpoint, **entries}, path)
    return path, meta


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_resume_with_another_budget_is_refused_where_a_schedule_depends_on_it(name, tmp_path, capsys):
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


def test_an_old_checkpoint_without_a_budget_resumes_with_one_line_saying_so(tmp_path, capsys):
    path, meta = old_checkpoint("dqn", tmp_path)  # written before checkpoints held their budget
    more = meta["global_step"] + 100
    run_in_process("dqn", *meta["flags"], "--resume", path, "--save-model", "--total-timesteps", more,
                   "--eval-episodes", "0")  # fmt: skip
    notices = [line for line in capsys.readouterr().err.splitlines() if "--total-timesteps" in line]
    assert len(notices) == 1 and f"epsilon decay is computed from {more}" in notices[0], notices
    assert load_checkpoint(path)["total_timesteps"] == more


@pytest.mark.parametrize("name", ["sac_continuous_action", "td3_continuous_action_torchcompile"])
def test_many_envs_log_once_every_log_every_iterations(name, monkeypatch):
    """16 envs, 250 iterations: logs at iterations 100 and 200 (counting env steps, 16 of every 100 would log)."""
    import run_utils

    logged = []
    real_log = run_utils.Run.log
    monkeypatch.setattr(
        run_utils.Run, "log", lambda run, step, *rest: logged.append(step) or real_log(run, step, *rest)
    )
    run_in_process(name, "--env-id", "Pendulum-v1", "--num-envs", "16", "--total-timesteps", 16 * 250,
                   "--learning-starts", "32", "--batch-size", "16")  # fmt: skip
    assert logged == [16 * 100, 16 * 200]


# Each twin with flags that record all its graphs within a few iterations, then measure a few more.
TWINS_ON_CUDA = {
    "sac_continuous_action_torchcompile": ("--env-id", "Pendulum-v1", "--total-timesteps", "150", "--learning-starts",
                                           "100", "--batch-size", "32"),
    "td3_continuous_action_torchcompile": ("--env-id", "Pendulum-v1", "--total-timesteps", "150", "--learning-starts",
                                           "100", "--batch-size", "32"),
    "dqn_torchcompile": ("--total-timesteps", "400", "--learning-starts", "200", "--batch-size", "32"),
    "ppo_continuous_action_torchcompile": ("--env-id", "InvertedPendulum-v5", "--num-envs", "2", "--num-steps", "16",
                                           "--num-minibatches", "2", "--total-timesteps", "320"),
    "ppo_atari_envpool_torchcompile": ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
                                       "--total-timesteps", "320"),
}  # fmt: skip


@requires_cuda
@pytest.mark.parametrize("name", TWINS_ON_CUDA)
def test_the_sps_clock_starts_after_every_cuda_graph_is_recorded(name, monkeypatch):
    import run_utils
    from tensordict.nn import CudaGraphModule

    recorded_when_measured = []
    real_clock = run_utils.Run.clock

    def clock(run, *args, **kwargs):
        started = run.measure_start
        real_clock(run, *args, **kwargs)
        if started is None and run.measure_start is not None:  # this call started the sps clock
            script_globals = sys._getframe(1).f_globals
            graphs = [graph for value in script_globals.values() if hasattr(value, "captured")
                      for graph in vars(value).values() if isinstance(graph, CudaGraphModule)]  # fmt: skip
            recorded_when_measured.append((len(graphs), all(graph.counter >= graph._warmup for graph in graphs)))

    monkeypatch.setattr(run_utils.Run, "clock", clock)
    run_globals = run_in_process(name, *TWINS_ON_CUDA[name], "--cudagraphs", cuda=True)
    assert run_globals["run"].sps is not None, "the run ended before its sps was measured: give it more steps"
    ((graph_count, all_recorded),) = recorded_when_measured
    assert graph_count >= 2 and all_recorded, recorded_when_measured
