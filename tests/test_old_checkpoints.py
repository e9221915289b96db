"""Checkpoints written before the run mechanics moved into leanrl/run_utils.py still resume and evaluate.

tests/old_checkpoints/<plain script>.pt.gz was written by that plain script at commit 21693df (tiny buffers; where
the file was over 1 MB, the agent's tensors but the actor's were zeroed to keep it small, which keeps its format).
Its .json gives the flags of that run, its step count, and the eval return both scripts of the pair gave it then
(the old scripts, --resume with nothing left to train, --eval-episodes 2).
"""

import gzip
import json
from pathlib import Path

import pytest
from checks import assert_same_state, check_bad_input_in_process
from helpers import SCRIPTS_DIR, load_checkpoint, load_script, read_results, run_in_process

OLD = Path(__file__).parent / "old_checkpoints"
# Every pair of leanrl/: one without an old checkpoint fails its two tests.
PAIRS = sorted(path.name[: -len("_torchcompile.py")] for path in SCRIPTS_DIR.glob("*_torchcompile.py"))
SCRIPTS = [pytest.param(plain + twin, id=plain + twin) for plain in PAIRS for twin in ("", "_torchcompile")]
MORE_STEPS = {"ppo": 256}  # PPO resumes by whole rollouts (the Atari pairs' 2 x 32 steps, continuous's 64): two or more


@pytest.mark.parametrize("name", SCRIPTS)
def test_old_checkpoint_resumes_and_evaluates(name, tmp_path, capsys):
    plain = name.removesuffix("_torchcompile")
    meta = json.loads((OLD / f"{plain}.json").read_text())
    old = tmp_path / "old.pt"
    old.write_bytes(gzip.decompress((OLD / f"{plain}.pt.gz").read_bytes()))
    results = tmp_path / "results.jsonl"
    common = (*meta["flags"], "--resume", old, "--save-model", "--results-path", results)

    # Nothing left to train: the agent is evaluated as it was saved, and saved back entry for entry.
    same_run = run_in_process(name, *common, "--total-timesteps", meta["global_step"], "--model-path",
                              tmp_path / "same.pt", "--eval-episodes", meta["eval_episodes"])  # fmt: skip
    schedule = same_run["run"].schedule
    (evaluated,) = read_results(results)
    # To 1e-6: the actor's float32 products round otherwise on another CPU (1.6e-9 apart on an AVX-512 Xeon from the
    # AVX2 EPYC that wrote the figure); another agent or another evaluation is far further.
    assert evaluated["eval_return"] == pytest.approx(meta["eval_return"], rel=1e-6), (
        "the old scripts evaluated this checkpoint otherwise"
    )
    assert evaluated["steps_done"] == meta["global_step"]
    saved, old_checkpoint = load_checkpoint(tmp_path / "same.pt"), load_checkpoint(old)
    # Hyper-parameters added since (SAC's and TD3's num_envs and gradient_steps) are saved at their defaults: the
    # settings of the old runs. The old checkpoint resumed without them (above) stands for a run made with them.
    assert saved.pop("total_timesteps") == meta["global_step"], "a checkpoint records its run's budget"
    assert saved.pop("run_seconds") > 0, "and its seconds (an old one's run counted from this sitting)"
    budget = old_checkpoint.pop("total_timesteps", None)  # recorded by checkpoints written since (PQN's)
    defaults = load_script(name).Args()
    added = saved["hyperparameters"].keys() - old_checkpoint["hyperparameters"].keys()
    assert {key: saved["hyperparameters"].pop(key) for key in added} == {key: getattr(defaults, key) for key in added}
    assert_same_state(saved, old_checkpoint)
    if added:  # and another value of one is refused: the old run was made with the default
        flag = sorted(added)[0].replace("_", "-")
        capsys.readouterr()  # what the run above printed
        refused = tmp_path / "refused"  # its own results file, which must stay unwritten
        refused.mkdir()
        flags = (*common, "--total-timesteps", meta["global_step"], f"--{flag}", "2")
        check_bad_input_in_process(name, flags, ["hyper-parameters", flag], refused, capsys)

    # Training goes on from it, unless it records a budget that a schedule is computed from (test_run_rules.py).
    if budget is not None and schedule:
        return
    more = MORE_STEPS["ppo"] if plain.startswith("ppo") else 100
    capsys.readouterr()
    run_in_process(name, *common, "--total-timesteps", meta["global_step"] + more,
                   "--model-path", tmp_path / "more.pt", "--eval-episodes", "1")  # fmt: skip
    # A checkpoint written before checkpoints held their budget: where a schedule is computed from it, one line says so.
    notices = [line for line in capsys.readouterr().err.splitlines() if "--total-timesteps" in line]
    expected = [f"{schedule} is computed from {meta['global_step'] + more}"] if schedule and budget is None else []
    assert len(notices) == len(expected) and all(e in n for e, n in zip(expected, notices, strict=True)), notices
    trained = read_results(results)[-1]
    assert trained["steps_done"] >= meta["global_step"] + more and not trained["interrupted"], trained
    assert isinstance(trained["eval_return"], float)
    more_checkpoint = load_checkpoint(tmp_path / "more.pt")
    assert more_checkpoint["global_step"] == trained["steps_done"]
    assert more_checkpoint["total_timesteps"] == meta["global_step"] + more
