"""SAC and TD3 on several envs at once (--num-envs) and with several gradient steps an iteration (--gradient-steps).

One env (the default) is the run it was before these flags, bit for bit: tests/num_envs_1_reference.json holds
the fingerprint (a SHA-256 of every tensor, the step, the returns) of the checkpoint each script wrote for the same
tiny run at commit 1af5c19, before --num-envs. It was written with

    git worktree add /tmp/base 1af5c19 && python tests/test_num_envs.py /tmp/base/leanrl

With several envs: the runs count env steps, the replay buffer takes an iteration's transitions as rows (the plain
and the twin buffer alike, wrapping around), a vector run resumes, refuses a checkpoint of another --num-envs or
--gradient-steps, and stops on a signal with a checkpoint to resume from. (The twins' learning tests, in test_sac.py
and test_td3.py, run on 4 envs.)
"""

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    assert_same_state,
    check_bad_input_in_process,
    check_resume_continues_the_run,
    check_signal_stops_the_run,
    load_checkpoint,
    load_script,
    one_torch_thread,
    read_results,
    run_in_process,
)

REFERENCE = Path(__file__).parent / "num_envs_1_reference.json"
PLAINS = ("sac_continuous_action", "td3_continuous_action")
# Each script of the pairs, the twins also compiled: (script, flags).
VARIANTS = {
    f"{plain}{twin}{' --compile' if compiled else ''}": (plain + twin, ("--compile",) if compiled else ())
    for plain in PLAINS
    for twin, compiled in (("", False), ("_torchcompile", False), ("_torchcompile", True))
}
# 600 steps, learning from step 200, in a 500-transition buffer: the buffer wraps around and the updates run.
TINY = ("--env-id", "Pendulum-v1", "--seed", "1", "--total-timesteps", "600", "--learning-starts", "200",
        "--buffer-size", "500", "--batch-size", "32", "--eval-episodes", "1")  # fmt: skip


def fingerprint(checkpoint):
    """{entry path: SHA-256 of its bytes (tensors) or its repr}, for every entry of a checkpoint but its
    hyper-parameters (the flags it was made with, which gained num_envs and gradient_steps)."""
    prints = {}

    def walk(value, where):
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}/{key}")
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")
        elif isinstance(value, torch.Tensor | np.ndarray):
            array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
            prints[where] = f"{array.dtype} {list(array.shape)} {hashlib.sha256(array.tobytes()).hexdigest()}"
        else:
            prints[where] = repr(value)

    walk({key: value for key, value in checkpoint.items() if key != "hyperparameters"}, "")
    return prints


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_env_is_the_run_before_num_envs_bit_for_bit(variant, tmp_path):
    name, flags = VARIANTS[variant]
    reference = json.loads(REFERENCE.read_text())[variant]
    results = tmp_path / "results.jsonl"
    with one_torch_thread():  # as the reference was written
        run = run_in_process(name, *TINY, *flags, "--save-model", "--model-path", tmp_path / "agent.pt",
                             "--results-path", results)  # fmt: skip
    assert run["episode_returns"] == reference["episode_returns"]
    assert read_results(results)[0]["eval_return"] == reference["eval_return"]
    prints = fingerprint(load_checkpoint(tmp_path / "agent.pt"))
    assert prints.keys() == reference["fingerprint"].keys()
    changed = [where for where in prints if prints[where] != reference["fingerprint"][where]]
    assert not changed, f"entries that differ from the run before --num-envs: {changed}"


# --- Several envs -------------------------------------------------------------------------------------------------

SCRIPTS = [plain + twin for plain in PLAINS for twin in ("", "_torchcompile")]
VECTOR = ("--env-id", "Pendulum-v1", "--num-envs", "4", "--learning-starts", "200", "--batch-size", "32")


