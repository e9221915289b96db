"""Learning curves: does a script reach the published returns, and how soon? Runs it over seeds, records every
episode's env step, return and wall-clock time, and plots the return against env steps with the published figures
for its algorithm and env, and against wall-clock time.

    OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script sac_continuous_action_torchcompile \\
        --seeds 1 2 --out docs/curves/sac -- --compile --total-timesteps 300000
    python benchmarks/learning_curves.py plot docs/curves/sac docs/curves/sac_plain --out docs/curves/sac.png \\
        --reach 5000

run: a script of leanrl/ (by name, or the path of a .py file) with the flags after `--`, once per seed, each run in a
child process (`record` below), one after another: a crash or a Ctrl-C loses that run only. A finished run's record
is written to DIR/<script>_<flags>_seed<S>.json under a temporary name, then renamed. Running the same command again
skips the seeds whose record exists and runs the others, so a long batch can be spread over several sittings; records
of the same script with other flags (another budget) are never taken for these (a line says they are there). The
runs inherit the environment: OMP_NUM_THREADS=1 gives each one thread.
With --checkpoint-every N a run also survives its interruption (a Ctrl-C, a SIGTERM to the batch or to the run, the
end of a sitting; the batch passes the signals it gets on to its run, which runs in a session of its own): the script
saves its checkpoint every N env steps (--save-model --checkpoint-every N, beside the records as a hidden file) and at
an interruption, and the episodes logged so far are saved with it; the same command then resumes the unfinished
seed from its checkpoint (--resume) and its record lists the steps it was resumed at. A resumed run starts a new
episode there, so it is not step for step the run that was not interrupted.
With --keep-model a finished run's last checkpoint, the trained agent, is kept beside its record (same name, .pt; the
record's "model"), to evaluate and watch: the script with the record's flags and seed, `--save-model --resume` that
file (a finished run trains no further) and --eval-episodes N, --capture-video.
With --also-bf16 each seed runs twice, with the flags given and with --bf16 added, one after the other, both recorded
in --out (one curve each in the plot): a learning comparison of fp32 and bf16 is one command. It is refused where the
device the scripts pick does not compute bf16 faster than fp32 (there --bf16 is off: both runs would be fp32's).

    OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script td3_continuous_action_torchcompile \
        --seeds 1 2 --also-bf16 --out docs/curves/td3_bf16 --checkpoint-every 50000 \
        -- --compile --total-timesteps 300000

With --processes N (a distributed script of leanrl/) each run is a world of N processes on this machine, started by
torchrun (its record's name ends in _worldN_seed<S>.json); such a run is neither checkpointed nor kept.

    OMP_NUM_THREADS=1 python benchmarks/learning_curves.py run --script ppo_atari_envpool_distributed_torchcompile \\
        --processes 2 --seeds 1 --out docs/breakout_distributed/world2 -- --compile --total-timesteps 500000

record: one run in this process (what `run` starts per seed; under torchrun, one per rank). The script's `__main__`
runs unchanged; the envs it makes with gymnasium.make (alone or in a SyncVectorEnv) or envpool.make (Atari) are
wrapped so that each finished episode is logged with its return, the env steps done by then, counting every env of a
vector env (the x axis of the curves), and the run's wall-clock seconds by then, from its start: the earlier sittings
of a resumed run are counted, the time between them not; in a world of processes, each rank's own clock. An episode
is [step, return, seconds]; records written before have [step, return]. The logged returns must be the script's own
(`run.episode_returns`), or no record is written: the curve is the script's report, step-stamped. In a world of N
processes each rank logs its own envs, a game's step is the global step count (every rank steps in lockstep), and
rank 0 puts the games of all ranks in the order the script reports them before that check. For an Atari game
(envpool), --random-games games of a uniformly random policy are played with the script's env settings: the
baseline. A record holds the command, machine, torch version, budget, episodes, random policy's scores, wall time
(wall_seconds, on the episodes' clock).

plot: the records of one or more folders, one panel per algorithm and env, one curve per script, flags and world
size (folders of earlier runs side by side compare them): the mean over seeds of the mean return of the last
--window training episodes, with a band of one standard deviation over seeds; the published figures for that
algorithm and env are points with their spread, the random policy's mean score a dashed line. Beside each panel, the
return against wall-clock time (minutes, or hours for a run over 2 hours): a curve per seed, the mean return of the
last --window episodes at each episode's end, in its run's colour; seeds are not averaged, as they end at different
times. A record without times is left out of that axes, and its legend says so. Writes the PNG and, beside it, a
markdown table (same name, .md): ours against each published figure at its step, and the commands.
With --reach R the table has a section per panel: for each run and seed, the wall-clock minutes and the env step at
the end of the first episode at which the mean return of the last --window episodes is R or more (once --window
episodes have ended), and their mean over seeds; a seed that never reaches R is "not reached", with its run's end.
A record without times gives the step only.
Where a run is another's with --bf16 added (--also-bf16 makes such pairs), the table says whether bf16 learns as fp32
does by the rule written down before any comparison was run: at half the budget and at its end, bf16's mean over
seeds lies within the fp32 seeds' range widened by 10% of their mean on each side.
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
from speedup_table import FAST_BF16, describe_machine, machine_text  # benchmarks/ is on the path when this file runs

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
    "ppo_atari_envpool_distributed": "ppo_atari",  # in any world size
    "pqn_atari_envpool": "pqn_atari",
}
COLORS = plt.get_cmap("tab10").colors  # a run's colour, on both axes of its panel
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


def launcher(world_size):
    """How a run is started: python, or torchrun for a world of several processes on this machine."""
    return ["python"] if world_size == 1 else ["torchrun", "--standalone", "--nproc-per-node", str(world_size)]


def record_name(script, flags, seed, world_size=1):
    """The file of one run's record: its script, flags, world size and seed, readable; a hash stands in for very long
    flags."""
    slug = re.sub(r"[^\w.=+-]+", "_", " ".join(flags))
    if len(slug) > 100:
        slug = f"{slug[:80]}_{hashlib.sha1(' '.join(flags).encode()).hexdigest()[:10]}"
    return f"{script}{'_' + slug if slug else ''}{f'_world{world_size}' if world_size > 1 else ''}_seed{seed}.json"


def read_record(path):
    """A record's contents, or None for a file that is not one. Records written before there were worlds of several
    processes and random policies are of a world of one, without one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not (isinstance(record, dict) and RECORD_FIELDS <= record.keys()):
        return None
    return {"world_size": 1, "random_policy_returns": None, **record}


