# Deep Q-Network (DQN) for discrete actions, plain eager PyTorch (the baseline of the speed-up table).
# Its twin, dqn_torchcompile.py, trains the same agent faster: `diff` the two files.
import importlib.util
import json
import os
import random
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import imageio
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tqdm
import tyro


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
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
    env_id: str = "CartPole-v1"
    """the id of the environment (a gymnasium id with a discrete action space and a flat observation)"""
    total_timesteps: int = 500000
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """gradient steps after learning starts that are left out of the sps measure (compile, warm-up)"""
    results_path: str | None = None
    """if set, append one JSON line with this run's results to this file"""
    save_model: bool = False
    """if toggled, save a checkpoint at the end of training (and at an interruption), then evaluate it"""
    model_path: str | None = None
    """the checkpoint's path (default: the --resume file, else runs/<env_id>__<exp_name>__<seed>__<time>/<exp_name>.pt)"""
    checkpoint_every: int = 0
    """with --save-model, also save the checkpoint every this many env steps (0: only at the end)"""
    resume: str | None = None
    """continue the run saved in this checkpoint; --total-timesteps counts the steps of the whole run"""
    eval_episodes: int = 10
    """episodes of the saved agent's epsilon-greedy policy (epsilon 0.05) on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation episodes as MP4 files in a videos/ folder beside the checkpoint"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1.0: the target becomes a copy of the Q network)"""
    target_network_frequency: int = 500
    """the timesteps between two updates of the target network"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the exploration rate epsilon (probability of a random action) at the first step"""
    end_e: float = 0.05
    """the exploration rate at the end of its decay, and from then on"""
    exploration_fraction: float = 0.5
    """the fraction of total-timesteps over which epsilon falls from start-e to end-e"""
    learning_starts: int = 10000
    """timestep to start learning"""
    train_frequency: int = 10
    """the timesteps between two gradient steps"""


LOG_EVERY = 100  # steps between progress-bar updates, logging and the non-finite loss check
# What makes the agent: a checkpoint made with other values of these is refused by --resume.
HYPERPARAMETERS = ("learning_rate", "buffer_size", "gamma", "tau", "target_network_frequency", "batch_size", "start_e",
                   "end_e", "exploration_fraction", "learning_starts", "train_frequency")  # fmt: skip
EVAL_SEED_OFFSET = 10_000  # the evaluation env's seed is the run's plus this: episodes the agent never trained on
EVAL_EPSILON = 0.05  # the evaluation's exploration rate, as in CleanRL's DQN evaluation


