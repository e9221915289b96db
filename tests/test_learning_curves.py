"""benchmarks/learning_curves.py: tiny runs are recorded episode by episode as the scripts report them, stamped with
the env steps, in a world of one process or of two (torchrun), beside a random policy's Atari games; a rerun skips
the recorded seeds; the plot draws the tool's published figures (those the README cites) and the table sets ours
beside them; bad input gets one line and exit status 2.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from helpers import REPO_ROOT, describe, run_in_process

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import learning_curves  # noqa: E402

TOOL = REPO_ROOT / "benchmarks" / "learning_curves.py"
SAC = "sac_continuous_action_torchcompile"
# Two 200-step Pendulum episodes, ending at env steps 200 and 400; 100 training steps.
SAC_FLAGS = ("--env-id", "Pendulum-v1", "--total-timesteps", "400", "--learning-starts", "300", "--batch-size", "32")


def run_tool(*args):
    """The tool in a subprocess from the repository root, on the CPU."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, str(TOOL), *map(str, args)]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def records(folder):
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def steps(record):
    return [episode[0] for episode in record["episodes"]]


def returns(record):
    return [episode[1] for episode in record["episodes"]]


def seconds(record):
    """Each episode's wall-clock seconds; checked on the run's clock: positive, in the order the episodes ended, none
    after the run's end."""
    times = [episode[2] for episode in record["episodes"]]
    assert all(len(episode) == 3 for episode in record["episodes"]), record["episodes"][:3]
    assert times and times[0] > 0 and times == sorted(times) and times[-1] <= record["wall_seconds"], times
    return times


# --- Recording and resuming ---------------------------------------------------------------------------------------


def test_run_records_the_scripts_episodes_and_a_rerun_skips_done_seeds(tmp_path):
    first = run_tool("run", "--script", SAC, "--seeds", 1, "--out", tmp_path, "--", *SAC_FLAGS)
    assert first.returncode == 0, describe(first)
    ((name, record),) = records(tmp_path).items()
    assert name == learning_curves.record_name(SAC, list(SAC_FLAGS), 1)
    assert record["script"] == f"{SAC}.py" and record["algo"] == "sac" and record["env_id"] == "Pendulum-v1"
    assert record["seed"] == 1 and record["flags"] == list(SAC_FLAGS)
    assert record["total_timesteps"] == record["steps"] == 400
    assert record["command"].endswith(f"python leanrl/{SAC}.py {' '.join(SAC_FLAGS)} --seed 1")
    assert record["machine"]["torch"] == torch.__version__ and record["wall_seconds"] > 0
    # The episodes' ends, and their returns: those the script itself reports for this seed.
    assert steps(record) == [200, 400]
    reported = run_in_process(SAC, *SAC_FLAGS, "--seed", 1)["episode_returns"]
    assert returns(record) == reported
    assert len(seconds(record)) == 2

    path = tmp_path / name
    before = (path.stat().st_mtime_ns, path.read_bytes())
    second = run_tool("run", "--script", SAC, "--seeds", 1, 2, "--out", tmp_path, "--", *SAC_FLAGS)
    assert second.returncode == 0, describe(second)
    assert f"seed 1: done before, skipped ({path})" in second.stdout
    assert second.stdout.count("400 steps on Pendulum-v1") == 1, "seed 1 ran again, or seed 2 did not run"
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before
    seed_2 = records(tmp_path)[learning_curves.record_name(SAC, list(SAC_FLAGS), 2)]
    assert seed_2["seed"] == 2 and steps(seed_2) == [200, 400] and len(seconds(seed_2)) == 2
    assert seed_2["episodes"] != record["episodes"]


# sac_continuous_action.py run as it is, but for its first sitting (no --resume), which holds at its checkpoint of step
# 400 until its handler has a Ctrl-C: the test's signal always finds the run there, whatever the machine's speed. It
# holds only while its batch lives: a run in a session of its own outlives a batch that died, and must not hang on.
HELD_SCRIPT = """
import os
import runpy
import sys
import time

sys.path.insert(0, {leanrl!r})
import run_utils

real_save = run_utils.Run.save_checkpoint


def save_then_hold(run, **agent):
    real_save(run, **agent)
    while agent["global_step"] == 400 and "--resume" not in sys.argv and not run.stop_signals and os.getppid() == BATCH:
        time.sleep(0.05)


BATCH = os.getppid()


run_utils.Run.save_checkpoint = save_then_hold
globals().update(runpy.run_path({leanrl!r} + "/sac_continuous_action.py", run_name="__main__"))
"""


