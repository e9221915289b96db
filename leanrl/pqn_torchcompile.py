# Parallelised Q-learning (PQN) for discrete actions, written for speed: the same agent and flags as pqn.py, plus
# --compile and --cudagraphs. `diff` the two files to see the speed tricks.
import os
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
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


@dataclass
class Args(run_utils.RunArgs):  # RunArgs: the flags every script has (seed, cuda, checkpoints, evaluation, ...)
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "CartPole-v1"
    """the id of the environment (a gymnasium id with a discrete action space and a flat observation)"""
    total_timesteps: int = 500000
    """total timesteps of the experiment"""
    eval_episodes: int = 10
    """episodes of the saved agent's epsilon-greedy policy (epsilon 0.05) on a fresh env after training"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per rollout"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the Q network on each rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    start_e: float = 1.0
    """the exploration rate epsilon (probability of a random action) at the first step"""
    end_e: float = 0.05
    """the exploration rate at the end of its decay, and from then on"""
    exploration_fraction: float = 0.5
    """the fraction of total-timesteps over which epsilon falls from start-e to end-e"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) targets (0: one-step Q-learning targets; 1: Monte Carlo returns)"""
    compile: bool = False
    """if toggled, the update, action selection and Q(lambda) targets are compiled with torch.compile"""
    cudagraphs: bool = False
    """if toggled, the update, action selection and Q(lambda) targets are captured in CUDA graphs (CUDA only)"""


# Each numeric hyper-parameter's domain, checked before the first step (run_utils.RUN_DOMAINS: the other flags').
DOMAINS = {
    "learning_rate": "> 0",
    "num_envs": ">= 1",
    "num_steps": ">= 1",
    "num_minibatches": ">= 1",
    "update_epochs": ">= 1",
    "gamma": "[0, 1]",
    "start_e": "[0, 1]",
    "end_e": "[0, 1]",
    "exploration_fraction": "(0, 1]",
    "max_grad_norm": "> 0",
    "q_lambda": "[0, 1]",
}
EVAL_EPSILON = 0.05  # the evaluation's exploration rate: the trained agent's, and CleanRL's DQN evaluation's


def check_args(args):
    run_utils.check_domains(args, DOMAINS)
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        run_utils.exit_with_error(f"--num-minibatches ({args.num_minibatches}) does not divide a batch of {batch_size}")
    if args.end_e > args.start_e:
        run_utils.exit_with_error(f"--end-e ({args.end_e}) is above --start-e ({args.start_e}): epsilon only goes down")


def make_env(env_id, render_mode=None):
    def thunk():
        try:
            env = run_utils.make_gym_env(env_id, render_mode)
        except gym.error.Error as error:
            run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
        if not isinstance(env.action_space, gym.spaces.Discrete):
            run_utils.exit_with_error(f"PQN needs a discrete action space, {env_id} has {env.action_space}")
        # The Q network is an MLP: it takes a vector, not an image (which needs a convolutional network).
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            run_utils.exit_with_error(f"PQN's Q network (an MLP) needs a flat Box observation, {env_id} has {space}")
        return gym.wrappers.RecordEpisodeStatistics(env)

    return thunk


def epsilon_at(step, args):
    """The exploration rate at a step: start_e at step 0, down in a straight line to end_e at step
    exploration_fraction * total_timesteps, then end_e."""
    decay_steps = args.exploration_fraction * args.total_timesteps
    return max(args.end_e, args.start_e + (args.end_e - args.start_e) * step / decay_steps)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 120)),
            nn.LayerNorm(120),
            nn.ReLU(),
            layer_init(nn.Linear(120, 84)),
            nn.LayerNorm(84),
            nn.ReLU(),
            layer_init(nn.Linear(84, n_actions)),
        )

    def forward(self, x):
        return self.network(x)


def q_lambda_returns(rewards, values, dones, last_value, gamma, q_lambda):
    """The Q(lambda) targets of a rollout, all tensors [num_steps, num_envs] but last_value: [num_envs].

    values[t] is max_a Q(obs t, a) and last_value that of the observation after the rollout; dones[t] says the
    episode ended at step t (terminated or truncated: PQN ends its returns at both, as CleanRL and the paper do):
    nothing after it is bootstrapped or summed.
    Each target mixes the one-step bootstrap and the next step's target:
    returns[t] = rewards[t] + gamma * (1 - dones[t]) * ((1 - q_lambda) * values[t + 1] + q_lambda * returns[t + 1]).
    """
    # As GAE's advantages: excess[t] = returns[t] - values[t] = deltas[t] + coefs[t] * excess[t + 1].
    next_values = torch.cat([values[1:], last_value[None]])
    excess = rewards + gamma * (1 - dones) * next_values - values  # the deltas
    coefs = gamma * q_lambda * (1 - dones)
    # A parallel scan: log2(num_steps) rounds of whole-rollout tensor ops instead of num_steps Python steps (it
    # compiles without unrolling them). After the round with `shift`, excess[t] sums steps t .. t + 2 * shift - 1.
    shift = 1
    while shift < len(excess):
        excess = excess + coefs * F.pad(excess[shift:], (0, 0, 0, shift))
        coefs = coefs * F.pad(coefs[shift:], (0, 0, 0, shift))
        shift *= 2
    return values + excess


