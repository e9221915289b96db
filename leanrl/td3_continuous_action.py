# Twin Delayed DDPG (TD3) for continuous actions, plain eager PyTorch (the baseline of the speed-up table).
# Its twin, td3_continuous_action_torchcompile.py, trains the same agent faster: `diff` the two files.
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
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (a gymnasium id with a bounded continuous action space)"""
    total_timesteps: int = 1000000
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
    """continue the run saved in this checkpoint; --total-timesteps counts the steps of the whole run"""
    eval_episodes: int = 10
    """episodes of the saved agent's deterministic policy (no noise) on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation episodes as MP4 files in a videos/ folder beside the checkpoint"""
    learning_rate: float = 3e-4
    """the learning rate of the actor and Q network optimizers"""
    buffer_size: int = int(1e6)
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    policy_noise: float = 0.2
    """the scale of the target policy smoothing noise (times the action scale)"""
    exploration_noise: float = 0.1
    """the scale of the exploration noise (times the action scale)"""
    learning_starts: int = 25000
    """timestep to start learning"""
    policy_frequency: int = 2
    """the frequency of training the policy and updating the target networks (delayed), in critic updates"""
    noise_clip: float = 0.5
    """noise clip parameter of the target policy smoothing regularization"""


LOG_EVERY = 100  # steps between progress-bar updates, logging and the non-finite loss check
# What makes the agent: a checkpoint made with other values of these is refused by --resume.
HYPERPARAMETERS = ("learning_rate", "buffer_size", "gamma", "tau", "batch_size", "policy_noise", "exploration_noise",
                   "learning_starts", "policy_frequency", "noise_clip")  # fmt: skip
EVAL_SEED_OFFSET = 10_000  # the evaluation env's seed is the run's plus this: episodes the agent never trained on


