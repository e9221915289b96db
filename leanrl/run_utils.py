# What every leanrl script does the same way, whatever its algorithm; the algorithms are in the scripts. Sections: the
# flags; a run (Run: checks, device, checkpoints, signals, progress, the end); outputs and their failed writes; random
# generators; evaluation; devices. What the twins add is in twin_utils.py.
import atexit
import contextlib
import importlib.util
import json
import os
import random
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, fields

import numpy as np
import torch
import tqdm


# --- The flags --------------------------------------------------------------------------------------------------------
@dataclass
class RunArgs:
    """The flags every script has. A script's Args adds its hyper-parameters and sets exp_name, env_id and
    total_timesteps (and any of these whose default or help is its own)."""

    exp_name: str = ""
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    env_id: str = ""
    """the id of the environment"""
    total_timesteps: int = 0
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """training iterations after learning starts that are left out of the sps measure (compile, warm-up)"""
    results_path: str | None = None
    """if set, append one JSON line with this run's results to this file"""
    save_model: bool = False
    """if toggled, save a checkpoint at the end of training (and at an interruption), then evaluate it"""
    model_path: str | None = None
    """the checkpoint's path (default: --resume's, else <exp_name>.pt in runs/<env_id>__<exp_name>__<seed>__<time>/)"""
    checkpoint_every: int = 0
    """with --save-model, also save the checkpoint every this many env steps (0: only at the end)"""
    resume: str | None = None
    """continue the run saved in this checkpoint; --total-timesteps counts the steps of the whole run (a script whose
    schedule, a learning-rate anneal or an epsilon decay, is computed from it refuses a budget other than the run's)"""
    eval_episodes: int = 10
    """episodes of the saved agent's policy on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation episodes as MP4 files in a videos/ folder beside the checkpoint"""
    episodes_path: str | None = None
    """if set, write each training episode as a JSON line [step, return, seconds of the run] to this file (a resumed
    run keeps the lines up to its checkpoint's step)"""


# The domains of the numeric flags every script has (a seed: what numpy, torch and the envs all accept).
RUN_DOMAINS = {"seed": "[0, 2147483647]", "total_timesteps": ">= 1", "measure_burnin": ">= 0",
               "checkpoint_every": ">= 0", "eval_episodes": ">= 0"}  # fmt: skip


def check_domains(args, domains):
    """Before anything is made: each numeric flag in its domain, or a line and exit 2. None (--target-kl) passes."""
    for name, domain in {**RUN_DOMAINS, **domains}.items():
        value = getattr(args, name)
        if value is not None and not in_domain(value, domain):
            where = f"in {domain}" if domain[0] in "[(" else domain
            exit_with_error(f"--{name.replace('_', '-')} must be {where}, got {value}")


def in_domain(value, domain):
    """Whether value lies in the domain "> a", ">= a" or an interval such as "[a, b)"."""
    low, high, low_closed, high_closed = domain_bounds(domain)
    return (low <= value if low_closed else low < value) and (value <= high if high_closed else value < high)


def domain_bounds(domain):
    """(low, high, low_closed, high_closed) of a domain."""
    if domain.startswith(">"):
        return float(domain.lstrip(">=")), float("inf"), domain.startswith(">="), False
    low, high = map(float, domain[1:-1].split(","))
    return low, high, domain[0] == "[", domain[-1] == "]"


# --- A run ------------------------------------------------------------------------------------------------------------
WRITE_FAILED = 74  # the exit status of a run stopped by an output it could not write (sysexits.h's EX_IOERR)


