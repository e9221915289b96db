# What every leanrl script does the same way, whatever its algorithm: the flags and checks of a run, the one-line
# error exit, checkpoints with their refusals, random-generator state, Ctrl-C and SIGTERM, the progress bar and sps
# meter, the results line and summary, the evaluation episodes (an Atari game's too) and their video, and an
# ensemble's stacked state in the plain per-network layout. The algorithms, and everything about them, are in the scripts.
import ctypes
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

EVAL_SEED_OFFSET = 10_000  # the evaluation env's seed is the run's plus this: episodes the agent never trained on


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
    """the checkpoint's path (default: the --resume file, else runs/<env_id>__<exp_name>__<seed>__<time>/<exp_name>.pt)"""
    checkpoint_every: int = 0
    """with --save-model, also save the checkpoint every this many env steps (0: only at the end)"""
    resume: str | None = None
    """continue the run saved in this checkpoint; --total-timesteps counts the steps of the whole run (a script whose
    schedule, a learning-rate anneal or an epsilon decay, is computed from it refuses a budget other than the run's)"""
    eval_episodes: int = 10
    """episodes of the saved agent's policy on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation episodes as MP4 files in a videos/ folder beside the checkpoint"""


def world():
    """This process's rank, the number of processes and those on this machine, from torchrun's environment
    variables; a plain `python` launch is a world of one."""
    return tuple(int(os.environ.get(name, default)) for name, default in
                 (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1)))  # fmt: skip


def exit_with_error(message):
    """A user's mistake: one line on stderr, exit status 2, no traceback. Under torchrun every rank finds the same
    mistake: rank 0 says it and exits, torchrun names it as the rank that failed and stops the others, which wait
    for that (a mistake only another rank sees, such as a file missing on its machine, it says 30 s later)."""
    rank = world()[0]
    if rank != 0:
        time.sleep(30)
    print(f"{os.path.basename(sys.argv[0])}: {f'rank {rank}: ' if rank else ''}error: {message}", file=sys.stderr)
    sys.exit(2)


# The domains of the numeric flags every script has (a seed: what numpy, torch and the environments all accept); a
# script's DOMAINS gives those of its hyper-parameters.
RUN_DOMAINS = {"seed": "[0, 2**31)", "total_timesteps": ">= 1", "measure_burnin": ">= 0", "checkpoint_every": ">= 0",
               "eval_episodes": ">= 0"}  # fmt: skip


def domain_bounds(domain):
    """(low, high, low_closed, high_closed) of a domain written "> a" or ">= a", or as an interval "[a, b]" (open at
    either end); a bound is a number or a power ("2**31")."""

    def bound(text):
        base, _, power = text.strip().partition("**")
        return float(base) ** float(power or 1)

    if domain.startswith(">"):
        return bound(domain.lstrip(">=")), float("inf"), domain.startswith(">="), False
    low, high = map(bound, domain[1:-1].split(","))
    return low, high, domain[0] == "[", domain[-1] == "]"


def in_domain(value, domain):
    low, high, low_closed, high_closed = domain_bounds(domain)
    return (low <= value if low_closed else low < value) and (value <= high if high_closed else value < high)


def check_domains(args, domains):
    """Before anything is made: every numeric flag in its domain (RUN_DOMAINS and the script's), or one line naming the
    flag, its value and its domain, and exit status 2. An optional flag left at None (--target-kl) is not checked."""
    for name, domain in {**RUN_DOMAINS, **domains}.items():
        value = getattr(args, name)
        if value is not None and not in_domain(value, domain):
            where = f"in {domain}" if domain[0] in "[(" else domain
            exit_with_error(f"--{name.replace('_', '-')} must be {where}, got {value}")


def check_run_args(args):
    """The checks of the flags every script has that their domains do not say (check_domains comes first)."""
    if (args.checkpoint_every or args.capture_video) and not args.save_model:
        exit_with_error("--checkpoint-every and --capture-video need --save-model")
    if args.capture_video and not args.eval_episodes:
        exit_with_error("--capture-video records the evaluation episodes: --eval-episodes must be positive")


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
        with open(os.path.join(folder, f".leanrl-write-test-{os.getpid()}"), "w"):
            pass
        os.remove(os.path.join(folder, f".leanrl-write-test-{os.getpid()}"))
    except OSError as error:
        exit_with_error(f"cannot write the {what} {path}: {error.strerror or error}")