# --- record: one run, its episodes logged -------------------------------------------------------------------------


class EpisodeLog:
    """The finished episodes of one env that steps (a single env, a vector env, an envpool env): (steps, return,
    seconds), seconds being the run's wall-clock time when the episode ended (earlier sittings of it included)."""

    def __init__(self):
        self.steps = 0  # env steps made so far, every env of a vector env counted
        self.episodes = []


class Recording:
    """Every env a run makes, logged apart: the training env is the one whose returns are the script's
    `run.episode_returns` (an evaluation env, made beside it, keeps its own log and its own step count).
    start_step: the steps done before this process (a resumed run), where the step counts start; seconds_before: the
    wall-clock seconds of its earlier sittings, where its clock starts."""

    def __init__(self, start_step=0, seconds_before=0.0):
        self.logs = []
        self.started = time.perf_counter() - seconds_before
        self.vector_log = None  # while a vector env steps, the log its envs' episodes go to
        self.start_step = start_step
        self.remake = None  # an Atari script's last envpool.make(**changes), unwrapped: the random policy's envs

    def new_log(self):
        self.logs.append(EpisodeLog())
        self.logs[-1].steps = self.start_step
        return self.logs[-1]

    def seconds(self):
        return time.perf_counter() - self.started


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
            log.episodes.append((log.steps, self.episode_return, self.recording.seconds()))
        return obs, reward, terminated, truncated, info


class GameRecorder:
    """Wraps an envpool Atari env: a game's score is its unclipped rewards over all lives, until the game is over or
    cut by the time limit (the scripts' episode_returns; envpool ends an episode at each lost life)."""

    def __init__(self, envs, recording):
        self.envs = envs
        self.recording = recording
        self.log = recording.new_log()
        self.scores = np.zeros(envs.config["num_envs"])

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, action):
        self.log.steps += len(action)
        obs, reward, terminated, truncated, info = self.envs.step(action)
        self.scores += info["reward"]
        for index in np.flatnonzero(info["terminated"].astype(bool) | truncated):
            self.log.episodes.append((self.log.steps, float(self.scores[index]), self.recording.seconds()))
            self.scores[index] = 0.0
        return obs, reward, terminated, truncated, info


def start_recording(script_source, start_step=0, seconds_before=0.0):
    """Wraps the env constructors of gymnasium (and of envpool, for a script that imports it), for this process."""
    recording = Recording(start_step, seconds_before)
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

        def envpool_make(*args, **kwargs):
            recording.remake = lambda **changes: real_envpool_make(*args, **{**kwargs, **changes})
            return GameRecorder(real_envpool_make(*args, **kwargs), recording)

        envpool.make = envpool_make
    return recording


