# Twin Delayed DDPG (TD3) for continuous actions, written for speed: the same agent and flags as
# td3_continuous_action.py, plus --compile and --cudagraphs. `diff` the two files to see the speed tricks.
import importlib.util
import json
import os
import random
import signal
import sys
import time
import warnings
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
from tensordict import TensorDict, from_modules
from tensordict.nn import CudaGraphModule


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
    compile: bool = False
    """if toggled, the updates and action selection are compiled with torch.compile"""
    cudagraphs: bool = False
    """if toggled, the updates and action selection are captured in CUDA graphs (CUDA only)"""


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
    """Transitions as rows of one tensor preallocated on the training device, overwritten oldest first.

    One row per transition: adding one is a single copy and sampling a batch a single gather, where a buffer per
    field takes five of each; the batch is a TensorDict of views into the gathered rows, on the device that uses it.
    """

    def __init__(self, size, obs_dim, action_dim, device):
        self.field_sizes = dict(
            observations=obs_dim, next_observations=obs_dim, actions=action_dim, rewards=1, terminations=1
        )
        self.storage = torch.zeros(size, sum(self.field_sizes.values()), device=device)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, next_obs, action, reward, terminated):
        row = np.concatenate([obs, next_obs, action, [reward, terminated]], dtype=np.float32)
        self.storage[self.pos] = torch.from_numpy(row)
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch_size):
        idx = torch.randint(0, self.size if self.full else self.pos, (batch_size,), device=self.storage.device)
        fields = self.storage[idx].split(list(self.field_sizes.values()), dim=1)
        batch = dict(zip(self.field_sizes, fields, strict=True))
        batch["rewards"], batch["terminations"] = batch["rewards"][:, 0], batch["terminations"][:, 0]  # [B, 1] -> [B]
        return TensorDict(batch, batch_size=[batch_size])

    def state_dict(self):
        """The filled rows split into a tensor per field on the CPU: the plain script's layout."""
        filled = self.size if self.full else self.pos
        fields = self.storage[:filled].cpu().split(list(self.field_sizes.values()), dim=1)
        state = {key: field.clone() for key, field in zip(self.field_sizes, fields, strict=True)}  # not views of it all
        state["rewards"], state["terminations"] = state["rewards"][:, 0], state["terminations"][:, 0]
        return {**state, "pos": self.pos, "full": self.full}

    def load_state_dict(self, state):
        rows = torch.cat([state[key].reshape(len(state[key]), -1) for key in self.field_sizes], dim=1)
        self.storage[: len(rows)] = rows
        self.pos, self.full = state["pos"], state["full"]


