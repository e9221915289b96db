# Twin Delayed DDPG (TD3) for continuous actions, written for speed: the same agent and flags as
# td3_continuous_action.py, plus --compile, --cudagraphs and --bf16. `diff` the two files to see the speed tricks.
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
    compile: bool = False
    """if toggled, the updates and action selection are compiled with torch.compile"""
    cudagraphs: bool = False
    """if toggled, the updates and action selection are captured in CUDA graphs (CUDA only)"""
    bf16: bool = False
    """if toggled, the hidden layer runs in bf16 where the device computes bf16 faster than fp32; the rest stays fp32"""


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
        x = F.relu(twin_utils.fp32_layer(self.fc1, x))  # under --bf16 too: rounded inputs bias the gradients
        x = F.relu(self.fc2(x))
        return twin_utils.fp32_layer(self.fc3, x)  # under --bf16 too: the Q values enter the TD target and the losses


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
        x = F.relu(twin_utils.fp32_layer(self.fc1, x))  # under --bf16 too: rounded observations bias the gradients
        x = F.relu(self.fc2(x))
        return torch.tanh(twin_utils.fp32_layer(self.fc_mu, x)) * self.action_scale + self.action_bias  # fp32 in --bf16


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


def build_td3(obs_dim, action_dim, action_low, action_high, args, device):
    """The networks, optimizers and update functions of TD3; the training loop only calls the functions."""
    actor = Actor(obs_dim, action_dim, action_low, action_high).to(device)
    # Both Q networks as one ensemble: stacked parameters, evaluated by one vmapped call instead of two.
    qnet_params = from_modules(*[QNetwork(obs_dim, action_dim).to(device) for _ in range(2)], as_module=True)
    # Shells without storage (on "meta"): this one filled with any Q parameter set, the target actor's below.
    qnet = QNetwork(obs_dim, action_dim).to("meta")
    qnet_params_detached = qnet_params.data  # views without autograd, made once (.data builds a TensorDict per call)
    qf1_params = qnet_params_detached[0]  # Q1's, the network that scores the actor
    # The targets are plain tensors, stored apart and swapped into storage-less shells to be evaluated:
    # they are updated by one lerp per TensorDict and never show up among the trainable parameters.
    actor_params = TensorDict.from_module(actor).data  # views of the actor's parameters and constant buffers
    target_actor_params = actor_params.clone()
    target_actor = Actor(obs_dim, action_dim, action_low, action_high).to("meta")
    target_qnet_params = qnet_params_detached.clone()
    # fused: one multi-tensor kernel per step; capturable: under a CUDA graph the step counter lives on the device.
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
        # --bf16: the hidden layers' matmuls in bf16, on the device's bf16 units (AMX, AVX512-BF16, tensor cores).
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            # Target policy smoothing: clipped noise on the target action, so Q cannot exploit a narrow peak.
            noise = (torch.randn_like(data["actions"]) * args.policy_noise).clamp(-args.noise_clip, args.noise_clip)
            with target_actor_params.to_module(target_actor, preserve_module_state=False):  # the target actor
                next_state_actions = target_actor(data["next_observations"]) + noise * target_actor.action_scale
            next_state_actions = next_state_actions.clamp(action_low, action_high)
            qf_next_target = q_values(target_qnet_params, data["next_observations"], next_state_actions)
            min_qf_next_target = qf_next_target.min(0).values
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
        # Q1 alone, not the vmapped ensemble: half the matmuls, which are what costs on CPU.
        # Detached Q parameters: the gradient flows through the actions only, no wasted Q gradients.
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            actor_loss = -q_value(qf1_params, data["observations"], actor(data["observations"])).mean()
        actor_loss.backward()
        return TensorDict(actor_loss=actor_loss.detach())

    def update_actor(data):
        actor_optimizer.zero_grad()
        losses = actor_backward(data)
        actor_optimizer.step()
        return losses

    def update_targets():
        # One in-place lerp per TensorDict, not a Python loop over tensors (the actor's buffers: equal, unchanged).
        target_actor_params.lerp_(actor_params, args.tau)
        target_qnet_params.lerp_(qnet_params_detached, args.tau)

    def policy(obs):
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            actions = actor(obs)
            actions = actions + torch.randn_like(actions) * actor.action_scale * args.exploration_noise
            return actions.clamp(action_low, action_high)

    # The update functions look critic_backward and actor_backward up when called, so they use the compiled ones.
    if args.compile:
        # Process-wide (docs/running.md): backward() traced into the compiled graphs; tensordict's lock warning off.
        twin_utils.set_compile_settings()
        # Guards on values, not on the code's structure (fewer checks a call); a copy per call: compile pops it.
        value_guards = {"guard_filter_fn": twin_utils.value_guards}
        # Compiled: fused kernels instead of one Python dispatch per op. On CPU, the graphs are called from generated
        # C++ instead of Python (cpp_wrapper), and the noise comes from ATen's generator (fallback_random): inductor's
        # own random kernel is slower there.
        on_cpu = device.type == "cpu"
        critic_backward = torch.compile(
            critic_backward, options={**value_guards, "cpp_wrapper": on_cpu, "fallback_random": on_cpu}
        )
        actor_backward = torch.compile(actor_backward, options={**value_guards, "cpp_wrapper": on_cpu})
        policy = torch.compile(policy, options={**value_guards, "cpp_wrapper": on_cpu, "fallback_random": on_cpu})
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        # Recorded at the 5th call: the calls before run on a side stream and compile (a recording cannot).
        update_critic = CudaGraphModule(update_critic, in_keys=[], out_keys=[], warmup=5)
        update_actor = CudaGraphModule(update_actor, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)

    # Checkpoints hold the plain script's layout: a state_dict per network, optimizer state per parameter of each Q
    # network, and the plain optimizers' settings (the twin's fused and capturable are its own).
    plain_adam = dict(fused=None, capturable=False)

    def state_dict():
        """The networks' and optimizers' state_dicts: a checkpoint's agent."""
        return {
            "actor": actor.state_dict(),
            **{f"qf{i + 1}": qnet_params_detached[i].clone().flatten_keys(".").to_dict() for i in range(2)},
            "target_actor": target_actor_params.clone().flatten_keys(".").to_dict(),
            **{f"qf{i + 1}_target": target_qnet_params[i].clone().flatten_keys(".").to_dict() for i in range(2)},
            "q_optimizer": twin_utils.optimizer_state(q_optimizer, members=2, **plain_adam),
            "actor_optimizer": twin_utils.optimizer_state(actor_optimizer, **plain_adam),
        }

    def load_state_dict(state):
        actor.load_state_dict(state["actor"])
        target_actor_params.update_(TensorDict(state["target_actor"]).unflatten_keys("."))
        for i in range(2):
            qnet_params_detached[i].update_(TensorDict(state[f"qf{i + 1}"]).unflatten_keys("."))
            target_qnet_params[i].update_(TensorDict(state[f"qf{i + 1}_target"]).unflatten_keys("."))
        twin_utils.load_optimizer_state(q_optimizer, state["q_optimizer"], members=2, **adam_kwargs)
        twin_utils.load_optimizer_state(actor_optimizer, state["actor_optimizer"], **adam_kwargs)

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
    replay_buffer = ReplayBuffer(args.buffer_size, obs_dim, action_dim, device)
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
                data = replay_buffer.sample(args.batch_size)
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
