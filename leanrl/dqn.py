# Deep Q-Network (DQN) for discrete actions, plain eager PyTorch (the baseline of the speed-up table).
# Its twin, dqn_torchcompile.py, trains the same agent faster: `diff` the two files.
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
    env_id: str = "CartPole-v1"
    """the id of the environment (a gymnasium id with a discrete action space and a flat observation)"""
    total_timesteps: int = 500000
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """gradient steps after learning starts that are left out of the sps measure (compile, warm-up)"""
    results_path: str | None = None
    """if set, append one JSON line with this run's results to this file"""
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


def make_env(env_id, seed):
    try:
        env = gym.make(env_id)
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
        return {
            key: torch.as_tensor(getattr(self, key)[idx], device=device)
            for key in ("observations", "next_observations", "actions", "rewards", "terminations")
        }


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

    return SimpleNamespace(
        qnet=qnet,
        target_qnet=target_qnet,
        optimizer=optimizer,
        update=update,
        update_target=update_target,
        greedy_actions=greedy_actions,
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
    obs_dim, n_actions = env.observation_space.shape[0], int(env.action_space.n)
    dqn = build_dqn(obs_dim, n_actions, args, device)
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim)

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=args.exp_name)

    obs, _ = env.reset(seed=args.seed)
    episode_return, episode_returns = 0.0, []
    recent_returns = deque(maxlen=20)
    measure_start_step = args.learning_starts + args.measure_burnin * args.train_frequency
    train_start = measure_start = None
    sps = compile_seconds = None
    losses = None  # the last gradient step's, logged every LOG_EVERY steps
    pbar = tqdm.tqdm(range(args.total_timesteps), desc=script, mininterval=1.0)
    for global_step in pbar:
        if global_step == args.learning_starts:
            train_start = time.perf_counter()
        if global_step == measure_start_step:
            measure_start = time.perf_counter()
            compile_seconds = measure_start - train_start

        # Epsilon-greedy: a random action with probability epsilon, else the action of the highest Q value.
        epsilon = epsilon_at(global_step, args)
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
                wandb.log({"charts/episodic_return": episode_return, "charts/epsilon": epsilon}, step=global_step)
            episode_return = 0.0
            next_obs, _ = env.reset()
        obs = next_obs

        if global_step >= args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = replay_buffer.sample(args.batch_size, device)
                losses = dqn.update(data)
            if global_step % args.target_network_frequency == 0:
                dqn.update_target()

            if global_step % LOG_EVERY == 0 and losses is not None:
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
        else "sps not measured (run ended before learning_starts + measure_burnin gradient steps)"
    )
    return_text = f"{final_return:.1f}" if final_return is not None else "n/a (no finished episode)"
    print(f"{script}: {args.total_timesteps} steps on {args.env_id}, {sps_text}, final return {return_text}")
