"""Learning curves: does a script reach the published returns, and how soon?

    OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script sac_continuous_action_torchcompile \\
        --seeds 1 2 3 --also-bf16 --out docs/curves/sac_bf16 -- --compile --total-timesteps 300000
    python benchmarks/learning_curves.py plot docs/curves/sac_bf16 docs/curves/sac_plain --out docs/curves/sac.png \\
        --reach 5000

run: a script of leanrl/ (by name, or a .py file's path) with the flags after `--`, once per seed, one after another,
each run a child process. The script writes its training episodes itself (--episodes-path: [env step, return,
wall-clock seconds of the run]) and its results line; from these, once the run has ended, the tool writes the seed's
record DIR/<script>_<flags>_seed<S>.json (with, for an Atari game, --random-games games of a random policy). The same
command again skips the recorded seeds and resumes an interrupted one from its checkpoint (--checkpoint-every N),
whose record so far is left beside it, hidden (.<record>: a copy without the dot is drawn as a run in progress). The
first Ctrl-C or SIGTERM goes on to the run, which ends after its step, and the batch stops; a second kills the run.

plot: the records of one or more folders (records of [step, return] episodes, from before the tool recorded times,
too): the mean return of the last --window training episodes against env steps, a curve per script, flags and world
size, the mean over seeds with the published figures for its algorithm and env; beside it, against wall-clock time,
a curve per seed. Beside the PNG, a markdown table: ours against each published figure, the steps and minutes each
seed takes to --reach R, whether a --bf16 run learns as its fp32 twin does, and the commands.
"""

import argparse
import contextlib
import functools
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
from collections import namedtuple
from pathlib import Path

import matplotlib
import numpy as np
from common import FAST_BF16, ROOT, Parser, describe_machine, fail, machine_text, table_head, table_row

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402

TOOL = "benchmarks/learning_curves.py"
COLORS = plt.get_cmap("tab10").colors  # a run's colour, on both axes of its panel
RECORD_FIELDS = {"script", "script_path", "algo", "env_id", "seed", "flags", "total_timesteps", "steps", "episodes"}
STOPS = (signal.SIGINT, signal.SIGTERM)
CUT = {128 + signum for signum in STOPS}  # the exit status of a run a signal cut

# --- Published figures ------------------------------------------------------------------------------------------

TRAINING = "training episodes"
EVALUATION = "deterministic evaluation"  # the policy without exploration noise, on episodes apart from training


# A published return at a step: its mean and standard deviation (spread) over its seeds; kind, TRAINING or EVALUATION;
# the env it was measured on, whose version may differ from ours; source, short, for the plot's legend; details, how it
# was measured, for the table; a TRAINING figure's mean over its last_episodes (ours is then taken alike).
Reference = namedtuple("Reference", "step value spread seeds kind env_id source details last_episodes", defaults=[None])


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
    ("pqn", "CartPole"): [cleanrl("pqn.py", 500_000, 495.13, 6.89, "CartPole-v1")],
    ("pqn", "Acrobot"): [cleanrl("pqn.py", 500_000, -95.63, 5.73, "Acrobot-v1")],
    ("pqn_atari", "Breakout"): [cleanrl("pqn_atari_envpool.py", 10_000_000, 384.85, 12.39, "Breakout-v5")],
    ("ppo_atari", "Breakout"): [
        cleanrl("ppo_atari_envpool.py", 10_000_000, 211.24, 151.84, "Breakout-v5"),
        cleanrl("ppo_atari_envpool_xla_jax.py", 10_000_000, 420.92, 16.75, "Breakout-v5"),
    ],
}


def references(algo, env_id):
    """The published figures for an algorithm on an env of this family (any version), by step."""
    return sorted(REFERENCES.get((algo, re.sub(r"-v\d+$", "", env_id)), []), key=lambda reference: reference.step)


# --- Small helpers ------------------------------------------------------------------------------------------------


def say(message):
    """Progress and notes, on stdout (stderr is for errors); flushed, as the runs write to the same terminal."""
    print(f"learning_curves.py: {message}", flush=True)


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