@pytest.mark.parametrize("name", SCRIPTS)
def test_steps_are_env_steps_of_every_env(name, tmp_path):
    """4 Pendulum envs for 1602 steps: 401 iterations, 1604 env steps (the budget rounded up to whole iterations);
    each env ends 2 episodes of 200 steps."""
    results = tmp_path / "results.jsonl"
    run = run_in_process(name, *VECTOR, "--total-timesteps", "1602", "--gradient-steps", "2", "--save-model",
                         "--model-path", tmp_path / "agent.pt", "--eval-episodes", "0",
                         "--results-path", results)  # fmt: skip
    assert read_results(results)[0]["steps_done"] == 1604
    assert len(run["episode_returns"]) == 8
    checkpoint = load_checkpoint(tmp_path / "agent.pt")
    assert checkpoint["global_step"] == 1604 and checkpoint["hyperparameters"]["num_envs"] == 4
    buffer = checkpoint["replay_buffer"]
    assert len(buffer["rewards"]) == 1604 and buffer["pos"] == 1604
    # Each iteration's 4 transitions are 4 rows: the rows of one env are every 4th, each one's next_obs the
    # next one's obs but at an episode's end, where the env was reset.
    obs, next_obs = buffer["observations"], buffer["next_observations"]
    follows = torch.isclose(next_obs[:-4], obs[4:]).all(1).reshape(-1, 4)
    assert follows.sum() == 1600 - 8 and not follows[[199, 399]].any()


@pytest.mark.parametrize("plain", PLAINS)
def test_plain_and_twin_replay_buffers_take_the_same_rows(plain):
    """The same iterations of 3 transitions into a 10-row buffer of each script of a pair: the same rows, wrapping
    around its end, and the same checkpoint entry."""
    buffers = [
        load_script(plain).ReplayBuffer(10, 3, 2),
        load_script(plain + "_torchcompile").ReplayBuffer(10, 3, 2, "cpu"),
    ]
    rng = np.random.default_rng(0)
    for _ in range(5):  # 15 rows: the last two iterations wrap around
        obs, next_obs, actions = rng.normal(size=(3, 3)), rng.normal(size=(3, 3)), rng.normal(size=(3, 2))
        rewards, terminations = rng.normal(size=3), rng.random(3) < 0.5
        for buffer in buffers:
            buffer.add(obs, next_obs, actions, rewards, terminations)
    plain_state, twin_state = (buffer.state_dict() for buffer in buffers)
    assert plain_state["pos"] == 5 and plain_state["full"]
    assert_same_state(twin_state, plain_state, "replay buffer")
    # The last iteration's rows, 2..4 after wrapping: its rewards.
    assert torch.equal(plain_state["rewards"][2:5], torch.as_tensor(rewards, dtype=torch.float32))


@pytest.mark.parametrize("name", SCRIPTS)
def test_vector_run_resumes_and_refuses_another_num_envs(name, tmp_path, saved_checkpoints, capsys):
    flags = (*VECTOR, "--seed", "1", "--gradient-steps", "2")
    check_resume_continues_the_run(name, flags, tmp_path, saved_checkpoints, steps=400, same_as_shorter_run=True)
    capsys.readouterr()  # what those runs printed
    for flag, value in (("--num-envs", "2"), ("--gradient-steps", "1")):
        changed = (*flags, "--total-timesteps", "800", "--resume", tmp_path / "mid.pt", flag, value)
        check_bad_input_in_process(name, changed, [flag, "hyper-parameters"], tmp_path, capsys)


@pytest.mark.parametrize("name", ["sac_continuous_action", "td3_continuous_action_torchcompile"])
def test_vector_run_stops_on_a_signal_with_a_checkpoint(name, tmp_path):
    check_signal_stops_the_run(name, VECTOR, signal.SIGTERM, tmp_path)


# --- Writing the reference (from a checkout before --num-envs) ---------------------------------------------------

RUN = """import json, runpy, sys, torch
torch.set_num_threads(1)
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])
print(json.dumps(runpy.run_path(sys.argv[0], run_name="__main__")["run"].episode_returns))"""

if __name__ == "__main__":
    leanrl, tmp = Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/num_envs_reference")
    tmp.mkdir(parents=True, exist_ok=True)
    reference = {}
    for variant, (name, flags) in VARIANTS.items():
        model, results = tmp / f"{variant}.pt", tmp / f"{variant}.jsonl"
        results.unlink(missing_ok=True)
        argv = [leanrl / f"{name}.py", *TINY, *flags, "--no-cuda", "--save-model", "--model-path", model,
                "--results-path", results]  # fmt: skip
        printed = subprocess.run([sys.executable, "-c", RUN, *map(str, argv)], capture_output=True, text=True,
                                 check=True).stdout  # fmt: skip
        reference[variant] = {
            "episode_returns": json.loads(printed.splitlines()[-1]),
            "eval_return": read_results(results)[0]["eval_return"],
            "fingerprint": fingerprint(load_checkpoint(model)),
        }
        print(variant, reference[variant]["episode_returns"])
    REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")
