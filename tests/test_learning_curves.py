"""benchmarks/learning_curves.py: batches of runs (resumed, interrupted, torchrun worlds) record each seed's episodes;
the plot and tables read them; bad input: one line, exit status 2."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from helpers import REPO_ROOT, command_line, describe, run_in_process
from test_speedup_table import markdown_rows

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import learning_curves  # noqa: E402

TOOL = REPO_ROOT / "benchmarks" / "learning_curves.py"
TORCHRUN = "torchrun --standalone --nproc-per-node 2"
DQN = ("--total-timesteps", "600", "--learning-starts", "300", "--batch-size", "32")  # CartPole: a few dozen episodes


def tool(*args, env=None, wait=True):
    """The tool in a subprocess on the CPU: its CompletedProcess, or its Popen in a session of its own (as a shell)."""
    command = [sys.executable, str(TOOL), *map(str, args)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    if wait:
        return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def dead(pid):
    """Whether a process has ended (a zombie: dead, not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        return True


# --- run ----------------------------------------------------------------------------------------------------------


def test_a_batch_records_each_seeds_episodes_as_the_script_reports_them(tmp_path):
    """Each seed's record holds the script's returns at their steps and seconds, --keep-model its agent; a rerun skips
    recorded seeds; flags the script refuses stop the batch with its line."""
    first = tool("run", "--script", "dqn", "--seeds", 1, 2, "--out", tmp_path, "--keep-model", "--", *DQN)
    assert first.returncode == 0, describe(first)
    names = [learning_curves.record_name("dqn", list(DQN), seed) for seed in (1, 2)]
    models = [name.replace(".json", ".pt") for name in names]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(names + models), "a hidden file was left"
    for seed, name, model in zip((1, 2), names, models, strict=True):
        record = json.loads((tmp_path / name).read_text())
        assert record["algo"] == "dqn" and record["env_id"] == "CartPole-v1" and record["flags"] == list(DQN)
        assert record["total_timesteps"] == record["steps"] == 600 and record["machine"]["torch"] == torch.__version__
        assert record["command"].endswith(f"python leanrl/dqn.py {' '.join(DQN)} --seed {seed}")
        assert record["model"] == model and torch.load(tmp_path / model, weights_only=True)["global_step"] == 600
        steps, returns, seconds = map(list, zip(*record["episodes"], strict=True))
        assert returns == run_in_process("dqn", *DQN, "--seed", seed)["episode_returns"]
        assert steps == list(np.cumsum(returns)) and steps[-1] <= 600
        assert seconds == sorted(seconds) and 0 < seconds[-1] <= record["wall_seconds"] + 0.001  # stamped to the ms
    written = {name: (tmp_path / name).read_bytes() for name in names}
    again = tool("run", "--script", "dqn", "--seeds", 1, 2, "--out", tmp_path, "--keep-model", "--", *DQN)
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 2, describe(again)
    assert {name: (tmp_path / name).read_bytes() for name in names} == written
    refused = tool("run", "--script", "dqn", "--seeds", 3, 4, "--out", tmp_path, "--", "--total-timesteps", 0)
    lines = refused.stderr.splitlines()  # the script's own line: the batch stops there, every seed would get it
    assert refused.returncode == 2 and len(lines) == 1 and "total-timesteps" in lines[0], describe(refused)
    assert "seed 4" not in refused.stdout and len(list(tmp_path.iterdir())) == 4


# dqn.py, but after its checkpoint of step $HOLD_AT it writes its pid to $HELD_FILE and holds while its batch lives:
# until a signal reaches it ($HOLD=signal) or for good ($HOLD=kill).
HELD_SCRIPT = """
import os, runpy, sys, time
sys.path.insert(0, {leanrl!r})
import run_utils
from dqn import Args

def save_then_hold(run, **agent):
    save(run, **agent)
    if agent["global_step"] == int(os.environ.get("HOLD_AT", -1)):
        with open(os.environ["HELD_FILE"], "w") as file:
            file.write(str(os.getpid()))
        while os.getppid() == batch and not (run.stop_signals and os.environ["HOLD"] == "signal"):
            time.sleep(0.05)

if __name__ == "__main__":
    batch, save = os.getppid(), run_utils.Run.save_checkpoint
    run_utils.Run.save_checkpoint = save_then_hold
    runpy.run_path({leanrl!r} + "/dqn.py", run_name="__main__")
"""


def test_an_interrupted_seed_goes_on_from_its_checkpoint_and_a_second_signal_kills(tmp_path):
    """Three sittings: Ctrl-C then SIGTERM kill the run held at step 200 (its checkpoint kept); resumed, a SIGTERM is
    passed on and the run saves step 400 and its record so far; resumed, it ends with every sitting's episodes."""
    script, out, held = tmp_path / "held" / "dqn.py", tmp_path / "out", tmp_path / "held.pid"
    script.parent.mkdir()
    script.write_text(HELD_SCRIPT.format(leanrl=str(REPO_ROOT / "leanrl")))
    args = ("run", "--script", script, "--seeds", 1, "--out", out, "--checkpoint-every", 200, "--", *DQN)
    name = learning_curves.record_name("dqn", list(DQN), 1)
    model, results, so_far = (out / f".{name.removesuffix('.json')}{end}" for end in (".pt", ".results.jsonl", ".json"))

    def sitting(hold_at, hold, *signals):
        """The batch's exit status, output and held run's pid; the signals go to the batch alone once its run holds."""
        batch = tool(*args, env={"HOLD_AT": str(hold_at), "HOLD": hold, "HELD_FILE": str(held)}, wait=False)
        try:
            while signals and not held.exists():
                assert batch.poll() is None, batch.stdout.read()
                time.sleep(0.05)
            for signum in signals:
                batch.send_signal(signum)
            output = batch.communicate(timeout=300)[0]
        finally:
            batch.kill()  # the batch, if the test failed above: its held run then ends on its own
        pid = int(held.read_text()) if signals else None
        held.unlink(missing_ok=True)
        return batch.returncode, output, pid

    status, output, pid = sitting(200, "kill", signal.SIGINT, signal.SIGTERM)
    assert status == 128 + signal.SIGINT and "SIGTERM again: the run is killed" in output, output
    while not dead(pid):  # held on, the run would end when its batch has
        time.sleep(0.05)
    assert not results.exists(), "the run was not killed: it ended and wrote its results line"
    assert torch.load(model, weights_only=True)["global_step"] == 200 and not (out / name).exists()

    status, output, _ = sitting(400, "signal", signal.SIGTERM)
    assert status == 128 + signal.SIGTERM and "resumed at step 200" in output, output
    assert "interrupted by SIGTERM at step 400" in output and "interrupted: the records" in output, output
    assert torch.load(model, weights_only=True)["global_step"] == 400 and not (out / name).exists()
    partial = learning_curves.read_record(so_far)  # a copy without the dot: a run in progress
    assert (partial["steps"], partial["total_timesteps"], partial["resumed_at"]) == (400, 600, [200]), partial
    assert partial["episodes"][-1][0] <= 400

    status, output, _ = sitting(-1, "signal")
    assert status == 0 and "resumed at step 400" in output, output
    assert [path.name for path in out.iterdir()] == [name], "a hidden file was left"
    record = json.loads((out / name).read_text())
    assert record["resumed_at"] == [200, 400] and record["steps"] == 600
    assert record["episodes"][: len(partial["episodes"])] == partial["episodes"]
    steps, _, seconds = zip(*record["episodes"], strict=True)
    assert len(steps) > len(partial["episodes"]) and list(steps) == sorted(set(steps)), steps
    assert list(seconds) == sorted(seconds) and seconds[-1] <= record["wall_seconds"], seconds


def test_a_world_of_processes_is_recorded_with_a_random_policys_games(tmp_path):
    """--processes 2: every rank's games at the global steps (the last 20: the script's final return); --random-games 2:
    a random policy's games of the same Atari game, in its points (Asterix: 50s)."""
    script = "ppo_atari_envpool_distributed"
    flags = ["--env-id", "Asterix-v5", "--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "128"]
    flags += ["--update-epochs", "1", "--num-minibatches", "2"]
    completed = tool("run", "--script", script, "--processes", 2, "--random-games", 2, "--seeds", 1, "--out", tmp_path,
                     "--", *flags, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert completed.returncode == 0, describe(completed)
    (path,) = tmp_path.iterdir()  # and no file of a rank's, or hidden
    record = json.loads(path.read_text())
    assert (record["world_size"], record["algo"], record["steps"]) == (2, "ppo_atari", 2048)
    assert record["command"].endswith(f"{TORCHRUN} leanrl/{script}.py {' '.join(flags)} --seed 1")
    steps, returns, _ = zip(*record["episodes"], strict=True)
    assert steps and all(step % 4 == 0 and step <= 2048 for step in steps), steps
    assert f"final return {np.mean(returns[-20:]):.1f}" in completed.stdout, completed.stdout[-500:]
    random_returns = record["random_policy_returns"]
    assert len(random_returns) == 2 and all(score % 50 == 0 for score in random_returns), random_returns


def test_also_bf16_runs_each_seed_with_and_without_it_where_bf16_is_fast(tmp_path, monkeypatch):
    """The runs faked: where bf16 is faster than fp32, each seed runs with the flags given, then with --bf16 added
    (elsewhere: refused, BAD_INPUT's also-bf16-slow)."""
    runs = []

    def run_seed(script, flags, seed, path, *rest):
        runs.append((seed, flags))
        path.write_text("{}")
        return 0

    monkeypatch.setattr(learning_curves, "describe_machine", lambda: {"fast_bf16": True})
    monkeypatch.setattr(learning_curves, "run_seed", run_seed)
    argv = ["run", "--script", "td3_continuous_action_torchcompile", "--seeds", 1, 2, "--out", tmp_path, "--also-bf16"]
    with command_line(list(map(str, [TOOL, *argv, "--", "--compile"]))):
        learning_curves.main()
    assert runs == [(seed, flags) for seed in (1, 2) for flags in (["--compile"], ["--compile", "--bf16"])]


RUN = ["run", "--script", "dqn", "--seeds", "1", "--out", "{tmp}"]
BAD_INPUT = {
    "unknown-script": (["run", "--script", "nope", "--seeds", "1", "--out", "{tmp}"], "no script 'nope'"),
    "seed-flag": ([*RUN, "--", "--seed", "3"], "--seeds"),
    "repeated-seed": (["run", "--script", "dqn", "--seeds", "1", "1", "--out", "{tmp}"], "distinct"),
    "out-is-a-file": ([*RUN, "--out", "{tmp}/file"], "is a file"),
    "not-a-record": (RUN, "is not the record of this run"),
    "processes": ([*RUN, "--processes", "0"], "--processes"),
    "world-kept": ([*RUN, "--processes", "2", "--keep-model"], "world of one"),
    "bf16-twice": ([*RUN, "--also-bf16", "--", "--bf16"], "--bf16"),
    "also-bf16-slow": ([*RUN, "--also-bf16"], "does not compute bf16 faster than fp32"),
    "plot-no-records": (["plot", "{tmp}/empty"], "no records"),
    "plot-no-folder": (["plot", "{tmp}/missing"], "no folder"),
    "plot-window": (["plot", "{tmp}", "--window", "0"], "--window"),
    "plot-reach": (["plot", "{tmp}", "--reach", "nan"], "--reach"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_exits_2_with_one_line(case, tmp_path, monkeypatch, capsys):
    """In this process, on a machine where bf16 is no faster than fp32: exit status 2, one line, nothing written."""
    monkeypatch.setattr(learning_curves, "describe_machine", lambda: {"fast_bf16": False})
    args, words = BAD_INPUT[case]
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").mkdir()
    if case == "not-a-record":
        (tmp_path / learning_curves.record_name("dqn", [], 1)).write_text("{}")  # where seed 1's record would go
    before = sorted(tmp_path.rglob("*"))
    with command_line([str(TOOL), *(arg.format(tmp=tmp_path) for arg in args)]), pytest.raises(SystemExit) as exit_:
        learning_curves.main()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and words in lines[0], lines
    assert sorted(tmp_path.rglob("*")) == before, "bad input wrote something"


# --- plot -----------------------------------------------------------------------------------------------------------


def write_record(folder, script, algo, env_id, budget, seed, flags=("--compile",), timed=True, offset=0, **fields):
    """A record as the tool writes them: an episode every 1000 steps, return step / 100 + 10 * seed + offset, at
    1800 * seed * step / budget seconds (timed=False: no seconds, as older records); fields: the optional ones."""
    flags = [*flags, "--total-timesteps", str(budget)]
    steps = range(1000, budget + 1, 1000)
    episodes = [[step, step / 100 + 10 * seed + offset, 1800.0 * seed * step / budget] for step in steps]
    record = dict(script=f"{script}.py", script_path=f"leanrl/{script}.py", algo=algo, env_id=env_id, seed=seed,
                  flags=flags, omp_num_threads="1", total_timesteps=budget, steps=budget, wall_seconds=1800.0 * seed,
                  machine=dict(cpu="Test CPU", cores=2, gpu=None, torch="2.13.0", torch_threads=1),
                  episodes=[episode[: 3 if timed else 2] for episode in episodes]) | fields  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    name = learning_curves.record_name(script, flags, seed, fields.get("world_size", 1))
    (folder / name).write_text(json.dumps(record))


SAC = "sac_continuous_action_torchcompile"
TWIN = "`sac_continuous_action_torchcompile.py --compile --total-timesteps 300000`"
PLAIN = "`sac_continuous_action.py --total-timesteps 300000`"


@pytest.fixture
def made_records(tmp_path):
    """Folders as docs/curves/ holds them: SAC's twin (2 seeds, with seconds) and plain script (1 seed, without), a
    modified copy of the plain script, and PPO Atari in worlds of 1 and 2 with random policies' games."""
    for seed in (1, 2):
        write_record(tmp_path / "twin", SAC, "sac", "HalfCheetah-v5", 300_000, seed)
    plain = ("sac_continuous_action", "sac", "HalfCheetah-v5")
    write_record(tmp_path / "plain", *plain, 300_000, 1, flags=(), timed=False)
    write_record(tmp_path / "copy", *plain, 100_000, 3, flags=(), script_path="/tmp/ablation/sac_continuous_action.py")
    for world_size, scores in ((1, [1.0, 2.0]), (2, [3.0, 6.0])):
        write_record(tmp_path / f"world{world_size}", "ppo_atari_envpool_distributed", "ppo_atari", "Breakout-v5",
                     50_000, 1, world_size=world_size, random_policy_returns=scores)  # fmt: skip
    return [tmp_path / name for name in ("twin", "plain", "copy", "world1", "world2")]


def test_the_table_sets_ours_beside_the_published_figures(made_records, tmp_path):
    out = tmp_path / "docs" / "curves.png"
    completed = tool("plot", *made_records, "--out", out, "--reach", 1000)
    assert completed.returncode == 0, describe(completed)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = out.with_suffix(".md").read_text()
    sac = markdown_rows(text, "sac on HalfCheetah-v5")
    twin = {row["step"]: row for row in sac if row["run"] == TWIN}
    assert list(twin) == ["100,000", "200,000", "300,000", "1,000,000"], "a row per published step, none at the end"
    # Episodes 81k..100k, returns 810..1000 + 10 * seed: 915 and 925.
    assert twin["100,000"] == {
        "step": "100,000", "run": TWIN, "ours": "920.0 ± 5.0", "per seed": "1: 915.0, 2: 925.0",
        "ours averages": "last 20 episodes", "published": "6515 ± 514 (10 seeds)", "kind": "deterministic evaluation",
        "source": "Tianshou's MuJoCo benchmark, 10 evaluation episodes each, HalfCheetah-v3",
    }  # fmt: skip
    assert twin["1,000,000"]["ours"] == "not reached (runs end at 300,000)"
    assert twin["1,000,000"]["ours averages"] == "last 100 episodes", "beside CleanRL's last 100, ours alike"
    assert [row["ours"] for row in sac if row["run"] == PLAIN][2] == "2915.0"
    copy = "`/tmp/ablation/sac_continuous_action.py --total-timesteps 100000`"
    assert [row["ours"] for row in sac if row["run"] == copy][0] == "935.0", "a copy is named by its path"
    # --reach 1000: the mean of the last 20 returns first reaches it at step 109,000 (seed 1, 654 s into its 1800) and
    # 108,000 (seed 2, 1296 s); the plain script's record has no seconds; the copy's 100 episodes never reach it.
    heading = "sac on HalfCheetah-v5: when the return reaches 1000"
    reach = {(row["run"], row["seed"]): row for row in markdown_rows(text, heading)}
    assert [reach[TWIN, seed]["env step"] for seed in ("1", "2", "mean")] == ["109,000", "108,000", "108,500"]
    minutes = ["10.9", "21.6", f"{(654 + 1296) / 2 / 60:.1f}"]
    assert [reach[TWIN, seed]["minutes"] for seed in ("1", "2", "mean")] == minutes
    assert (reach[PLAIN, "1"]["minutes"], reach[PLAIN, "1"]["env step"]) == ("–", "109,000")
    assert reach[copy, "3"]["minutes"] == "not reached (run ends at 100,000 steps, 90.0 min)"
    run = "ppo_atari_envpool_distributed.py --compile --total-timesteps 50000"
    atari = [row["run"] for row in markdown_rows(text, "ppo_atari on Breakout-v5") if "(end)" in row["step"]]
    assert atari == [f"`{run}`", f"`{TORCHRUN} {run}`"], "a curve per world size"
    assert "A uniformly random policy scores 3.00 over 4 games." in text
    assert (f"`OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script {SAC} --seeds 1 2 --out "
            f"{made_records[0]} -- --compile --total-timesteps 300000`: runs of 0.50, 1.00 h") in text  # fmt: skip
    assert "--processes 2 --seeds 1 --out" in text


def test_reach_is_the_first_full_window_at_or_above_the_return():
    """A lucky first episode is not a reached return: the mean is of --window episodes, once that many ended."""
    returns = (1000.0, 0.0, 0.0, 900.0, 900.0)
    record = {"episodes": [[1000 * n, ret, 60.0 * n] for n, ret in enumerate(returns, start=1)]}
    assert learning_curves.first_reach(record, 400, 3) == (5000, 300.0)  # (0 + 900 + 900) / 3
    assert learning_curves.first_reach(record, 700, 3) is None and learning_curves.first_reach(record, 400, 6) is None
    assert learning_curves.first_reach({"episodes": [e[:2] for e in record["episodes"]]}, 400, 3) == (5000, None)


def test_the_plot_draws_the_published_figures_and_each_seed_against_time(made_records, tmp_path):
    """Each published figure at its step, ± its std (circle: training episodes, diamond: evaluation); a curve per seed
    against minutes (hours past 2 hours) in its run's colour, a record without seconds left out, said in the legend."""
    write_record(tmp_path / "long", "td3_continuous_action", "td3", "HalfCheetah-v5", 20_000, 5)  # 9000 s
    fig = learning_curves.figure(learning_curves.read_folders([*made_records, tmp_path / "long"]), 20)
    axes = {ax.get_title(): ax for ax in fig.axes}
    plt.close(fig)
    marker = {learning_curves.TRAINING: "o", learning_curves.EVALUATION: "D"}
    for algo, env_id in (("sac", "HalfCheetah-v5"), ("td3", "HalfCheetah-v5"), ("ppo_atari", "Breakout-v5")):
        errorbars = [errorbar.lines for errorbar in axes[f"{algo} on {env_id}"].containers]
        drawn = [(x, y, pytest.approx((y1 - y0) / 2), line.get_marker()) for line, _, (bars,) in errorbars
                 for x, y, ((_, y0), (_, y1)) in zip(*line.get_data(), bars.get_segments(), strict=True)]  # fmt: skip
        published = [(r.step, r.value, r.spread, marker[r.kind]) for r in learning_curves.references(algo, env_id)]
        assert sorted(drawn) == sorted(published) and published, algo
    steps_ax, time_ax = axes["sac on HalfCheetah-v5"], axes["sac on HalfCheetah-v5, against wall-clock time"]
    colors = {line.get_label().split(" (seed")[0]: line.get_color() for line in steps_ax.get_lines()}
    drawn = [line for line in time_ax.get_lines() if len(line.get_xdata())]
    copy = "/tmp/ablation/sac_continuous_action.py --total-timesteps 100000"
    assert [line.get_color() for line in drawn] == [colors[TWIN.strip("`")]] * 2 + [colors[copy]]
    assert "minutes" in time_ax.get_xlabel() and drawn[1].get_xdata()[-1] == pytest.approx(60)  # seed 2: 3600 s
    assert drawn[0].get_ydata()[-1] == pytest.approx(2915)  # the mean of seed 1's last 20 returns
    legend = [text.get_text().replace("\n", " ") for text in time_ax.get_legend().get_texts()]
    assert legend == [f"left out, no wall-clock times recorded: {PLAIN.strip('`')} (seed 1)"]
    assert "hours" in axes["td3 on HalfCheetah-v5, against wall-clock time"].get_xlabel()


def test_the_table_says_whether_bf16_learns_as_fp32_by_the_band_written_down_before(tmp_path):
    """At half the budget and at its end, bf16's mean over seeds against the fp32 seeds' range widened by 10% of their
    mean on each side, and the verdict; not decided while a run is in progress; no rows for a run with no fp32 twin."""
    for algo, offset in (("sac", 200), ("td3", 0)):
        for seed in (1, 2):
            for flags, shift in ((("--compile",), 0), (("--compile", "--bf16"), offset)):
                write_record(tmp_path, f"{algo}_continuous_action_torchcompile", algo, "HalfCheetah-v5", 300_000, seed,
                             flags=flags, offset=shift)  # fmt: skip
    write_record(tmp_path, "dqn_torchcompile", "dqn", "CartPole-v1", 50_000, 1, flags=("--compile", "--bf16"))
    panels = learning_curves.read_folders([tmp_path])

    def rows(algo):
        lines = learning_curves.bf16_rows(panels[(algo, "HalfCheetah-v5")], window=20)
        return [list(row.values())[2:] for row in markdown_rows("## rows\n" + "\n".join(lines), "rows")]

    # The last 20 episodes by step T return T / 100 - 95 + 10 * seed: fp32 1415, 1425 at 150k and 2915, 2925 at 300k.
    assert rows("sac") == [
        ["1620.0", "1: 1415.0, 2: 1425.0", "1273.0 to 1567.0", "above the band"],
        ["3120.0", "1: 2915.0, 2: 2925.0", "2623.0 to 3217.0", "inside the band"],
        ["–", "–", "–", "**not the same learning**"],
    ]
    assert rows("td3")[-1] == ["–", "–", "–", "**the same learning**"]
    assert learning_curves.bf16_rows(panels[("dqn", "CartPole-v1")], window=20) == []
    bf16 = panels[("td3", "HalfCheetah-v5")][("leanrl/td3_continuous_action_torchcompile.py",
                                              ("--compile", "--bf16", "--total-timesteps", "300000"), 1)]  # fmt: skip
    for record in bf16:  # a run in progress, at 100k of 300k
        record.update(steps=100_000, episodes=record["episodes"][:100])
    assert [row[-1] for row in rows("td3")] == ["not reached (runs end at 100,000)"] * 2 + ["not decided yet"]


PUBLISHED = r"(\w[\w ]*?) (\d+(?:\.\d+)?) ± (\d+(?:\.\d+)?)(?: at (\d+)([kM]))?"  # source mean ± std (at step)


def test_published_figures_are_those_the_readme_cites():
    """Each published figure of the README's learning table (source, mean ± std, at its budget or the step it names)
    is one of the tool's references for that algorithm and env."""
    scale, cited = {"k": 1_000, "M": 1_000_000}, 0
    for row in markdown_rows((REPO_ROOT / "README.md").read_text(), "Learning"):
        env_id, count, unit = re.fullmatch(r"(\S+), (\d+)([kM])", row["env, budget"]).groups()
        refs = learning_curves.references(re.search(r"docs/curves/(\w+)\.md", list(row.values())[-1])[1], env_id)
        published = next(cell for column, cell in row.items() if column.startswith("published"))
        for source, value, spread, at, at_unit in re.findall(PUBLISHED, published):
            step = int(at) * scale[at_unit] if at else int(count) * scale[unit]
            known = {(ref.step, ref.value, ref.spread, ref.source[: len(source)]) for ref in refs}
            assert (step, float(value), float(spread), source) in known, (row, source, value, spread, step)
            cited += 1
    assert cited >= 5, f"{cited} published figures found in the README's learning table"