def launcher(world_size):
    """How a run is started: python, or torchrun for a world of several processes on this machine."""
    return ["python"] if world_size == 1 else ["torchrun", "--standalone", "--nproc-per-node", str(world_size)]


def record_name(script, flags, seed, world_size=1):
    """The file of a run's record: script, flags, world size and seed, readable (a hash for very long flags)."""
    slug = re.sub(r"[^\w.=+-]+", "_", " ".join(flags))
    if len(slug) > 100:
        slug = f"{slug[:80]}_{hashlib.sha1(' '.join(flags).encode()).hexdigest()[:10]}"
    return f"{script}{'_' + slug if slug else ''}{f'_world{world_size}' if world_size > 1 else ''}_seed{seed}.json"


def read_record(path):
    """A record's contents (older ones: of a world of one, without random policy), or None for a file not one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not (isinstance(record, dict) and RECORD_FIELDS <= record.keys()):
        return None
    return {"world_size": 1, "random_policy_returns": None, **record}


def write_atomically(path, text):
    """Written under a temporary name, then renamed: the file exists whole or not at all."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


# --- run: a batch of seeds, resumable -----------------------------------------------------------------------------


class Signals:
    """The Ctrl-Cs and SIGTERMs the batch gets. The first is passed on, once, to the run going (in a session of its own:
    the terminal's Ctrl-C reaches the batch alone), which ends after its step; the batch stops after that seed. Once
    only: a script dies of a second signal, which is the user's "now": the batch then kills the run and ends."""

    def __init__(self):
        self.received, self.child, self.passed_on = [], None, False
        for signum in STOPS:
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame):
        self.received.append(signum)
        if len(self.received) == 1:
            self.pass_on()
            return
        if self.child:
            with contextlib.suppress(ProcessLookupError):  # the run and its session (compile workers), at once
                os.killpg(self.child.pid, signal.SIGKILL)
        fail(f"{signal.Signals(signum).name} again: the run is killed, its last checkpoint kept; records of finished "
             "seeds are kept; the same command goes on", 128 + self.received[0])  # fmt: skip

    def pass_on(self):
        if self.child and self.received and not self.passed_on:
            self.passed_on = True
            self.child.send_signal(self.received[0])

    def run(self, command):
        """The command's exit status, as a shell tells it (128 + the signal that killed it)."""
        self.child = subprocess.Popen(command, start_new_session=True)
        self.pass_on()  # a signal that came as it started
        try:
            while self.child.poll() is None:  # not wait(): a signal another thread gets would not end the wait
                time.sleep(0.1)
            return 128 - self.child.returncode if self.child.returncode < 0 else self.child.returncode
        finally:
            self.child = None


@functools.cache
def definitions(script):
    """The script's definitions (Args, make_envs ...): its module level, which holds nothing else, run here."""
    sys.path.insert(0, str(script.parent))  # a script imports its run_utils from its folder
    return runpy.run_path(str(script), run_name="script")


def random_policy_returns(make_envs, env_id, games, seed):
    """Scores of `games` whole games of uniformly random actions, in 8 envs made by the script's make_envs (its
    settings: episodic life, clipped rewards), each game scored as the scripts score theirs: its unclipped rewards
    over all lives, until the game is over or cut by the time limit."""
    envs = make_envs(env_id, 8, seed)
    envs.reset()
    rng, scores, ended = np.random.default_rng(seed), np.zeros(8), []
    while len(ended) < games:
        _, _, _, truncated, info = envs.step(rng.integers(envs.action_space.n, size=8))
        scores += info["reward"]
        for index in np.flatnonzero(info["terminated"].astype(bool) | truncated):
            ended.append(float(scores[index]))
            scores[index] = 0.0
    envs.close()
    return ended[:games]


