"""Learning curves: does a script reach the published returns? Runs it over seeds, records every episode's env step
and return, and plots the return against env steps with the published figures for its algorithm and env.

    OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script sac_continuous_action_torchcompile \\
        --seeds 1 2 --out docs/curves/sac -- --compile --total-timesteps 300000
    python benchmarks/learning_curves.py plot docs/curves/sac docs/curves/sac_plain --out docs/curves/sac.png

run: a script of leanrl/ (by name, or the path of a .py file) with the flags after `--`, once per seed, each run in a
child process (`record` below), one after another: a crash or a Ctrl-C loses that run only. A finished run's record
is written to DIR/<script>_<flags>_seed<S>.json under a temporary name, then renamed. Running the same command again
skips the seeds whose record exists and runs the others, so a long batch can be spread over several sittings; records
of the same script with other flags (another budget) are never taken for these (a line says they are there). The
runs inherit the environment: OMP_NUM_THREADS=1 gives each one thread.
With --checkpoint-every N a run also survives its interruption (a Ctrl-C, a SIGTERM, the end of a sitting): the script
saves its checkpoint every N env steps (--save-model --checkpoint-every N, beside the records as a hidden file) and at
an interruption, and the episodes logged so far are saved with it; the same command then resumes the unfinished
seed from its checkpoint (--resume) and its record lists the steps it was resumed at. A resumed run starts a new
episode there, so it is not step for step the run that was not interrupted.
With --keep-model a finished run's last checkpoint, the trained agent, is kept beside its record (same name, .pt; the
record's "model"), to evaluate and watch: the script with the record's flags and seed, `--save-model --resume` that
file (a finished run trains no further) and --eval-episodes N, --capture-video.

record: one run in this process (what `run` starts per seed). The script's `__main__` runs unchanged; the envs it
makes with gymnasium.make (alone or in a SyncVectorEnv) or envpool.make (Atari) are wrapped so that each finished
episode is logged with its return and the env steps done by then, counting every env of a vector env (the x axis of
the curves). The logged returns must be the script's own `episode_returns`, or no record is written: the curve is
the script's report, step-stamped. A record holds the command, machine, torch version, budget, episodes, wall time.

plot: the records of one or more folders, one panel per algorithm and env, one curve per script and flags: the mean
over seeds of the mean return of the last --window training episodes, with a band of one standard deviation over
seeds; the published figures for that algorithm and env are points with their spread. Writes the PNG and, beside
it, a markdown table (same name, .md): ours against each published figure at its step, and the commands.
"""

import argparse
import hashlib
import json
import math
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import matplotlib
import numpy as np
from speedup_table import describe_machine, machine_text  # benchmarks/ is on the path when this file runs

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOOL = "benchmarks/learning_curves.py"
# A script's algorithm, as its results line names it, from its name without _torchcompile; other names stand as is.
ALGOS = {
    "sac_continuous_action": "sac",
    "td3_continuous_action": "td3",
    "ppo_continuous_action": "ppo_continuous",
    "ppo_atari_envpool": "ppo_atari",
    "ppo_atari_envpool_distributed": "ppo_atari",  # in a world of one (a plain launch)
}
RECORD_FIELDS = {"script", "script_path", "algo", "env_id", "seed", "flags", "total_timesteps", "steps", "episodes"}

# --- Published figures ------------------------------------------------------------------------------------------

TRAINING = "training episodes"
EVALUATION = "deterministic evaluation"  # the policy without exploration noise, on episodes apart from training


@dataclass(frozen=True)
class Reference:
    """A published return at one step: the mean over seeds and one standard deviation over seeds."""

    step: int
    value: float
    spread: float
    seeds: int
    kind: str  # TRAINING or EVALUATION
    env_id: str  # the env it was measured on, whose version may differ from ours
    source: str  # short, for the plot's legend
    details: str  # how it was measured, for the table
    last_episodes: int | None = None  # a TRAINING figure's mean over this many last episodes: ours is taken alike


def cleanrl(script, step, value, spread, env_id):
    """A figure of CleanRL's benchmark: 3 seeds, each the mean of its last 100 training episodes."""
    source, details = f"CleanRL {script}", f"CleanRL's benchmark of {script}, mean of the last 100 training episodes"
    return Reference(step, value, spread, 3, TRAINING, env_id, source, details, last_episodes=100)