def random_policy_returns(remake, games, seed):
    """Scores of `games` whole games of uniformly random actions, in 8 envs made with the script's settings."""
    envs = GameRecorder(remake(num_envs=8, seed=seed), Recording())
    envs.reset()
    rng = np.random.default_rng(seed)
    while len(envs.log.episodes) < games:
        envs.step(rng.integers(envs.action_space.n, size=8))
    return [episode[1] for episode in envs.log.episodes[:games]]


def partial_paths(out):
    """An unfinished run's checkpoint and the episodes logged up to it, hidden beside its record-to-be."""
    return out.with_name(f".{out.stem}.pt"), out.with_name(f".{out.stem}.episodes.json")


def rank_file(out, rank):
    """Where a rank other than 0 of a world of several processes leaves its episodes for rank 0, beside the record."""
    return out.with_name(f".{out.stem}.rank{rank}.json")


def write_atomically(path, text):
    """Written under a temporary name, then renamed: the file exists whole or not at all."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def in_reported_order(episodes_by_rank, world_size, rollout_steps):
    """The episodes of every rank of a distributed run in the order the script reports them (an iteration's rank by
    rank, each rank's in the order they ended), stamped with the global step count: a rank's steps times the world
    size (the ranks step together, each with num_envs / world size envs)."""
    episodes = [
        (rank, steps * world_size, *rest) for rank, ranks in enumerate(episodes_by_rank) for steps, *rest in ranks
    ]
    episodes.sort(key=lambda episode: ((episode[1] - 1) // rollout_steps, episode[0]))  # stable: a rank's order stays
    return [list(episode[1:]) for episode in episodes]


def record_run(script, flags, options):
    """Runs a script's __main__ in this process with its envs logged; writes the run's record to options.out.
    options.checkpoint_every: the script saves a checkpoint that often, with the episodes so far beside it, and an
    unfinished run of this record is resumed from there. options.keep_model: the run's last checkpoint, the trained
    agent, is kept beside the record (`out` with .pt), not removed. Under torchrun every rank runs this: the ranks
    other than 0 leave their episodes to rank 0, which writes the record."""
    import torch  # the scripts' own: with the script loaded, it costs nothing more

    out, seed = options.out, options.seed
    rank, world_size = (int(os.environ.get(name, default)) for name, default in (("RANK", 0), ("WORLD_SIZE", 1)))
    model, partial = partial_paths(out)
    kept_model = out.with_suffix(".pt")  # with keep_model, where the finished run's checkpoint goes
    before = {"episodes": [], "wall_seconds": 0.0, "resumed_at": []}  # what earlier sittings of this run did
    checkpoint_flags = []
    if options.checkpoint_every or options.keep_model:
        checkpoint_flags = ["--save-model", "--eval-episodes", "0", "--model-path", str(model)]
        if options.checkpoint_every:
            checkpoint_flags += ["--checkpoint-every", str(options.checkpoint_every)]
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
    pair = script.stem.removesuffix("_torchcompile")
    threads = os.environ.get("OMP_NUM_THREADS")
    # What a record says of its run, but for what the run itself gives: written with each checkpoint too.
    identity = {"script": script.name, "script_path": shown_path(script), "algo": ALGOS.get(pair, pair),
                "seed": seed, "flags": flags, "world_size": world_size, "omp_num_threads": threads,
                "machine": describe_machine()}  # fmt: skip
    sys.path.insert(0, str(script.parent))  # scripts import run_utils from their folder
    # This process ends with the run: nothing to undo.
    recording = start_recording(script.read_text(), start_step, before["wall_seconds"])
    sys.argv = [str(script), *flags, "--seed", str(seed), *checkpoint_flags]

    real_save = torch.save

    def save_with_episodes(obj, *args, **kwargs):
        real_save(obj, *args, **kwargs)
        if isinstance(obj, dict) and "global_step" in obj:  # the script's checkpoint: the episodes go with it
            log = max(recording.logs, key=lambda log: log.steps)  # the training env's: the one that stepped most
            episodes = before["episodes"] + log.episodes
            # With what a record says of its run, up to the checkpoint's step: `plot` draws a copy of it as a run in
            # progress (its steps short of its total_timesteps).
            so_far = {"env_id": obj["env_id"], "total_timesteps": obj["total_timesteps"], "steps": obj["global_step"]}
            partial.write_text(
                json.dumps({**identity, **so_far, **before, "episodes": episodes, "wall_seconds": recording.seconds()})
            )

    torch.save = save_with_episodes
    try:
        script_globals = runpy.run_path(str(script), run_name="__main__")
    except KeyboardInterrupt:  # a script that does not handle Ctrl-C itself: no traceback, no record
        sys.exit(130)
    except SystemExit as exit_:  # a distributed script's ranks other than 0 leave through sys.exit(0) at its end
        if exit_.code or rank == 0:
            raise
    wall_seconds = recording.seconds()  # the clock of the episodes' seconds, earlier sittings included
    if rank != 0:  # its episodes go to rank 0, which has the script's returns
        log = max(recording.logs, key=lambda log: log.steps)  # the training env's (rank 0 alone evaluates)
        write_atomically(rank_file(out, rank), json.dumps(log.episodes))
        return

    run, args = script_globals["run"], script_globals["args"]
    logs = [(log.steps, log.episodes) for log in recording.logs]
    if world_size > 1:
        others = []
        for other in range(1, world_size):
            path = rank_file(out, other)
            while not path.exists():  # torchrun stops this rank if that one fails
                time.sleep(0.5)
            others.append(json.loads(path.read_text()))
            path.unlink()
        if not run.distributed:
            fail(f"{script.name} is not a distributed script: it runs in a world of one (leave out --processes)")
        rollout_steps = args.num_envs * args.num_steps
        logs = [(steps * world_size, in_reported_order([episodes, *others], world_size, rollout_steps))
                for steps, episodes in logs]  # fmt: skip
    matching = [
        (steps, episodes) for steps, episodes in logs if [episode[1] for episode in episodes] == run.episode_returns
    ]
    if not matching:
        fail(
            f"no env's episodes are the {len(run.episode_returns)} returns of the script's run.episode_returns (does "
            "it make its envs with gymnasium.make, alone or in a SyncVectorEnv, or envpool.make?): no record written",
            status=1,
        )
    # Equal only when none finished an episode: the one that stepped most.
    steps, episodes = max(matching, key=lambda log: log[0])
    budget = args.total_timesteps
    if steps < budget:
        fail(f"the run stopped at env step {steps} of {budget}: no record written", status=1)
    random_returns = None
    if recording.remake and options.random_games:
        random_returns = random_policy_returns(recording.remake, options.random_games, seed)

    record = {
        **identity,
        "env_id": args.env_id,
        "command": (f"OMP_NUM_THREADS={threads} " if threads else "")
        + shlex.join([*launcher(world_size), shown_path(script), *flags, "--seed", str(seed)]),
        "device": str(run.device),
        "total_timesteps": budget,
        "steps": steps,
        "wall_seconds": wall_seconds,
        "resumed_at": before["resumed_at"],
        "episodes": before["episodes"] + episodes,
        "random_policy_returns": random_returns,
        "model": kept_model.name if options.keep_model else None,
    }
    if options.keep_model:
        model.replace(kept_model)  # before the record, which names it
    write_atomically(out, json.dumps(record) + "\n")
    for path in (model, partial):
        path.unlink(missing_ok=True)


# --- run: a batch of seeds, resumable -----------------------------------------------------------------------------


def run_child(script, seed, flags, out, options):
    """Exit status of one run in a child process (`record`), or in a world of processes started by torchrun."""
    command = [sys.executable, __file__, "record", "--script", str(script), "--seed", str(seed), "--out", str(out),
               "--checkpoint-every", str(options.checkpoint_every), "--random-games", str(options.random_games),
               *(["--keep-model"] if options.keep_model else [])]  # fmt: skip
    if options.processes > 1:  # torchrun: a world of that many processes on this machine, each running `record`
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(options.processes)]
    # The run in a session of its own, and each Ctrl-C or SIGTERM this batch gets passed on to it: the terminal's Ctrl-C
    # (to this process group) and a `kill` of this process alone both reach the run once, which ends its way (a second
    # Ctrl-C kills it); a run left out would train on alone, and one in this group would get a group's signal twice.
    child = subprocess.Popen([*command, "--", *flags], start_new_session=True)
    stops = (signal.SIGINT, signal.SIGTERM)
    handlers = {signum: signal.signal(signum, lambda signum, frame: child.send_signal(signum)) for signum in stops}
    try:
        status = child.wait()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    status = 128 - status if status < 0 else status  # killed by a signal (a second Ctrl-C): as a shell reports it
    if status in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # the run was cut (here too, or only there): stop
        fail(f"interrupted in seed {seed}: records of finished seeds (and checkpoints) are kept; the same command "
             "goes on", status)  # fmt: skip
    return status


def run_batch(script, flags, options):
    seeds, out = options.seeds, options.out
    if any(flag == "--seed" or flag.startswith("--seed=") for flag in flags):
        fail("the seeds come from --seeds: leave --seed out of the script's flags")
    if min(seeds) < 0 or len(set(seeds)) < len(seeds):
        fail(f"--seeds must be distinct non-negative integers, got {' '.join(map(str, seeds))}")
    if options.checkpoint_every < 0:
        fail(f"--checkpoint-every must not be negative, got {options.checkpoint_every}")
    if options.random_games < 0:
        fail(f"--random-games must not be negative, got {options.random_games}")
    if options.processes < 1:
        fail(f"--processes must be positive, got {options.processes}")
    if options.processes > 1 and (options.checkpoint_every or options.keep_model):
        fail("--checkpoint-every and --keep-model are for a world of one: a world of processes is recorded at its end")
    variants = [flags]
    if options.also_bf16:
        if "--bf16" in flags:
            fail("--also-bf16 adds --bf16 to a second run of each seed: leave it out of the script's flags")
        if not describe_machine()["fast_bf16"]:
            fail(f"--also-bf16: this machine does not compute bf16 faster than fp32 ({FAST_BF16}): its --bf16 runs "
                 "would be fp32 runs")  # fmt: skip
        variants.append([*flags, "--bf16"])
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)

    others = {
        shlex.join(record["flags"])
        for record in map(read_record, sorted(out.glob("*.json")))
        if record and record["script"] == script.name and record["flags"] not in variants
    }
    for other in sorted(others):
        say(f"{out} also holds records of {script.name} with other flags ({other}): not taken for these")

    failed = []
    for seed, flags in ((seed, flags) for seed in seeds for flags in variants):  # fp32 and bf16 of a seed together
        label = f"seed {seed}" + (" --bf16" if flags is not variants[0] else "")
        path = out / record_name(script.stem, flags, seed, options.processes)
        if path.exists():
            record = read_record(path)
            this_run = (script.name, flags, seed, options.processes)
            if record is None or (record["script"], record["flags"], record["seed"], record["world_size"]) != this_run:
                fail(f"{path} is not the record of this run (seed {seed}): move it away to run the seed again")
            say(f"{label}: done before, skipped ({path})")
            continue
        command = [*launcher(options.processes), shown_path(script), *flags, "--seed", str(seed)]
        say(f"{label}: {shlex.join(command)}")
        status = run_child(script, seed, flags, path, options)
        if status == 2:
            sys.exit(2)  # the script refused its flags and said why: every seed would
        if status != 0 or not path.exists():
            failed.append(label)
            say(f"{label} failed (exit status {status}): no record")
        else:
            say(f"{label}: recorded in {path}")
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
        for path in sorted(folder.glob("*.json")):
            if path.name.startswith("."):  # an unfinished run's episodes so far
                continue
            record = read_record(path)
            if record is None:
                say(f"{path} is not a record of this tool: left out")
                continue
            record["folder"] = folder
            runs = panels.setdefault((record["algo"], record["env_id"]), {})
            seeds = runs.setdefault((record["script_path"], tuple(record["flags"]), record["world_size"]), [])
            twice = [other["folder"] for other in seeds if other["seed"] == record["seed"]]
            if twice:
                name = run_name(record["script_path"], record["flags"], record["world_size"])
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
    ends, returns = np.array([episode[:2] for episode in episodes], dtype=float).reshape(-1, 2).T
    sums = np.concatenate([[0.0], np.cumsum(returns)])
    done = np.searchsorted(ends, steps, side="right")
    first = np.maximum(done - count, 0)
    with np.errstate(invalid="ignore"):
        return (sums[done] - sums[first]) / (done - first)


def in_leanrl(script_path):
    """Whether a record's script is one of leanrl/ (shown by name) rather than another file (shown by its path)."""
    return Path(script_path).parent == Path("leanrl")


def run_name(script_path, flags, world_size):
    """A script of leanrl/ by its file name; any other (a modified copy, say) by its path, so the two differ; a world
    of several processes by its torchrun launch."""
    script = Path(script_path).name if in_leanrl(script_path) else str(script_path)
    torchrun = launcher(world_size) if world_size > 1 else []
    return shlex.join([*torchrun, script, *flags])


def random_policy(runs):
    """The random policy's scores recorded beside a panel's runs (Atari games)."""
    return [score for records in runs.values() for record in records for score in record["random_policy_returns"] or []]


def timed(record):
    """Whether every episode of a record carries the wall-clock seconds it ended at (records written before the tool
    recorded them, and runs begun before and resumed after, do not)."""
    return all(len(episode) > 2 for episode in record["episodes"])


def time_curve(episodes, count):
    """A seed's curve against wall-clock time: at each episode's end, its seconds and the mean return of the last
    `count` episodes by then (of fewer before `count` have ended, as on the steps axes)."""
    _, returns, seconds = np.array([episode[:3] for episode in episodes], dtype=float).reshape(-1, 3).T
    sums = np.concatenate([[0.0], np.cumsum(returns)])
    done = np.arange(1, len(returns) + 1)
    first = np.maximum(done - count, 0)
    return seconds, (sums[done] - sums[first]) / (done - first)


def time_unit(runs):
    """(seconds per unit, unit) of a panel's time axis: hours where its longest run with times lasts over 2 hours,
    minutes otherwise."""
    longest = max(
        (record["wall_seconds"] for records in runs.values() for record in records if timed(record)), default=0
    )
    return (3600, "hours") if longest > 2 * 3600 else (60, "minutes")


def steps_axes(ax, algo, env_id, runs, window, reach):
    """Return against env steps: a curve per run (the mean over seeds, a band of one std), the published figures as
    points, the random policy's mean score as a dashed line."""
    for color, (run, records) in zip(COLORS, runs.items(), strict=False):
        grid = np.linspace(0, min(record["steps"] for record in records), 400)
        curves = np.array([recent_means(record["episodes"], grid, window) for record in records])
        mean, spread = curves.mean(axis=0), curves.std(axis=0)
        seeds = ", ".join(str(record["seed"]) for record in records)
        label = f"{run_name(*run)} (seed{'s' * (len(records) > 1)} {seeds})"
        if any(record["steps"] < record["total_timesteps"] for record in records):
            label += ", in progress"
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
    scores = random_policy(runs)
    if scores:
        ax.axhline(np.mean(scores), color="tab:red", ls="--", label=f"random policy ({len(scores)} games)")
    if reach is not None:
        ax.axhline(reach, color="tab:green", ls=":", label=f"--reach {reach:g}")
    ax.set_title(f"{algo} on {env_id}")
    ax.set_xlabel("environment steps (all envs)")
    ax.set_ylabel("episode return")
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14))  # below: the curves stay visible