class Run:
    """A training run's mechanics around a script's loop. Made before the first step, it checks the flags and outputs,
    loads the checkpoint to resume (run.checkpoint, else None), picks run.device, seeds, and turns Ctrl-C and SIGTERM
    into run.stop_signals. The loop calls clock(), episode(), log() and checkpoint_due(), ends after the step where
    run.stopping, then calls finish(). schedule: what the script computes from --total-timesteps, if anything."""

    def __init__(self, args, *, script, algo, name, total_steps, make_eval_env, unit="episodes", schedule=None,
                 ended_early="within measure_burnin iterations", distributed=False):  # fmt: skip
        self.start = time.perf_counter()
        self.args, self.script, self.algo, self.name = args, os.path.basename(script), algo, name
        self.total_steps, self.make_eval_env, self.unit = total_steps, make_eval_env, unit
        self.schedule, self.ended_early, self.distributed = schedule, ended_early, distributed
        # The fields a script's Args adds, but the twins' speed flags: what makes the agent, which --resume keeps.
        not_the_agents = {field.name for field in fields(RunArgs)} | {"compile", "cudagraphs", "bf16"}
        self.hyperparameters = [field.name for field in fields(args) if field.name not in not_the_agents]
        self.rank, self.world_size, local_world_size = world()
        self.check_flags()
        self.device = self.pick_device(local_world_size)
        self.checkpoint = self.load_checkpoint(args.resume) if args.resume else None
        default_path = f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}/{args.exp_name}.pt"
        self.model_path = args.model_path or args.resume or default_path
        self.video_folder = os.path.join(os.path.dirname(self.model_path), "videos")
        if self.rank == 0:  # every output the run writes (rank 0 writes them all) is writable before the first step
            outputs = {"checkpoint": self.model_path if args.save_model else None, "results file": args.results_path,
                       "video": os.path.join(self.video_folder, "eval-episode-0.mp4") if args.capture_video else None,
                       "episode record": args.episodes_path}  # fmt: skip
            for what, path in outputs.items():
                if path:
                    check_writable(path, what)
        for seed in (random.seed, np.random.seed, torch.manual_seed):  # each rank draws its own actions and batches
            seed(args.seed + self.rank)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        self.episode_returns = []
        self.recent_returns = deque(self.checkpoint["recent_returns"] if self.checkpoint else [], maxlen=20)
        # The checkpoint on disk and its step; the seconds of a resumed run's earlier sittings (the record's clock).
        self.saved = (args.resume, self.checkpoint["global_step"]) if self.checkpoint else (None, None)
        self.seconds_before = self.checkpoint.get("run_seconds", 0.0) if self.checkpoint else 0.0
        self.failed_writes = {}  # what -> "cannot write the <what> <path>: <reason>", for each output that failed
        if args.episodes_path and self.rank == 0:
            self.start_episode_record()
        self.wandb = importlib.import_module("wandb") if args.track and self.rank == 0 else None
        if self.wandb:
            self.wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args),
                            name=args.exp_name)  # fmt: skip
        self.stop_signals = []  # the signals received, which end the loop
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)
        self.pbar = None  # made by the loop's first clock()
        self.train_start = self.measure_start = self.measure_start_step = self.sps = self.compile_seconds = None

    def check_flags(self):
        """What the domains do not say; what --capture-video needs, checked before training rather than after."""
        args = self.args
        if (args.checkpoint_every or args.capture_video) and not args.save_model:
            exit_with_error("--checkpoint-every and --capture-video need --save-model")
        if args.capture_video and not args.eval_episodes:
            exit_with_error("--capture-video records the evaluation episodes: --eval-episodes must be positive")
        if not args.capture_video:
            return
        if importlib.util.find_spec("imageio_ffmpeg") is None:
            exit_with_error("--capture-video writes MP4 through imageio-ffmpeg: pip install imageio-ffmpeg")
        if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
            # No screen: MuJoCo renders off-screen (a GPU's EGL, or Mesa's), pygame (classic control) to memory.
            os.environ.setdefault("MUJOCO_GL", "egl")
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        env = self.make_eval_env(0, "rgb_array")
        try:
            env.reset(seed=0)
            frame = env.render()
        except Exception as error:  # MuJoCo raises several types when no OpenGL context can be made
            exit_with_error(f"{args.env_id} cannot render here: {error} "
                            "(headless MuJoCo needs MUJOCO_GL=egl or osmesa)")  # fmt: skip
        finally:
            env.close()
        if frame is None:
            exit_with_error(f"{args.env_id} renders no image, so there is nothing to record")

    def pick_device(self, local_world_size):
        """CUDA when there is one and --cuda, else the CPU; a twin's --cudagraphs or --bf16 that the device cannot
        use: one line, and it is off."""
        use_cuda = torch.cuda.is_available() and self.args.cuda
        if self.distributed and use_cuda and local_world_size > torch.cuda.device_count():  # NCCL: one rank per GPU
            exit_with_error(f"this machine has {torch.cuda.device_count()} GPU(s), too few for {local_world_size} "
                            "processes: start at most one per GPU (--nproc-per-node), "
                            "or run on the CPU with --no-cuda")  # fmt: skip
        cuda = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if self.distributed else "cuda"  # a GPU per rank
        device = torch.device(cuda if use_cuda else "cpu")
        if use_cuda and self.distributed:
            torch.cuda.set_device(device)
        if getattr(self.args, "cudagraphs", False) and not use_cuda:
            print(f"{self.script}: --cudagraphs needs a CUDA device; cudagraphs are off for this run", file=sys.stderr)
            self.args.cudagraphs = False
        if getattr(self.args, "bf16", False) and not fast_bf16(device):
            print(f"{self.script}: --bf16 needs a device that computes bf16 faster than fp32 (a CUDA GPU of compute "
                  f"capability 8+, a CPU with AMX, an AMD CPU with AVX512-BF16), which {device} is not; bf16 is off "
                  "for this run", file=sys.stderr)  # fmt: skip
            self.args.bf16 = False
        return device

    def load_checkpoint(self, path):
        """A checkpoint of this run (algorithm, env, seed and hyper-parameters), or one line and exit status 2."""
        args = self.args
        if not os.path.isfile(path):
            exit_with_error(f"no checkpoint at {path}")
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # a CUDA run resumes on a CPU too
        except Exception as error:  # truncated, corrupt, or not a torch file at all: each raises its own type
            exit_with_error(f"cannot read the checkpoint {path}: {str(error).splitlines()[0]}")
        if not isinstance(checkpoint, dict) or checkpoint.get("algo") != self.algo:
            found = checkpoint.get("algo") if isinstance(checkpoint, dict) else type(checkpoint).__name__
            exit_with_error(f"{path} is not a {self.name} checkpoint (it holds {found})")
        if (checkpoint["env_id"], checkpoint["seed"]) != (args.env_id, args.seed):
            exit_with_error(f"{path} is a run on {checkpoint['env_id']} with seed {checkpoint['seed']}, "
                            f"not on {args.env_id} with seed {args.seed}")  # fmt: skip
        # A hyper-parameter newer than the checkpoint was at its default (the flag did not exist).
        defaults = {field.name: field.default for field in fields(args)}
        saved = {**{name: defaults[name] for name in self.hyperparameters}, **checkpoint["hyperparameters"]}
        changed = [f"--{name.replace('_', '-')} {value} (checkpoint) vs {getattr(args, name)}"
                   for name, value in saved.items() if getattr(args, name) != value]  # fmt: skip
        if changed:
            exit_with_error(f"{path} was made with other hyper-parameters: {', '.join(changed)}")
        # Under another budget a schedule computed from it would jump mid-run, and an anneal past it go negative.
        budget = checkpoint.get("total_timesteps")
        if self.schedule and budget is not None and budget != args.total_timesteps:
            exit_with_error(f"{path} is a run of --total-timesteps {budget}, from which {self.schedule} is computed: "
                            f"resume it with --total-timesteps {budget} (or start a new run)")  # fmt: skip
        if self.schedule and budget is None and self.rank == 0:  # written before checkpoints held their budget
            print(f"{self.script}: {path} does not say its --total-timesteps; {self.schedule} is computed from "
                  f"{args.total_timesteps} from here on", file=sys.stderr)  # fmt: skip
        return checkpoint

    def start_episode_record(self):
        """A new run's --episodes-path file is empty; a resumed run's keeps the episodes up to its checkpoint's step (a
        run killed after its checkpoint plays the steps after it again)."""
        path, kept = self.args.episodes_path, []
        if self.checkpoint and os.path.exists(path):
            with open(path) as file:
                for line in file:
                    with contextlib.suppress(ValueError):  # a line cut by a kill or a full disk ends the record
                        if json.loads(line)[0] <= self.checkpoint["global_step"]:
                            kept.append(line)
        try:
            write_atomically(path, "".join(kept).encode())
        except OSError as error:
            exit_with_error(failed_write_message("episode record", path, error))

    def on_signal(self, signum, frame):
        """Ctrl-C or SIGTERM: the run ends after this step. A second one is the user's "now": the default handlers,
        which kill; but under torchrun, which passes a signal on to workers that may have had it already."""
        self.stop_signals.append(signum)
        for stop in (signal.SIGINT, signal.SIGTERM) if "RANK" not in os.environ else ():
            signal.signal(stop, signal.SIG_DFL)

    @property
    def stopping(self):
        """Whether the loop ends after this step: a signal came, or an output could not be written."""
        return bool(self.stop_signals or self.failed_writes)

    def seconds(self):
        return self.seconds_before + time.perf_counter() - self.start  # every sitting of a resumed run

    def clock(self, iteration, *, train_from, measure_from, global_step):
        """Atop every iteration, global_step steps done: moves the bar, starts the warm-up (compile) clock at train_from
        and the sps clock at measure_from, in the loop's own unit."""
        self.move_bar(global_step)
        if self.train_start is None and iteration >= train_from:
            self.train_start = time.perf_counter()
        if self.measure_start is None and iteration >= measure_from:
            self.measure_start, self.measure_start_step = time.perf_counter(), global_step
            self.compile_seconds = self.measure_start - self.train_start

    def move_bar(self, global_step):
        if self.pbar is None:  # from where a resumed run starts
            self.pbar = tqdm.tqdm(total=self.total_steps, desc=self.script, mininterval=1.0, initial=global_step,
                                  disable=self.rank != 0)  # fmt: skip
            atexit.register(self.pbar.close)  # before teardown, where tqdm's __del__ fails (after an uncaught error)
        self.pbar.update(global_step - self.pbar.n)

    def episode(self, episode_return, step, **charts):
        """A finished episode's return, step the env steps done by its end (and charts to log beside it)."""
        self.episode_returns.append(episode_return)
        self.recent_returns.append(episode_return)
        path = self.args.episodes_path
        if path and self.rank == 0 and "episode record" not in self.failed_writes:  # a failed write is told once
            line = json.dumps([int(step), float(episode_return), round(self.seconds(), 3)])
            self.write("episode record", path, append_line, path, line)
        if self.wandb:
            charts = {f"charts/{name}": value for name, value in charts.items()}
            self.wandb.log({"charts/episodic_return": episode_return, **charts}, step=step)

    def log(self, global_step, losses, charts=None):
        """The losses (a non-finite one stops the run), sps and recent return beside the bar, and wandb."""
        logs = {name: value.item() for name, value in losses.items()}
        for name, value in logs.items():
            if not np.isfinite(value):
                self.pbar.close()
                if self.rank == 0:  # the losses of a distributed run are global: every rank stops here
                    print(f"{self.script}: error: {name} is {value} at step {global_step}; stopping the run",
                          file=sys.stderr)  # fmt: skip
                sys.exit(1)
        self.update_sps(global_step)
        mean_return = np.mean(self.recent_returns) if self.recent_returns else float("nan")
        self.pbar.set_postfix(sps=f"{self.sps or 0:.0f}", ret=f"{mean_return:.1f}", refresh=False)
        if self.wandb:
            charts = {name: float(value) for name, value in (charts or {}).items()}
            self.wandb.log({**{f"losses/{k}": v for k, v in logs.items()}, **charts}, step=global_step)

    def update_sps(self, global_step):
        if self.measure_start is not None and global_step > self.measure_start_step:
            self.sps = (global_step - self.measure_start_step) / (time.perf_counter() - self.measure_start)

    def checkpoint_due(self, global_step, steps_per_iteration=1):
        """With --checkpoint-every: whether this iteration crossed a multiple of it (not the last: the end saves)."""
        every = self.args.checkpoint_every
        crossed = every and global_step // every > (global_step - steps_per_iteration) // every
        return bool(crossed) and global_step < self.total_steps

    def save_checkpoint(self, **agent):
        """The script's agent entries with the run's identity, recent returns, seconds and RNG state (an agent entry
        overrides one of the run's), written atomically."""
        checkpoint = {
            "algo": self.algo,
            "env_id": self.args.env_id,
            "seed": self.args.seed,
            "hyperparameters": {name: getattr(self.args, name) for name in self.hyperparameters},
            "total_timesteps": self.args.total_timesteps,
            "run_seconds": self.seconds(),
            "recent_returns": list(self.recent_returns),
            **agent,
        }
        checkpoint.setdefault("rng", rng_state())  # a distributed run's comes from every rank, gathered by the script
        if self.write("checkpoint", self.model_path, write_atomically, self.model_path, checkpoint):
            self.saved = (self.model_path, agent["global_step"])

    def write(self, what, path, write, *args):
        """write(*args); True, or False where it fails (a full disk, a mount gone read-only or away): the run then
        ends as at a signal, after this step, and finish() says in one line what could not be written."""
        try:
            write(*args)
            return True
        except OSError as error:
            self.failed_writes[what] = failed_write_message(what, path, error)
            return False

    def finish(self, global_step, save_checkpoint, make_policy):
        """The end of a run: with --save-model, save_checkpoint() (unless this step's is written, or a checkpoint
        failed) and the evaluation of make_policy(checkpoint, env, device) -> act; then the results line and summary.
        A signal cuts the training or the evaluation, never a write under way; a failed write stops both. "cut", the
        summary and the exit status say which: 128 + the signal, WRITE_FAILED; 0 when nothing was cut."""
        self.move_bar(global_step)
        self.pbar.close()
        self.update_sps(global_step)
        end = time.perf_counter()
        saved_or_failed = self.saved == (self.model_path, global_step) or "checkpoint" in self.failed_writes
        if self.args.save_model and not saved_or_failed:
            save_checkpoint()
        evaluates = self.args.save_model and self.args.eval_episodes and self.rank == 0
        eval_return = self.evaluate(make_policy) if evaluates and not self.stopping else None
        cut = "training" if global_step < self.total_steps else None  # only a stop ends the loop early
        if not cut and evaluates and eval_return is None:  # the evaluation was stopped, or never started
            cut = "evaluation"
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        if self.rank == 0:  # rank 0 alone writes the results and says what was cut
            results = self.results(global_step, end, cut, eval_return)
            if self.args.results_path:
                self.write("results line", self.args.results_path, append_line, self.args.results_path,
                           json.dumps(results))  # fmt: skip
            if self.wandb:
                self.wandb.log({"charts/sps": self.sps, "charts/eval_return": eval_return}, step=global_step)
                self.wandb.finish()
            print(self.summary(global_step, cut, results))
            intact = f"the checkpoint of step {self.saved[1]}, {self.saved[0]}" if self.saved[0] else "no checkpoint"
            for message in self.failed_writes.values():
                print(f"{self.script}: error: {message}; the run stopped at step {global_step}; intact: {intact}",
                      file=sys.stderr)  # fmt: skip
        # Nothing is left to cut: a signal must not kill the process now, or its exit status would say the run was cut.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        if self.failed_writes:
            sys.exit(WRITE_FAILED)
        if cut:
            sys.exit(128 + self.stop_signals[0])
        if self.stop_signals and self.rank == 0:
            print(f"{self.script}: {self.cause()} received as the run ended: nothing was cut", file=sys.stderr)

    def evaluate(self, make_policy):
        """The saved agent's mean return over --eval-episodes on a fresh env (None if a signal or a video's failed
        write stops it), from the checkpoint on disk: what a user who loads it gets."""
        video_folder = self.video_folder if self.args.capture_video else None
        seed = self.args.seed + EVAL_SEED_OFFSET
        env = self.make_eval_env(seed, "rgb_array" if video_folder else None)
        act = make_policy(torch.load(self.model_path, map_location="cpu", weights_only=True), env, self.device)
        try:
            return evaluate(env, act, self.args.eval_episodes, seed, video_folder, self.stop_signals)
        except OSError as error:  # evaluate() writes only the videos
            self.failed_writes["video"] = failed_write_message("video", error.filename, error)

    def results(self, global_step, end, cut, eval_return):
        """The results line: what ran where, how fast, how it ended, and what it returns."""
        args = self.args
        return {
            "script": self.script,
            "algo": self.algo + ("_distributed" if self.distributed else ""),
            "env_id": args.env_id,
            "seed": args.seed,
            **{flag: getattr(args, flag, False) for flag in ("compile", "cudagraphs", "bf16")},  # the twins' flags
            "device": str(self.device),
            "torch_version": torch.__version__,
            "total_timesteps": self.total_steps,
            "sps": self.sps,
            "compile_seconds": self.compile_seconds,
            "wall_seconds": end - self.start,
            "final_return": float(np.mean(self.recent_returns)) if self.recent_returns else None,
            "steps_done": global_step,
            "interrupted": cut is not None or bool(self.failed_writes),
            "cut": cut,
            "failed_write": next(iter(self.failed_writes.values()), None),
            "eval_return": eval_return,
            "model_path": self.model_path if args.save_model else None,
            **({"world_size": self.world_size} if self.distributed else {}),
        }

    def summary(self, global_step, cut, results):
        """The run's last line on stdout."""
        sps, final_return, eval_return = results["sps"], results["final_return"], results["eval_return"]
        sps_text = f"{sps:.0f} sps (steady state{', all ranks' if self.distributed else ''})" if sps else (
            f"sps not measured (run ended {self.ended_early})")  # fmt: skip
        return_text = f"{final_return:.1f}" if final_return is not None else "n/a (no finished episode)"
        done_text = f"{global_step} steps"
        if cut == "training":
            done_text = f"interrupted by {self.cause()} at step {global_step} of {self.total_steps}"
        processes = f" by {self.world_size} process(es)" if self.distributed else ""
        summary = f"{self.script}: {done_text} on {self.args.env_id}{processes}, {sps_text}, final return {return_text}"
        if self.args.save_model:
            summary += f"; checkpoint {self.saved[0] or 'not written'}"
            if eval_return is not None:
                summary += f", eval return {eval_return:.1f} over {self.args.eval_episodes} {self.unit}"
            if cut == "evaluation":
                summary += f", evaluation cut by {self.cause()}"
                summary += "" if self.failed_writes else " (--resume the checkpoint to evaluate it)"
        return summary

    def cause(self):
        """What stopped the run: a failed write, else the first signal."""
        return "a failed write" if self.failed_writes else signal.Signals(self.stop_signals[0]).name