TD3_PAPER = "TD3 paper", "the TD3 paper's curves (sfujim/TD3 learning_curves), 10 evaluation episodes each"
TIANSHOU = "Tianshou SAC", "Tianshou's MuJoCo benchmark, 10 evaluation episodes each"
# (algorithm, env without its version) -> the figures published for it.
REFERENCES = {
    ("sac", "HalfCheetah"): [
        Reference(100_000, 6515, 514, 10, EVALUATION, "HalfCheetah-v3", *TIANSHOU),
        Reference(200_000, 8208, 928, 10, EVALUATION, "HalfCheetah-v3", *TIANSHOU),
        Reference(300_000, 9059, 1051, 10, EVALUATION, "HalfCheetah-v3", *TIANSHOU),
        cleanrl("sac_continuous_action.py", 1_000_000, 9634.89, 1423.73, "HalfCheetah-v4"),
    ],
    ("td3", "HalfCheetah"): [
        Reference(100_000, 5513, 554, 10, EVALUATION, "HalfCheetah-v1", *TD3_PAPER),
        Reference(200_000, 6833, 683, 10, EVALUATION, "HalfCheetah-v1", *TD3_PAPER),
        Reference(300_000, 7697, 727, 10, EVALUATION, "HalfCheetah-v1", *TD3_PAPER),
        Reference(1_000_000, 9567, 833, 10, EVALUATION, "HalfCheetah-v1", *TD3_PAPER),
        cleanrl("td3_continuous_action.py", 1_000_000, 9583.22, 126.09, "HalfCheetah-v4"),
    ],
    ("ppo_continuous", "HalfCheetah"): [
        cleanrl("ppo_continuous_action.py", 1_000_000, 1442.64, 46.03, "HalfCheetah-v4"),
    ],
    ("dqn", "CartPole"): [cleanrl("dqn.py", 500_000, 488.69, 16.11, "CartPole-v1")],
    ("ppo_atari", "Breakout"): [
        cleanrl("ppo_atari_envpool.py", 10_000_000, 211.24, 151.84, "Breakout-v5"),
        cleanrl("ppo_atari_envpool_xla_jax.py", 10_000_000, 420.92, 16.75, "Breakout-v5"),
    ],
}


def references(algo, env_id):
    """The published figures for an algorithm on an env of this family (any version), by step."""
    return sorted(REFERENCES.get((algo, re.sub(r"-v\d+$", "", env_id)), []), key=lambda reference: reference.step)


# --- Small helpers ------------------------------------------------------------------------------------------------


def fail(message, status=2):
    """One line on stderr and an exit status: 2 for a user's mistake, 1 for a run that went wrong."""
    print(f"learning_curves.py: error: {message}", file=sys.stderr)
    sys.exit(status)


def say(message):
    """Progress and notes, on stdout (stderr is for errors); flushed, as the runs write to the same terminal."""
    print(f"learning_curves.py: {message}", flush=True)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(message)  # one line, not argparse's usage and message


def script_file(name):
    """A script of leanrl/ by name (with or without .py), or the path of a .py file."""
    path = Path(name)
    if not (path.suffix == ".py" and path.is_file()):
        path = ROOT / "leanrl" / f"{name.removesuffix('.py')}.py"
    if not path.is_file():
        fail(f"no script {name!r}: name one of leanrl/ (e.g. sac_continuous_action_torchcompile) or give a .py file")
    return path.resolve()


def shown_path(path):
    """A path as a command of the table shows it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def record_name(script, flags, seed):
    """The file of one run's record: its script, flags and seed, readable; a hash stands in for very long flags."""
    slug = re.sub(r"[^\w.=+-]+", "_", " ".join(flags))
    if len(slug) > 100:
        slug = f"{slug[:80]}_{hashlib.sha1(' '.join(flags).encode()).hexdigest()[:10]}"
    return f"{script}{'_' + slug if slug else ''}_seed{seed}.json"