def run_seed(script, flags, seed, path, options, signals, label):
    """One seed's run in a child process, from its hidden checkpoint if it has one; then its record to path, or (cut by
    a signal, with checkpoints) its record so far beside it, hidden. Returns the run's exit status."""
    import torch  # neither is needed to plot
    import tyro

    episodes, results, model, resumed, so_far = (  # the seed's files, hidden beside its record-to-be
        path.with_name(f".{path.stem}{suffix}")
        for suffix in (".episodes.jsonl", ".results.jsonl", ".pt", ".resumed", ".json")
    )
    python = [sys.executable]
    if options.processes > 1:
        python += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(options.processes)]
    command = [*python, str(script), *flags, "--seed", str(seed), "--episodes-path", str(episodes),
               "--results-path", str(results)]  # fmt: skip
    saves = bool(options.checkpoint_every or options.keep_model)
    if saves:
        command += ["--save-model", "--eval-episodes", "0", "--model-path", str(model),
                    "--checkpoint-every", str(options.checkpoint_every)]  # fmt: skip
    seconds_before = 0.0  # the run's wall-clock seconds in its earlier sittings
    if saves and model.exists():
        checkpoint = torch.load(model, map_location="cpu", weights_only=True)
        seconds_before = checkpoint.get("run_seconds", 0.0)
        with resumed.open("a") as file:
            file.write(f"{checkpoint['global_step']}\n")
        command += ["--resume", str(model)]
        say(f"{label}: resumed at step {checkpoint['global_step']} from {model}")
    else:  # what a start with no checkpoint to go on from left
        resumed.unlink(missing_ok=True)
        so_far.unlink(missing_ok=True)
    results.unlink(missing_ok=True)  # the file holds this sitting's results line, once it has written it
    status = signals.run(command)
    if not results.exists() or not (status == 0 or (status in CUT and saves)):
        return status
    line = json.loads(results.read_text())
    if options.processes > 1 and "world_size" not in line:
        fail(f"{script.name} is not a distributed script: it runs in a world of one (leave out --processes)")
    finished, defined = status == 0, definitions(script)
    args = tyro.cli(defined["Args"], args=flags)  # the run's flags as the script reads them
    threads = os.environ.get("OMP_NUM_THREADS")
    random_returns = None
    if finished and options.random_games and "make_envs" in defined:  # an Atari script
        random_returns = random_policy_returns(defined["make_envs"], args.env_id, options.random_games, seed)
    kept_model = path.with_suffix(".pt")
    shown = shlex.join([*launcher(options.processes), shown_path(script), *flags, "--seed", str(seed)])
    record = {
        "script": script.name, "script_path": shown_path(script), "seed": seed, "flags": flags,
        "algo": line["algo"].removesuffix("_distributed"),  # a distributed script's panel is its algorithm's
        "env_id": args.env_id, "total_timesteps": args.total_timesteps, "world_size": options.processes,
        "omp_num_threads": threads, "command": (f"OMP_NUM_THREADS={threads} " if threads else "") + shown,
        "machine": describe_machine(), "device": line["device"], "steps": line["steps_done"],
        "wall_seconds": seconds_before + line["wall_seconds"],  # on the episodes' clock
        "resumed_at": [int(step) for step in resumed.read_text().split()] if resumed.exists() else [],
        "episodes": [json.loads(episode) for episode in episodes.read_text().splitlines()],
        "random_policy_returns": random_returns, "model": kept_model.name if finished and options.keep_model else None,
    }  # fmt: skip
    if not finished:
        write_atomically(so_far, json.dumps(record) + "\n")
        return status
    if options.keep_model:
        model.replace(kept_model)  # before the record, which names it
    write_atomically(path, json.dumps(record) + "\n")
    for leftover in (episodes, results, model, resumed, so_far):
        leftover.unlink(missing_ok=True)
    return status