def exit_with_error(message):
    """A user's mistake: one line on stderr, exit status 2, no traceback."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for name in ("total_timesteps", "buffer_size", "batch_size", "policy_frequency"):
        if getattr(args, name) <= 0:
            exit_with_error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.learning_starts < 0 or args.measure_burnin < 0:
        exit_with_error("--learning-starts and --measure-burnin must not be negative")
    if min(args.policy_noise, args.exploration_noise, args.noise_clip) < 0:
        exit_with_error("--policy-noise, --exploration-noise and --noise-clip must not be negative")
    if args.batch_size > args.buffer_size:
        exit_with_error(f"--batch-size ({args.batch_size}) is larger than --buffer-size ({args.buffer_size})")
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
    space = env.action_space
    # The actor's tanh is scaled to the action bounds, so they must be finite.
    if not isinstance(space, gym.spaces.Box) or not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        exit_with_error(f"TD3 needs a bounded continuous (Box) action space, {env_id} has {space}")
    env.action_space.seed(seed)
    return env


class QNetwork(nn.Module):
    def __init__(self, obs_dim, action_dim):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + action_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 1)

    def forward(self, x, a):
        x = torch.cat([x, a], 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Actor(nn.Module):
    def __init__(self, obs_dim, action_dim, action_low, action_high):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mu = nn.Linear(256, action_dim)
        action_low = torch.as_tensor(action_low, dtype=torch.float32)
        action_high = torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (action_high - action_low) / 2.0)
        self.register_buffer("action_bias", (action_high + action_low) / 2.0)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return torch.tanh(self.fc_mu(x)) * self.action_scale + self.action_bias


class ReplayBuffer:
    """Transitions in preallocated numpy arrays, overwritten oldest first, sampled uniformly."""

    fields = ("observations", "next_observations", "actions", "rewards", "terminations")

    def __init__(self, size, obs_dim, action_dim):
        self.observations = np.zeros((size, obs_dim), dtype=np.float32)
        self.next_observations = np.zeros((size, obs_dim), dtype=np.float32)
        self.actions = np.zeros((size, action_dim), dtype=np.float32)
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


def build_td3(obs_dim, action_dim, action_low, action_high, args, device):
    """The networks, optimizers and update functions of TD3; the training loop only calls the functions."""
    actor = Actor(obs_dim, action_dim, action_low, action_high).to(device)
    qf1 = QNetwork(obs_dim, action_dim).to(device)
    qf2 = QNetwork(obs_dim, action_dim).to(device)
    target_actor = Actor(obs_dim, action_dim, action_low, action_high).to(device)
    qf1_target = QNetwork(obs_dim, action_dim).to(device)
    qf2_target = QNetwork(obs_dim, action_dim).to(device)
    target_actor.load_state_dict(actor.state_dict())
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.learning_rate)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate)
    action_low = torch.as_tensor(action_low, dtype=torch.float32, device=device)
    action_high = torch.as_tensor(action_high, dtype=torch.float32, device=device)

    def update_critic(data):
        with torch.no_grad():
            # Target policy smoothing: clipped noise on the target action, so Q cannot exploit a narrow peak.
            noise = (torch.randn_like(data["actions"]) * args.policy_noise).clamp(-args.noise_clip, args.noise_clip)
            next_state_actions = target_actor(data["next_observations"]) + noise * target_actor.action_scale
            next_state_actions = next_state_actions.clamp(action_low, action_high)
            qf1_next_target = qf1_target(data["next_observations"], next_state_actions)
            qf2_next_target = qf2_target(data["next_observations"], next_state_actions)
            min_qf_next_target = torch.min(qf1_next_target, qf2_next_target)
            next_q_value = data["rewards"] + (1 - data["terminations"]) * args.gamma * min_qf_next_target.view(-1)

        qf1_a_values = qf1(data["observations"], data["actions"]).view(-1)
        qf2_a_values = qf2(data["observations"], data["actions"]).view(-1)
        qf_loss = F.mse_loss(qf1_a_values, next_q_value) + F.mse_loss(qf2_a_values, next_q_value)

        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        return {"qf_loss": qf_loss.detach(), "qf1_values": qf1_a_values.detach().mean()}

    def update_actor(data):
        actor_loss = -qf1(data["observations"], actor(data["observations"])).mean()

        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        return {"actor_loss": actor_loss.detach()}

    def update_targets():
        for net, target_net in ((actor, target_actor), (qf1, qf1_target), (qf2, qf2_target)):
            for param, target_param in zip(net.parameters(), target_net.parameters(), strict=True):
                target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

    def policy(obs):
        with torch.no_grad():
            actions = actor(obs)
            actions = actions + torch.randn_like(actions) * actor.action_scale * args.exploration_noise
            return actions.clamp(action_low, action_high)

    networks = dict(actor=actor, qf1=qf1, qf2=qf2, target_actor=target_actor, qf1_target=qf1_target,
                    qf2_target=qf2_target)  # fmt: skip
    optimizers = dict(q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)

    def state_dict():
        """The networks' and optimizers' state_dicts: a checkpoint's agent."""
        return {
            **{name: net.state_dict() for name, net in networks.items()},
            **{name: optimizer.state_dict() for name, optimizer in optimizers.items()},
        }

    def load_state_dict(state):
        for name, net in networks.items():
            net.load_state_dict(state[name])
        for name, optimizer in optimizers.items():
            optimizer.load_state_dict(state[name])

    return SimpleNamespace(
        actor=actor,
        qf1=qf1,
        qf2=qf2,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
        policy=policy,
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


def save_checkpoint(path, td3, replay_buffer, args, global_step, recent_returns):
    """A plain torch.save dict: its networks and optimizers are this script's state_dicts, which the twin reads too.
    Written to a temporary file and renamed, so a crash while writing leaves the last good checkpoint in place."""
    checkpoint = {
        "algo": "td3",
        "env_id": args.env_id,
        "seed": args.seed,
        "hyperparameters": {name: getattr(args, name) for name in HYPERPARAMETERS},
        "global_step": global_step,
        "agent": td3.state_dict(),
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
    if not isinstance(checkpoint, dict) or checkpoint.get("algo") != "td3":
        found = checkpoint.get("algo") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        exit_with_error(f"{path} is not a TD3 checkpoint (it holds {found})")
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
    """The mean return of the checkpoint's deterministic policy (no exploration noise) over --eval-episodes episodes of a
    fresh env with another seed, in a fresh actor; None if a signal stops it. Video: one MP4 per episode."""
    env = make_env(args.env_id, args.seed + EVAL_SEED_OFFSET, render_mode="rgb_array" if video_folder else None)
    actor = Actor(env.observation_space.shape[0], env.action_space.shape[0], env.action_space.low,
                  env.action_space.high).to(device)  # fmt: skip
    actor.load_state_dict(checkpoint["agent"]["actor"])
    returns = []
    obs, _ = env.reset(seed=args.seed + EVAL_SEED_OFFSET)
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
            with torch.no_grad():
                action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))
            obs, reward, terminated, truncated, _ = env.step(action[0].cpu().numpy())
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
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    td3 = build_td3(obs_dim, action_dim, env.action_space.low, env.action_space.high, args, device)
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, action_dim)
    recent_returns = deque(maxlen=20)
    if checkpoint:
        td3.load_state_dict(checkpoint["agent"])
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
    measure_start_step = train_step + args.measure_burnin
    train_start = measure_start = None
    sps = compile_seconds = None
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

        if step < args.learning_starts:
            actions = env.action_space.sample()
        else:
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            actions = td3.policy(obs_tensor)[0].cpu().numpy()

        next_obs, reward, terminated, truncated, _ = env.step(actions)
        # A time-limit truncation still bootstraps from next_obs; only a termination cuts the return.
        replay_buffer.add(obs, next_obs, actions, reward, terminated)
        episode_return += float(reward)
        if terminated or truncated:
            episode_returns.append(episode_return)
            recent_returns.append(episode_return)
            if args.track:
                wandb.log({"charts/episodic_return": episode_return}, step=step)
            episode_return = 0.0
            next_obs, _ = env.reset()
        obs = next_obs

        if step >= args.learning_starts:
            data = replay_buffer.sample(args.batch_size, device)
            losses = td3.update_critic(data)
            if step % args.policy_frequency == 0:  # delayed: the actor and the targets move less often
                losses.update(td3.update_actor(data))
                td3.update_targets()

            if step % LOG_EVERY == 0:
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
            save_checkpoint(model_path, td3, replay_buffer, args, global_step, recent_returns)
    pbar.close()
    env.close()

    end = time.perf_counter()
    if measure_start is not None and global_step > measure_start_step:
        sps = (global_step - measure_start_step) / (end - measure_start)
    eval_return = None
    if args.save_model:
        save_checkpoint(model_path, td3, replay_buffer, args, global_step, recent_returns)
        if args.eval_episodes and not stop_signals:
            video_folder = os.path.join(os.path.dirname(model_path), "videos") if args.capture_video else None
            if video_folder:
                os.makedirs(video_folder, exist_ok=True)
            eval_checkpoint = torch.load(model_path, map_location="cpu", weights_only=True)
            eval_return = evaluate(eval_checkpoint, args, device, video_folder, stop_signals)
    final_return = float(np.mean(recent_returns)) if recent_returns else None
    results = {
        "script": script,
        "algo": "td3",
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
        else "sps not measured (run ended before learning_starts + measure_burnin)"
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
