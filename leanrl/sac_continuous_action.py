# Soft Actor-Critic for continuous actions, plain eager PyTorch (the baseline of the speed-up table).
# Its twin, sac_continuous_action_torchcompile.py, trains the same agent faster: `diff` the two files.
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
    """the id of the environment (a gymnasium id with a continuous action space)"""
    total_timesteps: int = 1000000
    """total env steps of the experiment, every env's counted (rounded up to a multiple of num_envs)"""
    eval_episodes: int = 10
    """episodes of the saved agent's deterministic policy (its mean action) on a fresh env after training"""
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
    learning_starts: int = 5000
    """the env step (every env's counted) to start learning"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the Q network optimizer"""
    policy_frequency: int = 2
    """the frequency of training policy (delayed), in gradient steps; it is updated this many times to compensate"""
    target_network_frequency: int = 1
    """the frequency of updates for the target networks, in gradient steps"""
    alpha: float = 0.2
    """entropy regularization coefficient (the initial value when autotune is on)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""


LOG_EVERY = 100  # iterations (steps of one env) between logs and the non-finite loss check
# Each numeric hyper-parameter's domain, checked before the first step (run_utils.RUN_DOMAINS: the other flags').
DOMAINS = {
    "num_envs": ">= 1",
    "gradient_steps": ">= 1",
    "buffer_size": ">= 1",
    "gamma": "[0, 1]",
    "tau": "[0, 1]",
    "batch_size": ">= 1",
    "learning_starts": ">= 0",
    "policy_lr": "> 0",
    "q_lr": "> 0",
    "policy_frequency": ">= 1",
    "target_network_frequency": ">= 1",
    "alpha": ">= 0",
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
    if args.autotune and args.alpha == 0:
        run_utils.exit_with_error("--autotune learns log(alpha) from --alpha, which must then be positive")


def make_env(env_id, render_mode=None):
    try:
        env = run_utils.make_gym_env(env_id, render_mode)  # gym.make, without MuJoCo's settotalmass warning
    except gym.error.Error as error:
        run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
    if not isinstance(env.action_space, gym.spaces.Box):
        run_utils.exit_with_error(f"SAC needs a continuous (Box) action space, {env_id} has {env.action_space}")
    return env


class SoftQNetwork(nn.Module):
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


LOG_STD_MAX = 2
LOG_STD_MIN = -5


class Actor(nn.Module):
    def __init__(self, obs_dim, action_dim, action_low, action_high):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mean = nn.Linear(256, action_dim)
        self.fc_logstd = nn.Linear(256, action_dim)
        action_low = torch.as_tensor(action_low, dtype=torch.float32)
        action_high = torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (action_high - action_low) / 2.0)
        self.register_buffer("action_bias", (action_high + action_low) / 2.0)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # from SpinUp / Denis Yarats
        return mean, log_std

    def get_action(self, x):
        mean, log_std = self(x)
        std = log_std.exp()
        normal = torch.distributions.Normal(mean, std)
        x_t = normal.rsample()  # reparameterization trick (mean + std * N(0,1))
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = normal.log_prob(x_t)
        # Enforcing action bounds: correct the density for the tanh squashing.
        log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
        log_prob = log_prob.sum(1, keepdim=True)
        mean = torch.tanh(mean) * self.action_scale + self.action_bias
        return action, log_prob, mean


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


def build_sac(obs_dim, action_dim, action_low, action_high, args, device):
    """The networks, optimizers and update functions of SAC; the training loop only calls the functions."""
    actor = Actor(obs_dim, action_dim, action_low, action_high).to(device)
    qf1 = SoftQNetwork(obs_dim, action_dim).to(device)
    qf2 = SoftQNetwork(obs_dim, action_dim).to(device)
    qf1_target = SoftQNetwork(obs_dim, action_dim).to(device)
    qf2_target = SoftQNetwork(obs_dim, action_dim).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr)

    # Automatic entropy tuning: alpha is learned so that the policy's entropy stays near -|A|.
    target_entropy = -float(action_dim)
    log_alpha = torch.tensor(np.log(args.alpha), dtype=torch.float32, device=device, requires_grad=True)
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr)
    alpha = args.alpha

    def update_critic(data):
        with torch.no_grad():
            next_state_actions, next_state_log_pi, _ = actor.get_action(data["next_observations"])
            qf1_next_target = qf1_target(data["next_observations"], next_state_actions)
            qf2_next_target = qf2_target(data["next_observations"], next_state_actions)
            min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
            next_q_value = data["rewards"] + (1 - data["terminations"]) * args.gamma * min_qf_next_target.view(-1)

        qf1_a_values = qf1(data["observations"], data["actions"]).view(-1)
        qf2_a_values = qf2(data["observations"], data["actions"]).view(-1)
        qf_loss = F.mse_loss(qf1_a_values, next_q_value) + F.mse_loss(qf2_a_values, next_q_value)

        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        return {"qf_loss": qf_loss.detach(), "qf1_values": qf1_a_values.detach().mean()}

    def update_actor(data):
        nonlocal alpha
        pi, log_pi, _ = actor.get_action(data["observations"])
        min_qf_pi = torch.min(qf1(data["observations"], pi), qf2(data["observations"], pi))
        actor_loss = ((alpha * log_pi) - min_qf_pi).mean()

        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        losses = {"actor_loss": actor_loss.detach()}

        if args.autotune:
            # log_pi of the batch just used for the actor, detached: alpha follows the policy's entropy.
            alpha_loss = (-log_alpha.exp() * (log_pi.detach() + target_entropy)).mean()
            losses["alpha_loss"] = alpha_loss.detach()
            alpha_optimizer.zero_grad()
            alpha_loss.backward()
            alpha_optimizer.step()
            alpha = log_alpha.exp().item()
        return losses

    def update_targets():
        for net, target_net in ((qf1, qf1_target), (qf2, qf2_target)):
            for param, target_param in zip(net.parameters(), target_net.parameters(), strict=True):
                target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

    def policy(obs):
        with torch.no_grad():
            return actor.get_action(obs)[0]

    networks = dict(actor=actor, qf1=qf1, qf2=qf2, qf1_target=qf1_target, qf2_target=qf2_target)
    optimizers = dict(q_optimizer=q_optimizer, actor_optimizer=actor_optimizer, alpha_optimizer=alpha_optimizer)

    def state_dict():
        """The networks' and optimizers' state_dicts and log_alpha: a checkpoint's agent."""
        return {
            **{name: net.state_dict() for name, net in networks.items()},
            **{name: optimizer.state_dict() for name, optimizer in optimizers.items()},
            "log_alpha": log_alpha.detach().clone(),
        }

    def load_state_dict(state):
        nonlocal alpha
        for name, net in networks.items():
            net.load_state_dict(state[name])
        for name, optimizer in optimizers.items():
            optimizer.load_state_dict(state[name])
        log_alpha.data.copy_(state["log_alpha"])
        if args.autotune:
            alpha = log_alpha.exp().item()

    return SimpleNamespace(
        log_alpha=log_alpha,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
        policy=policy,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def evaluation_policy(checkpoint, env, device):
    """The saved agent's deterministic policy, for the evaluation: the mean action of a fresh actor."""
    actor = Actor(
        env.observation_space.shape[0], env.action_space.shape[0], env.action_space.low, env.action_space.high
    ).to(device)
    actor.load_state_dict(checkpoint["agent"]["actor"])

    def act(obs):
        with torch.no_grad():
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            return actor.get_action(obs_tensor)[2][0].cpu().numpy()  # [2]: the mean action

    return act


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    make_eval_env = lambda seed, render_mode: make_env(args.env_id, render_mode)  # noqa: E731
    run = run_utils.Run(
        args,
        script=__file__,
        algo="sac",
        name="SAC",
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
    sac = build_sac(obs_dim, action_dim, action_space.low, action_space.high, args, device)
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, action_dim)
    if run.checkpoint:
        sac.load_state_dict(run.checkpoint["agent"])
        replay_buffer.load_state_dict(run.checkpoint["replay_buffer"])
        run_utils.set_rng_state(run.checkpoint["rng"])

    def save_checkpoint():  # a SAC checkpoint: the step, the agent and the replay buffer (Run adds the run's state)
        run.save_checkpoint(global_step=global_step, agent=sac.state_dict(), replay_buffer=replay_buffer.state_dict())

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
            actions = sac.policy(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()

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
            # This iteration's gradient steps, numbered over the run: the delays count them.
            for update in range(iteration * args.gradient_steps, (iteration + 1) * args.gradient_steps):
                data = replay_buffer.sample(args.batch_size, device)
                losses = sac.update_critic(data)
                if update % args.policy_frequency == 0:
                    for _ in range(args.policy_frequency):  # compensate for the delay by doing several updates
                        losses.update(sac.update_actor(data))
                if update % args.target_network_frequency == 0:
                    sac.update_targets()
            # Counted in iterations, not env steps: every log reads the losses back, a wait for the device.
            if iteration % LOG_EVERY == 0:
                run.log(step, losses, {"alpha": sac.log_alpha.exp()})

        global_step = step + args.num_envs
        if run.checkpoint_due(global_step, args.num_envs):
            save_checkpoint()
        if run.stopping:
            break
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