def run_batch(script, flags, options):
    seeds, out = options.seeds, options.out
    if any(flag == "--seed" or flag.startswith("--seed=") for flag in flags):
        fail("the seeds come from --seeds: leave --seed out of the script's flags")
    if min(seeds) < 0 or len(set(seeds)) < len(seeds):
        fail(f"--seeds must be distinct non-negative integers, got {' '.join(map(str, seeds))}")
    if options.checkpoint_every < 0 or options.random_games < 0:
        fail("--checkpoint-every and --random-games must not be negative")
    if options.processes < 1:
        fail(f"--processes must be positive, got {options.processes}")
    if options.processes > 1 and (options.checkpoint_every or options.keep_model):
        fail("--checkpoint-every and --keep-model are for a world of one: a world of processes is recorded at its end")
    if options.also_bf16 and "--bf16" in flags:
        fail("--also-bf16 adds --bf16 to a second run of each seed: leave it out of the script's flags")
    if options.also_bf16 and not describe_machine()["fast_bf16"]:
        fail(f"--also-bf16: this machine does not compute bf16 faster than fp32 ({FAST_BF16}): its --bf16 runs would "
             "be fp32 runs")  # fmt: skip
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a folder")
    variants = [flags, [*flags, "--bf16"]] if options.also_bf16 else [flags]
    out.mkdir(parents=True, exist_ok=True)

    records = filter(None, map(read_record, out.glob("[!.]*.json")))
    others = {shlex.join(r["flags"]) for r in records if r["script"] == script.name and r["flags"] not in variants}
    for other in sorted(others):
        say(f"{out} also holds records of {script.name} with other flags ({other}): not taken for these")

    signals, failed, status = Signals(), [], 0
    for seed, variant in ((seed, variant) for seed in seeds for variant in variants):  # fp32 and bf16 of a seed
        if signals.received or status in CUT:
            break
        label = f"seed {seed}" + (" --bf16" if variant is not variants[0] else "")
        path = out / record_name(script.stem, variant, seed, options.processes)
        if path.exists():
            record = read_record(path)
            this_run = (script.name, variant, seed, options.processes)
            if record is None or (record["script"], record["flags"], record["seed"], record["world_size"]) != this_run:
                fail(f"{path} is not the record of this run (seed {seed}): move it away to run the seed again")
            say(f"{label}: done before, skipped ({path})")
            continue
        say(f"{label}: {shlex.join([*launcher(options.processes), shown_path(script), *variant, '--seed', str(seed)])}")
        status = run_seed(script, variant, seed, path, options, signals, label)
        if status in (2, 74):  # the script refused its flags, or could not write (run_utils.WRITE_FAILED): said why
            sys.exit(status)  # and every seed would
        if status == 0 and path.exists():
            say(f"{label}: recorded in {path}")
        elif status not in CUT:
            failed.append(label)
            say(f"{label} failed (exit status {status}): no record")
    if signals.received or status in CUT:
        fail("interrupted: the records of finished seeds, and the checkpoints, are kept; the same command goes on",
             128 + signals.received[0] if signals.received else status)  # fmt: skip
    if failed:
        fail(f"{', '.join(failed)} failed; the same command runs them again", status=1)
    say(f"all {len(seeds)} seeds{' (fp32 and bf16)' if options.also_bf16 else ''} recorded in {out}; plot: "
        f"python {TOOL} plot {out}")  # fmt: skip


# --- plot: curves and the table -----------------------------------------------------------------------------------


def read_folders(folders):
    """{(algo, env_id): {(script_path, flags, world_size): [records by seed]}}, with each record's folder."""
    panels = {}
    for folder in folders:
        if not folder.is_dir():
            fail(f"no folder {folder}")
        for path in sorted(folder.glob("[!.]*.json")):  # a hidden one is a seed's files, not recorded yet
            record = read_record(path)
            if record is None:
                say(f"{path} is not a record of this tool: left out")
                continue
            run = (record["script_path"], tuple(record["flags"]), record["world_size"])
            seeds = panels.setdefault((record["algo"], record["env_id"]), {}).setdefault(run, [])
            if twice := [other["folder"] for other in seeds if other["seed"] == record["seed"]]:
                fail(f"seed {record['seed']} of `{run_name(*run)}` is in {twice[0]} and in {folder}: keep one")
            seeds.append({**record, "folder": folder})
    if not panels:
        fail(f"no records in {', '.join(map(str, folders))}")
    for runs in panels.values():
        for seeds in runs.values():
            seeds.sort(key=lambda record: record["seed"])
    return panels


def window_means(returns, done, count):
    """For each number of episodes done, the mean return of the last `count` of them (of fewer at first; nan: none)."""
    sums = np.concatenate([[0.0], np.cumsum(returns)])
    first = np.maximum(done - count, 0)
    with np.errstate(invalid="ignore"):
        return (sums[done] - sums[first]) / (done - first)