def read_record(path):
    """A record's contents, or None for a file that is not one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and RECORD_FIELDS <= record.keys() else None


# --- record: one run, its episodes logged -------------------------------------------------------------------------


class EpisodeLog:
    """The finished episodes of one env that steps (a single env, a vector env, an envpool env): (steps, return)."""

    def __init__(self):
        self.steps = 0  # env steps made so far, every env of a vector env counted
        self.episodes = []


class Recording:
    """Every env a run makes, logged apart: the training env is the one whose returns are the script's
    `episode_returns` (an evaluation env, made beside it, keeps its own log and its own step count).
    start_step: the steps done before this process (a resumed run), where the step counts start."""

    def __init__(self, start_step=0):
        self.logs = []
        self.vector_log = None  # while a vector env steps, the log its envs' episodes go to
        self.start_step = start_step

    def new_log(self):
        self.logs.append(EpisodeLog())
        self.logs[-1].steps = self.start_step
        return self.logs[-1]


class EpisodeRecorder(gym.Wrapper):
    """Wraps what gymnasium.make returns (below the script's reward wrappers: the env's own rewards) and logs each
    episode's return when it ends, summed as the scripts sum theirs."""

    def __init__(self, env, recording):
        super().__init__(env)
        self.recording = recording
        self.log = recording.new_log()
        self.episode_return = 0.0

    def reset(self, **kwargs):
        self.episode_return = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        log = self.recording.vector_log
        if log is None:  # stepped alone; a vector env counts its envs' steps itself
            log = self.log
            log.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_return += float(reward)
        if terminated or truncated:
            log.episodes.append((log.steps, self.episode_return))
        return obs, reward, terminated, truncated, info


class GameRecorder:
    """Wraps an envpool Atari env: a game's score is its unclipped rewards over all lives, until the game is over or
    cut by the time limit (the scripts' episode_returns; envpool ends an episode at each lost life)."""

    def __init__(self, envs, recording):
        self.envs = envs
        self.log = recording.new_log()
        self.scores = np.zeros(envs.config["num_envs"])

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, action):
        self.log.steps += len(action)
        obs, reward, terminated, truncated, info = self.envs.step(action)
        self.scores += info["reward"]
        for index in np.flatnonzero(info["terminated"].astype(bool) | truncated):
            self.log.episodes.append((self.log.steps, float(self.scores[index])))
            self.scores[index] = 0.0
        return obs, reward, terminated, truncated, info


def start_recording(script_source, start_step=0):
    """Wraps the env constructors of gymnasium (and of envpool, for a script that imports it), for this process."""
    recording = Recording(start_step)
    real_make, real_vector_step = gym.make, gym.vector.SyncVectorEnv.step

    def vector_step(envs, actions):
        if not hasattr(envs, "episode_log"):
            envs.episode_log = recording.new_log()
        envs.episode_log.steps += envs.num_envs
        recording.vector_log = envs.episode_log
        try:
            return real_vector_step(envs, actions)
        finally:
            recording.vector_log = None

    gym.make = lambda *args, **kwargs: EpisodeRecorder(real_make(*args, **kwargs), recording)
    gym.vector.SyncVectorEnv.step = vector_step
    if re.search(r"^import envpool\b", script_source, re.MULTILINE):  # importing envpool alone takes over a second
        import envpool

        real_envpool_make = envpool.make
        envpool.make = lambda *args, **kwargs: GameRecorder(real_envpool_make(*args, **kwargs), recording)
    return recording


def partial_paths(out):
    """An unfinished run's checkpoint and the episodes logged up to it, hidden beside its record-to-be."""
    return out.with_name(f".{out.stem}.pt"), out.with_name(f".{out.stem}.episodes.json")