def check_video_recording(make_env, env_id):
    """--capture-video fails before training, not after it: the env must render and imageio must write MP4."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        exit_with_error("--capture-video writes MP4 through imageio-ffmpeg: pip install imageio-ffmpeg")
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        # No screen: MuJoCo renders off-screen (a GPU's EGL, or Mesa's), pygame (classic control) to memory.
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = make_env(render_mode="rgb_array")
    try:
        env.reset(seed=0)
        frame = env.render()
    except Exception as error:  # MuJoCo raises several types when no OpenGL context can be made
        exit_with_error(f"{env_id} cannot render here: {error} "
                        "(headless MuJoCo needs MUJOCO_GL=egl or osmesa)")  # fmt: skip
    finally:
        env.close()
    if frame is None:
        exit_with_error(f"{env_id} renders no image, so there is nothing to record")


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


def network_state(params):
    """One network's parameters held in a TensorDict, as the state_dict of its nn.Module."""
    return {key: value.clone() for key, value in params.flatten_keys(".").items()}


def load_network_state(params, state):
    """Put a state_dict into a network's parameters held in a TensorDict, in place."""
    from tensordict import TensorDict  # only the twins hold parameters in TensorDicts

    params.update_(TensorDict(state).unflatten_keys("."))


def optimizer_state(optimizer, members=1, **settings):
    """An optimizer's state_dict in the plain script's layout: its groups with these settings (the plain script's,
    where the twin's differ) and, over an ensemble's stacked parameters, the state of each member's parameters as
    its own entries, member after member, as for one optimizer over the members' separate parameters."""
    state = optimizer.state_dict()
    groups = [{**group, **settings} for group in state["param_groups"]]
    n = len(groups[0]["params"])
    if members > 1:
        state = {
            i * n + k: {name: value if name == "step" else value[i] for name, value in param_state.items()}
            for i in range(members)
            for k, param_state in state["state"].items()
        }
        groups[0]["params"] = list(range(members * n))
        return {"state": state, "param_groups": groups}
    return {**state, "param_groups": groups}


def load_optimizer_state(optimizer, state, members=1, **settings):
    """Load a state saved in the plain layout (see optimizer_state) into an optimizer of the twin's settings."""
    groups = [{**group, **settings} for group in state["param_groups"]]
    if members > 1:
        n = len(groups[0]["params"]) // members
        saved = state["state"]
        state = {
            k: {name: value if name == "step" else torch.stack([saved[i * n + k][name] for i in range(members)])
                for name, value in saved[k].items()}
            for k in range(n) if k in saved
        }  # fmt: skip
        groups = [{**group, "params": list(range(n))} for group in groups]
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    else:
        optimizer.load_state_dict({**state, "param_groups": groups})


def stop_on_signals():
    """Ctrl-C (SIGINT) and SIGTERM end the run after the current step or iteration instead of killing it: the list
    returned receives the signal's number. A second signal of the same kind stops the process at once, but under
    torchrun: it passes on to its workers the Ctrl-C the terminal sent them already, and kills them 30 s later."""
    received = []

    def handler(signum, frame):
        received.append(signum)
        if "RANK" not in os.environ:
            signal.signal(signum, signal.SIG_DFL)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
    return received


def report_lost_rank(kind, error, traceback):
    """sys.excepthook of a distributed run. An error raised in a collective of torch.distributed: another rank died
    or hung (gloo raises a RuntimeError, NCCL a DistError). One line instead of a traceback; torchrun's report names
    the rank that failed. Anything else: Python's usual traceback."""
    innermost = traceback
    while innermost.tb_next:
        innermost = innermost.tb_next
    if os.path.join("torch", "distributed", "") in innermost.tb_frame.f_code.co_filename:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else kind.__name__
        print(f"{os.path.basename(sys.argv[0])}: error: lost another rank: {first_line}", file=sys.stderr)
    else:
        sys.__excepthook__(kind, error, traceback)


