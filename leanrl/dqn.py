# Deep Q-Network (DQN) for discrete actions, plain eager PyTorch (the baseline of the speed-up table).
# Its twin, dqn_torchcompile.py, trains the same agent faster: `diff` the two files.
import os
import random
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import run_utils
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro


@dataclass
class Args(run_utils.RunArgs):  # RunArgs: the flags every script has (seed, cuda, checkpoints, evaluation, ...)
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "CartPole-v1"
    """the id of the environment (a gymnasium id with a discrete action space and a flat observation)"""
    total_timesteps: int = 500000
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """gradient steps after learning starts that are left out of the sps measure (compile, warm-up)"""
    eval_episodes: int = 10
    """episodes of the saved agent's epsilon-greedy policy (epsilon 0.05) on a fresh env after training"""
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


LOG_EVERY = 100  # steps between logs (the sps and return beside the bar, wandb) and the non-finite loss check
# Each numeric hyper-parameter's domain, checked before the first step (run_utils.RUN_DOMAINS: the other flags').
DOMAINS = {
    "learning_rate": "> 0",
    "buffer_size": ">= 1",
    "gamma": "[0, 1]",
    "tau": "[0, 1]",
    "target_network_frequency": ">= 1",
    "batch_size": ">= 1",
    "start_e": "[0, 1]",
    "end_e": "[0, 1]",
    "exploration_fraction": "(0, 1]",
    "learning_starts": ">= 0",
    "train_frequency": ">= 1",
}
EVAL_EPSILON = 0.05  # the evaluation's exploration rate, as in CleanRL's DQN evaluation


def check_args(args):
    run_utils.check_domains(args, DOMAINS)
    if args.batch_size > args.buffer_size:
        run_utils.exit_with_error(f"--batch-size ({args.batch_size}) is larger than --buffer-size ({args.buffer_size})")
    if args.end_e > args.start_e:
        run_utils.exit_with_error(f"--end-e ({args.end_e}) is above --start-e ({args.start_e}): epsilon only goes down")


def make_env(env_id, seed, render_mode=None):
    try:
        # Asked for only when recording: an env that takes no render_mode argument still trains.
        env = gym.make(env_id, render_mode=render_mode) if render_mode else gym.make(env_id)
    except gym.error.Error as error:
        run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
    if not isinstance(env.action_space, gym.spaces.Discrete):
        run_utils.exit_with_error(f"DQN needs a discrete action space, {env_id} has {env.action_space}")
    # The Q network is an MLP: it takes a vector, not an image (which needs a convolutional network).
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        run_utils.exit_with_error(f"DQN's Q network (an MLP) needs a flat Box observation, {env_id} has {space}")
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

    def state_dict():
        """The networks' and the optimizer's state_dicts: a checkpoint's agent."""
        return {
            "qnet": qnet.state_dict(),
            "target_qnet": target_qnet.state_dict(),
            "optimizer": optimizer.state_dict(),
        }

    def load_state_dict(state):
        qnet.load_state_dict(state["qnet"])
        target_qnet.load_state_dict(state["target_qnet"])
        optimizer.load_state_dict(state["optimizer"])

    return SimpleNamespace(
        update=update,
        update_target=update_target,
        greedy_actions=greedy_actions,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def evaluation_policy(checkpoint, env, device):
    """The saved agent's epsilon-greedy policy (epsilon 0.05, as CleanRL evaluates DQN), for the evaluation: a fresh
    Q network. The exploration draws come from a generator of their own, seeded with the evaluation's seed, so the
    plain script and its twin play the same episodes."""
    qnet = QNetwork(env.observation_space.shape[0], int(env.action_space.n)).to(device)
    qnet.load_state_dict(checkpoint["agent"]["qnet"])
    explore = np.random.default_rng(checkpoint["seed"] + run_utils.EVAL_SEED_OFFSET)

    def act(obs):
        if explore.random() < EVAL_EPSILON:
            return env.action_space.sample()
        with torch.no_grad():
            return qnet(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)).argmax(1)[0].item()

    return act


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    make_eval_env = lambda seed, render_mode: make_env(args.env_id, seed, render_mode)  # noqa: E731
    run = run_utils.Run(
        args,
        script=__file__,
        algo="dqn",
        name="DQN",
        total_steps=args.total_timesteps,
        make_eval_env=make_eval_env,
        schedule="the epsilon decay",
        ended_early="before learning_starts + measure_burnin gradient steps",
    )
    device = run.device
    start_step = run.checkpoint["global_step"] if run.checkpoint else 0

    # A resumed run starts a new episode, on an env seeded by the step it resumes at.
    env_seed = args.seed + start_step
    env = make_env(args.env_id, env_seed)
    obs_dim, n_actions = env.observation_space.shape[0], int(env.action_space.n)
    dqn = build_dqn(obs_dim, n_actions, args, device)
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim)
    if run.checkpoint:
        dqn.load_state_dict(run.checkpoint["agent"])
        replay_buffer.load_state_dict(run.checkpoint["replay_buffer"])
        run_utils.set_rng_state(run.checkpoint["rng"])

    def save_checkpoint():  # a DQN checkpoint: the step, the agent and the replay buffer (Run adds the run's state)
        run.save_checkpoint(global_step=global_step, agent=dqn.state_dict(), replay_buffer=replay_buffer.state_dict())

    obs, _ = env.reset(seed=env_seed)
    episode_return = 0.0
    train_step = max(args.learning_starts, start_step)  # where this process starts training
    measure_step = train_step + args.measure_burnin * args.train_frequency  # and where the sps clock starts counting
    losses = None  # the last gradient step's, logged every LOG_EVERY steps
    global_step = start_step  # the steps done, as the loop goes
    for step in range(start_step, args.total_timesteps):
        run.clock(step, train_from=train_step, measure_from=measure_step, global_step=global_step)
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
            run.episode(episode_return, step + 1, epsilon=epsilon)
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
                run.log(step, losses)

        global_step = step + 1
        if run.checkpoint_due(global_step):
            save_checkpoint()
        if run.stopping:
            break
    env.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