def record_run(script, seed, flags, out, checkpoint_every=0, keep_model=False):
    """Runs a script's __main__ in this process with its envs logged; writes the run's record to `out`.
    checkpoint_every: the script saves a checkpoint that often, with the episodes so far beside it, and an unfinished
    run of this record is resumed from there. keep_model: the run's last checkpoint, the trained agent, is kept
    beside the record (`out` with .pt), not removed."""
    import torch  # the scripts' own: with the script loaded, it costs nothing more

    model, partial = partial_paths(out)
    kept_model = out.with_suffix(".pt")  # with keep_model, where the finished run's checkpoint goes
    before = {"episodes": [], "wall_seconds": 0.0, "resumed_at": []}  # what earlier sittings of this run did
    checkpoint_flags = []
    if checkpoint_every or keep_model:
        checkpoint_flags = ["--save-model", "--eval-episodes", "0", "--model-path", str(model)]
        if checkpoint_every:
            checkpoint_flags += ["--checkpoint-every", str(checkpoint_every)]
        if model.exists() and partial.exists():
            step = torch.load(model, map_location="cpu", weights_only=True)["global_step"]
            saved = json.loads(partial.read_text())
            # The episodes file is written as the checkpoint is: it may be a save ahead, never behind.
            episodes = [episode for episode in saved["episodes"] if episode[0] <= step]
            before = {
                "episodes": episodes,
                "wall_seconds": saved["wall_seconds"],
                "resumed_at": [*saved["resumed_at"], step],
            }
            checkpoint_flags += ["--resume", str(model)]
            say(f"seed {seed}: resumed at step {step} from {model}")
    start_step = before["resumed_at"][-1] if before["resumed_at"] else 0
    recording = start_recording(script.read_text(), start_step)  # this process ends with the run: nothing to undo
    sys.argv = [str(script), *flags, "--seed", str(seed), *checkpoint_flags]
    start = time.perf_counter()

    real_save = torch.save

    def save_with_episodes(obj, *args, **kwargs):
        real_save(obj, *args, **kwargs)
        if isinstance(obj, dict) and "global_step" in obj:  # the script's checkpoint: the episodes go with it
            log = max(recording.logs, key=lambda log: log.steps)  # the training env's: the one that stepped most
            episodes = before["episodes"] + log.episodes
            wall_seconds = before["wall_seconds"] + time.perf_counter() - start
            partial.write_text(json.dumps({**before, "episodes": episodes, "wall_seconds": wall_seconds}))

    torch.save = save_with_episodes
    try:
        run = runpy.run_path(str(script), run_name="__main__")
    except KeyboardInterrupt:  # a script that does not handle Ctrl-C itself: no traceback, no record
        sys.exit(130)
    wall_seconds = before["wall_seconds"] + time.perf_counter() - start

    reported = run.get("episode_returns")
    matching = [log for log in recording.logs if [ret for _, ret in log.episodes] == reported]
    if not matching:
        fail(
            f"no env's episodes are the {len(reported or [])} returns of the script's episode_returns (does it make "
            "its envs with gymnasium.make, alone or in a SyncVectorEnv, or envpool.make?): no record written",
            status=1,
        )
    log = max(matching, key=lambda log: log.steps)  # equal only when none finished an episode: the one that stepped
    budget = run["args"].total_timesteps
    if log.steps < budget:
        fail(f"the run stopped at env step {log.steps} of {budget}: no record written", status=1)

    threads = os.environ.get("OMP_NUM_THREADS")
    pair = script.stem.removesuffix("_torchcompile")
    record = {
        "script": script.name,
        "script_path": shown_path(script),
        "algo": ALGOS.get(pair, pair),
        "env_id": run["args"].env_id,
        "seed": seed,
        "flags": flags,
        "command": (f"OMP_NUM_THREADS={threads} " if threads else "")
        + shlex.join(["python", shown_path(script), *flags, "--seed", str(seed)]),
        "omp_num_threads": threads,
        "machine": describe_machine(),
        "device": str(run.get("device")),
        "total_timesteps": budget,
        "steps": log.steps,
        "wall_seconds": wall_seconds,
        "resumed_at": before["resumed_at"],
        "episodes": before["episodes"] + log.episodes,
        "model": kept_model.name if keep_model else None,
    }
    if keep_model:
        model.replace(kept_model)  # before the record, which names it
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record) + "\n")
    temporary.replace(out)  # atomic: a record exists whole or not at all
    for path in (model, partial):
        path.unlink(missing_ok=True)


# --- run: a batch of seeds, resumable -----------------------------------------------------------------------------


def run_child(script, seed, flags, out, checkpoint_every, keep_model):
    """Exit status of one run in a child process (`record`)."""
    command = [sys.executable, __file__, "record", "--script", str(script), "--seed", str(seed), "--out", str(out),
               "--checkpoint-every", str(checkpoint_every), *(["--keep-model"] if keep_model else [])]  # fmt: skip
    child = subprocess.Popen([*command, "--", *flags])
    try:
        return child.wait()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child got the Ctrl-C too: let it end its run its way
        child.wait()
        fail(f"interrupted in seed {seed}: records of finished seeds (and checkpoints) are kept; the same command "
             "goes on", 130)  # fmt: skip


