# Deep Q-Network (DQN) for discrete actions, written for speed: the same agent and flags as dqn.py, plus
# --compile and --cudagraphs. `diff` the two files to see the speed tricks.
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
import twin_utils
import tyro
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule


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
    compile: bool = False
    """if toggled, the update and action selection are compiled with torch.compile"""
    cudagraphs: bool = False
    """if toggled, the update and action selection are captured in CUDA graphs (CUDA only)"""


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
    """Transitions as rows of one tensor on the device, oldest overwritten first: one copy adds, one gather samples."""

    def __init__(self, size, obs_dim, device):
        self.field_sizes = dict(observations=obs_dim, next_observations=obs_dim, actions=1, rewards=1, terminations=1)
        self.storage = torch.zeros(size, sum(self.field_sizes.values()), device=device)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, next_obs, action, reward, terminated):
        row = np.concatenate([obs, next_obs, [action, reward, terminated]], dtype=np.float32)
        self.storage[self.pos] = torch.from_numpy(row)
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch_size):
        idx = torch.randint(0, self.size if self.full else self.pos, (batch_size,), device=self.storage.device)
        fields = self.storage[idx].split(list(self.field_sizes.values()), dim=1)
        batch = dict(zip(self.field_sizes, fields, strict=True))
        for key in ("actions", "rewards", "terminations"):
            batch[key] = batch[key][:, 0]  # [B, 1] -> [B]
        batch["actions"] = batch["actions"].long()  # a float in the row, exact for any action index
        return TensorDict(batch, batch_size=[batch_size])

    def state_dict(self):
        """The filled rows of each field as tensors (the checkpoint's layout), and where the next one goes."""
        filled = self.size if self.full else self.pos
        fields = self.storage[:filled].cpu().split(list(self.field_sizes.values()), dim=1)
        state = {key: field.clone() for key, field in zip(self.field_sizes, fields, strict=True)}  # not views of it all
        for key in ("actions", "rewards", "terminations"):
            state[key] = state[key][:, 0]
        state["actions"] = state["actions"].long()
        return {**state, "pos": self.pos, "full": self.full}

    def load_state_dict(self, state):
        rows = torch.cat([state[key].reshape(len(state[key]), -1).float() for key in self.field_sizes], dim=1)
        self.storage[: len(rows)] = rows
        self.pos, self.full = state["pos"], state["full"]


