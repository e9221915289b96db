# Twin Delayed DDPG (TD3) for continuous actions, plain eager PyTorch (the baseline of the speed-up table).
# Its twin, td3_continuous_action_torchcompile.py, trains the same agent faster: `diff` the two files.
import json
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
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


def make_env(env_id, seed):
    try:
        env = gym.make(env_id)
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
        return {
            key: torch.as_tensor(getattr(self, key)[idx], device=device)
            for key in ("observations", "next_observations", "actions", "rewards", "terminations")
        }


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

    return SimpleNamespace(
        actor=actor,
        qf1=qf1,
        qf2=qf2,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
        policy=policy,
    )


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    run_start = time.perf_counter()
    script = os.path.basename(__file__)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    env = make_env(args.env_id, args.seed)
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    td3 = build_td3(obs_dim, action_dim, env.action_space.low, env.action_space.high, args, device)
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, action_dim)

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=args.exp_name)

    obs, _ = env.reset(seed=args.seed)
    episode_return, episode_returns = 0.0, []
    recent_returns = deque(maxlen=20)
    measure_start_step = args.learning_starts + args.measure_burnin
    train_start = measure_start = None
    sps = compile_seconds = None
    pbar = tqdm.tqdm(range(args.total_timesteps), desc=script, mininterval=1.0)
    for global_step in pbar:
        if global_step == args.learning_starts:
            train_start = time.perf_counter()
        if global_step == measure_start_step:
            measure_start = time.perf_counter()
            compile_seconds = measure_start - train_start

        if global_step < args.learning_starts:
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
                wandb.log({"charts/episodic_return": episode_return}, step=global_step)
            episode_return = 0.0
            next_obs, _ = env.reset()
        obs = next_obs

        if global_step >= args.learning_starts:
            data = replay_buffer.sample(args.batch_size, device)
            losses = td3.update_critic(data)
            if global_step % args.policy_frequency == 0:  # delayed: the actor and the targets move less often
                losses.update(td3.update_actor(data))
                td3.update_targets()

            if global_step % LOG_EVERY == 0:
                logs = {name: value.item() for name, value in losses.items()}
                for name, value in logs.items():
                    if not np.isfinite(value):
                        pbar.close()
                        sys.exit(f"{script}: error: {name} is {value} at step {global_step}; stopping the run")
                if measure_start is not None and global_step > measure_start_step:
                    sps = (global_step - measure_start_step) / (time.perf_counter() - measure_start)
                mean_return = np.mean(recent_returns) if recent_returns else float("nan")
                pbar.set_postfix(sps=f"{sps or 0:.0f}", ret=f"{mean_return:.1f}", refresh=False)
                if args.track:
                    wandb.log({f"losses/{k}": v for k, v in logs.items()}, step=global_step)
    pbar.close()
    env.close()

    end = time.perf_counter()
    if measure_start is not None and args.total_timesteps > measure_start_step:
        sps = (args.total_timesteps - measure_start_step) / (end - measure_start)
    final_return = float(np.mean(episode_returns[-20:])) if episode_returns else None
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
    }
    if args.results_path:
        with open(args.results_path, "a") as f:
            f.write(json.dumps(results) + "\n")
    if args.track:
        wandb.log({"charts/sps": sps}, step=args.total_timesteps)
        wandb.finish()
    sps_text = (
        f"{sps:.0f} sps (steady state)"
        if sps
        else "sps not measured (run ended before learning_starts + measure_burnin)"
    )
    return_text = f"{final_return:.1f}" if final_return is not None else "n/a (no finished episode)"
    print(f"{script}: {args.total_timesteps} steps on {args.env_id}, {sps_text}, final return {return_text}")
