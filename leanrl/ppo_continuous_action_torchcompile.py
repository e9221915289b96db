# Proximal Policy Optimization for continuous actions, written for speed: the same agent and flags as
# ppo_continuous_action.py, plus --compile and --cudagraphs. `diff` the two files to see the speed tricks.
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
from torch.distributions.normal import Normal


@dataclass
class Args(run_utils.RunArgs):  # RunArgs: the flags every script has (seed, cuda, checkpoints, evaluation, ...)
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (a gymnasium id with a continuous action space)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """training iterations (rollout + update) left out of the sps measure (compile, warm-up)"""
    checkpoint_every: int = 0
    """with --save-model, also save the checkpoint every this many env steps, as an iteration ends (0: only at end)"""
    eval_episodes: int = 10
    """episodes of the saved agent's policy (actions sampled, as CleanRL evaluates) on a fresh env after training"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold: stop the epochs of an update early once it is exceeded"""
    compile: bool = False
    """if toggled, the update, action selection and advantage estimation are compiled with torch.compile"""
    cudagraphs: bool = False
    """if toggled, the update, action selection and advantage estimation are captured in CUDA graphs (CUDA only)"""


# Each numeric hyper-parameter's domain, checked before the first step (run_utils.RUN_DOMAINS: the other flags').
DOMAINS = {
    "learning_rate": "> 0",
    "num_envs": ">= 1",
    "num_steps": ">= 1",
    "gamma": "[0, 1]",
    "gae_lambda": "[0, 1]",
    "num_minibatches": ">= 1",
    "update_epochs": ">= 1",
    "clip_coef": "> 0",
    "ent_coef": ">= 0",
    "vf_coef": ">= 0",
    "max_grad_norm": "> 0",
    "target_kl": "> 0",
}


def check_args(args):
    run_utils.check_domains(args, DOMAINS)
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        run_utils.exit_with_error(f"--num-minibatches ({args.num_minibatches}) does not divide a batch of {batch_size}")


class RunningMeanStd(gym.wrappers.utils.RunningMeanStd):
    """gymnasium's running mean and variance, fed one sample a step by the normalisation wrappers of a single env:
    updated from the sample itself (its own mean, with variance 0) instead of np.mean and np.var of a one-row array.
    The same numbers, some 10 us less per update."""

    def update(self, x):
        self.update_from_moments(x[0], 0.0, 1)