def build_pqn(obs_dim, n_actions, args, device):
    """The Q network, its optimizer and the update of one minibatch; the training loop only calls the functions."""
    qnet = QNetwork(obs_dim, n_actions).to(device)
    # The acting copy: the Q network's parameters as plain tensors (not nn.Parameters) sharing their storage, so the
    # optimizer's in-place steps reach it and the compiled (and captured) acting sees no tensor that requires grad.
    # Its shell is built on "meta": no memory, and no draw from the random generator (the plain script's draws).
    with torch.device("meta"):
        acting_qnet = QNetwork(obs_dim, n_actions)
    from_module(qnet).data.to_module(acting_qnet, preserve_module_state=False)
    # lr in a tensor: annealing writes into it instead of changing a Python float the compiled code depends on;
    # foreach: RAdam's step as multi-tensor kernels instead of a loop over parameters (RAdam has no fused kernel);
    # capturable: under a CUDA graph the step counter lives on the device.
    optimizer = torch.optim.RAdam(
        qnet.parameters(), lr=torch.tensor(args.learning_rate, device=device), foreach=True, capturable=args.cudagraphs
    )

    # The loss and its backward pass in one function, so that --compile turns both into a single graph.
    def loss_backward(minibatch):
        q_values = qnet(minibatch["obs"]).gather(1, minibatch["actions"].unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(q_values, minibatch["returns"])
        loss.backward()
        return TensorDict(td_loss=loss.detach(), q_values=q_values.detach().mean())

    # Clipping and the step in a function of their own (torch.optim breaks a graph that holds the loss): --compile
    # fuses RAdam's dozen ops per parameter into a few kernels (its lr a tensor already).
    def clip_and_step():
        # foreach: the norm and the scaling as multi-tensor kernels instead of a loop over parameters.
        nn.utils.clip_grad_norm_(qnet.parameters(), args.max_grad_norm, foreach=True)
        optimizer.step()

    def update(minibatch):
        optimizer.zero_grad()
        losses = loss_backward(minibatch)
        clip_and_step()
        return losses

    # Epsilon-greedy without a branch, epsilon a 0-d tensor: one function to compile and capture, no value sent to the
    # host to decide. One draw for both choices: compiled code may run two independent random ops in either order.
    def policy(obs, epsilon):
        """Epsilon-greedy actions for a batch of observations, and max_a Q(obs, a) (the bootstrap value) of each."""
        with torch.no_grad():
            values, greedy = acting_qnet(obs).max(1)
        uniform = torch.rand((2, *greedy.shape), device=obs.device)
        random_actions = (uniform[1] * n_actions).long()
        return torch.where(uniform[0] < epsilon, random_actions, greedy), values

    def value(obs):
        with torch.no_grad():
            return acting_qnet(obs).max(1).values

    def returns(rewards, values, dones, last_value):
        return q_lambda_returns(rewards, values, dones, last_value, args.gamma, args.q_lambda)

    # update looks loss_backward and clip_and_step up when called, so it uses the compiled ones.
    if args.compile:
        # Process-wide (docs/running.md): backward() traced into the compiled graphs; tensordict's lock warning off.
        twin_utils.set_compile_settings()
        # Compiled: fused kernels instead of one Python dispatch per op.
        loss_backward = torch.compile(loss_backward)
        clip_and_step = torch.compile(clip_and_step)
        policy = torch.compile(policy)
        value = torch.compile(value)
        returns = torch.compile(returns)
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        # Recorded at the 5th call: the calls before run on a side stream and compile (a recording cannot).
        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)
        value = CudaGraphModule(value, warmup=5)
        returns = CudaGraphModule(returns, warmup=5)

    # The learning rate lives in the tensor the compiled and captured steps read; checkpoints hold the plain float.
    learning_rate = twin_utils.TensorLearningRate(optimizer, args.learning_rate)
    set_learning_rate = learning_rate.set

    # Checkpoints hold the plain script's layout: its state_dicts, and the plain optimizer's settings, not the twin's.
    def state_dict():
        """The Q network's and the optimizer's state_dicts, as the plain script saves them (its lr and settings)."""
        optimizer_state = learning_rate.optimizer_state(foreach=None, capturable=False)
        return {"qnet": qnet.state_dict(), "optimizer": optimizer_state}

    def load_state_dict(state):
        qnet.load_state_dict(state["qnet"])  # in place: acting_qnet's views see the loaded parameters
        learning_rate.load_optimizer_state(state["optimizer"], foreach=True, capturable=args.cudagraphs)

    return SimpleNamespace(
        optimizer=optimizer,
        update=update,
        policy=policy,
        value=value,
        returns=returns,
        set_learning_rate=set_learning_rate,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def evaluation_policy(checkpoint, env, device):
    """The saved agent's epsilon-greedy policy (epsilon 0.05, the rate it ends training with), for the evaluation: a
    fresh Q network. The exploration draws come from a generator of their own, seeded with the evaluation's seed, so
    the plain script and its twin play the same episodes."""
    qnet = QNetwork(env.observation_space.shape[0], int(env.action_space.n)).to(device)
    qnet.load_state_dict(checkpoint["agent"]["qnet"])
    explore = np.random.default_rng(checkpoint["seed"] + run_utils.EVAL_SEED_OFFSET)

    def act(obs):
        if explore.random() < EVAL_EPSILON:
            return int(explore.integers(env.action_space.n))
        with torch.no_grad():
            return qnet(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)).argmax(1)[0].item()

    return act


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    make_eval_env = lambda seed, render_mode: make_env(args.env_id, render_mode)()  # noqa: E731
    schedule = "the learning-rate anneal and the epsilon decay" if args.anneal_lr else "the epsilon decay"
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # whole rollouts: at least total_timesteps steps
    run = run_utils.Run(
        args,
        script=__file__,
        algo="pqn",
        name="PQN",
        total_steps=num_iterations * batch_size,
        make_eval_env=make_eval_env,
        schedule=schedule,
    )
    device = run.device
    start_step, start_iteration = (
        (run.checkpoint["global_step"], run.checkpoint["iteration"]) if run.checkpoint else (0, 0)
    )

    # SAME_STEP: an env that ends an episode is reset within that step, so every stored step is a real transition:
    # none spans a reset. A truncation (time limit) ends the return like a termination, as in CleanRL and the paper.
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id) for _ in range(args.num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    pqn = build_pqn(obs_dim, n_actions, args, device)
    if run.checkpoint:
        pqn.load_state_dict(run.checkpoint["agent"])
        run_utils.set_rng_state(run.checkpoint["rng"])

    # A PQN checkpoint: the step, the iteration (the learning-rate schedule's position) and the agent (Run adds the
    # run's state); no replay buffer: each rollout trains one update and is dropped.
    def save_checkpoint():
        run.save_checkpoint(global_step=global_step, iteration=iterations_done, agent=pqn.state_dict())

    # A resumed run starts new episodes, on envs seeded by the step it resumes at.
    next_obs, _ = envs.reset(seed=args.seed + start_step)
    next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
    epsilon_tensor = torch.zeros((), device=device)
    global_step, iterations_done = start_step, start_iteration  # as the loop goes
    measure_from = start_iteration + 1 + args.measure_burnin  # the first iteration the sps clock counts
    for iteration in range(start_iteration + 1, num_iterations + 1):
        run.clock(iteration, train_from=start_iteration + 1, measure_from=measure_from, global_step=global_step)
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            pqn.set_learning_rate(frac * args.learning_rate)

        # The rollout's tensors are collected in lists and stacked once: cheaper than a write per step and key.
        # The rewards and dones stay numpy until then: one host-to-device copy per rollout instead of two per step.
        steps, env_steps = [], []
        for _ in range(args.num_steps):
            global_step += args.num_envs
            epsilon = epsilon_at(global_step, args)  # at the step count this step reaches, as in CleanRL
            epsilon_tensor.fill_(epsilon)  # written in place: a captured graph reads it, a changing float recompiles
            action, value = pqn.policy(next_obs, epsilon_tensor)
            steps.append(dict(obs=next_obs, actions=action, values=value))

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            reward = reward.astype(np.float32)
            if "final_info" in infos:
                for index in np.flatnonzero(infos["final_info"].get("_episode", [])):
                    run.episode(float(infos["final_info"]["episode"]["r"][index]), global_step, epsilon=epsilon)
            env_steps.append(dict(rewards=reward, dones=(terminations | truncations).astype(np.float32)))
            next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)

        rollout = TensorDict(
            {
                **{key: torch.stack([s[key] for s in steps]) for key in steps[0]},
                **{key: torch.as_tensor(np.stack([s[key] for s in env_steps]), device=device) for key in env_steps[0]},
            },
            [args.num_steps, args.num_envs],
        )
        rollout["returns"] = pqn.returns(rollout["rewards"], rollout["values"], rollout["dones"], pqn.value(next_obs))

        batch = rollout.reshape(-1)  # flatten the batch
        # Fit the Q network to the targets, in shuffled minibatches, for a few epochs.
        for _ in range(args.update_epochs):
            # One gather per epoch for every key at once; the minibatches are then views of it.
            shuffled = batch[torch.randperm(batch_size, device=device)]
            for minibatch in shuffled.split(minibatch_size):
                losses = pqn.update(minibatch)

        # Log once per iteration, from the last minibatch.
        charts = {"charts/learning_rate": pqn.optimizer.param_groups[0]["lr"], "charts/epsilon": epsilon}
        run.log(global_step, losses, charts)
        iterations_done = iteration
        if run.checkpoint_due(global_step, batch_size):
            save_checkpoint()
        if run.stopping:
            break
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