# --- Outputs ----------------------------------------------------------------------------------------------------------
def exit_with_error(message):
    """A user's mistake: one line on stderr, exit status 2, no traceback. Under torchrun every rank finds it, rank 0
    says it and torchrun stops the others, which wait (a mistake only another rank sees it says 30 s later)."""
    rank = world()[0]
    if rank != 0:
        time.sleep(30)
    print(f"{os.path.basename(sys.argv[0])}: {f'rank {rank}: ' if rank else ''}error: {message}", file=sys.stderr)
    sys.exit(2)


def failed_write_message(what, path, error):
    return f"cannot write the {what} {path}: {error.strerror or str(error).splitlines()[0]}"


def check_writable(path, what):
    """Before the first step: a run that cannot write an output stops now, not after hours of training."""
    folder = existing = os.path.dirname(os.path.abspath(path))
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path} is a directory")
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise NotADirectoryError(f"{existing} is a file, not a folder")
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".leanrl-write-test-{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as error:
        exit_with_error(failed_write_message(what, path, error))


def write_atomically(path, content):
    """content (bytes, or an object for torch.save) to a temporary file renamed over path: a crash or a failed write
    leaves the file as it was, and no temporary file. Through a Python file, so that a failed write raises the
    system's error (torch.save to a path raises its own, which does not say why)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # again, if a cleanup removed the folder
    temp = path + ".tmp"
    try:
        with open(temp, "wb") as file:
            file.write(content) if isinstance(content, bytes) else torch.save(content, file)
        os.replace(temp, path)
    except (OSError, RuntimeError) as error:  # torch.save's zip writer may raise its own error over the file's
        with contextlib.suppress(OSError):
            os.remove(temp)
        cause = error
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__context__
        raise cause or error from None


def append_line(path, line):
    """line at the end of the file at path; a failed write leaves the file as it was, with no half line."""
    size = os.path.getsize(path) if os.path.exists(path) else None
    try:
        with open(path, "a") as file:
            file.write(line + "\n")
    except OSError:
        with contextlib.suppress(OSError):
            os.truncate(path, size) if size is not None else os.remove(path)
        raise


# --- Random generators ------------------------------------------------------------------------------------------------
def rng_state():
    """The state of every random generator the run draws from (the envs' are reseeded on resume)."""
    numpy_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1]), *numpy_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and len(state["cuda"]) == torch.cuda.device_count():  # a CUDA run resumed on a CPU skips it
        torch.cuda.set_rng_state_all(state["cuda"])