def test_an_interrupted_seed_goes_on_from_its_checkpoint(tmp_path):
    """--checkpoint-every: a run stopped by a SIGTERM to the batch alone (`kill PID`; the batch passes it, and a
    Ctrl-C, on to the run in its own session) writes its checkpoint and its episodes so far; the same command resumes
    the seed there, and the record holds the episodes of both sittings, stamped in order, and the step it resumed at.
    The second sitting's clock goes on from the first's: its episodes' seconds come after the time the first sitting
    had run."""
    flags = ("--env-id", "Pendulum-v1", "--total-timesteps", "1200", "--learning-starts", "100", "--batch-size", "32")
    held = tmp_path / "held" / "sac_continuous_action.py"  # the script, held at step 400 of its first sitting
    held.parent.mkdir()
    held.write_text(HELD_SCRIPT.format(leanrl=str(REPO_ROOT / "leanrl")))
    command = [sys.executable, str(TOOL), "run", "--script", str(held), "--seeds", "1",
               "--out", str(tmp_path), "--checkpoint-every", "200", "--", *flags]  # fmt: skip
    name = learning_curves.record_name("sac_continuous_action", list(flags), 1)
    model, partial = learning_curves.partial_paths(tmp_path / name)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, start_new_session=True, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (partial.exists() and len(json.loads(partial.read_text())["episodes"]) >= 2):
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)  # the batch's process only: the run holds until it gets it from there
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:  # a failure above: the batch passes the SIGTERM on and ends with its run
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "interrupted by SIGTERM at step" in output and "interrupted in seed 1" in output, output
    assert not (tmp_path / name).exists() and model.exists(), "an interrupted seed has a checkpoint, no record"
    step = torch.load(model, weights_only=True)["global_step"]
    assert 400 <= step < 1200, step
    saved = json.loads(partial.read_text())  # the first sitting's episodes, with its seconds, and its wall time
    first_sitting = [episode for episode in saved["episodes"] if episode[0] <= step]
    assert len(first_sitting) >= 2 and len(seconds(saved)) == len(saved["episodes"])
    # A copy of that file (without the dot) is a record of the run so far: plot draws it as a run in progress.
    assert (saved["seed"], saved["steps"], saved["total_timesteps"]) == (1, step, 1200), saved
    so_far = tmp_path / "so_far"
    so_far.mkdir()
    (so_far / name).write_text(partial.read_text())
    drawn = run_tool("plot", so_far)
    assert drawn.returncode == 0, describe(drawn)
    assert f"| {step:,} (in progress, of 1,200) | `{held} --env-id Pendulum-v1" in (so_far / "curves.md").read_text()

    second = run_tool(*command[2:])
    assert second.returncode == 0, describe(second)
    assert f"seed 1: resumed at step {step}" in second.stdout
    record = records(tmp_path)[name]
    assert record["resumed_at"] == [step] and record["steps"] == 1200
    # 200-step episodes from step 0, then from the resume on: the episode cut short by the interruption is not one.
    before, after = list(range(200, step + 1, 200)), list(range(step + 200, 1201, 200))
    assert steps(record) == before + after
    times = seconds(record)
    assert record["episodes"][: len(before)] == first_sitting, "the first sitting's episodes, seconds included"
    assert times[len(before)] > saved["wall_seconds"] >= times[len(before) - 1], "the clock started again"
    assert record["wall_seconds"] > saved["wall_seconds"]
    assert not model.exists() and not partial.exists(), "the checkpoint and episodes of a recorded seed are removed"


def test_keep_model_keeps_the_final_agent_beside_the_record_to_evaluate(tmp_path):
    """--keep-model (no checkpoints on the way): the run's final checkpoint is the record's .pt, named by the record,
    with no hidden file left; the script evaluates it as a finished run, training nothing more."""
    result = run_tool("run", "--script", SAC, "--seeds", 1, "--out", tmp_path, "--keep-model", "--", *SAC_FLAGS)
    assert result.returncode == 0, describe(result)
    name = learning_curves.record_name(SAC, list(SAC_FLAGS), 1)
    model = (tmp_path / name).with_suffix(".pt")
    assert records(tmp_path)[name]["model"] == model.name
    assert torch.load(model, weights_only=True)["global_step"] == 400
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([name, model.name]), "a hidden file was left"
    results = tmp_path / "results.jsonl"
    run = run_in_process(SAC, *SAC_FLAGS, "--seed", 1, "--save-model", "--resume", model, "--eval-episodes", 1,
                         "--results-path", results)  # fmt: skip
    assert run["episode_returns"] == [] and json.loads(results.read_text())["eval_return"] is not None