def recent_means(episodes, steps, count):
    """At each of `steps`, the mean return of the last `count` episodes that ended at or before it (nan: none yet)."""
    ends, returns = np.array([episode[:2] for episode in episodes], dtype=float).reshape(-1, 2).T
    return window_means(returns, np.searchsorted(ends, steps, side="right"), count)


def in_leanrl(script_path):
    """Whether a record's script is one of leanrl/ (shown by name) rather than another file (shown by its path)."""
    return Path(script_path).parent == Path("leanrl")


def run_name(script_path, flags, world_size):
    """A script of leanrl/ by file name, any other (a modified copy) by its path; a world of processes with torchrun."""
    script = Path(script_path).name if in_leanrl(script_path) else str(script_path)
    return shlex.join([*(launcher(world_size) if world_size > 1 else []), script, *flags])


def random_policy(runs):
    """The random policy's scores recorded beside a panel's runs (Atari games)."""
    return [score for records in runs.values() for record in records for score in record["random_policy_returns"] or []]


def timed(record):
    """Whether each episode of a record carries its wall-clock seconds (not so in records older than the times)."""
    return all(len(episode) > 2 for episode in record["episodes"])


def levels(ax, runs, reach):
    """The random policy's mean score as a dashed line, --reach as a dotted one; the legend below the axes."""
    if scores := random_policy(runs):
        ax.axhline(np.mean(scores), color="tab:red", ls="--", label=f"random policy ({len(scores)} games)")
    if reach is not None:
        ax.axhline(reach, color="tab:green", ls=":", label=f"--reach {reach:g}")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14))  # below: the curves stay visible


def steps_axes(ax, algo, env_id, runs, window, reach):
    """Return against env steps: a curve per run (the mean over seeds, a band of one std), the published figures as
    points (one errorbar per source and env: circles for training episodes, diamonds for an evaluation)."""
    for color, (run, records) in zip(COLORS, runs.items(), strict=False):
        grid = np.linspace(0, min(record["steps"] for record in records), 400)
        curves = np.array([recent_means(record["episodes"], grid, window) for record in records])
        mean, spread = curves.mean(axis=0), curves.std(axis=0)
        label = f"{run_name(*run)} (seed{'s' * (len(records) > 1)} {', '.join(str(r['seed']) for r in records)})"
        if any(record["steps"] < record["total_timesteps"] for record in records):
            label += ", in progress"
        # Wrapped: a long line of flags would widen the legend and squeeze the axes.
        ax.plot(grid, mean, color=color, label=textwrap.fill(label, 100))
        ax.fill_between(grid, mean - spread, mean + spread, color=color, alpha=0.2, linewidth=0)
    groups = {}
    for reference in references(algo, env_id):
        groups.setdefault((reference.source, reference.env_id, reference.kind, reference.seeds), []).append(reference)
    for index, ((source, ref_env, kind, seeds), points) in enumerate(groups.items()):
        steps, values, spreads = zip(*[(point.step, point.value, point.spread) for point in points], strict=True)
        ax.errorbar(steps, values, yerr=spreads, fmt="o" if kind == TRAINING else "D", capsize=4,
                    color=("black", "dimgray", "gray", "darkgray")[index % 4],
                    label=f"{source}, {ref_env}: {kind}, {seeds} seeds")  # fmt: skip
    ax.set(title=f"{algo} on {env_id}", xlabel="environment steps (all envs)")
    ax.xaxis.set_major_formatter(EngFormatter())
    levels(ax, runs, reach)