def build_dqn(obs_dim, n_actions, args, device):
    """The networks, optimizer and update functions of DQN; the training loop only calls the functions."""
    qnet = QNetwork(obs_dim, n_actions).to(device)
    qnet_params = TensorDict.from_module(qnet).data  # detached views of the Q network's parameters
    # Storage-less shells, built on "meta" (no memory, no initialisation), filled with other parameters:
    # - the target network's, plain tensors stored apart: updated by one lerp of their TensorDict, and never among
    #   the trainable parameters;
    # - the acting copy's, the detached views of the Q network's: the optimizer's in-place steps reach it and the
    #   compiled (and captured) acting sees no tensor that requires grad.
    with torch.device("meta"):
        target_qnet, acting_qnet = QNetwork(obs_dim, n_actions), QNetwork(obs_dim, n_actions)
    target_qnet_params = qnet_params.clone()
    qnet_params.to_module(acting_qnet, preserve_module_state=False)
    # fused: one multi-tensor kernel per step; capturable: under a CUDA graph the step counter lives on the device.
    optimizer = torch.optim.Adam(qnet.parameters(), lr=args.learning_rate, fused=True, capturable=args.cudagraphs)

    # The loss and its backward pass in one function, so that --compile turns both into a single graph.
    def td_loss_backward(data):
        with torch.no_grad():
            # The TD target: the reward, plus the discounted best target Q value of the next state unless the
            # episode terminated there.
            with target_qnet_params.to_module(target_qnet, preserve_module_state=False):  # the target network
                target_max = target_qnet(data["next_observations"]).max(1).values
            td_target = data["rewards"] + args.gamma * target_max * (1 - data["terminations"])
        q_values = qnet(data["observations"]).gather(1, data["actions"].unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(q_values, td_target)
        loss.backward()
        return TensorDict(td_loss=loss.detach(), q_values=q_values.detach().mean())

    # zero_grad and step stay out of the compiled function: torch.optim breaks graphs; the fused step is one kernel.
    def update(data):
        optimizer.zero_grad()
        losses = td_loss_backward(data)
        optimizer.step()
        return losses

    def update_target():
        # One in-place lerp of the TensorDict instead of a Python loop over tensors (tau 1: a copy).
        target_qnet_params.lerp_(qnet_params, args.tau)

    def greedy_actions(obs):
        with torch.no_grad():
            return acting_qnet(obs).argmax(1)

    # Epsilon-greedy on the GPU, without a branch: the random-vs-greedy choice is a tensor, so no value goes to the host
    # to decide, and the whole selection is one compilable (and capturable) function. epsilon: a 0-d tensor.
    # One draw for both choices: compiled code may run two independent random ops in either order (it does on CUDA).
    def policy(obs, epsilon):
        greedy = greedy_actions(obs)
        uniform = torch.rand((2, *greedy.shape), device=greedy.device)
        random_actions = (uniform[1] * n_actions).long()
        return torch.where(uniform[0] < epsilon, random_actions, greedy)

    # update looks td_loss_backward up when called, so it uses the compiled one.
    if args.compile:
        # Process-wide (docs/running.md): backward() traced into the compiled graphs; tensordict's lock warning off.
        twin_utils.set_compile_settings()
        # Guards on values, not on the code's structure (fewer checks a call); a copy per call: compile pops it.
        value_guards = {"guard_filter_fn": twin_utils.value_guards}
        # On CPU the graph is called from generated C++ instead of Python (cpp_wrapper). There the training loop acts
        # with the eager greedy_actions: one observation through three small layers is faster than a compiled call.
        on_cpu = device.type == "cpu"
        td_loss_backward = torch.compile(td_loss_backward, options={**value_guards, "cpp_wrapper": on_cpu})
        policy = torch.compile(policy, options={**value_guards})
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        # Recorded at the 5th call: the calls before run on a side stream and compile (a recording cannot).
        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)

    # Checkpoints hold the plain script's layout: its state_dicts, and the plain optimizer's settings, not the twin's.
    def state_dict():
        """The networks' and the optimizer's state_dicts: a checkpoint's agent."""
        return {
            "qnet": qnet.state_dict(),
            "target_qnet": target_qnet_params.clone().flatten_keys(".").to_dict(),
            "optimizer": twin_utils.optimizer_state(optimizer, fused=None, capturable=False),
        }

    def load_state_dict(state):
        qnet.load_state_dict(state["qnet"])
        target_qnet_params.update_(TensorDict(state["target_qnet"]).unflatten_keys("."))
        twin_utils.load_optimizer_state(optimizer, state["optimizer"], fused=True, capturable=args.cudagraphs)

    return SimpleNamespace(
        update=update,
        update_target=update_target,
        greedy_actions=greedy_actions,
        policy=policy,
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
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, device)
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
    epsilon_tensor = torch.zeros((), device=device)
    global_step = start_step  # the steps done, as the loop goes
    for step in range(start_step, args.total_timesteps):
        run.clock(step, train_from=train_step, measure_from=measure_step, global_step=global_step)
        # Epsilon-greedy: a random action with probability epsilon, else the action of the highest Q value.
        epsilon = epsilon_at(step, args)
        if device.type == "cuda":
            epsilon_tensor.fill_(epsilon)  # written in place: a captured graph reads it, a changing float recompiles
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            action = dqn.policy(obs_tensor, epsilon_tensor)[0].item()
        # On CPU choosing on the host costs nothing, four small tensor ops per step do, and a random step skips the net.
        elif random.random() < epsilon:
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
                data = replay_buffer.sample(args.batch_size)
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