def time_axes(ax, algo, env_id, runs, window, reach):
    """Return against wall-clock time: a curve per seed, in its run's colour (seeds end at different times, so they
    are not averaged); a record without times is left out, and a legend line says which."""
    ax.set_title(f"{algo} on {env_id}, against wall-clock time")
    for run, records in runs.items():
        untimed = [str(record["seed"]) for record in records if not timed(record)]
        if untimed:
            label = f"left out, no wall-clock times recorded: {run_name(*run)} (seed{'s' * (len(untimed) > 1)} "
            ax.plot([], [], " ", label=textwrap.fill(f"{label}{', '.join(untimed)})", 100))
    if not any(timed(record) for records in runs.values() for record in records):
        ax.text(0.5, 0.5, "no record here has wall-clock times", transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14))
        return
    per_unit, unit = time_unit(runs)
    for color, records in zip(COLORS, runs.values(), strict=False):
        for record in filter(timed, records):
            seconds, means = time_curve(record["episodes"], window)
            ax.plot(seconds / per_unit, means, color=color, linewidth=1, drawstyle="steps-post")  # as on the left
    scores = random_policy(runs)
    if scores:
        ax.axhline(np.mean(scores), color="tab:red", ls="--", label=f"random policy ({len(scores)} games)")
    if reach is not None:
        ax.axhline(reach, color="tab:green", ls=":", label=f"--reach {reach:g}")
    ax.set_xlim(left=0)
    ax.set_xlabel(f"wall-clock time of the run ({unit}), earlier sittings included")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14))