def time_axes(ax, algo, env_id, runs, window, reach):
    """Return against wall-clock time (minutes; hours where a run lasts over 2 hours): a curve per seed, in its run's
    colour, at each episode's end the mean return of the last `window` (seeds end at different times, so they are not
    averaged); a record without times is left out, and a legend line says which."""
    longest = max((r["wall_seconds"] for records in runs.values() for r in records if timed(r)), default=0)
    per_unit, unit = (3600, "hours") if longest > 2 * 3600 else (60, "minutes")
    for color, (run, records) in zip(COLORS, runs.items(), strict=False):
        for record in filter(timed, records):
            _, returns, seconds = np.array(record["episodes"], dtype=float).reshape(-1, 3).T
            means = window_means(returns, np.arange(1, len(returns) + 1), window)
            ax.plot(seconds / per_unit, means, color=color, linewidth=1, drawstyle="steps-post")  # as on the left
        if untimed := [str(record["seed"]) for record in records if not timed(record)]:
            label = f"left out, no wall-clock times recorded: {run_name(*run)} (seed{'s' * (len(untimed) > 1)} "
            ax.plot([], [], " ", label=textwrap.fill(f"{label}{', '.join(untimed)})", 100))
    if not any(timed(record) for records in runs.values() for record in records):
        ax.text(0.5, 0.5, "no record here has wall-clock times", transform=ax.transAxes, ha="center", va="center")
        ax.set(xticks=[], yticks=[])
    ax.set(title=f"{algo} on {env_id}, against wall-clock time", xlim=(0, None))
    ax.set_xlabel(f"wall-clock time of the run ({unit}), earlier sittings included")
    levels(ax, runs, reach)


def figure(panels, window, reach=None):
    """A row per (algorithm, env): its return against env steps, and beside it against wall-clock time."""
    fig, axes = plt.subplots(len(panels), 2, figsize=(14, 6 * len(panels)), squeeze=False, layout="constrained")
    for (left, right), ((algo, env_id), runs) in zip(axes, panels.items(), strict=True):
        steps_axes(left, algo, env_id, runs, window, reach)
        time_axes(right, algo, env_id, runs, window, reach)
    fig.suptitle(f"Return of training episodes, per seed the mean of the last {window}; left: against env steps, line, "
                 "mean over seeds; band, ± 1 std; points: published figures, ± 1 std over their seeds\nright: against "
                 "wall-clock time, a line per seed, in its run's colour on the left", fontsize=10)  # fmt: skip
    return fig


def at_step(records, step, count):
    """Per seed, the mean return of the last `count` episodes ended by `step`; or, where there is none, why."""
    reached = min(record["steps"] for record in records)
    if reached < step:
        return f"not reached (runs end at {reached:,})"
    values = [recent_means(record["episodes"], [step], count)[0] for record in records]
    return "no finished episode by then" if any(map(math.isnan, values)) else values


def ours(records, step, count):
    """(mean ± std over seeds, per seed) of the mean return of the last `count` episodes ended by `step`."""
    values = at_step(records, step, count)
    if isinstance(values, str):
        return values, "–"
    spread = f" ± {np.std(values):.1f}" if len(values) > 1 else ""
    per_seed = ", ".join(f"{record['seed']}: {value:.1f}" for record, value in zip(records, values, strict=True))
    return f"{np.mean(values):.1f}{spread}", per_seed


def first_reach(record, value, count):
    """(env step, seconds: None without times) at the end of the first episode at which the mean return of the last
    `count` episodes is `value` or more, counted once `count` episodes have ended; None if never."""
    episodes = record["episodes"]
    if len(episodes) < count:
        return None
    returns = np.array([episode[1] for episode in episodes], dtype=float)
    hits = np.flatnonzero(np.lib.stride_tricks.sliding_window_view(returns, count).mean(axis=1) >= value)
    if not hits.size:
        return None
    episode = episodes[hits[0] + count - 1]
    return episode[0], episode[2] if timed(record) else None


def reach_rows(runs, value, count):
    """Per run and seed, the minutes and env step at which it first reaches `value`, then their mean over seeds."""
    lines = table_head("run", "seed", "minutes", "env step")
    for run_key, records in runs.items():
        run = f"`{run_name(*run_key)}`"
        reaches = [first_reach(record, value, count) for record in records]
        for record, reach in zip(records, reaches, strict=True):
            seed, ends = str(record["seed"]), f"{record['steps']:,} steps, {record['wall_seconds'] / 60:.1f} min"
            if reach is None:
                lines.append(table_row(run, seed, f"not reached (run ends at {ends})", "–"))
            else:
                lines.append(table_row(run, seed, "–" if reach[1] is None else f"{reach[1] / 60:.1f}", f"{reach[0]:,}"))
        if None in reaches:
            reaching = len(reaches) - reaches.count(None)
            lines.append(table_row(run, "mean", f"{reaching} of {len(reaches)} seeds reach it", "–"))
        else:
            seconds = [seconds for _, seconds in reaches]
            minutes = "–" if None in seconds else f"{np.mean(seconds) / 60:.1f}"
            lines.append(table_row(run, "mean", minutes, f"{np.mean([step for step, _ in reaches]):,.0f}"))
    return lines