def make_gym_env(env_id, render_mode=None):
    """gym.make(env_id), with render_mode only when one is asked for (an env that takes none still trains).

    MuJoCo (3.16 on) prints a deprecation warning, and appends it to MUJOCO_LOG.TXT in the working folder, each time it
    compiles a model whose XML sets <compiler settotalmass> (gymnasium's HalfCheetah does): one line per env made. Such
    an env is made from a copy of its XML without the attribute, and the compiled model then gets the same total mass
    the way MuJoCo's warning says (mj_setTotalmass, mj_setConst), plus the two statistics that only the compiler
    computes: the model is gymnasium's own bit for bit (tests/test_run_utils.py checks it), and MuJoCo is silent.
    Its other warnings are untouched. An env whose XML names other files is made as it is, warning and all."""
    import inspect
    import tempfile
    from xml.etree import ElementTree

    import gymnasium as gym

    kwargs = {"render_mode": render_mode} if render_mode else {}
    spec = gym.spec(env_id)  # an unknown id raises gym's error here, as gym.make would
    creator = spec.entry_point
    if isinstance(creator, str):
        creator = gym.envs.registration.load_env_creator(creator)
    # Loaded with the env's module when its env is a MuJoCo one: other envs (and other users) need no MuJoCo at all.
    mujoco_env = sys.modules.get("gymnasium.envs.mujoco.mujoco_env")
    xml_arg = inspect.signature(creator).parameters.get("xml_file") if isinstance(creator, type) else None
    if xml_arg is None or mujoco_env is None or not issubclass(creator, mujoco_env.MujocoEnv):
        return gym.make(env_id, **kwargs)
    xml_path = mujoco_env.expand_model_path(spec.kwargs.get("xml_file", xml_arg.default))
    root = ElementTree.parse(xml_path).getroot()
    compiler = root.find("compiler")
    names_files = any("file" in element.attrib for element in root.iter())  # <include file>, meshes, textures
    if compiler is None or "settotalmass" not in compiler.attrib or names_files:
        return gym.make(env_id, **kwargs)
    total_mass = float(compiler.attrib.pop("settotalmass"))
    with tempfile.TemporaryDirectory() as folder:  # the model is compiled in gym.make: the copy is not needed after
        copy = os.path.join(folder, os.path.basename(xml_path))
        ElementTree.ElementTree(root).write(copy)
        env = gym.make(env_id, xml_file=copy, **kwargs)
    if total_mass > 0:  # MuJoCo ignores a settotalmass <= 0
        import mujoco

        model, data = env.unwrapped.model, env.unwrapped.data
        mujoco.mj_setTotalmass(model, total_mass)
        mujoco.mj_setConst(model, data)
        # Since MuJoCo 3.17 mj_setConst leaves the statistics to the compiler: set them as it does, in its order of sums.
        meanmass, meaninertia = 0.0, 0.0
        for body in range(1, model.nbody):
            meanmass += float(model.body_mass[body])
        for dof in range(model.nv):  # dof_M0 (set by mj_setConst): the diagonal of the inertia matrix at qpos0
            meaninertia += float(model.dof_M0[dof])
        model.stat.meanmass = meanmass / (model.nbody - 1)
        model.stat.meaninertia = meaninertia / model.nv
        mujoco.mj_resetData(model, data)  # mj_setConst simulated in data: leave it as gym.make made it
    return env


def evaluate(env, act, episodes, seed, video_folder, stop_signals):
    """The mean return of act(obs) -> action over this many episodes of env, None if a signal stops it first. The env
    and torch's generators (sampled actions) are seeded with seed: the same checkpoint gives the same evaluation, and
    the run's own generators are left as they were. Video: one MP4 per episode, of env.render()."""
    if video_folder:
        import imageio  # only runs that record video need it
    returns = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        obs, _ = env.reset(seed=seed)
        while len(returns) < episodes and not stop_signals:
            episode_return, done, video = 0.0, False, None
            if video_folder:  # macro_block_size 2: H.264 needs even sides only; the default (16) would resize frames
                path, fps = f"{video_folder}/eval-episode-{len(returns)}.mp4", env.metadata["render_fps"]
                video = imageio.get_writer(path, fps=fps, macro_block_size=2)
            while not done and not stop_signals:
                if video:
                    video.append_data(env.render())
                obs, reward, terminated, truncated, info = env.step(act(obs))
                episode_return += float(reward)
                done = terminated or truncated
            if video:
                video.close()
            if done:
                # An env that records its episodes (below a reward normalisation) knows the real return.
                returns.append(float(info["episode"]["r"]) if "episode" in info else episode_return)
                if len(returns) < episodes:  # a reset per episode: none after the last one
                    obs, _ = env.reset()
    env.close()
    return float(np.mean(returns)) if len(returns) == episodes else None