def figure(panels, window, reach=None):
    """A row per (algorithm, env): its return against env steps, and beside it against wall-clock time."""
    fig, axes = plt.subplots(len(panels), 2, figsize=(14, 6 * len(panels)), squeeze=False, layout="constrained")
    for (left, right), ((algo, env_id), runs) in zip(axes, panels.items(), strict=True):
        steps_axes(left, algo, env_id, runs, window, reach)
        time_axes(right, algo, env_id, runs, window, reach)
    fig.suptitle(
        f"Return of training episodes, per seed the mean of the last {window}; left: against env steps, line, mean "
        "over seeds; band, ± 1 std; points: published figures, ± 1 std over their seeds\n"
        "right: against wall-clock time, a line per seed, in its run's colour on the left",
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


def first_reach(record, value, count):
    """(env step, seconds) at the end of the first episode at which the mean return of the last `count` episodes is
    `value` or more, counted once `count` episodes have ended; seconds None for a record without times; None if
    never."""
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
    """Per run and seed, the wall-clock minutes and env step at which it first reaches `value`, then their mean over
    the seeds."""
    lines = [row("run", "seed", "minutes", "env step"), "|---" * 4 + "|"]
    for run_key, records in runs.items():
        run = f"`{run_name(*run_key)}`"
        reaches = [first_reach(record, value, count) for record in records]
        for record, reach in zip(records, reaches, strict=True):
            if reach is None:
                end = f"not reached (run ends at {record['steps']:,} steps, {record['wall_seconds'] / 60:.1f} min)"
                lines.append(row(run, str(record["seed"]), end, "–"))
            else:
                minutes = "–" if reach[1] is None else f"{reach[1] / 60:.1f}"
                lines.append(row(run, str(record["seed"]), minutes, f"{reach[0]:,}"))
        if None in reaches:
            reaching = len(reaches) - reaches.count(None)
            lines.append(row(run, "mean", f"{reaching} of {len(reaches)} seeds reach it", "–"))
        else:
            seconds = [seconds for _, seconds in reaches]
            minutes = "–" if None in seconds else f"{np.mean(seconds) / 60:.1f}"
            lines.append(row(run, "mean", minutes, f"{np.mean([step for step, _ in reaches]):,.0f}"))
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
        if not lines:
            lines = [row("step", "run", "bf16, mean over seeds", "fp32 seeds", "band", "bf16 lies"), "|---" * 6 + "|"]
        sides = []  # per step: where bf16 lies against the band, None where that is not known yet
        for step in (budget // 2, budget):
            reached = min(record["steps"] for record in bf16 + fp32)
            bf16_values = [recent_means(record["episodes"], [step], window)[0] for record in bf16]
            fp32_values = [recent_means(record["episodes"], [step], window)[0] for record in fp32]
            if reached < step or any(map(math.isnan, bf16_values + fp32_values)):  # the words of ours() for these
                sides.append(None)
                why = f"not reached (runs end at {reached:,})" if reached < step else "no finished episode by then"
                lines.append(row(f"{step:,}", run, "–", "–", "–", why))
                continue
            margin = 0.1 * abs(np.mean(fp32_values))
            low, high, mean = min(fp32_values) - margin, max(fp32_values) + margin, np.mean(bf16_values)
            sides.append("inside" if low <= mean <= high else "above" if mean > high else "below")
            per_seed = ", ".join(f"{r['seed']}: {value:.1f}" for r, value in zip(fp32, fp32_values, strict=True))
            lines.append(
                row(f"{step:,}", run, f"{mean:.1f}", per_seed, f"{low:.1f} to {high:.1f}", f"{sides[-1]} the band")
            )
        if None in sides:
            verdict = "not decided yet"
        else:
            verdict = "**the same learning**" if sides == ["inside", "inside"] else "**not the same learning**"
        lines.append(row("verdict", run, "–", "–", "–", verdict))
    return lines


def run_command(script_path, flags, world_size, records):
    """The command that makes these records, all in one folder (a rerun skips them and runs any seed missing)."""
    threads = {record["omp_num_threads"] for record in records}
    prefix = f"OMP_NUM_THREADS={threads.pop()} " if len(threads) == 1 and None not in threads else ""
    script = Path(script_path).stem if in_leanrl(script_path) else script_path
    processes = f" --processes {world_size}" if world_size > 1 else ""
    seeds = " ".join(str(record["seed"]) for record in records)
    command = f"{prefix}python {TOOL} run --script {script}{processes} --seeds {seeds}"
    command += f" --out {shown_path(records[0]['folder'])}"
    return command + (f" -- {shlex.join(flags)}" if flags else "")


def row(*cells):
    return "| " + " | ".join(cells) + " |"


def table(panels, window, image, plot_command, reach=None):
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
    if reach is not None:
        lines += [
            f"When the return reaches {reach:g}: per seed, the wall-clock minutes of the run (compile time and earlier "
            "sittings of a resumed run included) and the env step at the end of the first training episode at which "
            f"the mean return of the last {window} is {reach:g} or more, then their mean over seeds. A record written "
            "before the tool recorded times gives the step only.",
            "",
        ]
    for (algo, env_id), runs in panels.items():
        published = references(algo, env_id)
        lines += [f"## {algo} on {env_id}", ""]
        lines += [
            row("step", "run", "ours", "per seed", "ours averages", "published", "kind", "source"),
            "|---" * 8 + "|",
        ]
        for run_key, records in runs.items():
            run = f"`{run_name(*run_key)}`"
            for reference in published:
                count = reference.last_episodes or window
                cells = [f"{reference.step:,}", run, *ours(records, reference.step, count), f"last {count} episodes"]
                cells += [f"{reference.value:g} ± {reference.spread:g} ({reference.seeds} seeds)", reference.kind]
                lines.append(row(*cells, f"{reference.details}, {reference.env_id}"))
            budget, reached = records[0]["total_timesteps"], min(record["steps"] for record in records)
            end = min(budget, reached)  # a run in progress: as far as it has got
            if end not in {reference.step for reference in published}:
                step = f"{end:,} (end)" if end == budget else f"{end:,} (in progress, of {budget:,})"
                cells = [step, run, *ours(records, end, window), f"last {window} episodes"]
                lines.append(row(*cells, "–", "–", "–"))
        versions = sorted({reference.env_id for reference in published} - {env_id})
        if versions:
            lines += ["", f"The published figures are on {', '.join(versions)}; ours on {env_id}."]
        scores = random_policy(runs)
        if scores:
            lines += ["", f"A uniformly random policy scores {np.mean(scores):.2f} over {len(scores)} games."]
        if reach is not None:
            lines += [
                "",
                f"### {algo} on {env_id}: when the return reaches {reach:g}",
                "",
                *reach_rows(runs, reach, window),
            ]
        bf16 = bf16_rows(runs, window)
        if bf16:
            lines += [
                "",
                f"### {algo} on {env_id}: --bf16 against fp32",
                "",
                f"bf16's mean over seeds of the mean return of the last {window} episodes, at half the budget and at "
                "its end, against the band written down before any comparison was run: the fp32 seeds' range widened "
                "by 10% of their mean on each side. In the band at both steps: the same learning, by that rule (a few "
                "seeds: a hint at a difference, not a proof of none).",
                "",
                *bf16,
            ]
        lines.append("")

    lines += ["## Commands", ""]
    for runs in panels.values():
        for run_key, records in runs.items():
            folders = {}
            for record in records:
                folders.setdefault(record["folder"], []).append(record)
            for in_folder in folders.values():
                hours = ", ".join(f"{record['wall_seconds'] / 3600:.2f}" for record in in_folder)
                machines = "; ".join(sorted({machine_text(record["machine"]) for record in in_folder}))
                torch_versions = ", ".join(sorted({record["machine"]["torch"] for record in in_folder}))
                lines.append(
                    f"- `{run_command(*run_key, in_folder)}`: runs of {hours} h on {machines}, torch {torch_versions}"
                )
    lines += [f"- `{plot_command}`: this table and the plot", ""]
    return "\n".join(lines)


def plot(folders, out, window, reach):
    panels = read_folders(folders)
    fig = figure(panels, window, reach)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    plot_command = f"python {TOOL} plot {shlex.join(sys.argv[2:])}"
    out.with_suffix(".md").write_text(table(panels, window, out.name, plot_command, reach))
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
    one = commands.add_parser("record", help="one run in this process (what run starts per seed)")
    one.add_argument("--script", required=True)
    one.add_argument("--seed", type=int, required=True)
    one.add_argument("--out", type=Path, required=True, help="the record's file")
    one.add_argument("--checkpoint-every", type=int, default=0)
    one.add_argument("--keep-model", action="store_true")
    one.add_argument("--random-games", type=int, default=100)
    draw = commands.add_parser("plot", help="curves and table from the records of one or more folders")
    draw.add_argument("folders", type=Path, nargs="+")
    draw.add_argument("--out", type=Path, help="the PNG, the table beside it (default: FIRST_FOLDER/curves.png)")
    draw.add_argument("--window", type=int, default=20, help="training episodes averaged per point (default 20)")
    draw.add_argument(
        "--reach", type=float, help="a return: the table gives the minutes and steps each run takes to it"
    )
    args = parser.parse_args(argv)

    if args.command == "run":
        run_batch(script_file(args.script), flags, args)
    elif args.command == "record":
        record_run(script_file(args.script), flags, args)
    else:
        if flags:
            fail("plot takes no script flags")
        if args.window <= 0:
            fail(f"--window must be positive, got {args.window}")
        if args.reach is not None and not math.isfinite(args.reach):
            fail(f"--reach must be a finite return, got {args.reach}")
        plot(args.folders, args.out or args.folders[0] / "curves.png", args.window, args.reach)


if __name__ == "__main__":
    main()