def make_env(env_id, gamma, render_mode=None):
    def thunk():
        try:
            env = run_utils.make_gym_env(env_id, render_mode)  # gym.make, without MuJoCo's settotalmass warning
        except gym.error.Error as error:
            run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
        if not isinstance(env.action_space, gym.spaces.Box):
            run_utils.exit_with_error(
                f"continuous PPO needs a continuous (Box) action space, {env_id} has {env.action_space}"
            )
        env = gym.wrappers.FlattenObservation(env)  # deal with dm_control's Dict observation space
        env = gym.wrappers.RecordEpisodeStatistics(env)  # before the reward wrappers: real returns
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env.obs_rms = RunningMeanStd(shape=env.obs_rms.mean.shape, dtype=env.obs_rms.mean.dtype)  # the fast update
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env.return_rms = RunningMeanStd()
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, action_dim):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, action_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))  # state-independent log std

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_std = self.actor_logstd.expand_as(action_mean).exp()
        probs = Normal(action_mean, action_std, validate_args=False)  # no argument checks: they sync with the host
        if action is None:
            # What probs.sample() draws (mean + std * N(0, 1), the same numbers), as ops the compiler fuses: under
            # torch.compile, sample()'s torch.normal runs through a slow Python fallback.
            action = action_mean + action_std * torch.randn_like(action_mean)
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def compute_advantages(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimates of a rollout, all tensors [num_steps, num_envs] but next_*: [num_envs].

    dones[t] says observation t starts a new episode: nothing is bootstrapped across it.
    """
    next_non_terminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    next_values = torch.cat([values[1:], next_value[None]])
    advantages = rewards + gamma * next_values * next_non_terminal - values  # the deltas
    coefs = gamma * gae_lambda * next_non_terminal
    # A parallel scan: log2(num_steps) rounds of whole-rollout tensor ops instead of num_steps Python steps (it
    # compiles without unrolling them). After the round with `shift`, advantages[t] sums steps t .. t + 2 * shift - 1.
    shift = 1
    while shift < len(advantages):
        advantages = advantages + coefs * F.pad(advantages[shift:], (0, 0, 0, shift))
        coefs = coefs * F.pad(coefs[shift:], (0, 0, 0, shift))
        shift *= 2
    return advantages


def bootstrap_truncated(rewards, terminations, truncations, final_obs, value, gamma, device):
    """This step's rewards plus gamma * value(last observation) for the envs whose episode hit its time limit.

    A time limit is not a failure: the return goes on past it. A termination gets no bootstrap.
    """
    truncated = truncations & ~terminations
    if truncated.any():
        last_obs = torch.tensor(np.stack(final_obs[truncated]), dtype=torch.float32, device=device)
        rewards = rewards.copy()
        rewards[truncated] += (gamma * value(last_obs)).cpu().numpy()
    return rewards


def build_ppo(obs_dim, action_dim, args, device):
    """The agent, its optimizer and the update of one minibatch; the training loop only calls the functions."""
    agent = Agent(obs_dim, action_dim).to(device)
    # The acting copy: the agent's parameters as plain tensors (not nn.Parameters) sharing their storage, so the
    # optimizer's in-place steps reach it and the compiled (and captured) acting sees no tensor that requires grad.
    # Its shell is built on "meta": no memory, and no draw from the random generator (the plain script's draws).
    with torch.device("meta"):
        acting_agent = Agent(obs_dim, action_dim)
    from_module(agent).data.to_module(acting_agent, preserve_module_state=False)
    # lr in a tensor: annealing writes into it instead of changing a Python float the compiled code depends on;
    # fused: one multi-tensor kernel per step; capturable: under a CUDA graph the step counter lives on the device.
    optimizer = torch.optim.Adam(
        agent.parameters(),
        lr=torch.tensor(args.learning_rate, device=device),
        eps=1e-5,
        fused=True,
        capturable=args.cudagraphs,
    )

    # The loss and its backward pass in one function, so that --compile turns both into a single graph.
    def loss_backward(minibatch):
        obs, actions, logprobs = minibatch["obs"], minibatch["actions"], minibatch["logprobs"]
        advantages, returns, values = minibatch["advantages"], minibatch["returns"], minibatch["values"]
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
        logratio = newlogprob - logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            # http://joschu.net/blog/kl-approx.html
            old_approx_kl = (-logratio).mean()
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

        if args.norm_adv:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        # Policy loss: the pessimistic (larger) of the plain and the clipped surrogate losses.
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        newvalue = newvalue.view(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - returns) ** 2
            v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
            v_loss_clipped = (v_clipped - returns) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        else:
            v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

        loss.backward()
        return TensorDict(
            pg_loss=pg_loss.detach(),
            v_loss=v_loss.detach(),
            entropy=entropy_loss.detach(),
            old_approx_kl=old_approx_kl,
            approx_kl=approx_kl,
            clipfrac=clipfrac,
        )

    # zero_grad, clipping and the step stay outside the compiled function: torch.optim breaks the graph anyway,
    # and the fused step is a single kernel already.
    def update(minibatch):
        optimizer.zero_grad()
        losses = loss_backward(minibatch)
        # foreach: the norm and the scaling as multi-tensor kernels instead of a loop over parameters.
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
        optimizer.step()
        return losses

    def policy(obs):
        with torch.no_grad():
            action, logprob, _, value = acting_agent.get_action_and_value(obs)
        return action, logprob, value.flatten()

    def value(obs):
        with torch.no_grad():
            return acting_agent.get_value(obs).flatten()

    def gae(rewards, values, dones, next_value, next_done):
        return compute_advantages(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)

    # update looks loss_backward up when called, so it uses the compiled one.
    if args.compile:
        # Process-wide (docs/running.md): backward() traced into the compiled graphs; tensordict's lock warning off.
        twin_utils.set_compile_settings()
        # Guards on values, not on the code's structure (fewer checks a call); a copy per call: compile pops it.
        value_guards = {"guard_filter_fn": twin_utils.value_guards}
        # Compiled: fused kernels instead of one Python dispatch per op; on CPU called from generated C++ (cpp_wrapper).
        on_cpu = device.type == "cpu"
        loss_backward = torch.compile(loss_backward, options={**value_guards, "cpp_wrapper": on_cpu})
        policy = torch.compile(policy, options={**value_guards, "cpp_wrapper": on_cpu})
        gae = torch.compile(gae, options={**value_guards})
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        # Recorded at the 5th call: the calls before run on a side stream and compile (a recording cannot).
        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)
        gae = CudaGraphModule(gae, warmup=5)

    # The learning rate lives in the tensor the compiled and captured steps read; checkpoints hold the plain float.
    learning_rate = twin_utils.TensorLearningRate(optimizer, args.learning_rate)
    set_learning_rate = learning_rate.set

    def state_dict():
        """The agent's and the optimizer's state_dicts, as the plain script saves them (its lr, fused and
        capturable)."""
        optimizer_state = learning_rate.optimizer_state(fused=None, capturable=False)
        return {"agent": agent.state_dict(), "optimizer": optimizer_state}

    def load_state_dict(state):
        agent.load_state_dict(state["agent"])  # in place: acting_agent's views see the loaded parameters
        learning_rate.load_optimizer_state(state["optimizer"], fused=True, capturable=args.cudagraphs)

    return SimpleNamespace(
        optimizer=optimizer,
        update=update,
        policy=policy,
        value=value,
        gae=gae,
        set_learning_rate=set_learning_rate,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


# The statistics of each training env's normalisation wrappers: (wrapper, its RunningMeanStd attribute).
NORMALIZERS = {
    "obs": (gym.wrappers.NormalizeObservation, "obs_rms"),
    "reward": (gym.wrappers.NormalizeReward, "return_rms"),
}


def find_wrapper(env, wrapper_type):
    """The wrapper of this type in an env's stack of wrappers."""
    while not isinstance(env, wrapper_type):
        env = env.env
    return env


def normalization_state(env):
    """The running mean, variance and count of an env's observation and reward normalisation, as tensors (a
    checkpoint is read with weights_only=True, which reads no numpy arrays)."""
    state = {}
    for key, (wrapper_type, attribute) in NORMALIZERS.items():
        rms = getattr(find_wrapper(env, wrapper_type), attribute)
        state[key] = {
            "mean": torch.from_numpy(np.array(rms.mean)),
            "var": torch.from_numpy(np.array(rms.var)),
            "count": float(rms.count),
        }
    return state


def load_normalization_state(env, state, frozen=False):
    """Give an env these normalisation statistics; frozen: they stay as they are (evaluation)."""
    for key, (wrapper_type, attribute) in NORMALIZERS.items():
        wrapper = find_wrapper(env, wrapper_type)
        rms = getattr(wrapper, attribute)
        rms.mean, rms.var, rms.count = (
            state[key]["mean"].cpu().numpy(),
            state[key]["var"].cpu().numpy(),
            state[key]["count"],
        )
        wrapper.update_running_mean = not frozen


def evaluation_policy(checkpoint, env, device):
    """The saved agent's policy, for the evaluation, as CleanRL's (cleanrl_utils/evals/ppo_eval.py): actions sampled
    from a fresh agent, on observations normalised with the checkpoint's statistics (those of the first training env),
    frozen; the returns are the env's real ones (RecordEpisodeStatistics sits below the reward normalisation)."""
    load_normalization_state(env, checkpoint["normalization"][0], frozen=True)
    agent = Agent(env.observation_space.shape[0], env.action_space.shape[0]).to(device)
    agent.load_state_dict(checkpoint["agent"]["agent"])

    def act(obs):
        with torch.no_grad():
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            return agent.get_action_and_value(obs_tensor)[0][0].cpu().numpy()

    return act


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    make_eval_env = lambda seed, render_mode: make_env(args.env_id, args.gamma, render_mode)()  # noqa: E731
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # whole rollouts: at least total_timesteps steps
    run = run_utils.Run(
        args,
        script=__file__,
        algo="ppo_continuous",
        name="continuous PPO",
        total_steps=num_iterations * batch_size,
        make_eval_env=make_eval_env,
        schedule="the learning-rate anneal" if args.anneal_lr else None,
    )
    device = run.device
    start_step, start_iteration = (
        (run.checkpoint["global_step"], run.checkpoint["iteration"]) if run.checkpoint else (0, 0)
    )

    # SAME_STEP: an env that ends an episode is reset within that step (its last observation is in
    # infos["final_obs"]), so every stored step is a real transition: none spans a reset.
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, args.gamma) for _ in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs.action_space.seed(args.seed)
    obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    ppo = build_ppo(obs_dim, action_dim, args, device)
    if run.checkpoint:
        ppo.load_state_dict(run.checkpoint["agent"])
        for env, state in zip(envs.envs, run.checkpoint["normalization"], strict=True):
            load_normalization_state(env, state)
        run_utils.set_rng_state(run.checkpoint["rng"])

    # A continuous PPO checkpoint: the step, the iteration (the learning-rate schedule's position), the agent and
    # each env's normalisation statistics (Run adds the run's state).
    def save_checkpoint():
        normalization = [normalization_state(env) for env in envs.envs]  # each env's observation and return statistics
        run.save_checkpoint(
            global_step=global_step, iteration=iterations_done, agent=ppo.state_dict(), normalization=normalization
        )

    # A resumed run starts new episodes, on envs seeded by the step it resumes at. A run with nothing left to train
    # resets no env: the reset would move the normalisation statistics it saves.
    if start_iteration < num_iterations:
        next_obs, _ = envs.reset(seed=args.seed + start_step)
        next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
    next_done = np.zeros(args.num_envs, dtype=np.float32)
    global_step, iterations_done = start_step, start_iteration  # as the loop goes
    measure_from = start_iteration + 1 + args.measure_burnin  # the first iteration the sps clock counts
    for iteration in range(start_iteration + 1, num_iterations + 1):
        run.clock(iteration, train_from=start_iteration + 1, measure_from=measure_from, global_step=global_step)
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            ppo.set_learning_rate(frac * args.learning_rate)

        # The rollout's tensors are collected in lists and stacked once: cheaper than a write per step and key.
        # The rewards and dones stay numpy until then: one host-to-device copy per rollout instead of two per step.
        steps, env_steps = [], []
        for _ in range(args.num_steps):
            global_step += args.num_envs
            action, logprob, value = ppo.policy(next_obs)
            steps.append(dict(obs=next_obs, actions=action, logprobs=logprob, values=value))
            env_steps.append(dict(dones=next_done))

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            reward = reward.astype(np.float32)
            if "final_obs" in infos:
                reward = bootstrap_truncated(
                    reward, terminations, truncations, infos["final_obs"], ppo.value, args.gamma, device
                )
                for index in np.flatnonzero(infos["final_info"].get("_episode", [])):
                    run.episode(float(infos["final_info"]["episode"]["r"][index]), global_step)
            env_steps[-1]["rewards"] = reward
            next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
            next_done = (terminations | truncations).astype(np.float32)

        rollout = TensorDict(
            {
                **{key: torch.stack([s[key] for s in steps]) for key in steps[0]},
                **{key: torch.as_tensor(np.stack([s[key] for s in env_steps]), device=device) for key in env_steps[0]},
            },
            [args.num_steps, args.num_envs],
        )
        rollout["advantages"] = ppo.gae(
            rollout["rewards"],
            rollout["values"],
            rollout["dones"],
            ppo.value(next_obs),
            torch.as_tensor(next_done, device=device),
        )
        rollout["returns"] = rollout["advantages"] + rollout["values"]

        # Optimize the policy and value network.
        batch = rollout.reshape(-1)  # flatten the batch
        for _ in range(args.update_epochs):
            # One gather per epoch for every key at once; the minibatches are then views of it.
            shuffled = batch[torch.randperm(batch_size, device=device)]
            for minibatch in shuffled.split(minibatch_size):
                losses = ppo.update(minibatch)
            if args.target_kl is not None and losses["approx_kl"] > args.target_kl:
                break

        # Log once per iteration, from the last minibatch.
        run.log(global_step, losses, {"charts/learning_rate": ppo.optimizer.param_groups[0]["lr"]})
        iterations_done = iteration
        if run.checkpoint_due(global_step, batch_size):
            save_checkpoint()
        if run.stopping:
            break
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