# --- Evaluation -------------------------------------------------------------------------------------------------------
EVAL_SEED_OFFSET = 10_000  # the evaluation env's seed is the run's plus this: episodes the agent never trained on


def evaluate(env, act, episodes, seed, video_folder, stop_signals):
    """The mean return of act(obs) -> action over this many episodes, None if a signal stops it first; env and torch
    seeded with seed (the run's generators left as they were), so it repeats. Video: an MP4 an episode; a write that
    fails raises its OSError, naming the file, and leaves no part of it."""
    import imageio  # only runs that record video need it, and they have it (Run.check_flags)

    returns = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        obs, _ = env.reset(seed=seed)
        while len(returns) < episodes and not stop_signals:
            episode_return, done, video = 0.0, False, None
            path = video_folder and f"{video_folder}/eval-episode-{len(returns)}.mp4"
            try:
                if path:  # macro_block_size 2: H.264 needs even sides only; the default (16) would resize frames
                    os.makedirs(video_folder, exist_ok=True)
                    video = imageio.get_writer(path, fps=env.metadata["render_fps"], macro_block_size=2)
                while not done and not stop_signals:
                    if video:
                        video.append_data(env.render())
                    obs, reward, terminated, truncated, info = env.step(act(obs))
                    episode_return += float(reward)
                    done = terminated or truncated
                if video:
                    video.close()
            except OSError as error:
                if not path:
                    raise
                with contextlib.suppress(OSError):
                    os.remove(path)
                error.filename = path
                raise
            if done:
                # An env that records its episodes (below a reward normalisation) knows the real return.
                returns.append(float(info["episode"]["r"]) if "episode" in info else episode_return)
                if len(returns) < episodes:  # a reset per episode: none after the last one
                    obs, _ = env.reset()
    env.close()
    return float(np.mean(returns)) if len(returns) == episodes else None


