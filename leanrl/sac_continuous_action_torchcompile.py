# Soft Actor-Critic for continuous actions, written for speed: the same agent and flags as
# sac_continuous_action.py, plus --compile, --cudagraphs and --bf16. `diff` the two files to see the speed tricks.
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
from tensordict import TensorDict, from_modules
from tensordict.nn import CudaGraphModule


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
    compile: bool = False
    """if toggled, the updates and action selection are compiled with torch.compile"""
    cudagraphs: bool = False
    """if toggled, the updates and action selection are captured in CUDA graphs (CUDA only)"""
    bf16: bool = False
    """if toggled, the hidden layer runs in bf16 where the device computes bf16 faster than fp32; the rest stays fp32"""


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
        x = F.relu(twin_utils.fp32_layer(self.fc1, x))  # under --bf16 too: rounded inputs bias the gradients
        x = F.relu(self.fc2(x))
        return twin_utils.fp32_layer(self.fc3, x)  # under --bf16 too: the Q values enter the TD target and the losses


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
        x = F.relu(twin_utils.fp32_layer(self.fc1, x))  # under --bf16 too: rounded observations bias the gradients
        x = F.relu(self.fc2(x))
        mean = twin_utils.fp32_layer(self.fc_mean, x)  # under --bf16 too: its log-probability enters the losses
        log_std = torch.tanh(twin_utils.fp32_layer(self.fc_logstd, x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # from SpinUp / Denis Yarats
        return mean, log_std

    def get_action(self, x):
        mean, log_std = self(x)
        std = log_std.exp()
        normal = torch.distributions.Normal(mean, std, validate_args=False)  # its checks read the host (no CUDA graph)
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
    """Transitions as rows of one tensor on the device, oldest overwritten first: one copy adds, one gather samples."""

    fields = ("observations", "next_observations", "actions", "rewards", "terminations")

    def __init__(self, size, obs_dim, action_dim, device):
        self.field_sizes = dict(zip(self.fields, (obs_dim, obs_dim, action_dim, 1, 1), strict=True))
        self.storage = torch.zeros(size, sum(self.field_sizes.values()), device=device)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, next_obs, actions, rewards, terminations):
        """An iteration's transitions, one per env: its rows in one copy (two where they wrap around the end)."""
        rows = np.concatenate([obs, next_obs, actions, rewards[:, None], terminations[:, None]], 1, dtype=np.float32)
        rows, end = torch.from_numpy(rows), self.pos + len(rows)
        self.storage[self.pos : min(end, self.size)] = rows[: self.size - self.pos]
        self.storage[: max(end - self.size, 0)] = rows[self.size - self.pos :]
        self.full = self.full or end >= self.size
        self.pos = end % self.size

    def sample(self, batch_size):
        idx = torch.randint(0, self.size if self.full else self.pos, (batch_size,), device=self.storage.device)
        fields = self.storage[idx].split(list(self.field_sizes.values()), dim=1)
        batch = dict(zip(self.field_sizes, fields, strict=True))
        batch["rewards"], batch["terminations"] = batch["rewards"][:, 0], batch["terminations"][:, 0]  # [B, 1] -> [B]
        return TensorDict(batch, batch_size=[batch_size])

    def state_dict(self):
        """The filled rows of each field as tensors (the checkpoint's layout), and where the next one goes."""
        filled = self.size if self.full else self.pos
        fields = self.storage[:filled].cpu().split(list(self.field_sizes.values()), dim=1)
        state = {key: field.clone() for key, field in zip(self.field_sizes, fields, strict=True)}  # not views of it all
        state["rewards"], state["terminations"] = state["rewards"][:, 0], state["terminations"][:, 0]
        return {
            **state,
            "pos": self.pos,
            "full": self.full,
        }

    def load_state_dict(self, state):
        rows = torch.cat([state[key].reshape(len(state[key]), -1) for key in self.field_sizes], dim=1)
        self.storage[: len(rows)] = rows
        self.pos, self.full = state["pos"], state["full"]


def build_sac(obs_dim, action_dim, action_low, action_high, args, device):
    """The networks, optimizers and update functions of SAC; the training loop only calls the functions."""
    actor = Actor(obs_dim, action_dim, action_low, action_high).to(device)
    # Both Q networks as one ensemble: stacked parameters, evaluated by one vmapped call instead of two.
    qnet_params = from_modules(*[SoftQNetwork(obs_dim, action_dim).to(device) for _ in range(2)], as_module=True)
    qnet_params_detached = qnet_params.data  # views without autograd, made once (.data builds a TensorDict per call)
    target_qnet_params = qnet_params_detached.clone()
    # A shell without storage (on "meta"), filled with either parameter set when the ensemble is evaluated.
    qnet = SoftQNetwork(obs_dim, action_dim).to("meta")
    # fused: one multi-tensor kernel per step; capturable: under a CUDA graph the step counter lives on the device.
    adam_kwargs = dict(fused=True, capturable=args.cudagraphs)
    q_optimizer = torch.optim.Adam(qnet_params.values(True, True), lr=args.q_lr, **adam_kwargs)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr, **adam_kwargs)

    # Automatic entropy tuning: alpha is learned so that the policy's entropy stays near -|A|.
    target_entropy = -float(action_dim)
    log_alpha = torch.tensor(np.log(args.alpha), dtype=torch.float32, device=device, requires_grad=True)
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr, **adam_kwargs)
    # alpha stays a tensor on the device: no host sync to read it, no recompile when it changes.
    alpha = log_alpha.detach().exp()

    def q_value(params, obs, actions):
        # preserve_module_state=False: plain tensors (the targets) must not be turned into trainable parameters.
        with params.to_module(qnet, preserve_module_state=False):
            return qnet(obs, actions)

    q_values = torch.vmap(q_value, (0, None, None))  # both networks in one call, over the stacked parameters

    # The loss and its backward pass in one function, so that --compile turns both into a single graph.
    def critic_backward(data):
        # --bf16: the hidden layers' matmuls in bf16, on the device's bf16 units (AMX, AVX512-BF16, tensor cores).
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            next_state_actions, next_state_log_pi, _ = actor.get_action(data["next_observations"])
            qf_next_target = q_values(target_qnet_params, data["next_observations"], next_state_actions)
            min_qf_next_target = qf_next_target.min(0).values - alpha * next_state_log_pi
            next_q_value = data["rewards"] + (1 - data["terminations"]) * args.gamma * min_qf_next_target.view(-1)

        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            qf_a_values = q_values(qnet_params, data["observations"], data["actions"]).view(2, -1)
        # The sum over the ensemble of each network's MSE, as qf1_loss + qf2_loss.
        qf_loss = (qf_a_values - next_q_value).pow(2).mean(1).sum()
        qf_loss.backward()
        return TensorDict(qf_loss=qf_loss.detach(), qf1_values=qf_a_values[0].detach().mean())

    # zero_grad and step stay out of the compiled function: torch.optim breaks graphs; the fused step is one kernel.
    def update_critic(data):
        q_optimizer.zero_grad()
        losses = critic_backward(data)
        q_optimizer.step()
        return losses

    def actor_backward(data):
        # Detached Q parameters: the actor's gradient flows through the actions only, no wasted Q gradients.
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            pi, log_pi, _ = actor.get_action(data["observations"])
            min_qf_pi = q_values(qnet_params_detached, data["observations"], pi).min(0).values
        actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
        losses = TensorDict(actor_loss=actor_loss.detach())
        if args.autotune:
            # log_pi of the batch just used for the actor, detached: alpha follows the policy's entropy.
            alpha_loss = (-log_alpha.exp() * (log_pi.detach() + target_entropy)).mean()
            losses["alpha_loss"] = alpha_loss.detach()
            actor_loss = actor_loss + alpha_loss  # disjoint parameters: one backward pass gives both gradients
        actor_loss.backward()
        return losses

    def update_actor(data):
        actor_optimizer.zero_grad()
        alpha_optimizer.zero_grad()
        losses = actor_backward(data)
        actor_optimizer.step()
        if args.autotune:
            alpha_optimizer.step()
            alpha.copy_(log_alpha.detach().exp())
        return losses

    def update_targets():
        # One in-place lerp over all stacked parameters instead of a Python loop over tensors.
        target_qnet_params.lerp_(qnet_params_detached, args.tau)

    def policy(obs):
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            return actor.get_action(obs)[0]

    # The update functions look critic_backward and actor_backward up when called, so they use the compiled ones.
    if args.compile:
        # Process-wide (docs/running.md): backward() traced into the compiled graphs; tensordict's lock warning off.
        twin_utils.set_compile_settings()
        # Guards on values, not on the code's structure (fewer checks a call); a copy per call: compile pops it.
        value_guards = {"guard_filter_fn": twin_utils.value_guards}
        # Compiled: fused kernels instead of one Python dispatch per op; on CPU called from generated C++ (cpp_wrapper).
        on_cpu = device.type == "cpu"
        critic_backward = torch.compile(critic_backward, options={**value_guards, "cpp_wrapper": on_cpu})
        actor_backward = torch.compile(actor_backward, options={**value_guards, "cpp_wrapper": on_cpu})
        policy = torch.compile(policy, options={**value_guards, "cpp_wrapper": on_cpu})
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        # Recorded at the 5th call: the calls before run on a side stream and compile (a recording cannot).
        update_critic = CudaGraphModule(update_critic, in_keys=[], out_keys=[], warmup=5)
        update_actor = CudaGraphModule(update_actor, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)

    # Checkpoints hold the plain script's layout: a state_dict per network, the plain optimizers' settings.
    plain_adam = dict(fused=None, capturable=False)

    def state_dict():
        """The networks' and optimizers' state_dicts and log_alpha: a checkpoint's agent."""
        return {
            "actor": actor.state_dict(),
            **{f"qf{i + 1}": qnet_params_detached[i].clone().flatten_keys(".").to_dict() for i in range(2)},
            **{f"qf{i + 1}_target": target_qnet_params[i].clone().flatten_keys(".").to_dict() for i in range(2)},
            "q_optimizer": twin_utils.optimizer_state(q_optimizer, members=2, **plain_adam),
            "actor_optimizer": twin_utils.optimizer_state(actor_optimizer, **plain_adam),
            "alpha_optimizer": twin_utils.optimizer_state(alpha_optimizer, **plain_adam),
            "log_alpha": log_alpha.detach().clone(),
        }

    def load_state_dict(state):
        actor.load_state_dict(state["actor"])
        for i in range(2):
            qnet_params_detached[i].update_(TensorDict(state[f"qf{i + 1}"]).unflatten_keys("."))
            target_qnet_params[i].update_(TensorDict(state[f"qf{i + 1}_target"]).unflatten_keys("."))
        twin_utils.load_optimizer_state(q_optimizer, state["q_optimizer"], members=2, **adam_kwargs)
        twin_utils.load_optimizer_state(actor_optimizer, state["actor_optimizer"], **adam_kwargs)
        twin_utils.load_optimizer_state(alpha_optimizer, state["alpha_optimizer"], **adam_kwargs)
        log_alpha.data.copy_(state["log_alpha"])
        if args.autotune:
            alpha.copy_(log_alpha.detach().exp())

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
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, action_dim, device)
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
                data = replay_buffer.sample(args.batch_size)
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