def run_batch(script, seeds, flags, out, checkpoint_every, keep_model=False):
    if any(flag == "--seed" or flag.startswith("--seed=") for flag in flags):
        fail("the seeds come from --seeds: leave --seed out of the script's flags")
    if min(seeds) < 0 or len(set(seeds)) < len(seeds):
        fail(f"--seeds must be distinct non-negative integers, got {' '.join(map(str, seeds))}")
    if checkpoint_every < 0:
        fail(f"--checkpoint-every must not be negative, got {checkpoint_every}")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)

    others = {
        shlex.join(record["flags"])
        for record in map(read_record, sorted(out.glob("*.json")))
        if record and record["script"] == script.name and record["flags"] != flags
    }
    for other in sorted(others):
        say(f"{out} also holds records of {script.name} with other flags ({other}): not taken for these")

    failed = []
    for seed in seeds:
        path = out / record_name(script.stem, flags, seed)
        if path.exists():
            record = read_record(path)
            if record is None or (record["script"], record["flags"], record["seed"]) != (script.name, flags, seed):
                fail(f"{path} is not the record of this run (seed {seed}): move it away to run the seed again")
            say(f"seed {seed}: done before, skipped ({path})")
            continue
        say(f"seed {seed}: python {shown_path(script)} {shlex.join([*flags, '--seed', str(seed)])}")
        status = run_child(script, seed, flags, path, checkpoint_every, keep_model)
        if status == 2:
            sys.exit(2)  # the script refused its flags and said why: every seed would
        if status != 0 or not path.exists():
            failed.append(seed)
            say(f"seed {seed} failed (exit status {status}): no record")
        else:
            say(f"seed {seed}: recorded in {path}")
    if failed:
        fail(f"seeds {' '.join(map(str, failed))} failed; the same command runs them again", status=1)
    say(f"all {len(seeds)} seeds recorded in {out}; plot: python {TOOL} plot {out}")


# --- plot: curves and the table -----------------------------------------------------------------------------------


def read_folders(folders):
    """{(algo, env_id): {(script_path, flags): [records by seed]}}, with each record's folder."""
    panels = {}
    for folder in folders:
        if not folder.is_dir():
            fail(f"no folder {folder}")
        for path in sorted(folder.glob("*.json")):
            record = read_record(path)
            if record is None:
                say(f"{path} is not a record of this tool: left out")
                continue
            record["folder"] = folder
            runs = panels.setdefault((record["algo"], record["env_id"]), {})
            seeds = runs.setdefault((record["script_path"], tuple(record["flags"])), [])
            twice = [other["folder"] for other in seeds if other["seed"] == record["seed"]]
            if twice:
                name = run_name(record["script_path"], record["flags"])
                fail(f"seed {record['seed']} of `{name}` is in {twice[0]} and in {folder}: keep one")
            seeds.append(record)
    if not panels:
        fail(f"no records in {', '.join(map(str, folders))}")
    for runs in panels.values():
        for seeds in runs.values():
            seeds.sort(key=lambda record: record["seed"])
    return panels


def recent_means(episodes, steps, count):
    """At each of `steps`, the mean return of the last `count` episodes that ended at or before it (nan: none yet)."""
    ends, returns = np.array(episodes, dtype=float).reshape(-1, 2).T
    sums = np.concatenate([[0.0], np.cumsum(returns)])
    done = np.searchsorted(ends, steps, side="right")
    first = np.maximum(done - count, 0)
    with np.errstate(invalid="ignore"):
        return (sums[done] - sums[first]) / (done - first)


def in_leanrl(script_path):
    """Whether a record's script is one of leanrl/ (shown by name) rather than another file (shown by its path)."""
    return Path(script_path).parent == Path("leanrl")


def run_name(script_path, flags):
    """A script of leanrl/ by its file name; any other (a modified copy, say) by its path, so the two differ."""
    script = Path(script_path).name if in_leanrl(script_path) else str(script_path)
    return shlex.join([script, *flags])