def make_gym_env(env_id, render_mode=None):
    """gym.make(env_id), render_mode only if asked for (an env that takes none still trains), without MuJoCo's (3.16+)
    warning, on stderr and in MUJOCO_LOG.TXT, that HalfCheetah's <compiler settotalmass> is deprecated."""
    import gymnasium as gym

    kwargs = {"render_mode": render_mode} if render_mode else {}
    if importlib.util.find_spec("mujoco") is None:  # gymnasium's MuJoCo envs need it; other envs (and users) need not
        return gym.make(env_id, **kwargs)
    import mujoco

    def warn(message):  # MuJoCo's other warnings, as it tells them: in its log file and on stderr
        if "'settotalmass' is deprecated" not in message:
            mujoco.mju_writeLog("WARNING", message)
            print(f"WARNING: {message}\n", file=sys.stderr)

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(warn)  # while this env is made: the warning comes as its XML is compiled
    try:
        return gym.make(env_id, **kwargs)
    finally:
        mujoco.set_mju_user_warning(previous)


class EvalGame:
    """A pool of one envpool Atari env played by evaluate() a game an episode, as CleanRL evaluates: on the training
    env (episodic life, clipped rewards), a game's return its real one over all lives. Video: what the agent sees."""

    metadata = {"render_fps": 15}  # the ALE's 60 frames a second, of which envpool keeps one in 4 (frame_skip=4)

    def __init__(self, envs):
        self.envs = envs

    def reset(self, seed=None):  # the pool was seeded when it was made
        self.obs, info = self.envs.reset()
        return self.obs, info

    def step(self, action):
        self.obs, _, _, truncations, infos = self.envs.step(action)
        # A lost life ends an episode but not the game: the env goes on to the next life, as in training.
        return self.obs, float(infos["reward"][0]), bool(infos["terminated"][0]), bool(truncations[0]), {}

    def render(self):  # envpool's Atari envs cannot render: the newest of the agent's 4 stacked 84x84 frames
        return self.obs[0, -1]

    def close(self):
        self.envs.close()


# --- Devices ----------------------------------------------------------------------------------------------------------
def world():
    """This process's rank, the number of processes and those on this machine (torchrun's variables; else 0, 1, 1)."""
    return tuple(int(os.environ.get(name, default)) for name, default in
                 (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1)))  # fmt: skip


def fast_bf16(device):
    """Whether the device computes bf16 faster than fp32, so that --bf16 pays (docs/speed_cpu.md): a CUDA GPU of
    compute capability 8 or more, a CPU with AMX, an AMD CPU with AVX512-BF16. An Intel CPU with AVX512-BF16 but no
    AMX computes bf16 no faster and pays the casts; elsewhere bf16 is emulated, 15x slower."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    amd_avx512_bf16 = torch.cpu._is_avx512_bf16_supported() and cpu_vendor() == "AuthenticAMD"
    return torch.cpu._is_amx_tile_supported() or amd_avx512_bf16


def cpu_vendor():
    """The CPU's maker as it names itself (GenuineIntel, AuthenticAMD), from Linux's /proc/cpuinfo; "" elsewhere."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")
    except OSError:
        return ""