def build_td3(obs_dim, action_dim, action_low, action_high, args, device):
    """The networks, optimizers and update functions of TD3; the training loop only calls the functions."""
    actor = Actor(obs_dim, action_dim, action_low, action_high).to(device)
    # Both Q networks as one ensemble: stacked parameters, evaluated by one vmapped call instead of two.
    qnet_params = from_modules(
        QNetwork(obs_dim, action_dim).to(device), QNetwork(obs_dim, action_dim).to(device), as_module=True
    )
    qnet = QNetwork(obs_dim, action_dim).to("meta")  # a shell without storage, filled with any Q parameter set
    qf1_params = qnet_params.data[0]  # detached views of Q1's parameters, the network that scores the actor
    # The targets are plain tensors, stored apart and swapped into storage-less shells to be evaluated:
    # they are updated by one lerp per TensorDict and never show up among the trainable parameters.
    actor_params = TensorDict.from_module(actor).data  # views of the actor's parameters and constant buffers
    target_actor_params = actor_params.clone()
    target_actor = Actor(obs_dim, action_dim, action_low, action_high).to("meta")
    target_qnet_params = qnet_params.data.clone()
    # fused: one multi-tensor kernel per step instead of a dozen small ops per parameter;
    # capturable: under a CUDA graph the step counter lives on the device.
    adam_kwargs = dict(fused=True, capturable=args.cudagraphs)
    q_optimizer = torch.optim.Adam(qnet_params.values(True, True), lr=args.learning_rate, **adam_kwargs)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, **adam_kwargs)
    action_low = torch.as_tensor(action_low, dtype=torch.float32, device=device)
    action_high = torch.as_tensor(action_high, dtype=torch.float32, device=device)

    def q_value(params, obs, actions):
        # preserve_module_state=False: plain tensors (the targets) must not be turned into trainable parameters.
        with params.to_module(qnet, preserve_module_state=False):
            return qnet(obs, actions)

    q_values = torch.vmap(q_value, (0, None, None))  # both networks in one call, over the stacked parameters

    # The loss and its backward pass in one function, so that --compile turns both into a single graph.
    def critic_backward(data):
        with torch.no_grad():
            # Target policy smoothing: clipped noise on the target action, so Q cannot exploit a narrow peak.
            noise = (torch.randn_like(data["actions"]) * args.policy_noise).clamp(-args.noise_clip, args.noise_clip)
            with target_actor_params.to_module(target_actor, preserve_module_state=False):  # the target actor
                next_state_actions = target_actor(data["next_observations"]) + noise * target_actor.action_scale
            next_state_actions = next_state_actions.clamp(action_low, action_high)
            qf_next_target = q_values(target_qnet_params, data["next_observations"], next_state_actions)
            min_qf_next_target = qf_next_target.min(0).values
            next_q_value = data["rewards"] + (1 - data["terminations"]) * args.gamma * min_qf_next_target.view(-1)

        qf_a_values = q_values(qnet_params, data["observations"], data["actions"]).view(2, -1)
        # The sum over the ensemble of each network's MSE, as qf1_loss + qf2_loss.
        qf_loss = (qf_a_values - next_q_value).pow(2).mean(1).sum()
        qf_loss.backward()
        return TensorDict(qf_loss=qf_loss.detach(), qf1_values=qf_a_values[0].detach().mean())

    # zero_grad and the step stay outside the compiled function: torch.optim breaks the graph anyway,
    # and the fused step is a single kernel already.
    def update_critic(data):
        q_optimizer.zero_grad()
        losses = critic_backward(data)
        q_optimizer.step()
        return losses

    def actor_backward(data):
        # Q1 alone, not the vmapped ensemble: half the matmuls, which are what costs on CPU.
        # Detached Q parameters: the gradient flows through the actions only, no wasted Q gradients.
        actor_loss = -q_value(qf1_params, data["observations"], actor(data["observations"])).mean()
        actor_loss.backward()
        return TensorDict(actor_loss=actor_loss.detach())

    def update_actor(data):
        actor_optimizer.zero_grad()
        losses = actor_backward(data)
        actor_optimizer.step()
        return losses

    def update_targets():
        # One in-place lerp per TensorDict instead of a Python loop over tensors; the actor's constant buffers
        # ride along unchanged (a lerp between equal values).
        target_actor_params.lerp_(actor_params, args.tau)
        target_qnet_params.lerp_(qnet_params.data, args.tau)

    def policy(obs):
        with torch.no_grad():
            actions = actor(obs)
            actions = actions + torch.randn_like(actions) * actor.action_scale * args.exploration_noise
            return actions.clamp(action_low, action_high)

    # The update functions look critic_backward and actor_backward up when called, so they use the compiled ones.
    if args.compile:
        # Trace backward() into the compiled graph (torch >= 2.11): forward and backward become one kernel
        # program, with no autograd engine at run time. Older versions compile them as two graphs.
        if hasattr(torch._dynamo.config, "trace_autograd_ops"):
            torch._dynamo.config.trace_autograd_ops = True
        # TensorDictParams' lock is not enforced inside compiled code; tensordict says so on every run.
        warnings.filterwarnings("ignore", message=r"Using lock_\(\) inside a compiled graph")
        # Compiled: fused kernels instead of one Python dispatch per op. On CPU, the graphs are called from generated
        # C++ instead of Python (cpp_wrapper: 7% off an update here), and the noise comes from ATen's generator
        # (fallback_random): inductor's own random kernel there takes ~0.1 ms for a batch's 1536 draws.
        on_cpu = device.type == "cpu"
        critic_backward = torch.compile(critic_backward, options={"cpp_wrapper": on_cpu, "fallback_random": on_cpu})
        actor_backward = torch.compile(actor_backward, options={"cpp_wrapper": on_cpu})
        # On CPU, acting stays eager: one observation through three small layers is faster than a compiled call.
        if not on_cpu:
            policy = torch.compile(policy)
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        update_critic = CudaGraphModule(update_critic, in_keys=[], out_keys=[], warmup=5)
        update_actor = CudaGraphModule(update_actor, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)

    # Checkpoints hold the plain script's layout: a state_dict per network, optimizer state per parameter of each Q
    # network, and the plain optimizers' settings (the twin's fused and capturable are its own).
    def network_state(params):
        return {key: value.clone() for key, value in params.flatten_keys(".").items()}

    def optimizer_state(optimizer, **settings):
        state = optimizer.state_dict()
        return {**state, "param_groups": [{**group, **settings} for group in state["param_groups"]]}

    def state_dict():
        """The networks' and optimizers' state_dicts, as the plain script saves them."""
        q_state = optimizer_state(q_optimizer, fused=None, capturable=False)
        n = len(q_state["param_groups"][0]["params"])  # stacked parameters: each stands for one per network
        q_state["state"] = {
            i * n + k: {name: value if name == "step" else value[i] for name, value in param_state.items()}
            for i in range(2)
            for k, param_state in q_state["state"].items()
        }
        q_state["param_groups"][0]["params"] = list(range(2 * n))
        return {
            "actor": actor.state_dict(),
            **{f"qf{i + 1}": network_state(qnet_params.data[i]) for i in range(2)},
            "target_actor": network_state(target_actor_params),
            **{f"qf{i + 1}_target": network_state(target_qnet_params[i]) for i in range(2)},
            "q_optimizer": q_state,
            "actor_optimizer": optimizer_state(actor_optimizer, fused=None, capturable=False),
        }

    def load_state_dict(state):
        actor.load_state_dict(state["actor"])
        target_actor_params.update_(TensorDict(state["target_actor"]).unflatten_keys("."))
        for i in range(2):
            qnet_params.data[i].update_(TensorDict(state[f"qf{i + 1}"]).unflatten_keys("."))
            target_qnet_params[i].update_(TensorDict(state[f"qf{i + 1}_target"]).unflatten_keys("."))
        q_state = state["q_optimizer"]
        n = len(q_state["param_groups"][0]["params"]) // 2
        stacked = {
            k: {name: value if name == "step" else torch.stack([value, q_state["state"][n + k][name]])
                for name, value in q_state["state"][k].items()}
            for k in range(n) if k in q_state["state"]
        }  # fmt: skip
        groups = [{**group, "params": list(range(n))} for group in q_state["param_groups"]]
        for optimizer, saved in ((q_optimizer, {"state": stacked, "param_groups": groups}),
                                 (actor_optimizer, state["actor_optimizer"])):  # fmt: skip
            optimizer.load_state_dict(
                {**saved, "param_groups": [{**group, **adam_kwargs} for group in saved["param_groups"]]}
            )

    return SimpleNamespace(
        actor=actor,
        qnet_params=qnet_params,
        target_qnet_params=target_qnet_params,
        target_actor_params=target_actor_params,
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
    if args.cudagraphs and device.type != "cuda":
        print(f"{script}: --cudagraphs needs a CUDA device; cudagraphs are off for this run", file=sys.stderr)
        args.cudagraphs = False
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
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, action_dim, device)
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
            data = replay_buffer.sample(args.batch_size)
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
        "compile": args.compile,
        "cudagraphs": args.cudagraphs,
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