def figure(panels, window):
    """One panel per (algorithm, env): a curve per script and flags, the published figures as points."""
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 6 * nrows), squeeze=False, layout="constrained")
    for ax, ((algo, env_id), runs) in zip(axes.flat, panels.items(), strict=False):
        for color, ((script_path, flags), records) in zip(plt.get_cmap("tab10").colors, runs.items(), strict=False):
            grid = np.linspace(0, min(record["steps"] for record in records), 400)
            curves = np.array([recent_means(record["episodes"], grid, window) for record in records])
            mean, spread = curves.mean(axis=0), curves.std(axis=0)
            seeds = ", ".join(str(record["seed"]) for record in records)
            label = f"{run_name(script_path, flags)} (seed{'s' * (len(records) > 1)} {seeds})"
            label = textwrap.fill(label, 100)  # a long line of flags would widen the legend and squeeze the axes
            ax.plot(grid, mean, color=color, label=label)
            ax.fill_between(grid, mean - spread, mean + spread, color=color, alpha=0.2, linewidth=0)
        # One errorbar per source and env (a legend entry each): circles for training episodes, diamonds for evaluation.
        groups = {}
        for reference in references(algo, env_id):
            key = (reference.source, reference.env_id, reference.kind, reference.seeds)
            groups.setdefault(key, []).append(reference)
        for index, ((source, ref_env, kind, seeds), points) in enumerate(groups.items()):
            ax.errorbar(
                [point.step for point in points],
                [point.value for point in points],
                yerr=[point.spread for point in points],
                fmt="o" if kind == TRAINING else "D",
                color=("black", "dimgray", "gray", "darkgray")[index % 4],
                capsize=4,
                label=f"{source}, {ref_env}: {kind}, {seeds} seeds",
            )
        ax.set_title(f"{algo} on {env_id}")
        ax.set_xlabel("environment steps (all envs)")
        ax.set_ylabel("episode return")
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14))  # below: the curves stay visible
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        f"Return of training episodes, per seed the mean of the last {window}: line, mean over seeds; band, ± 1 std\n"
        "points: published figures, ± 1 std over their seeds",
        fontsize=10,
    )
    return fig


def ours(records, step, count):
    """(mean ± std over seeds, per seed) of the mean return of the last `count` episodes ended by `step`."""
    reached = min(record["steps"] for record in records)
    if reached < step:
        return f"not reached (runs end at {reached:,})", "–"
    values = [recent_means(record["episodes"], [step], count)[0] for record in records]
    if any(math.isnan(value) for value in values):
        return "no finished episode by then", "–"
    spread = f" ± {np.std(values):.1f}" if len(values) > 1 else ""
    per_seed = ", ".join(f"{record['seed']}: {value:.1f}" for record, value in zip(records, values, strict=True))
    return f"{np.mean(values):.1f}{spread}", per_seed


def run_command(script_path, flags, records):
    """The command that makes these records, all in one folder (a rerun skips them and runs any seed missing)."""
    threads = {record["omp_num_threads"] for record in records}
    prefix = f"OMP_NUM_THREADS={threads.pop()} " if len(threads) == 1 and None not in threads else ""
    script = Path(script_path).stem if in_leanrl(script_path) else script_path
    seeds = " ".join(str(record["seed"]) for record in records)
    command = f"{prefix}python {TOOL} run --script {script} --seeds {seeds} --out {shown_path(records[0]['folder'])}"
    return command + (f" -- {shlex.join(flags)}" if flags else "")


def row(*cells):
    return "| " + " | ".join(cells) + " |"