def bf16_rows(runs, window):
    """Where a run is another's with --bf16 added: at half the budget and at its end, bf16's mean over seeds against
    the band written down before any comparison was run (the fp32 seeds' range widened by 10% of their mean on each
    side), then the verdict: the same learning where it lies in the band at both steps."""
    lines = []
    for (script_path, flags, world_size), bf16 in runs.items():
        fp32 = runs.get((script_path, tuple(flag for flag in flags if flag != "--bf16"), world_size))
        if "--bf16" not in flags or fp32 is None:
            continue
        run, budget = f"`{run_name(script_path, flags, world_size)}`", bf16[0]["total_timesteps"]
        lines = lines or table_head("step", "run", "bf16, mean over seeds", "fp32 seeds", "band", "bf16 lies")
        sides = []  # per step: where bf16 lies against the band, None where that is not known yet
        for step in (budget // 2, budget):
            values = at_step(bf16 + fp32, step, window)
            if isinstance(values, str):
                sides.append(None)
                lines.append(table_row(f"{step:,}", run, "–", "–", "–", values))
                continue
            bf16_values, fp32_values = values[: len(bf16)], values[len(bf16) :]
            margin = 0.1 * abs(np.mean(fp32_values))
            low, high, mean = min(fp32_values) - margin, max(fp32_values) + margin, np.mean(bf16_values)
            sides.append("inside" if low <= mean <= high else "above" if mean > high else "below")
            per_seed = ", ".join(f"{r['seed']}: {value:.1f}" for r, value in zip(fp32, fp32_values, strict=True))
            band = f"{low:.1f} to {high:.1f}"
            lines.append(table_row(f"{step:,}", run, f"{mean:.1f}", per_seed, band, f"{sides[-1]} the band"))
        verdict = "**the same learning**" if sides == ["inside", "inside"] else "**not the same learning**"
        lines.append(table_row("verdict", run, "–", "–", "–", "not decided yet" if None in sides else verdict))
    return lines


def run_command(script_path, flags, world_size, records):
    """The command that makes these records, all in one folder (a rerun skips them and runs any seed missing)."""
    threads = {record["omp_num_threads"] for record in records}
    prefix = f"OMP_NUM_THREADS={threads.pop()} " if len(threads) == 1 and None not in threads else ""
    script = Path(script_path).stem if in_leanrl(script_path) else script_path
    processes = f" --processes {world_size}" if world_size > 1 else ""
    seeds = " ".join(str(record["seed"]) for record in records)
    command = f"{prefix}python {TOOL} run --script {script}{processes} --seeds {seeds}"
    return f"{command} --out {shown_path(records[0]['folder'])}" + (f" -- {shlex.join(flags)}" if flags else "")


def table(panels, window, image, plot_command, reach=None):
    lines = ["# Learning curves against the published returns", "", f"![return curves]({image})", "",
             "Ours: per seed, the mean return of the last N training episodes that ended by the step (N = 100 beside "
             f"CleanRL's figures, the mean of their last 100 training episodes; N = {window} elsewhere), then the "
             "mean ± standard deviation over seeds. Published: mean ± standard deviation over their seeds, of "
             "training episodes or of a deterministic evaluation (the policy without exploration noise, on separate "
             "episodes), on the env version named in the source column.", ""]  # fmt: skip
    if reach is not None:
        lines += [f"When the return reaches {reach:g}: per seed, the wall-clock minutes of the run (compile time and "
                  "earlier sittings of a resumed run included) and the env step at the end of the first training "
                  f"episode at which the mean return of the last {window} is {reach:g} or more, then their mean over "
                  "seeds. A record written before the tool recorded times gives the step only.", ""]  # fmt: skip
    for (algo, env_id), runs in panels.items():
        published, panel = references(algo, env_id), f"{algo} on {env_id}"
        lines += [f"## {panel}", ""]
        lines += table_head("step", "run", "ours", "per seed", "ours averages", "published", "kind", "source")
        for run_key, records in runs.items():
            run = f"`{run_name(*run_key)}`"
            for reference in published:
                count = reference.last_episodes or window
                cells = [f"{reference.step:,}", run, *ours(records, reference.step, count), f"last {count} episodes"]
                cells += [f"{reference.value:g} ± {reference.spread:g} ({reference.seeds} seeds)", reference.kind]
                lines.append(table_row(*cells, f"{reference.details}, {reference.env_id}"))
            budget, reached = records[0]["total_timesteps"], min(record["steps"] for record in records)
            end = min(budget, reached)  # a run in progress: as far as it has got
            if end not in {reference.step for reference in published}:
                step = f"{end:,} (end)" if end == budget else f"{end:,} (in progress, of {budget:,})"
                cells = *ours(records, end, window), f"last {window} episodes", "–", "–", "–"
                lines.append(table_row(step, run, *cells))
        if versions := sorted({reference.env_id for reference in published} - {env_id}):
            lines += ["", f"The published figures are on {', '.join(versions)}; ours on {env_id}."]
        if scores := random_policy(runs):
            lines += ["", f"A uniformly random policy scores {np.mean(scores):.2f} over {len(scores)} games."]
        if reach is not None:
            lines += ["", f"### {panel}: when the return reaches {reach:g}", "", *reach_rows(runs, reach, window)]
        bf16 = bf16_rows(runs, window)
        if bf16:
            lines += ["", f"### {panel}: --bf16 against fp32", "",
                      f"bf16's mean over seeds of the mean return of the last {window} episodes, at half the budget "
                      "and at its end, against the band written down before any comparison was run: the fp32 seeds' "
                      "range widened by 10% of their mean on each side. In the band at both steps: the same "
                      "learning, by that rule (a few seeds: a hint at a difference, not a proof of none).", "",
                      *bf16]  # fmt: skip
        lines.append("")
    lines += ["## Commands", ""]
    for run_key, records in (run for runs in panels.values() for run in runs.items()):
        for folder in dict.fromkeys(record["folder"] for record in records):
            in_folder = [record for record in records if record["folder"] == folder]
            hours = ", ".join(f"{record['wall_seconds'] / 3600:.2f}" for record in in_folder)
            machines = "; ".join(sorted({machine_text(record["machine"]) for record in in_folder}))
            versions = ", ".join(sorted({record["machine"]["torch"] for record in in_folder}))
            lines.append(f"- `{run_command(*run_key, in_folder)}`: runs of {hours} h on {machines}, torch {versions}")
    return "\n".join([*lines, f"- `{plot_command}`: this table and the plot", ""])


def plot(folders, out, window, reach):
    panels = read_folders(folders)
    fig = figure(panels, window, reach)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    table_text = table(panels, window, out.name, f"python {TOOL} plot {shlex.join(sys.argv[2:])}", reach)
    out.with_suffix(".md").write_text(table_text)
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
    run.add_argument("--processes", type=int, default=1, help="a distributed script's world size (torchrun)")
    run.add_argument("--random-games", type=int, default=100, help="an Atari game's random-policy games (0: none)")
    run.add_argument("--also-bf16", action="store_true", help="each seed also with --bf16 added (where bf16 is faster)")
    draw = commands.add_parser("plot", help="curves and table from the records of one or more folders")
    draw.add_argument("folders", type=Path, nargs="+")
    draw.add_argument("--out", type=Path, help="the PNG, the table beside it (default: FIRST_FOLDER/curves.png)")
    draw.add_argument("--window", type=int, default=20, help="training episodes averaged per point (default 20)")
    draw.add_argument("--reach", type=float, help="a return: the table gives the minutes and steps to reach it")
    args = parser.parse_args(argv)

    if args.command == "run":
        return run_batch(script_file(args.script), flags, args)
    if flags:
        fail("plot takes no script flags")
    if args.window <= 0:
        fail(f"--window must be positive, got {args.window}")
    if args.reach is not None and not math.isfinite(args.reach):
        fail(f"--reach must be a finite return, got {args.reach}")
    plot(args.folders, args.out or args.folders[0] / "curves.png", args.window, args.reach)


if __name__ == "__main__":
    main()