def exit_with_error(message):
    """A user's mistake: one line on stderr, exit status 2, no traceback."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for name in ("total_timesteps", "buffer_size", "batch_size", "target_network_frequency", "train_frequency"):
        if getattr(args, name) <= 0:
            exit_with_error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.learning_starts < 0 or args.measure_burnin < 0:
        exit_with_error("--learning-starts and --measure-burnin must not be negative")
    if args.batch_size > args.buffer_size:
        exit_with_error(f"--batch-size ({args.batch_size}) is larger than --buffer-size ({args.buffer_size})")
    if not 0 < args.exploration_fraction <= 1:
        exit_with_error(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if not (0 <= args.start_e <= 1 and 0 <= args.end_e <= 1):
        exit_with_error(f"--start-e and --end-e are probabilities, in [0, 1]; got {args.start_e} and {args.end_e}")
    if args.end_e > args.start_e:
        exit_with_error(f"--end-e ({args.end_e}) is above --start-e ({args.start_e}): epsilon only goes down")
    if not 0 <= args.seed < 2**31:  # what numpy, torch and the environments all accept
        exit_with_error(f"--seed must be in [0, 2**31), got {args.seed}")
    if args.checkpoint_every < 0 or args.eval_episodes < 0:
        exit_with_error("--checkpoint-every and --eval-episodes must not be negative")
    if (args.checkpoint_every or args.capture_video) and not args.save_model:
        exit_with_error("--checkpoint-every and --capture-video need --save-model")
    if args.capture_video and not args.eval_episodes:
        exit_with_error("--capture-video records the evaluation episodes: --eval-episodes must be positive")


def make_env(env_id, seed, render_mode=None):
    try:
        # Asked for only when recording: an env that takes no render_mode argument still trains.
        env = gym.make(env_id, render_mode=render_mode) if render_mode else gym.make(env_id)
    except gym.error.Error as error:
        exit_with_error(f"cannot make env {env_id!r}: {error}")
    if not isinstance(env.action_space, gym.spaces.Discrete):
        exit_with_error(f"DQN needs a discrete action space, {env_id} has {env.action_space}")
    # The Q network is an MLP: it takes a vector, not an image (which needs a convolutional network).
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        exit_with_error(f"DQN's Q network (an MLP) needs a flat Box observation, {env_id} has {space}")
    env.action_space.seed(seed)
    return env


def epsilon_at(step, args):
    """The exploration rate at a step: start_e at step 0, down in a straight line to end_e at step
    exploration_fraction * total_timesteps, then end_e."""
    decay_steps = args.exploration_fraction * args.total_timesteps
    return max(args.end_e, args.start_e + (args.end_e - args.start_e) * step / decay_steps)


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, n_actions)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class ReplayBuffer:
    """Transitions in preallocated numpy arrays, overwritten oldest first, sampled uniformly."""

    fields = ("observations", "next_observations", "actions", "rewards", "terminations")

    def __init__(self, size, obs_dim):
        self.observations = np.zeros((size, obs_dim), dtype=np.float32)
        self.next_observations = np.zeros((size, obs_dim), dtype=np.float32)
        self.actions = np.zeros(size, dtype=np.int64)
        self.rewards = np.zeros(size, dtype=np.float32)
        self.terminations = np.zeros(size, dtype=np.float32)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, next_obs, action, reward, terminated):
        self.observations[self.pos] = obs
        self.next_observations[self.pos] = next_obs
        self.actions[self.pos] = action
        self.rewards[self.pos] = reward
        self.terminations[self.pos] = terminated
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch_size, device):
        idx = np.random.randint(0, self.size if self.full else self.pos, size=batch_size)
        return {key: torch.as_tensor(getattr(self, key)[idx], device=device) for key in self.fields}

    def state_dict(self):
        """The filled rows of each field as tensors (the checkpoint's layout), and where the next one goes."""
        filled = self.size if self.full else self.pos
        return {
            **{key: torch.from_numpy(getattr(self, key)[:filled].copy()) for key in self.fields},
            "pos": self.pos,
            "full": self.full,
        }

    def load_state_dict(self, state):
        for key in self.fields:
            getattr(self, key)[: len(state[key])] = state[key].numpy()
        self.pos, self.full = state["pos"], state["full"]


def build_dqn(obs_dim, n_actions, args, device):
    """The networks, optimizer and update functions of DQN; the training loop only calls the functions."""
    qnet = QNetwork(obs_dim, n_actions).to(device)
    target_qnet = QNetwork(obs_dim, n_actions).to(device)
    target_qnet.load_state_dict(qnet.state_dict())
    optimizer = torch.optim.Adam(qnet.parameters(), lr=args.learning_rate)

    def update(data):
        with torch.no_grad():
            # The TD target: the reward, plus the discounted best target Q value of the next state unless the
            # episode terminated there.
            target_max = target_qnet(data["next_observations"]).max(1).values
            td_target = data["rewards"] + args.gamma * target_max * (1 - data["terminations"])
        q_values = qnet(data["observations"]).gather(1, data["actions"].unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(q_values, td_target)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"td_loss": loss.detach(), "q_values": q_values.detach().mean()}

    def update_target():
        for param, target_param in zip(qnet.parameters(), target_qnet.parameters(), strict=True):
            target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

    def greedy_actions(obs):
        with torch.no_grad():
            return qnet(obs).argmax(1)

    networks = dict(qnet=qnet, target_qnet=target_qnet)

    def state_dict():
        """The networks' and the optimizer's state_dicts: a checkpoint's agent."""
        return {**{name: net.state_dict() for name, net in networks.items()}, "optimizer": optimizer.state_dict()}

    def load_state_dict(state):
        for name, net in networks.items():
            net.load_state_dict(state[name])
        optimizer.load_state_dict(state["optimizer"])

    return SimpleNamespace(
        qnet=qnet,
        target_qnet=target_qnet,
        optimizer=optimizer,
        update=update,
        update_target=update_target,
        greedy_actions=greedy_actions,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def rng_state():
    """The state of every random generator the run draws from (the env's are reseeded on resume)."""
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


def save_checkpoint(path, dqn, replay_buffer, args, global_step, recent_returns):
    """A plain torch.save dict: its networks and optimizers are this script's state_dicts, which the twin reads too.
    Written to a temporary file and renamed, so a crash while writing leaves the last good checkpoint in place."""
    checkpoint = {
        "algo": "dqn",
        "env_id": args.env_id,
        "seed": args.seed,
        "hyperparameters": {name: getattr(args, name) for name in HYPERPARAMETERS},
        "global_step": global_step,
        "agent": dqn.state_dict(),
        "replay_buffer": replay_buffer.state_dict(),
        "recent_returns": list(recent_returns),
        "rng": rng_state(),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(checkpoint, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path, args):
    """A checkpoint of this run (algorithm, env, seed and hyper-parameters), or one line and exit status 2."""
    if not os.path.isfile(path):
        exit_with_error(f"no checkpoint at {path}")
    try:
        # On the CPU: loading puts each tensor where its parameter lives, and a CUDA run resumes on a CPU.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, corrupt, or not a torch file at all: each raises its own type
        exit_with_error(f"cannot read the checkpoint {path}: {str(error).splitlines()[0]}")
    if not isinstance(checkpoint, dict) or checkpoint.get("algo") != "dqn":
        found = checkpoint.get("algo") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        exit_with_error(f"{path} is not a DQN checkpoint (it holds {found})")
    if (checkpoint["env_id"], checkpoint["seed"]) != (args.env_id, args.seed):
        exit_with_error(
            f"{path} is a run on {checkpoint['env_id']} with seed {checkpoint['seed']}, "
            f"not on {args.env_id} with seed {args.seed}"
        )
    changed = [
        f"--{name.replace('_', '-')} {value} (checkpoint) vs {getattr(args, name)}"
        for name, value in checkpoint["hyperparameters"].items()
        if getattr(args, name) != value
    ]
    if changed:
        exit_with_error(f"{path} was made with other hyper-parameters: {', '.join(changed)}")
    return checkpoint


def evaluate(checkpoint, args, device, video_folder, stop_signals):
    """The mean return of the checkpoint's epsilon-greedy policy (epsilon 0.05, as CleanRL evaluates DQN) over
    --eval-episodes episodes of a fresh env with another seed, in a fresh Q network; None if a signal stops it. The
    exploration draws come from a generator of their own, so the plain script and its twin play the same episodes.
    Video: one MP4 per episode."""
    eval_seed = args.seed + EVAL_SEED_OFFSET
    env = make_env(args.env_id, eval_seed, render_mode="rgb_array" if video_folder else None)
    qnet = QNetwork(env.observation_space.shape[0], int(env.action_space.n)).to(device)
    qnet.load_state_dict(checkpoint["agent"]["qnet"])
    explore = np.random.default_rng(eval_seed)
    returns = []
    obs, _ = env.reset(seed=eval_seed)
    while len(returns) < args.eval_episodes and not stop_signals:
        episode_return, done = 0.0, False
        video = None
        if video_folder:
            # macro_block_size 2: H.264 needs even frame sizes only; the default (16) would resize most frames.
            video = imageio.get_writer(
                f"{video_folder}/eval-episode-{len(returns)}.mp4", fps=env.metadata["render_fps"], macro_block_size=2
            )
        while not done and not stop_signals:
            if video:
                video.append_data(env.render())
            if explore.random() < EVAL_EPSILON:
                action = env.action_space.sample()
            else:
                with torch.no_grad():
                    obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
                    action = qnet(obs_tensor).argmax(1)[0].item()
            obs, reward, terminated, truncated, _ = env.step(action)
            episode_return += float(reward)
            done = terminated or truncated
        if video:
            video.close()
        if done:
            returns.append(episode_return)
            obs, _ = env.reset()
    env.close()
    return float(np.mean(returns)) if len(returns) == args.eval_episodes else None


def check_video_recording(env_id):
    """--capture-video fails before training, not after it: the env must render and imageio must write MP4."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        exit_with_error("--capture-video writes MP4 through imageio-ffmpeg: pip install imageio-ffmpeg")
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        # No screen: MuJoCo renders off-screen (a GPU's EGL, or Mesa's), pygame (classic control) to memory.
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = make_env(env_id, 0, render_mode="rgb_array")
    try:
        env.reset(seed=0)
        frame = env.render()
    except Exception as error:  # MuJoCo raises several types when no OpenGL context can be made
        exit_with_error(f"{env_id} cannot render here: {error} (headless MuJoCo needs MUJOCO_GL=egl or osmesa)")
    finally:
        env.close()
    if frame is None:
        exit_with_error(f"{env_id} renders no image, so there is nothing to record")


def stop_on_signals():
    """Ctrl-C (SIGINT) and SIGTERM end the run after the current step instead of killing it: the list returned
    receives the signal's number. A second signal of the same kind stops the process at once."""
    received = []

    def handler(signum, frame):
        received.append(signum)
        signal.signal(signum, signal.SIG_DFL)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
    return received


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    run_start = time.perf_counter()
    script = os.path.basename(__file__)
    if args.capture_video:
        check_video_recording(args.env_id)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None
    start_step = checkpoint["global_step"] if checkpoint else 0
    model_path = args.model_path or args.resume
    model_path = (
        model_path or f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}/{args.exp_name}.pt"
    )

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # A resumed run starts a new episode, on an env seeded by the step it resumes at.
    env_seed = args.seed + start_step
    env = make_env(args.env_id, env_seed)
    obs_dim, n_actions = env.observation_space.shape[0], int(env.action_space.n)
    dqn = build_dqn(obs_dim, n_actions, args, device)
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim)
    recent_returns = deque(maxlen=20)
    if checkpoint:
        dqn.load_state_dict(checkpoint["agent"])
        replay_buffer.load_state_dict(checkpoint["replay_buffer"])
        recent_returns.extend(checkpoint["recent_returns"])
        set_rng_state(checkpoint["rng"])

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=args.exp_name)

    stop_signals = stop_on_signals()
    obs, _ = env.reset(seed=env_seed)
    episode_return, episode_returns = 0.0, []
    train_step = max(args.learning_starts, start_step)  # where this process starts training
    measure_start_step = train_step + args.measure_burnin * args.train_frequency
    train_start = measure_start = None
    sps = compile_seconds = None
    losses = None  # the last gradient step's, logged every LOG_EVERY steps
    global_step = start_step  # the steps done, as the loop goes
    pbar = tqdm.tqdm(
        range(start_step, args.total_timesteps),
        desc=script,
        mininterval=1.0,
        initial=start_step,
        total=args.total_timesteps,
    )
    for step in pbar:
        if step == train_step:
            train_start = time.perf_counter()
        if step == measure_start_step:
            measure_start = time.perf_counter()
            compile_seconds = measure_start - train_start

        # Epsilon-greedy: a random action with probability epsilon, else the action of the highest Q value.
        epsilon = epsilon_at(step, args)
        if random.random() < epsilon:
            action = env.action_space.sample()
        else:
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            action = dqn.greedy_actions(obs_tensor)[0].item()

        next_obs, reward, terminated, truncated, _ = env.step(action)
        # A time-limit truncation still bootstraps from next_obs; only a termination cuts the return.
        replay_buffer.add(obs, next_obs, action, reward, terminated)
        episode_return += float(reward)
        if terminated or truncated:
            episode_returns.append(episode_return)
            recent_returns.append(episode_return)
            if args.track:
                wandb.log({"charts/episodic_return": episode_return, "charts/epsilon": epsilon}, step=step)
            episode_return = 0.0
            next_obs, _ = env.reset()
        obs = next_obs

        if step >= args.learning_starts:
            if step % args.train_frequency == 0:
                data = replay_buffer.sample(args.batch_size, device)
                losses = dqn.update(data)
            if step % args.target_network_frequency == 0:
                dqn.update_target()

            if step % LOG_EVERY == 0 and losses is not None:
                logs = {name: value.item() for name, value in losses.items()}
                for name, value in logs.items():
                    if not np.isfinite(value):
                        pbar.close()
                        sys.exit(f"{script}: error: {name} is {value} at step {step}; stopping the run")
                if measure_start is not None and step > measure_start_step:
                    sps = (step - measure_start_step) / (time.perf_counter() - measure_start)
                pbar.set_postfix(sps=f"{sps or 0:.0f}", ret=f"{np.mean(recent_returns or [np.nan]):.1f}", refresh=False)
                if args.track:
                    wandb.log({f"losses/{k}": v for k, v in logs.items()}, step=step)
        global_step = step + 1
        if stop_signals:
            break
        if args.checkpoint_every and global_step % args.checkpoint_every == 0 and global_step < args.total_timesteps:
            save_checkpoint(model_path, dqn, replay_buffer, args, global_step, recent_returns)
    pbar.close()
    env.close()

    end = time.perf_counter()
    if measure_start is not None and global_step > measure_start_step:
        sps = (global_step - measure_start_step) / (end - measure_start)
    eval_return = None
    if args.save_model:
        save_checkpoint(model_path, dqn, replay_buffer, args, global_step, recent_returns)
        if args.eval_episodes and not stop_signals:
            video_folder = os.path.join(os.path.dirname(model_path), "videos") if args.capture_video else None
            if video_folder:
                os.makedirs(video_folder, exist_ok=True)
            eval_checkpoint = torch.load(model_path, map_location="cpu", weights_only=True)
            eval_return = evaluate(eval_checkpoint, args, device, video_folder, stop_signals)
    final_return = float(np.mean(recent_returns)) if recent_returns else None
    results = {
        "script": script,
        "algo": "dqn",
        "env_id": args.env_id,
        "seed": args.seed,
        "compile": False,
        "cudagraphs": False,
        "device": str(device),
        "torch_version": torch.__version__,
        "total_timesteps": args.total_timesteps,
        "sps": sps,
        "compile_seconds": compile_seconds,
        "wall_seconds": end - run_start,
        "final_return": final_return,
        "steps_done": global_step,
        "interrupted": bool(stop_signals),
        "eval_return": eval_return,
        "model_path": model_path if args.save_model else None,
    }
    if args.results_path:
        with open(args.results_path, "a") as f:
            f.write(json.dumps(results) + "\n")
    if args.track:
        wandb.log({"charts/sps": sps, "charts/eval_return": eval_return}, step=global_step)
        wandb.finish()
    sps_text = (
        f"{sps:.0f} sps (steady state)"
        if sps
        else "sps not measured (run ended before learning_starts + measure_burnin gradient steps)"
    )
    return_text = f"{final_return:.1f}" if final_return is not None else "n/a (no finished episode)"
    if stop_signals:
        done_text = (
            f"interrupted by {signal.Signals(stop_signals[0]).name} at step {global_step} of {args.total_timesteps}"
        )
    else:
        done_text = f"{global_step} steps"
    summary = f"{script}: {done_text} on {args.env_id}, {sps_text}, final return {return_text}"
    if args.save_model:
        summary += f"; checkpoint {model_path}"
        summary += (
            f", eval return {eval_return:.1f} over {args.eval_episodes} episodes" if eval_return is not None else ""
        )
    print(summary)
    if stop_signals:
        sys.exit(128 + stop_signals[0])