class EvalGame:
    """An envpool Atari pool of one env played as evaluate() plays a gymnasium env, a game an episode.

    As CleanRL evaluates its Atari agents: the env is the training one (episodic life, clipped rewards), and a game's
    return is its real one, the game's own rewards summed over all lives, as the training loops report it. Video: the
    newest frame of each observation (envpool's Atari envs cannot render)."""

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

    def render(self):
        return self.obs[0, -1]  # what the agent sees: the newest of its 4 stacked 84x84 frames

    def close(self):
        self.envs.close()


def make_frames_to_device(shape, device):
    """A function that gives envpool's uint8 frames (of this shape) as a tensor on the device, for the Atari twins: on
    the CPU the env's own array (no copy), on a GPU a copy through one buffer pinned once (pinning each step's frames
    cost 2.7 ms a step on an H200 machine)."""
    if device.type != "cuda":
        return torch.from_numpy
    # From pinned memory the transfer runs on its own (non_blocking) while the host goes on to launch the policy.
    pinned_frames, copied = torch.empty(shape, dtype=torch.uint8, pin_memory=True), torch.cuda.Event()

    def frames_to_device(frames):
        copied.synchronize()  # the last transfer has read the buffer (in a rollout at once: the action's copy waited)
        on_device = pinned_frames.copy_(torch.from_numpy(frames)).to(device, non_blocking=True)
        copied.record()
        return on_device

    return frames_to_device


def env_pool_count(env_halves, num_envs, device, odd_envs):
    """How many envpool pools the Atari twins step their envs in (their --env-halves): two halves, one stepping in
    envpool's threads while the policy acts for the other, with "on", or with "auto" where the policy runs on CUDA; one
    on a CPU, where torch's threads and envpool's share the cores (halves measured no faster, docs/ppo_atari.md), and
    for an odd number of envs, which prints "<odd_envs> do not split in two halves" unless odd_envs is None."""
    halves = env_halves == "on" or (env_halves == "auto" and device.type == "cuda")
    if halves and num_envs % 2:
        if odd_envs is not None:
            print(f"{odd_envs} do not split in two halves: they step as one pool")
        return 1
    return 2 if halves else 1


