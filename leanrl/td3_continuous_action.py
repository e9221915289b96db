# Twin Delayed DDPG (TD3) for continuous actions, plain eager PyTorch (the baseline of the speed-up table).
# Its twin, td3_continuous_action_torchcompile.py, trains the same agent faster: `diff` the two files.
import os
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
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (a gymnasium id with a bounded continuous action space)"""
    total_timesteps: int = 1000000
    """total env steps of the experiment, every env's counted (rounded up to a multiple of num_envs)"""
    eval_episodes: int = 10
    """episodes of the saved agent's deterministic policy (no noise) on a fresh env after training"""
    learning_rate: float = 3e-4
    """the learning rate of the actor and Q network optimizers"""
    num_envs: int = 1
    """the number of environments stepped together, one transition each per iteration"""
    gradient_steps: int = 1
    """gradient steps (critic updates, each on its own batch) per iteration"""
    buffer_size: int = int(1e6)
    """the replay memory buffer size, in transitions (env steps)"""
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
    """the env step (every env's counted) to start learning"""
    policy_frequency: int = 2
    """the frequency of training the policy and updating the target networks (delayed), in gradient steps"""
    noise_clip: float = 0.5
    """noise clip parameter of the target policy smoothing regularization"""


LOG_EVERY = 100  # iterations (steps of one env) between logs and the non-finite loss check
# Each numeric hyper-parameter's domain, checked before the first step (run_utils.RUN_DOMAINS: the other flags').
DOMAINS = {
    "learning_rate": "> 0",
    "num_envs": ">= 1",
    "gradient_steps": ">= 1",
    "buffer_size": ">= 1",
    "gamma": "[0, 1]",
    "tau": "[0, 1]",
    "batch_size": ">= 1",
    "policy_noise": ">= 0",
    "exploration_noise": ">= 0",
    "learning_starts": ">= 0",
    "policy_frequency": ">= 1",
    "noise_clip": ">= 0",
}


def check_args(args):
    run_utils.check_domains(args, DOMAINS)
    if args.batch_size > args.buffer_size:
        run_utils.exit_with_error(f"--batch-size ({args.batch_size}) is larger than --buffer-size ({args.buffer_size})")
    if args.num_envs > args.buffer_size:
        run_utils.exit_with_error(
            f"--num-envs ({args.num_envs}) is larger than --buffer-size ({args.buffer_size}): "
            "an iteration's transitions must fit in the buffer"
        )


def make_env(env_id, render_mode=None):
    try:
        env = run_utils.make_gym_env(env_id, render_mode)  # gym.make, without MuJoCo's settotalmass warning
    except gym.error.Error as error:
        run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
    space = env.action_space
    # The actor's tanh is scaled to the action bounds, so they must be finite.
    if not isinstance(space, gym.spaces.Box) or not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        run_utils.exit_with_error(f"TD3 needs a bounded continuous (Box) action space, {env_id} has {space}")
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

    def add(self, obs, next_obs, actions, rewards, terminations):
        """An iteration's transitions, one per env (a row each, wrapping around the end)."""
        idx = (self.pos + np.arange(len(obs))) % self.size
        self.observations[idx] = obs
        self.next_observations[idx] = next_obs
        self.actions[idx] = actions
        self.rewards[idx] = rewards
        self.terminations[idx] = terminations
        self.full = self.full or self.pos + len(obs) >= self.size
        self.pos = (self.pos + len(obs)) % self.size

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

    networks = dict(
        actor=actor, qf1=qf1, qf2=qf2, target_actor=target_actor, qf1_target=qf1_target, qf2_target=qf2_target
    )
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
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
        policy=policy,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def evaluation_policy(checkpoint, env, device):
    """The saved agent's deterministic policy, for the evaluation: a fresh actor's action, no exploration noise."""
    actor = Actor(
        env.observation_space.shape[0], env.action_space.shape[0], env.action_space.low, env.action_space.high
    ).to(device)
    actor.load_state_dict(checkpoint["agent"]["actor"])

    def act(obs):
        with torch.no_grad():
            return actor(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))[0].cpu().numpy()

    return act


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    make_eval_env = lambda seed, render_mode: make_env(args.env_id, render_mode)  # noqa: E731
    run = run_utils.Run(
        args,
        script=__file__,
        algo="td3",
        name="TD3",
        total_steps=args.total_timesteps,
        make_eval_env=make_eval_env,
        ended_early="before learning_starts + measure_burnin",
    )
    device = run.device
    start_step = run.checkpoint["global_step"] if run.checkpoint else 0

    # num_envs envs stepped together. One whose episode ends is reset in that same step; the episode's last
    # observation is in infos["final_obs"], so every stored transition is a real one.
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id) for _ in range(args.num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    # A resumed run starts new episodes, on envs seeded by the step it resumes at.
    env_seed = args.seed + start_step
    envs.action_space.seed(env_seed)
    action_space = envs.single_action_space
    obs_dim, action_dim = envs.single_observation_space.shape[0], action_space.shape[0]
    td3 = build_td3(obs_dim, action_dim, action_space.low, action_space.high, args, device)
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, action_dim)
    if run.checkpoint:
        td3.load_state_dict(run.checkpoint["agent"])
        replay_buffer.load_state_dict(run.checkpoint["replay_buffer"])
        run_utils.set_rng_state(run.checkpoint["rng"])

    def save_checkpoint():  # a TD3 checkpoint: the step, the agent and the replay buffer (Run adds the run's state)
        run.save_checkpoint(global_step=global_step, agent=td3.state_dict(), replay_buffer=replay_buffer.state_dict())

    obs, _ = envs.reset(seed=env_seed)
    current_returns = np.zeros(args.num_envs)  # each env's episode so far
    train_step = max(args.learning_starts, start_step)  # where this process starts training
    measure_step = train_step + args.measure_burnin * args.num_envs  # and where the sps clock starts counting
    global_step = start_step  # the steps done, as the loop goes
    for step in range(start_step, args.total_timesteps, args.num_envs):
        run.clock(step, train_from=train_step, measure_from=measure_step, global_step=global_step)
        if step < args.learning_starts:
            actions = envs.action_space.sample()
        else:
            actions = td3.policy(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        # A time-limit truncation still bootstraps from the episode's last observation; only a termination cuts it.
        real_next_obs = next_obs.copy()
        current_returns += rewards
        for index in np.flatnonzero(terminations | truncations):
            real_next_obs[index] = infos["final_obs"][index]
            run.episode(float(current_returns[index]), step + args.num_envs)
            current_returns[index] = 0.0
        replay_buffer.add(obs, real_next_obs, actions, rewards, terminations)
        obs = next_obs

        if step >= args.learning_starts:
            iteration = step // args.num_envs
            # This iteration's gradient steps, numbered over the run: the delay counts them.
            for update in range(iteration * args.gradient_steps, (iteration + 1) * args.gradient_steps):
                data = replay_buffer.sample(args.batch_size, device)
                losses = td3.update_critic(data)
                if update % args.policy_frequency == 0:  # delayed: the actor and the targets move less often
                    losses.update(td3.update_actor(data))
                    td3.update_targets()
            # Counted in iterations, not env steps: every log reads the losses back, a wait for the device.
            if iteration % LOG_EVERY == 0:
                run.log(step, losses)

        global_step = step + args.num_envs
        if run.checkpoint_due(global_step, args.num_envs):
            save_checkpoint()
        if run.stopping:
            break
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