def test_vector_env_episodes_are_stamped_with_the_steps_of_every_env(tmp_path):
    """Continuous PPO, 2 Pendulum envs reset in the step that ends an episode: both episodes end at vector step 200,
    env step 400 (a count per env would say 399 for the first)."""
    flags = ["--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "100", "--total-timesteps", "400"]
    flags += ["--num-minibatches", "2", "--update-epochs", "1"]
    completed = run_tool("run", "--script", "ppo_continuous_action", "--seeds", 3, "--out", tmp_path, "--", *flags)
    assert completed.returncode == 0, describe(completed)
    (record,) = records(tmp_path).values()
    assert record["algo"] == "ppo_continuous" and record["steps"] == 400
    assert steps(record) == [400, 400] and len(seconds(record)) == 2


def test_atari_games_are_recorded_with_their_unclipped_scores(tmp_path):
    """envpool Atari: whole games over all lives, scored in the game's own points (Asterix: multiples of 50)."""
    flags = ["--env-id", "Asterix-v5", "--num-envs", "2", "--num-steps", "128", "--total-timesteps", "1536"]
    flags += ["--num-minibatches", "2", "--update-epochs", "1"]
    completed = run_tool("run", "--script", "ppo_atari_envpool", "--seeds", 1, "--out", tmp_path, "--", *flags)
    assert completed.returncode == 0, describe(completed)
    (record,) = records(tmp_path).values()
    assert record["algo"] == "ppo_atari" and record["steps"] == 1536
    ends = steps(record)
    assert len(ends) >= 3 and ends == sorted(ends) and ends[-1] <= 1536
    assert all(step % 2 == 0 for step in ends), ends
    assert all(ret % 50 == 0 for ret in returns(record)) and max(returns(record)) > 50
    assert len(seconds(record)) == len(ends)


@pytest.mark.parametrize("processes", [1, 2])
def test_run_records_a_world_of_ranks_in_order_and_random_policy_games(processes, tmp_path):
    """--processes 2 runs the script under torchrun: each rank logs its own envs and rank 0 puts their games in the
    order the script reports them (checked against its returns, or no record), each at the global step it ended, a
    multiple of the envs stepped together; the last-20 mean is the script's final return; no rank file is left.
    --random-games: a random policy's games of the same Atari game, scored alike."""
    num_envs, num_steps, total = 8, 128, 4096  # the script's default envs and rollout: 4 iterations
    flags = ["--env-id", "Asterix-v5", "--total-timesteps", str(total), "--update-epochs", "1"]  # 1 epoch: quicker
    script = "ppo_atari_envpool_distributed"
    completed = run_tool("run", "--script", script, "--processes", processes, "--random-games", 2, "--seeds", 1,
                         "--out", tmp_path, "--", *flags)  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    name = learning_curves.record_name(script, flags, 1, processes)
    assert [path.name for path in tmp_path.iterdir()] == [name], "rank files left behind"
    record = records(tmp_path)[name]
    assert record["world_size"] == processes and record["algo"] == "ppo_atari" and record["steps"] == total
    launch = "python" if processes == 1 else "torchrun --standalone --nproc-per-node 2"
    assert f"{launch} leanrl/{script}.py {' '.join(flags)} --seed 1" in record["command"]
    ends = steps(record)
    assert len(ends) >= 3 and all(step % num_envs == 0 and 0 < step <= total for step in ends), ends
    # Each rank's own clock: in order within a rank, not across ranks.
    assert all(len(episode) == 3 and 0 < episode[2] <= record["wall_seconds"] for episode in record["episodes"])
    iterations = [(step - 1) // (num_envs * num_steps) for step in ends]
    assert iterations == sorted(iterations), "games out of the order of the iterations they ended in"
    final = re.search(r"final return ([\d.]+)", completed.stdout).group(1)
    assert f"{np.mean(returns(record)[-20:]):.1f}" == final, completed.stdout[-500:]
    random_returns = record["random_policy_returns"]
    assert len(random_returns) == 2 and all(score % 50 == 0 for score in random_returns), random_returns


# A stand-in for the DQN twin (it bears its name), fast and torch-free: CartPole in a SyncVectorEnv that resets an
# env on the step after its episode ends (gymnasium's default), random actions, then an evaluation env beside it. It
# writes where each training episode ended (its own global step) to --ends-file; --wrong reports a wrong return,
# --stop-at N stops the run at step N as an interrupted run would, without an error; --pause-at N sleeps --pause
# seconds before the step after global step N.
FAKE_SCRIPT = """
import json
import sys
import time
from types import SimpleNamespace

import gymnasium as gym
import numpy as np

flags = sys.argv[1:]
flag = lambda name, default=None: flags[flags.index(name) + 1] if name in flags else default
args = SimpleNamespace(env_id="CartPole-v1", total_timesteps=int(flag("--total-timesteps")))
run = SimpleNamespace(episode_returns=[], device="cpu")
seed = int(flag("--seed"))
envs = gym.vector.SyncVectorEnv(
    [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(args.env_id)) for _ in range(2)]
)
envs.action_space.seed(seed)
envs.reset(seed=seed)
ends, global_step = [], 0
while global_step < int(flag("--stop-at", args.total_timesteps)):
    if global_step == int(flag("--pause-at", -1)):
        time.sleep(float(flag("--pause")))
    global_step += envs.num_envs
    infos = envs.step(envs.action_space.sample())[-1]
    for index in np.flatnonzero(infos.get("_episode", [])):
        run.episode_returns.append(float(infos["episode"]["r"][index]))
        ends.append(global_step)
evaluation = gym.make(args.env_id)
for episode in range(2):
    evaluation.reset(seed=seed + episode)
    while not any(evaluation.step(evaluation.action_space.sample())[2:4]):
        pass
if "--wrong" in flags:
    run.episode_returns[0] += 1.0
with open(flag("--ends-file"), "w") as f:
    json.dump(ends, f)
"""


@pytest.fixture
def fake_script(tmp_path):
    path = tmp_path / "dqn_torchcompile.py"
    path.write_text(FAKE_SCRIPT)
    return path


def test_vector_env_resetting_on_the_next_step_and_an_evaluation_env(fake_script, tmp_path):
    """The stamps are the script's own global steps, reset steps counted; the evaluation env's episodes stay out.
    A batch with another budget in the same folder is told of the records there and makes its own."""
    out, ends_file = tmp_path / "records", tmp_path / "ends.json"
    for budget in (300, 400):
        flags = ["--total-timesteps", budget, "--ends-file", ends_file]
        completed = run_tool("run", "--script", fake_script, "--seeds", 5, "--out", out, "--", *flags)
        assert completed.returncode == 0, describe(completed)
        record = records(out)[learning_curves.record_name("dqn_torchcompile", list(map(str, flags)), 5)]
        ends = json.loads(ends_file.read_text())
        assert len(ends) >= 5 and steps(record) == ends
        assert record["steps"] == budget and record["env_id"] == "CartPole-v1" and record["algo"] == "dqn"
    assert (
        f"also holds records of dqn_torchcompile.py with other flags (--total-timesteps 300 --ends-file {ends_file})"
        in (completed.stdout)
    )
    assert len(records(out)) == 2


def test_episodes_carry_the_wall_clock_seconds_of_the_run(fake_script, tmp_path):
    """Each episode's seconds are the run's wall-clock time when it ended: a pause of the script half-way lies between
    the episodes that ended before it and those after."""
    pause_at, pause = 200, 1.5
    flags = ["--total-timesteps", 400, "--ends-file", tmp_path / "ends.json", "--pause-at", pause_at, "--pause", pause]
    completed = run_tool("run", "--script", fake_script, "--seeds", 1, "--out", tmp_path / "out", "--", *flags)
    assert completed.returncode == 0, describe(completed)
    (record,) = records(tmp_path / "out").values()
    times = seconds(record)
    before = [ended for step, ended in zip(steps(record), times, strict=True) if step <= pause_at]
    after = times[len(before) :]
    assert before and after, steps(record)
    assert after[0] - before[-1] >= pause, (before, after)


@pytest.mark.parametrize(
    "extra, words",
    [(["--wrong"], "episode_returns"), (["--stop-at", "200"], "stopped at env step 200 of 300")],
    ids=["wrong-returns", "stopped-early"],
)
def test_no_record_of_episodes_not_the_scripts_or_of_a_stopped_run(fake_script, tmp_path, extra, words):
    flags = ["--total-timesteps", 300, "--ends-file", tmp_path / "ends.json", *extra]
    completed = run_tool("run", "--script", fake_script, "--seeds", 1, "--out", tmp_path / "out", "--", *flags)
    assert completed.returncode == 1, describe(completed)
    assert words in completed.stderr and "Traceback" not in completed.stderr, describe(completed)
    assert not records(tmp_path / "out") and not list((tmp_path / "out").iterdir()), "a record or a temporary file"


# --- Plot and table -----------------------------------------------------------------------------------------------

# (script, algo, env, budget) of a hand-made folder of records: a panel per algorithm with published figures, and one
# without.
PANELS = [
    ("sac_continuous_action_torchcompile", "sac", "HalfCheetah-v5", 300_000),
    ("td3_continuous_action_torchcompile", "td3", "HalfCheetah-v5", 300_000),
    ("ppo_continuous_action_torchcompile", "ppo_continuous", "HalfCheetah-v5", 1_000_000),
    ("dqn_torchcompile", "dqn", "CartPole-v1", 500_000),
    ("ppo_atari_envpool_torchcompile", "ppo_atari", "Breakout-v5", 2_000_000),
    ("sac_continuous_action", "sac", "Pendulum-v1", 10_000),
]


def write_record(
    folder, script, algo, env_id, budget, seed, flags=("--compile",), script_path=None, timed=True, offset=0, **fields
):
    """A record as `run` wrote it before worlds of processes and random policies; an episode ends every 1000 steps
    with return step / 100 + 10 * seed + offset, at 1800 * seed * step / budget seconds (the run's wall_seconds at its
    end; timed=False: without seconds, as records were written before). script_path: where the script was, as the
    record shows it (default: leanrl/). fields: the newer ones (world_size, random_policy_returns)."""
    flags = [*flags, "--total-timesteps", str(budget)]
    episodes = [[step, step / 100 + 10 * seed + offset] for step in range(1000, budget + 1, 1000)]
    if timed:
        episodes = [[step, ret, 1800.0 * seed * step / budget] for step, ret in episodes]
    machine = dict(cpu="Test CPU", cores=2, gpu=None, torch="2.13.0", torch_threads=1)
    record = dict(script=f"{script}.py", script_path=script_path or f"leanrl/{script}.py", algo=algo, env_id=env_id,
                  seed=seed, flags=flags, command="", omp_num_threads="1", machine=machine, device="cpu",
                  total_timesteps=budget, steps=budget, wall_seconds=1800.0 * seed, episodes=episodes,
                  **fields)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    name = learning_curves.record_name(script, flags, seed, fields.get("world_size", 1))
    (folder / name).write_text(json.dumps(record))


@pytest.fixture
def made_records(tmp_path):
    for script, algo, env_id, budget in PANELS:
        for seed in (1, 2):
            write_record(tmp_path / "twins", script, algo, env_id, budget, seed)
    write_record(tmp_path / "plain", "sac_continuous_action", "sac", "HalfCheetah-v5", 300_000, 1, flags=())
    return tmp_path


def drawn_figures(ax):
    """(step, mean, std, marker) of each published point an axes shows (errorbars)."""
    points = []
    for container in ax.containers:
        line, _, (bars,) = container.lines
        for x, y, ((_, low), (_, high)) in zip(line.get_xdata(), line.get_ydata(), bars.get_segments(), strict=True):
            points.append((x, y, pytest.approx((high - low) / 2), line.get_marker()))
    return points


def test_plot_draws_each_published_figure_on_its_panel(made_records, monkeypatch):
    """Every figure of the tool's table of published returns is drawn on the panel of its algorithm and env family, at
    its step, its mean with one std as error bar, a circle for training episodes and a diamond for an evaluation; none
    on a panel with no figure (SAC on Pendulum). A figure added to the table (here one more for DQN on CartPole) is
    drawn too: the plot draws what the table holds."""
    added = learning_curves.Reference(250_000, 300.0, 25.0, 4, learning_curves.EVALUATION, "CartPole-v0", "test", "")
    dqn = ("dqn", "CartPole")
    monkeypatch.setitem(learning_curves.REFERENCES, dqn, [*learning_curves.REFERENCES[dqn], added])
    panels = learning_curves.read_folders([made_records / "twins", made_records / "plain"])
    fig = learning_curves.figure(panels, window=20)
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    plt.close(fig)
    titles = [f"{algo} on {env_id}" for _, algo, env_id, _ in PANELS]
    assert set(axes) == {*titles, *(f"{title}, against wall-clock time" for title in titles)}
    marker = {learning_curves.TRAINING: "o", learning_curves.EVALUATION: "D"}
    for _, algo, env_id, _ in PANELS:
        published = learning_curves.references(algo, env_id)
        expected = [(ref.step, ref.value, ref.spread, marker[ref.kind]) for ref in published]
        assert sorted(drawn_figures(axes[f"{algo} on {env_id}"])) == sorted(expected), algo
    assert (250_000, 300.0, 25.0, "D") in drawn_figures(axes["dqn on CartPole-v1"])
    assert drawn_figures(axes["sac on Pendulum-v1"]) == [] and not learning_curves.references("sac", "Pendulum-v1")
    assert not any(drawn_figures(axes[f"{title}, against wall-clock time"]) for title in titles), "steps on a time axis"
    # Twin (2 seeds) and plain script (1 seed) on the same axes: the mean of seed 1 and 2's curves, and seed 1's.
    curves = {
        line.get_label(): line for line in axes["sac on HalfCheetah-v5"].get_lines() if "(seed" in line.get_label()
    }
    assert set(curves) == {
        "sac_continuous_action_torchcompile.py --compile --total-timesteps 300000 (seeds 1, 2)",
        "sac_continuous_action.py --total-timesteps 300000 (seed 1)",
    }
    twin = curves["sac_continuous_action_torchcompile.py --compile --total-timesteps 300000 (seeds 1, 2)"]
    x, y = twin.get_xdata(), twin.get_ydata()
    assert x[-1] == 300_000 and y[-1] == pytest.approx(2905 + 15)  # episodes 281k..300k: returns 2810..3000


def window_means(record, count):
    """Each episode's seconds and the mean return of the last `count` episodes by then (fewer at first), one by one."""
    episodes = record["episodes"]
    means = [
        np.mean([ret for _, ret, _ in episodes[max(0, index + 1 - count) : index + 1]])
        for index in range(len(episodes))
    ]
    return [ended for *_, ended in episodes], means


def test_published_figures_are_those_the_readme_cites():
    """The README's learning table cites a published figure per algorithm (source, mean ± std, at the budget or at the
    step it names): each is in the tool's table for that algorithm and env, so the plots and tables the tool makes
    show the figures the README quotes."""
    lines = (REPO_ROOT / "README.md").read_text().split("\n## Learning\n", 1)[1].split("\n## ", 1)[0].splitlines()
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    column = next(index for index, name in enumerate(header) if name.startswith("published"))
    scale = {"k": 1_000, "M": 1_000_000}
    cited = 0
    for row in rows:
        algo = re.search(r"docs/curves/(\w+)\.md", row[-1])[1]
        env_id, count, unit = re.fullmatch(r"(\S+), (\d+)([kM])", row[1]).groups()
        for source, value, spread, at, at_unit in re.findall(
            r"(\w[\w ]*?) (\d+(?:\.\d+)?) ± (\d+(?:\.\d+)?)(?: at (\d+)([kM]))?", row[column]
        ):
            step = int(at) * scale[at_unit] if at else int(count) * scale[unit]
            matches = [
                ref
                for ref in learning_curves.references(algo, env_id)
                if (ref.step, ref.value, ref.spread) == (step, float(value), float(spread))
                and ref.source.startswith(source)
            ]
            assert matches, f"README cites {source} {value} ± {spread} at {step} for {algo}: not in the tool's table"
            cited += 1
    assert cited >= 5, f"{cited} published figures found in the README's learning table"


def test_plot_draws_each_seed_against_wall_clock_time(made_records):
    """Beside each panel, a curve per seed against its minutes, in its run's colour; a record without seconds is
    left out with a legend line saying so; a run of over 2 hours is drawn in hours."""
    old = made_records / "old"
    write_record(old, "sac_continuous_action", "sac", "HalfCheetah-v5", 100_000, 3, flags=(), timed=False)
    write_record(made_records / "long", "td3_continuous_action", "td3", "HalfCheetah-v5", 20_000, 5)  # 9000 s
    folders = [made_records / name for name in ("twins", "plain", "old", "long")]
    fig = learning_curves.figure(learning_curves.read_folders(folders), window=20)
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    plt.close(fig)
    steps_ax, time_ax = axes["sac on HalfCheetah-v5"], axes["sac on HalfCheetah-v5, against wall-clock time"]
    colors = {line.get_label(): line.get_color() for line in steps_ax.get_lines() if "(seed" in line.get_label()}
    twin = "sac_continuous_action_torchcompile.py --compile --total-timesteps 300000 (seeds 1, 2)"
    plain = "sac_continuous_action.py --total-timesteps 300000 (seed 1)"
    drawn = [line for line in time_ax.get_lines() if len(line.get_xdata())]
    assert [line.get_color() for line in drawn] == [colors[twin], colors[twin], colors[plain]]
    assert "minutes" in time_ax.get_xlabel()
    twin_flags = ["--compile", "--total-timesteps", "300000"]
    expected = [
        records(made_records / "twins")[learning_curves.record_name(SAC, twin_flags, 1)],
        records(made_records / "twins")[learning_curves.record_name(SAC, twin_flags, 2)],
        *records(made_records / "plain").values(),
    ]
    for line, record in zip(drawn, expected, strict=True):
        times, means = window_means(record, 20)
        assert line.get_xdata() == pytest.approx(np.array(times) / 60) and line.get_ydata() == pytest.approx(means)
    assert drawn[1].get_xdata()[-1] == pytest.approx(60)  # seed 2's run: 3600 s
    legend = [text.get_text().replace("\n", " ") for text in time_ax.get_legend().get_texts()]
    assert legend == [
        "left out, no wall-clock times recorded: sac_continuous_action.py --total-timesteps 100000 (seed 3)"
    ]
    td3_time = axes["td3 on HalfCheetah-v5, against wall-clock time"]
    assert "hours" in td3_time.get_xlabel()
    assert max(line.get_xdata()[-1] for line in td3_time.get_lines()) == pytest.approx(2.5)


def test_a_run_with_many_flags_does_not_narrow_its_panel(tmp_path):
    """The legend sits below the axes; an unwrapped label of many flags once squeezed the axes to a third of it."""

    def panel_width(folder):
        fig = learning_curves.figure(learning_curves.read_folders([folder]), window=20)
        fig.canvas.draw()  # constrained layout places the axes when drawn
        (ax,) = [ax for ax in fig.axes if ax.get_title() == "td3 on HalfCheetah-v5"]
        width = ax.get_position().width
        plt.close(fig)
        return width

    write_record(tmp_path / "short", "td3_continuous_action", "td3", "HalfCheetah-v5", 50_000, 1)
    many_flags = ("--compile", "--learning-rate", "1e-3", "--batch-size", "100", "--learning-starts", "10000",
                  "--policy-noise", "0.2", "--exploration-noise", "0.1", "--noise-clip", "0.5")  # fmt: skip
    write_record(tmp_path / "long", "td3_continuous_action", "td3", "HalfCheetah-v5", 50_000, 1, flags=many_flags)
    assert panel_width(tmp_path / "long") == pytest.approx(panel_width(tmp_path / "short"), rel=0.05)


def test_a_modified_copy_of_a_script_is_named_by_its_path(tmp_path):
    """A copy of a script changed for an experiment, outside leanrl/, has the script's file name and flags: its curve
    and its rows are named by its path, so they cannot be taken for the script's."""
    write_record(tmp_path / "script", "td3_continuous_action", "td3", "HalfCheetah-v5", 50_000, 1)
    copy = "/tmp/ablation/td3_continuous_action.py"
    write_record(tmp_path / "copy", "td3_continuous_action", "td3", "HalfCheetah-v5", 50_000, 1, script_path=copy)
    panels = learning_curves.read_folders([tmp_path / "script", tmp_path / "copy"])
    fig = learning_curves.figure(panels, window=20)
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines() if "(seed" in line.get_label()}
    plt.close(fig)
    runs = ["td3_continuous_action.py --compile --total-timesteps 50000", f"{copy} --compile --total-timesteps 50000"]
    assert labels == {f"{run} (seed 1)" for run in runs}
    rows = markdown_rows(learning_curves.table(panels, 20, "curves.png", "plot"), "td3 on HalfCheetah-v5")
    assert {row["run"] for row in rows} == {f"`{run}`" for run in runs}


def markdown_rows(text, heading):
    """The rows of the table under `## heading`, as {column: cell}."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n#", 1)[0]  # to the next heading, of any level
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return [dict(zip(header, row, strict=True)) for row in rows]


def test_plot_writes_the_png_and_a_table_of_ours_beside_the_published(made_records):
    out = made_records / "docs" / "curves.png"
    completed = run_tool("plot", made_records / "twins", made_records / "plain", "--out", out)
    assert completed.returncode == 0, describe(completed)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(out).shape
    assert height > 500 and width > 500, (height, width)

    text = out.with_suffix(".md").read_text()
    assert "![return curves](curves.png)" in text
    rows = markdown_rows(text, "sac on HalfCheetah-v5")
    twin = "`sac_continuous_action_torchcompile.py --compile --total-timesteps 300000`"
    by_step = {row["step"]: row for row in rows if row["run"] == twin}
    assert list(by_step) == ["100,000", "200,000", "300,000", "1,000,000"], "a row per published step, none at the end"
    # Episodes 81k..100k, returns 810..1000 + 10 * seed: 915 and 925.
    assert by_step["100,000"] == {
        "step": "100,000", "run": twin, "ours": "920.0 ± 5.0", "per seed": "1: 915.0, 2: 925.0",
        "ours averages": "last 20 episodes", "published": "6515 ± 514 (10 seeds)", "kind": "deterministic evaluation",
        "source": "Tianshou's MuJoCo benchmark, 10 evaluation episodes each, HalfCheetah-v3",
    }  # fmt: skip
    assert by_step["1,000,000"]["ours"] == "not reached (runs end at 300,000)"
    assert by_step["1,000,000"]["published"] == "9634.89 ± 1423.73 (3 seeds)"
    assert by_step["1,000,000"]["kind"] == "training episodes"
    plain = [row for row in rows if row["run"] == "`sac_continuous_action.py --total-timesteps 300000`"]
    assert plain[2]["ours"] == "2915.0" and plain[2]["per seed"] == "1: 2915.0"
    assert "The published figures are on HalfCheetah-v3, HalfCheetah-v4; ours on HalfCheetah-v5." in text
    # CleanRL's figure is the mean of its last 100 training episodes: ours beside it too.
    (dqn,) = markdown_rows(text, "dqn on CartPole-v1")[:1]
    assert dqn["ours averages"] == "last 100 episodes" and dqn["ours"] == "4520.0 ± 5.0"  # 4010..5000 + 10 * seed
    atari = markdown_rows(text, "ppo_atari on Breakout-v5")
    assert [row["step"] for row in atari] == ["10,000,000", "10,000,000", "2,000,000 (end)"]
    assert atari[-1]["ours"] == "19920.0 ± 5.0" and atari[-1]["published"] == "–"
    assert (
        "`OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script sac_continuous_action_torchcompile "
        f"--seeds 1 2 --out {made_records / 'twins'} -- --compile --total-timesteps 300000`: runs of 0.50, 1.00 h"
    ) in text


def reached_at(record, value, count):
    """The first episode at whose end the mean return of the last `count` is `value` or more, looked for one by one."""
    episodes = record["episodes"]
    for index in range(count - 1, len(episodes)):
        if np.mean([episode[1] for episode in episodes[index + 1 - count : index + 1]]) >= value:
            return episodes[index]
    return None


def test_plot_reach_gives_each_seeds_minutes_and_steps_to_a_return(made_records):
    """--reach R: a section per panel, a row per run and seed with the minutes and the env step at which the mean of
    the last --window episodes first reaches R, then their mean over seeds; a record without seconds gives the step
    only; a seed that does not reach R says where its run ends."""
    old = made_records / "old"
    write_record(old, "sac_continuous_action", "sac", "HalfCheetah-v5", 300_000, 2, flags=(), timed=False)
    out = made_records / "reach.png"
    folders = [made_records / name for name in ("twins", "plain", "old")]
    completed = run_tool("plot", *folders, "--out", out, "--reach", 1000)
    assert completed.returncode == 0, describe(completed)
    text = out.with_suffix(".md").read_text()
    rows = markdown_rows(text, "sac on HalfCheetah-v5: when the return reaches 1000")
    twin = "`sac_continuous_action_torchcompile.py --compile --total-timesteps 300000`"
    plain = "`sac_continuous_action.py --total-timesteps 300000`"
    assert [(row["run"], row["seed"]) for row in rows] == [
        (twin, "1"), (twin, "2"), (twin, "mean"), (plain, "1"), (plain, "2"), (plain, "mean")
    ]  # fmt: skip
    twin_records = [record for record in records(made_records / "twins").values() if record["script"] == f"{SAC}.py"]
    plain_records = [*records(made_records / "plain").values(), *records(old).values()]
    for run, run_records in ((twin, twin_records), (plain, plain_records)):
        firsts = [reached_at(record, 1000, 20) for record in run_records]
        by_seed = {row["seed"]: row for row in rows if row["run"] == run}
        for record, first in zip(run_records, firsts, strict=True):
            minutes = f"{first[2] / 60:.1f}" if len(first) == 3 else "–"
            assert by_seed[str(record["seed"])] == {"run": run, "seed": str(record["seed"]), "minutes": minutes,
                                                    "env step": f"{first[0]:,}"}  # fmt: skip
        assert by_seed["mean"]["env step"] == f"{np.mean([first[0] for first in firsts]):,.0f}"
    # Episodes of returns step / 100 + 10 * seed: seed 1's last 20 reach 1000 at step 109,000, 654 s into its 1800.
    assert rows[0]["env step"] == "109,000" and rows[0]["minutes"] == "10.9"
    assert rows[2]["minutes"] == f"{np.mean([reached_at(r, 1000, 20)[2] for r in twin_records]) / 60:.1f}"
    assert rows[4]["minutes"] == "–" and rows[5]["minutes"] == "–", "a record without seconds gives the step only"
    # 10 episodes of Pendulum: never 20 to average.
    pendulum = markdown_rows(text, "sac on Pendulum-v1: when the return reaches 1000")
    assert [row["minutes"] for row in pendulum] == [
        "not reached (run ends at 10,000 steps, 30.0 min)", "not reached (run ends at 10,000 steps, 60.0 min)",
        "0 of 2 seeds reach it",
    ]  # fmt: skip


def test_reach_is_the_first_full_window_at_or_above_the_return():
    """A lucky first episode is not a reached return: the mean is of --window episodes, once that many ended. A seed
    that never reaches it leaves the mean over seeds undone."""
    episodes = [
        [1000, 1000.0, 60.0],
        [2000, 0.0, 120.0],
        [3000, 0.0, 180.0],
        [4000, 900.0, 240.0],
        [5000, 900.0, 300.0],
    ]
    record = {"episodes": episodes, "seed": 1, "steps": 5000, "wall_seconds": 330.0}
    assert learning_curves.first_reach(record, 400, 3) == (5000, 300.0)  # (0 + 900 + 900) / 3
    assert learning_curves.first_reach(record, 700, 3) is None
    assert learning_curves.first_reach(record, 400, 6) is None  # 5 episodes
    untimed = {**record, "episodes": [episode[:2] for episode in episodes]}
    assert learning_curves.first_reach(untimed, 400, 3) == (5000, None)
    worse = {**record, "seed": 2, "episodes": [[step, ret - 500, ended] for step, ret, ended in episodes]}

    def cells(records, value):
        lines = learning_curves.reach_rows({("leanrl/x.py", (), 1): records}, value, 3)
        return [[cell.strip() for cell in line.strip("|").split("|")][1:] for line in lines[2:]]

    assert cells([record, worse], 400) == [
        ["1", "5.0", "5,000"], ["2", "not reached (run ends at 5,000 steps, 5.5 min)", "–"],
        ["mean", "1 of 2 seeds reach it", "–"],
    ]  # fmt: skip
    assert cells([record, {**untimed, "seed": 2}], 400) == [
        ["1", "5.0", "5,000"],
        ["2", "–", "5,000"],
        ["mean", "–", "5,000"],
    ]


def test_plot_compares_worlds_of_one_and_two_with_the_random_policy(tmp_path):
    """Folders of earlier runs drawn together, nothing run (no progress bar): a curve per world size in one panel, the
    random policy's mean score over all their games as a dashed line and in the table, the commands with
    --processes."""
    script = "ppo_atari_envpool_distributed_torchcompile"
    for world_size, random_returns in ((1, [1.0, 2.0]), (2, [3.0, 6.0])):
        write_record(tmp_path / f"world{world_size}", script, "ppo_atari", "Breakout-v5", 50_000, 1,
                     world_size=world_size, random_policy_returns=random_returns)  # fmt: skip
    out = tmp_path / "worlds.png"
    completed = run_tool("plot", tmp_path / "world1", tmp_path / "world2", "--out", out)
    assert completed.returncode == 0, describe(completed)
    assert completed.stdout.strip() == f"learning_curves.py: plot: {out}; table: {out.with_suffix('.md')}"
    assert "it/s" not in completed.stderr, describe(completed)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    fig = learning_curves.figure(learning_curves.read_folders([tmp_path / "world1", tmp_path / "world2"]), window=20)
    (ax,) = [ax for ax in fig.axes if ax.get_title() == "ppo_atari on Breakout-v5"]
    lines = {line.get_label().replace("\n", " "): line for line in ax.get_lines()}  # long labels are wrapped
    plt.close(fig)
    run = f"{script}.py --compile --total-timesteps 50000"
    runs = [run, f"torchrun --standalone --nproc-per-node 2 {run}"]
    assert {label for label in lines if "(seed" in label} == {f"{name} (seed 1)" for name in runs}
    assert list(lines["random policy (4 games)"].get_ydata()) == [3.0, 3.0]
    text = out.with_suffix(".md").read_text()
    assert {row["run"] for row in markdown_rows(text, "ppo_atari on Breakout-v5")} == {f"`{name}`" for name in runs}
    assert "A uniformly random policy scores 3.00 over 4 games." in text
    assert (
        f"`OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script {script} --processes 2 --seeds 1 --out "
        f"{tmp_path / 'world2'} -- --compile --total-timesteps 50000`"
    ) in text


def test_plot_says_whether_bf16_learns_as_fp32_by_the_band_written_down_before(tmp_path):
    """A run with --bf16 beside the same run without: at half the budget and at its end, bf16's mean over seeds
    against the fp32 seeds' range widened by 10% of their mean on each side, and the verdict; a run with no fp32
    twin has no such rows."""
    for algo, offset in (("sac", 200), ("td3", 0)):
        for seed in (1, 2):
            for flags, shift in ((("--compile",), 0), (("--compile", "--bf16"), offset)):
                write_record(tmp_path, f"{algo}_continuous_action_torchcompile", algo, "HalfCheetah-v5", 300_000, seed,
                             flags=flags, offset=shift)  # fmt: skip
    write_record(tmp_path, "dqn_torchcompile", "dqn", "CartPole-v1", 50_000, 1, flags=("--compile", "--bf16"))
    for flags in (("--compile",), ("--compile", "--bf16")):  # a pair whose bf16 run is in progress, at 20k of 50k
        write_record(tmp_path, "pqn_torchcompile", "pqn", "CartPole-v1", 50_000, 1, flags=flags)
    in_progress = tmp_path / learning_curves.record_name("pqn_torchcompile", [*flags, "--total-timesteps", "50000"], 1)
    record = json.loads(in_progress.read_text())
    record.update(steps=20_000, episodes=record["episodes"][:20])
    in_progress.write_text(json.dumps(record))
    panels = learning_curves.read_folders([tmp_path])

    def rows(algo, env_id="HalfCheetah-v5"):
        lines = learning_curves.bf16_rows(panels[(algo, env_id)], window=20)
        return [[row["step"], row["bf16, mean over seeds"], row["fp32 seeds"], row["band"], row["bf16 lies"]]
                for row in markdown_rows("## rows\n" + "\n".join(lines), "rows")]  # fmt: skip

    # The last 20 episodes by step T return T / 100 - 95 + 10 * seed: fp32 1415, 1425 at 150k and 2915, 2925 at 300k,
    # bands 1415 - 142 to 1425 + 142 and 2915 - 292 to 2925 + 292; bf16 has the mean of its seeds, plus its offset.
    assert rows("sac") == [
        ["150,000", "1620.0", "1: 1415.0, 2: 1425.0", "1273.0 to 1567.0", "above the band"],
        ["300,000", "3120.0", "1: 2915.0, 2: 2925.0", "2623.0 to 3217.0", "inside the band"],
        ["verdict", "–", "–", "–", "**not the same learning**"],
    ]
    assert rows("td3") == [
        ["150,000", "1420.0", "1: 1415.0, 2: 1425.0", "1273.0 to 1567.0", "inside the band"],
        ["300,000", "2920.0", "1: 2915.0, 2: 2925.0", "2623.0 to 3217.0", "inside the band"],
        ["verdict", "–", "–", "–", "**the same learning**"],
    ]
    assert learning_curves.bf16_rows(panels[("dqn", "CartPole-v1")], window=20) == []
    assert rows("pqn", "CartPole-v1") == [
        ["25,000", "–", "–", "–", "not reached (runs end at 20,000)"],
        ["50,000", "–", "–", "–", "not reached (runs end at 20,000)"],
        ["verdict", "–", "–", "–", "not decided yet"],
    ]


# --- Bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["fast-bf16", "no-fast-bf16"])
def test_also_bf16_records_each_seed_with_and_without_it_where_bf16_is_fast(fast, fake_script, tmp_path, monkeypatch):
    """In this process (the runs are children): where bf16 is faster than fp32, a seed runs with the flags given and
    then with --bf16 added, both recorded in --out; elsewhere --also-bf16 is refused with one line before any run (its
    --bf16 runs would be fp32 runs)."""
    machine = {**learning_curves.describe_machine(), "fast_bf16": fast}
    monkeypatch.setattr(learning_curves, "describe_machine", lambda: machine)
    out, flags = tmp_path / "out", ["--total-timesteps", "200", "--ends-file", str(tmp_path / "ends.json")]
    argv = ["run", "--script", str(fake_script), "--seeds", "1", "--out", str(out), "--also-bf16", "--", *flags]
    monkeypatch.setattr(sys, "argv", [str(TOOL), *argv])
    if not fast:
        with pytest.raises(SystemExit) as exit_:
            learning_curves.main()
        assert exit_.value.code == 2 and not out.exists()
        return
    learning_curves.main()
    names = {learning_curves.record_name("dqn_torchcompile", variant, 1) for variant in (flags, [*flags, "--bf16"])}
    assert set(records(out)) == names


BAD_INPUT = {
    "unknown-script": (["run", "--script", "nope", "--seeds", "1", "--out", "{tmp}"], "no script 'nope'"),
    "seed-flag": (["run", "--script", SAC, "--seeds", "1", "--out", "{tmp}", "--", "--seed", "3"], "--seeds"),
    "repeated-seed": (["run", "--script", SAC, "--seeds", "1", "1", "--out", "{tmp}"], "distinct"),
    "no-seeds": (["run", "--script", SAC, "--out", "{tmp}"], "--seeds"),
    "out-is-a-file": (["run", "--script", SAC, "--seeds", "1", "--out", "{tmp}/file"], "is a file"),
    "not-a-record": (["run", "--script", SAC, "--seeds", "1", "--out", "{tmp}"], "is not the record of this run"),
    "processes": (["run", "--script", SAC, "--seeds", "1", "--out", "{tmp}", "--processes", "0"], "--processes"),
    "world-kept": (
        ["run", "--script", SAC, "--seeds", "1", "--out", "{tmp}", "--processes", "2", "--keep-model"],
        "world of one",
    ),
    "random-games": (["run", "--script", SAC, "--seeds", "1", "--out", "{tmp}", "--random-games", "-1"], "random"),
    "bf16-twice": (["run", "--script", SAC, "--seeds", "1", "--out", "{tmp}", "--also-bf16", "--", "--bf16"], "--bf16"),
    "plot-no-records": (["plot", "{tmp}/empty"], "no records"),
    "plot-no-folder": (["plot", "{tmp}/missing"], "no folder"),
    "plot-window": (["plot", "{tmp}", "--window", "0"], "--window"),
    "plot-reach": (["plot", "{tmp}", "--reach", "nan"], "--reach"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_exits_2_with_one_line(case, tmp_path, monkeypatch, capsys):
    """In this process (none of these cases starts a run): exit status 2, one line on stderr, nothing written."""
    args, words = BAD_INPUT[case]
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").mkdir()
    if case == "not-a-record":
        (tmp_path / learning_curves.record_name(SAC, [], 1)).write_text("{}")  # where seed 1's record would go
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.setattr(sys, "argv", [str(TOOL), *(arg.format(tmp=tmp_path) for arg in args)])
    with pytest.raises(SystemExit) as exit_:
        learning_curves.main()
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], lines
    assert sorted(tmp_path.rglob("*")) == before, "bad input wrote something"


def test_flags_the_script_refuses_stop_the_batch_with_its_own_line(tmp_path):
    completed = run_tool("run", "--script", SAC, "--seeds", 1, 2, "--out", tmp_path, "--", "--total-timesteps", 0)
    assert completed.returncode == 2, describe(completed)
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "total-timesteps" in lines[0], describe(completed)
    assert "Traceback" not in completed.stdout + completed.stderr
    assert "seed 2" not in completed.stdout and not list(tmp_path.iterdir())