def keep_freed_memory():
    """Have glibc's malloc keep the memory a process frees (up to 1 GiB) and serve blocks up to 32 MiB from it: an
    Atari twin frees and allocates tens of MB of activations every update, and memory given back to the kernel costs
    a page fault per 4 kB page when it is allocated again. Nothing to do where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt  # noqa: B018 (glibc's; AttributeError elsewhere)
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # the largest it takes on a 64-bit machine
    libc.mallopt(m_trim_threshold, 2**30)


class Run:
    """A training run's mechanics around a script's loop: the checks and the checkpoint it resumes before the first
    step, the seeds, the signals, the clock of the sps meter, the episodes' returns, the progress bar and the logs,
    and the end (checkpoint, evaluation, results line, summary).

    algo names the script's checkpoints ("sac") and name says it to a user ("SAC"); hyperparameters are the Args
    fields a resumed run must share with its checkpoint; make_eval_env(seed, render_mode) makes the env the saved
    agent is evaluated on; unit is what an evaluation episode is called; ended_early completes "sps not measured (run
    ended ...)"; distributed runs report their world size. schedule names what the script computes from
    --total-timesteps ("the learning-rate anneal"), None if nothing: a resume with another budget is then refused."""

    def __init__(self, args, script_file, algo, name, hyperparameters, make_eval_env, unit="episodes",
                 ended_early="within measure_burnin iterations", distributed=False, schedule=None):  # fmt: skip
        self.start = time.perf_counter()
        self.args, self.algo, self.name, self.hyperparameters = args, algo, name, hyperparameters
        self.schedule = schedule
        self.make_eval_env, self.unit, self.ended_early = make_eval_env, unit, ended_early
        self.script, self.distributed = os.path.basename(script_file), distributed
        self.rank, self.world_size, local_world_size = world()
        check_run_args(args)
        use_cuda = torch.cuda.is_available() and args.cuda
        if distributed and use_cuda and local_world_size > torch.cuda.device_count():  # NCCL: one rank per GPU
            exit_with_error(f"this machine has {torch.cuda.device_count()} GPU(s), too few for {local_world_size} "
                            "processes: start at most one per GPU (--nproc-per-node), or run on the CPU with --no-cuda")  # fmt: skip
        # A distributed run has a GPU per rank on each machine (torchrun's LOCAL_RANK).
        self.device = torch.device(("cuda:" + os.environ.get("LOCAL_RANK", "0") if distributed else "cuda")
                                   if use_cuda else "cpu")  # fmt: skip
        if use_cuda and distributed:
            torch.cuda.set_device(self.device)
        if getattr(args, "cudagraphs", False) and not use_cuda:  # the twins' flag
            print(f"{self.script}: --cudagraphs needs a CUDA device; cudagraphs are off for this run", file=sys.stderr)
            args.cudagraphs = False
        if args.capture_video:
            check_video_recording(lambda render_mode: make_eval_env(0, render_mode), args.env_id)
        self.checkpoint = self.load_checkpoint(args.resume) if args.resume else None
        default_path = f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}/{args.exp_name}.pt"
        self.model_path = args.model_path or args.resume or default_path
        if args.save_model and self.rank == 0:
            check_writable(self.model_path, "checkpoint")
            if args.capture_video:
                check_writable(os.path.join(self.video_folder(), "eval-episode-0.mp4"), "video")
        if args.results_path and self.rank == 0:
            check_writable(args.results_path, "results file")

        # Each rank of a distributed run draws its own actions and minibatches.
        random.seed(args.seed + self.rank)
        np.random.seed(args.seed + self.rank)
        torch.manual_seed(args.seed + self.rank)
        torch.backends.cudnn.deterministic = args.torch_deterministic

        self.episode_returns, self.recent_returns = [], deque(maxlen=20)
        if self.checkpoint:
            self.recent_returns.extend(self.checkpoint["recent_returns"])
        self.wandb = None
        if args.track and self.rank == 0:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=args.exp_name)
            self.wandb = wandb
        self.stop_signals = stop_on_signals()
        self.pbar = self.total = None
        self.train_start = self.measure_start = self.measure_start_step = self.sps = self.compile_seconds = None

    def video_folder(self):
        return os.path.join(os.path.dirname(self.model_path), "videos")

    def load_checkpoint(self, path):
        """A checkpoint of this run (algorithm, env, seed and hyper-parameters), or one line and exit status 2."""
        args = self.args
        if not os.path.isfile(path):
            exit_with_error(f"no checkpoint at {path}")
        try:
            # On the CPU: loading puts each tensor where its parameter lives, and a CUDA run resumes on a CPU.
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # truncated, corrupt, or not a torch file at all: each raises its own type
            exit_with_error(f"cannot read the checkpoint {path}: {str(error).splitlines()[0]}")
        if not isinstance(checkpoint, dict) or checkpoint.get("algo") != self.algo:
            found = checkpoint.get("algo") if isinstance(checkpoint, dict) else type(checkpoint).__name__
            exit_with_error(f"{path} is not a {self.name} checkpoint (it holds {found})")
        if (checkpoint["env_id"], checkpoint["seed"]) != (args.env_id, args.seed):
            exit_with_error(f"{path} is a run on {checkpoint['env_id']} with seed {checkpoint['seed']}, "
                            f"not on {args.env_id} with seed {args.seed}")  # fmt: skip
        # A checkpoint older than one of the hyper-parameters was made with its default (the flag did not exist).
        defaults = {field.name: field.default for field in fields(args)}
        saved = {**{name: defaults[name] for name in self.hyperparameters}, **checkpoint["hyperparameters"]}
        changed = [
            f"--{name.replace('_', '-')} {value} (checkpoint) vs {getattr(args, name)}"
            for name, value in saved.items()
            if getattr(args, name) != value
        ]
        if changed:
            exit_with_error(f"{path} was made with other hyper-parameters: {', '.join(changed)}")
        # A schedule computed from the budget would jump mid-run under another one (an anneal back up, an epsilon
        # decay pushed out), and an anneal past its budget would go negative: a budget is the run's for good.
        budget = checkpoint.get("total_timesteps")
        if self.schedule and budget is not None and budget != args.total_timesteps:
            exit_with_error(f"{path} is a run of --total-timesteps {budget}, from which {self.schedule} is computed: "
                            f"resume it with --total-timesteps {budget} (or start a new run)")  # fmt: skip
        if self.schedule and budget is None and self.rank == 0:  # written before checkpoints held their budget
            print(f"{self.script}: {path} does not say its --total-timesteps; {self.schedule} is computed from "
                  f"{args.total_timesteps} from here on", file=sys.stderr)  # fmt: skip
        return checkpoint

    def save_checkpoint(self, **agent):
        """Write what the script says its agent is, with the run's identity, recent returns and random generators: a
        plain torch.save dict, written to a temporary file and renamed, so a crash while writing leaves the last
        good checkpoint in place. An entry of agent named like one of the run's replaces it."""
        args = self.args
        checkpoint = {
            "algo": self.algo,
            "env_id": args.env_id,
            "seed": args.seed,
            "hyperparameters": {name: getattr(args, name) for name in self.hyperparameters},
            "total_timesteps": args.total_timesteps,
            **agent,
        }
        checkpoint.setdefault("recent_returns", list(self.recent_returns))
        checkpoint.setdefault("rng", rng_state())
        os.makedirs(os.path.dirname(os.path.abspath(self.model_path)), exist_ok=True)
        torch.save(checkpoint, self.model_path + ".tmp")
        os.replace(self.model_path + ".tmp", self.model_path)

    def steps(self, start, total, per_iteration=1):
        """The steps of a loop that makes per_iteration env steps at a time (one per env), under the progress bar;
        the last iteration may pass total by fewer than per_iteration steps."""
        self.progress(start, total)
        for step in range(start, total, per_iteration):
            yield step
            self.pbar.update(per_iteration)

    def progress(self, start, total):
        """The progress bar of a loop of iterations of many steps: log() moves it."""
        self.total = total
        self.pbar = tqdm.tqdm(total=total, desc=self.script, mininterval=1.0, initial=start, disable=self.rank != 0)

    def clock(self, iteration, train_iteration, measure_iteration, global_step=None, ready=True):
        """At the top of each iteration: the warm-up clock (compile time) starts at the first training iteration,
        the sps clock measure_burnin iterations later, at global_step (default: the iteration is the step), or later
        while ready is False (a twin's CUDA graphs not all recorded yet). A loop whose iterations count several steps
        starts each clock at the first iteration at or past its mark."""
        if self.train_start is None and iteration >= train_iteration:
            self.train_start = time.perf_counter()
        if self.measure_start is None and iteration >= measure_iteration and ready:
            self.measure_start = time.perf_counter()
            self.measure_start_step = iteration if global_step is None else global_step
            self.compile_seconds = self.measure_start - self.train_start

    def update_sps(self, global_step):
        if self.measure_start is not None and global_step > self.measure_start_step:
            self.sps = (global_step - self.measure_start_step) / (time.perf_counter() - self.measure_start)

    def episode(self, episode_return, step, **charts):
        """A finished episode's return (and charts to log beside it)."""
        self.episode_returns.append(episode_return)
        self.recent_returns.append(episode_return)
        if self.wandb:
            self.wandb.log({"charts/episodic_return": episode_return, **{f"charts/{k}": v for k, v in charts.items()}},
                           step=step)  # fmt: skip

    def log(self, global_step, losses, charts=None):
        """Every few steps: the losses (a non-finite one stops the run), the sps, the bar, and wandb."""
        logs = {name: value.item() for name, value in losses.items()}
        for name, value in logs.items():
            if not np.isfinite(value):
                self.pbar.close()
                if self.rank == 0:  # the losses of a distributed run are global: every rank stops here
                    print(f"{self.script}: error: {name} is {value} at step {global_step}; stopping the run",
                          file=sys.stderr)  # fmt: skip
                sys.exit(1)
        self.update_sps(global_step)
        self.pbar.update(global_step - self.pbar.n)  # a progress() bar moves here (steps() has moved its own)
        mean_return = np.mean(self.recent_returns) if self.recent_returns else float("nan")
        self.pbar.set_postfix(sps=f"{self.sps or 0:.0f}", ret=f"{mean_return:.1f}", refresh=False)
        if self.wandb:
            charts = {name: float(value) for name, value in (charts or {}).items()}
            self.wandb.log({**{f"losses/{k}": v for k, v in logs.items()}, **charts}, step=global_step)

    def checkpoint_due(self, global_step, steps_per_iteration=1):
        """With --checkpoint-every: after the iteration in which the step count reaches a multiple of it (the last
        iteration excepted: the end of the run saves anyway)."""
        every = self.args.checkpoint_every
        crossed = every and global_step // every > (global_step - steps_per_iteration) // every
        return bool(crossed) and global_step < self.total

    def finish(self, global_step, save_checkpoint, make_policy):
        """The end of the run: with --save-model the checkpoint (save_checkpoint()) and the evaluation of the agent
        make_policy(checkpoint, env, device) -> act reads back from it; then the results line and the summary.

        A signal cuts what is left to do, never a write under way: the training (the loop stops before its total),
        else the evaluation (skipped, or stopped mid-episode); the checkpoint and the results line are always
        written whole. The results line's "cut" says which, the summary says it too, and the exit status is 128 + the
        signal's number; a signal that cut nothing (the results written) gets one line and exit status 0."""
        args = self.args
        self.pbar.close()
        self.update_sps(global_step)
        end = time.perf_counter()
        eval_return = None
        evaluates = args.save_model and args.eval_episodes and self.rank == 0
        if args.save_model:
            save_checkpoint()
            if evaluates and not self.stop_signals:
                video_folder = self.video_folder() if args.capture_video else None
                if video_folder:
                    os.makedirs(video_folder, exist_ok=True)
                seed = args.seed + EVAL_SEED_OFFSET
                env = self.make_eval_env(seed, "rgb_array" if video_folder else None)
                checkpoint = torch.load(self.model_path, map_location="cpu", weights_only=True)
                act = make_policy(checkpoint, env, self.device)
                eval_return = evaluate(env, act, args.eval_episodes, seed, video_folder, self.stop_signals)
        # Only a signal ends the loop before its total; evaluate() returns None only when a signal stops it.
        cut = "training" if global_step < self.total else "evaluation" if evaluates and eval_return is None else None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        if self.rank != 0:  # rank 0 alone writes the results and says what was cut
            self.exit(cut)
            sys.exit(0)
        final_return = float(np.mean(self.recent_returns)) if self.recent_returns else None
        results = {
            "script": self.script,
            "algo": self.algo + ("_distributed" if self.distributed else ""),
            "env_id": args.env_id,
            "seed": args.seed,
            "compile": getattr(args, "compile", False),
            "cudagraphs": getattr(args, "cudagraphs", False),
            "device": str(self.device),
            "torch_version": torch.__version__,
            "total_timesteps": self.total,
            "sps": self.sps,
            "compile_seconds": self.compile_seconds,
            "wall_seconds": end - self.start,
            "final_return": final_return,
            "steps_done": global_step,
            "interrupted": cut is not None,
            "cut": cut,
            "eval_return": eval_return,
            "model_path": self.model_path if args.save_model else None,
            **({"world_size": self.world_size} if self.distributed else {}),
        }
        if args.results_path:
            with open(args.results_path, "a") as f:
                f.write(json.dumps(results) + "\n")
        if self.wandb:
            self.wandb.log({"charts/sps": self.sps, "charts/eval_return": eval_return}, step=global_step)
            self.wandb.finish()
        sps_text = f"{self.sps:.0f} sps (steady state{', all ranks' if self.distributed else ''})" if self.sps else (
            f"sps not measured (run ended {self.ended_early})")  # fmt: skip
        return_text = f"{final_return:.1f}" if final_return is not None else "n/a (no finished episode)"
        done_text = f"{global_step} steps"
        if cut == "training":
            done_text = f"interrupted by {self.signal_name()} at step {global_step} of {self.total}"
        processes = f" by {self.world_size} process(es)" if self.distributed else ""
        summary = f"{self.script}: {done_text} on {args.env_id}{processes}, {sps_text}, final return {return_text}"
        if args.save_model:
            summary += f"; checkpoint {self.model_path}"
            if eval_return is not None:
                summary += f", eval return {eval_return:.1f} over {args.eval_episodes} {self.unit}"
            if cut == "evaluation":
                summary += f", evaluation cut by {self.signal_name()} (--resume the checkpoint to evaluate it)"
        print(summary)
        self.exit(cut)

    def signal_name(self):
        return signal.Signals(self.stop_signals[0]).name

    def exit(self, cut):
        """128 + the signal's number when it cut something; else this process goes on to its end (exit status 0)."""
        # From here on there is nothing left to cut: a signal must not kill the process as it exits, for its exit
        # status would then say that the run was cut.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        if cut:
            sys.exit(128 + self.stop_signals[0])
        if self.stop_signals and self.rank == 0:
            print(f"{self.script}: {self.signal_name()} received as the run ended: nothing was cut", file=sys.stderr)