def table(panels, window, image, plot_command):
    lines = [
        "# Learning curves against the published returns",
        "",
        f"![return curves]({image})",
        "",
        "Ours: per seed, the mean return of the last N training episodes that ended by the step (N = 100 beside "
        f"CleanRL's figures, the mean of their last 100 training episodes; N = {window} elsewhere), then the mean ± "
        "standard deviation over seeds. Published: mean ± standard deviation over their seeds, of training "
        "episodes or of a deterministic evaluation (the policy without exploration noise, on separate episodes), "
        "on the env version named in the source column.",
        "",
    ]
    for (algo, env_id), runs in panels.items():
        published = references(algo, env_id)
        lines += [f"## {algo} on {env_id}", ""]
        lines += [
            row("step", "run", "ours", "per seed", "ours averages", "published", "kind", "source"),
            "|---" * 8 + "|",
        ]
        for (script_path, flags), records in runs.items():
            run = f"`{run_name(script_path, flags)}`"
            for reference in published:
                count = reference.last_episodes or window
                cells = [f"{reference.step:,}", run, *ours(records, reference.step, count), f"last {count} episodes"]
                cells += [f"{reference.value:g} ± {reference.spread:g} ({reference.seeds} seeds)", reference.kind]
                lines.append(row(*cells, f"{reference.details}, {reference.env_id}"))
            budget = records[0]["total_timesteps"]
            if budget not in {reference.step for reference in published}:
                cells = [f"{budget:,} (end)", run, *ours(records, budget, window), f"last {window} episodes"]
                lines.append(row(*cells, "–", "–", "–"))
        versions = sorted({reference.env_id for reference in published} - {env_id})
        if versions:
            lines += ["", f"The published figures are on {', '.join(versions)}; ours on {env_id}."]
        lines.append("")

    lines += ["## Commands", ""]
    for runs in panels.values():
        for (script_path, flags), records in runs.items():
            folders = {}
            for record in records:
                folders.setdefault(record["folder"], []).append(record)
            for in_folder in folders.values():
                hours = ", ".join(f"{record['wall_seconds'] / 3600:.2f}" for record in in_folder)
                machines = "; ".join(sorted({machine_text(record["machine"]) for record in in_folder}))
                torch_versions = ", ".join(sorted({record["machine"]["torch"] for record in in_folder}))
                lines.append(
                    f"- `{run_command(script_path, flags, in_folder)}`: runs of {hours} h on {machines}, "
                    f"torch {torch_versions}"
                )
    lines += [f"- `{plot_command}`: this table and the plot", ""]
    return "\n".join(lines)


def plot(folders, out, window):
    panels = read_folders(folders)
    fig = figure(panels, window)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    plot_command = f"python {TOOL} plot {shlex.join(sys.argv[2:])}"
    out.with_suffix(".md").write_text(table(panels, window, out.name, plot_command))
    say(f"plot: {out}; table: {out.with_suffix('.md')}")


# --- Command line -------------------------------------------------------------------------------------------------


def main():
    argv, flags = sys.argv[1:], []
    if "--" in argv:  # what follows goes to the script untouched
        argv, flags = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train a script over seeds, skipping those already recorded")
    run.add_argument("--script", required=True, help="a script of leanrl/ by name, or the path of a .py file")
    run.add_argument("--seeds", type=int, nargs="+", required=True)
    run.add_argument("--out", type=Path, required=True, help="the folder of the records")
    run.add_argument("--checkpoint-every", type=int, default=0, help="env steps between checkpoints (0: none)")
    run.add_argument("--keep-model", action="store_true", help="keep each run's trained agent beside its record (.pt)")
    one = commands.add_parser("record", help="one run in this process (what run starts per seed)")
    one.add_argument("--script", required=True)
    one.add_argument("--seed", type=int, required=True)
    one.add_argument("--out", type=Path, required=True, help="the record's file")
    one.add_argument("--checkpoint-every", type=int, default=0)
    one.add_argument("--keep-model", action="store_true")
    draw = commands.add_parser("plot", help="curves and table from the records of one or more folders")
    draw.add_argument("folders", type=Path, nargs="+")
    draw.add_argument("--out", type=Path, help="the PNG, the table beside it (default: FIRST_FOLDER/curves.png)")
    draw.add_argument("--window", type=int, default=20, help="training episodes averaged per point (default 20)")
    args = parser.parse_args(argv)

    if args.command == "run":
        run_batch(script_file(args.script), args.seeds, flags, args.out, args.checkpoint_every, args.keep_model)
    elif args.command == "record":
        record_run(script_file(args.script), args.seed, flags, args.out, args.checkpoint_every, args.keep_model)
    else:
        if flags:
            fail("plot takes no script flags")
        if args.window <= 0:
            fail(f"--window must be positive, got {args.window}")
        plot(args.folders, args.out or args.folders[0] / "curves.png", args.window)


if __name__ == "__main__":
    main()
