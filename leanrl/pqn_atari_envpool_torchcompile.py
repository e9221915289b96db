# Parallelised Q-learning (PQN) on Atari (envpool), written for speed: the same agent and flags as
# pqn_atari_envpool.py, plus --compile, --cudagraphs and --bf16. `diff` the two files to see the speed tricks.
# PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning") is DQN without a replay buffer and
# without a target network: many envs fill an on-policy rollout, a Q network with LayerNorm (which keeps its
# bootstrapped targets stable) regresses onto the rollout's Q(lambda) returns for a few epochs, and the rollout goes.
import ctypes
import os
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import numpy as np
import run_utils
import torch
import torch.nn as nn
import torch.nn.functional as F
import twin_utils
import tyro
from envpool.registration import registry
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


@dataclass
class Args(run_utils.RunArgs):  # RunArgs: the flags every script has (seed, cuda, checkpoints, evaluation, ...)
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """training iterations (rollout + update) left out of the sps measure (compile, warm-up)"""
    checkpoint_every: int = 0
    """with --save-model, also save the checkpoint every this many env steps, as an iteration ends (0: only at end)"""
    eval_episodes: int = 10
    """games of the saved agent's epsilon-greedy policy (epsilon 0.05) on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation games as MP4 files in a videos/ folder beside the checkpoint (84x84)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for the Q network"""
    gamma: float = 0.99
    """the discount factor gamma"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the Q network on each rollout"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    start_e: float = 1.0
    """the exploration rate epsilon (probability of a random action) at the first step"""
    end_e: float = 0.01
    """the exploration rate at the end of its decay, and from then on"""
    exploration_fraction: float = 0.10
    """the fraction of total-timesteps over which epsilon falls from start-e to end-e"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) targets (0: one-step Q-learning targets, 1: Monte Carlo returns)"""
    compile: bool = False
    """if toggled, the update, action selection and Q(lambda) targets are compiled (on a CPU the targets only)"""
    cudagraphs: bool = False
    """if toggled, the update, action selection and Q(lambda) targets are captured in CUDA graphs (CUDA only)"""
    bf16: bool = False
    """if toggled, the Q network's forward and backward passes run in bf16 (autocast) where the device computes bf16
    faster than fp32 (a CUDA GPU of compute capability 8+, AMX, AMD's AVX512-BF16); weights and optimizer stay fp32"""


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
EVAL_EPSILON = 0.05  # the evaluation's exploration rate, as in CleanRL's DQN evaluation (it has none for PQN)


def check_args(args):
    run_utils.check_domains(args, DOMAINS)
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        run_utils.exit_with_error(f"--num-minibatches ({args.num_minibatches}) does not divide a batch of {batch_size}")
    if args.end_e > args.start_e:
        run_utils.exit_with_error(f"--end-e ({args.end_e}) is above --start-e ({args.start_e}): epsilon only goes down")


def make_envs(env_id, num_envs, seed):
    if env_id not in envpool.list_all_envs():
        run_utils.exit_with_error(f"cannot make env {env_id!r}: envpool has no env with this id")
    # envpool's registry names the module that implements each id: only its Atari games give 84x84 frames.
    if registry.specs[env_id][0] != "envpool.atari":
        run_utils.exit_with_error(f"PQN Atari needs an Atari game (e.g. Breakout-v5), {env_id} is not one")
    try:
        # Frames: grey 84x84, 4 stacked, 4 frames skipped per step, up to 30 no-ops at reset. Episodic life
        # (a lost life ends an episode) and rewards clipped to their sign are for learning only: the returns
        # reported are the game's own (infos["reward"], summed until infos["terminated"]: the game is over).
        envs = envpool.make(
            env_id,
            env_type="gymnasium",
            num_envs=num_envs,
            episodic_life=True,
            reward_clip=True,
            seed=seed % 2**31,  # envpool takes an int32: a seed plus an offset wraps around
        )
    except Exception as error:
        run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
    return envs


def make_frames_to_device(shape, device):
    """envpool's uint8 frames (of this shape) as a tensor on the device: on a CPU the env's own array, with no copy."""
    if device.type != "cuda":
        return torch.from_numpy
    # To a GPU through one buffer pinned once (pinning each step's frames costs more than the copy): from pinned memory
    # the copy runs on its own (non_blocking) while the host goes on to launch the policy.
    pinned_frames, copied = torch.empty(shape, dtype=torch.uint8, pin_memory=True), torch.cuda.Event()

    def frames_to_device(frames):
        copied.synchronize()  # the last copy has read the buffer
        on_device = pinned_frames.copy_(torch.from_numpy(frames)).to(device, non_blocking=True)
        copied.record()
        return on_device

    return frames_to_device


def keep_freed_memory():
    """Have glibc's malloc keep the memory the process frees (up to 1 GiB) and serve blocks up to 32 MiB from it: an
    update frees and allocates tens of MB of activations, and memory given back to the kernel costs a page fault per
    4 kB page when it is allocated again. Nothing to do where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, 32 * 2**20)  # the largest it takes on a 64-bit machine
    mallopt(m_trim_threshold, 2**30)


def epsilon_at(step, args):
    """The exploration rate at a step: start_e at step 0, down in a straight line to end_e at step
    exploration_fraction * total_timesteps, then end_e."""
    decay_steps = args.exploration_fraction * args.total_timesteps
    return max(args.end_e, args.start_e + (args.end_e - args.start_e) * step / decay_steps)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class ChannelsLastLayerNorm(nn.LayerNorm):
    """nn.LayerNorm over a frame's [C, H, W]; on channels-last activations (the update's) done in their order,
    [H, W, C]: the same normalisation with the same parameters, read and written in memory order, not across it."""

    def forward(self, x):
        if not x.is_contiguous(memory_format=torch.channels_last):
            return super().forward(x)
        x = x.permute(0, 2, 3, 1)  # a contiguous view of channels-last memory
        weight, bias = self.weight.permute(1, 2, 0), self.bias.permute(1, 2, 0)
        return nn.functional.layer_norm(x, x.shape[1:], weight, bias, self.eps).permute(0, 3, 1, 2)


class QNetwork(nn.Module):
    """The Nature DQN CNN with a LayerNorm after each hidden layer, one Q value per action."""

    def __init__(self, num_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            ChannelsLastLayerNorm([32, 20, 20]),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            ChannelsLastLayerNorm([64, 9, 9]),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            ChannelsLastLayerNorm([64, 7, 7]),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.LayerNorm(512),
            nn.ReLU(),
            layer_init(nn.Linear(512, num_actions)),
        )

    def forward(self, x):
        # Under --bf16 the last layer stays fp32 (fp32_layer): the Q values set the targets, the loss and the argmax.
        *body, head = self.network  # not network[:-1], which builds a new Sequential at each call
        x = x / 255.0
        for layer in body:
            x = layer(x)
        return twin_utils.fp32_layer(head, x)


def epsilon_greedy(q_values, epsilon):
    """Per row, a uniformly random action with probability epsilon, else the action of the highest Q value. One
    draw of the generator serves both choices of every row, row after row."""
    uniform = torch.rand((q_values.shape[0], 2), device=q_values.device)
    random_actions = (uniform[:, 1] * q_values.shape[1]).long()
    return torch.where(uniform[:, 0] < epsilon, random_actions, q_values.argmax(1))


def compute_q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda):
    """Q(lambda) returns of a rollout, all tensors [num_steps, num_envs] but next_*: [num_envs].

    values[t] = max_a Q(obs[t], a). The return of step t mixes the one-step target on the next state's best Q value
    and the return of the next step: G[t] = r[t] + gamma * ((1 - q_lambda) * values[t + 1] + q_lambda * G[t + 1]),
    and the step after the rollout's last is next_value (so G[T - 1] = r + gamma * next_value). dones[t] says
    observation t is the last frame of a finished episode: nothing after it is bootstrapped or summed.
    """
    next_non_terminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    next_values = torch.cat([values[1:], next_value[None]])
    returns = rewards + gamma * (1 - q_lambda) * next_non_terminal * next_values  # a[t]
    coefs = gamma * q_lambda * next_non_terminal  # G[t] = a[t] + coefs[t] * G[t + 1]
    returns = torch.cat([returns[:-1], returns[-1:] + coefs[-1:] * next_value])  # G[T] = next_value
    # A parallel scan: log2(num_steps) rounds of whole-rollout tensor ops instead of num_steps Python steps (it
    # compiles without unrolling them). After the round with `shift`, returns[t] sums steps t .. t + 2 * shift - 1.
    shift = 1
    while shift < len(returns):
        returns = returns + coefs * F.pad(returns[shift:], (0, 0, 0, shift))
        coefs = coefs * F.pad(coefs[shift:], (0, 0, 0, shift))
        shift *= 2
    return returns


def masked_mean(x, mask):
    """The mean of x over the entries where mask is 1 (0 where there is none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def build_pqn(num_actions, args, device):
    """The Q network, its optimizer and the update of one minibatch; the training loop only calls the functions."""
    qnet = QNetwork(num_actions).to(device)
    # The acting copy: the Q network's parameters as plain tensors (not nn.Parameters) sharing their storage, so the
    # optimizer's in-place steps reach it and the compiled (and captured) acting sees no tensor that requires grad.
    # Its shell is built on "meta": no memory, and no draw from the random generator (the plain script's draws).
    with torch.device("meta"):
        acting_qnet = QNetwork(num_actions)
    from_module(qnet).data.to_module(acting_qnet, preserve_module_state=False)
    # lr in a tensor: annealing writes into it, with no recompile and no re-capture; foreach: multi-tensor kernels
    # instead of a dozen small ops per parameter (RAdam has no fused kernel); capturable: under a CUDA graph the step
    # counter lives on the device.
    optimizer = torch.optim.RAdam(
        qnet.parameters(),
        lr=torch.tensor(args.learning_rate, device=device),
        foreach=True,
        capturable=args.cudagraphs,
    )

    # The loss and its backward pass in one function, so that --compile turns both into a single graph.
    def loss_backward(minibatch):
        obs, actions, returns = minibatch["obs"], minibatch["actions"], minibatch["returns"]
        mask = minibatch["mask"]  # 0 for envpool's reset steps (see the rollout), 1 elsewhere
        # --bf16: the convolutions and matmuls in bf16, on the device's bf16 units (AMX, AVX512-BF16, tensor cores).
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            q_values = qnet(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = masked_mean((q_values - returns) ** 2, mask)

        loss.backward()
        return TensorDict(td_loss=loss.detach(), q_values=masked_mean(q_values.detach(), mask))

    # zero_grad, clipping and the step stay outside the compiled function: torch.optim breaks the graph anyway.
    def update(minibatch):
        optimizer.zero_grad()
        losses = loss_backward(minibatch)
        # foreach: the norm and the scaling as multi-tensor kernels instead of a loop over parameters.
        nn.utils.clip_grad_norm_(qnet.parameters(), args.max_grad_norm, foreach=True)
        optimizer.step()
        return losses

    # epsilon: a 0-d tensor, written in place each step (a changing Python float would recompile).
    def policy(obs, epsilon):
        """The epsilon-greedy actions and the best Q value of each observation."""
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            q_values = acting_qnet(obs)
        return epsilon_greedy(q_values, epsilon), q_values.max(1).values

    def value(obs):
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            return acting_qnet(obs).max(1).values

    # The learning rate lives in the tensor the compiled and captured steps read; checkpoints hold the plain float.
    learning_rate = twin_utils.TensorLearningRate(optimizer, args.learning_rate)
    set_learning_rate = learning_rate.set

    # Checkpoints hold the plain script's optimizer: lr a Python float, and the plain RAdam's settings (foreach and
    # capturable are the twin's own, applied again on load).
    def state_dict():
        """The Q network's and the optimizer's state_dicts: a checkpoint's agent."""
        optimizer_state = learning_rate.optimizer_state(foreach=None, capturable=False)
        return {"qnet": qnet.state_dict(), "optimizer": optimizer_state}

    def load_state_dict(state):
        qnet.load_state_dict(state["qnet"])  # in place: the acting copy shares the parameters' storage
        learning_rate.load_optimizer_state(state["optimizer"], foreach=True, capturable=args.cudagraphs)

    def q_lambda_returns(rewards, values, dones, next_value, next_done):
        return compute_q_lambda_returns(rewards, values, dones, next_value, next_done, args.gamma, args.q_lambda)

    # update looks loss_backward up when called, so it uses the compiled one.
    if args.compile:
        # Compiled: fused kernels instead of one Python dispatch per op. On a CPU the Q network stays eager: oneDNN's
        # kernels beat inductor's LayerNorms there, in the update and in acting.
        q_lambda_returns = torch.compile(q_lambda_returns)
        if device.type != "cpu":
            # Process-wide (docs/running.md): backward() traced into the compiled graphs; tensordict's lock warning off.
            twin_utils.set_compile_settings()
            loss_backward = torch.compile(loss_backward)
            policy = torch.compile(policy)
            value = torch.compile(value)
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        # Recorded at the 5th call: the calls before run on a side stream and compile (a recording cannot).
        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)
        value = CudaGraphModule(value, warmup=5)
        q_lambda_returns = CudaGraphModule(q_lambda_returns, warmup=5)

    return SimpleNamespace(
        optimizer=optimizer,
        update=update,
        policy=policy,
        value=value,
        q_lambda_returns=q_lambda_returns,
        set_learning_rate=set_learning_rate,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def evaluation_policy(checkpoint, env, device):
    """The saved agent's epsilon-greedy policy (epsilon 0.05), for the evaluation: a fresh Q network. Not greedy: a
    greedy agent can repeat one move forever (in Breakout, never serve the ball) until the game's time limit, and
    CleanRL's DQN evaluation uses this epsilon. The draws come from torch's generator, which the
    evaluation seeds with its own seed."""
    qnet = QNetwork(env.envs.action_space.n).to(device)
    qnet.load_state_dict(checkpoint["agent"]["qnet"])

    def act(obs):
        with torch.no_grad():
            q_values = qnet(torch.as_tensor(obs, dtype=torch.float32, device=device))
        return epsilon_greedy(q_values, EVAL_EPSILON).cpu().numpy()

    return act


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    keep_freed_memory()  # each update frees and allocates tens of MB: kept, not faulted in page by page
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # whole rollouts: at least total_timesteps steps
    make_eval_env = lambda seed, render_mode: run_utils.EvalGame(make_envs(args.env_id, 1, seed))  # noqa: E731
    schedule = "the learning-rate anneal and the epsilon decay" if args.anneal_lr else "the epsilon decay"
    run = run_utils.Run(
        args,
        script=__file__,
        algo="pqn_atari",
        name="PQN Atari",
        total_steps=num_iterations * batch_size,
        make_eval_env=make_eval_env,
        unit="games",
        schedule=schedule,
    )
    device = run.device
    start_iteration, start_step = (
        (run.checkpoint["iteration"], run.checkpoint["global_step"]) if run.checkpoint else (0, 0)
    )

    # A resumed run starts new games, on envs seeded by the step it resumes at.
    envs = make_envs(args.env_id, args.num_envs, args.seed + start_step)
    pqn = build_pqn(envs.action_space.n, args, device)
    if run.checkpoint:
        pqn.load_state_dict(run.checkpoint["agent"])
        run_utils.set_rng_state(run.checkpoint["rng"])

    def save_checkpoint():
        """A PQN checkpoint: the step, the iterations done (where the schedules go on) and the agent."""
        run.save_checkpoint(global_step=global_step, iteration=global_step // batch_size, agent=pqn.state_dict())

    next_obs, _ = envs.reset()
    # Frames stay uint8 until the network divides them by 255: a quarter of the memory and copies of float32.
    frames_to_device = make_frames_to_device(next_obs.shape, device)
    next_obs = frames_to_device(next_obs)
    next_done = torch.zeros(args.num_envs)
    epsilon_tensor = torch.zeros((), device=device)
    game_returns = np.zeros(args.num_envs)  # each env's unclipped score since its game started, over all lives
    global_step = start_step
    measure_from = start_iteration + 1 + args.measure_burnin  # the first iteration the sps clock counts
    for iteration in range(start_iteration + 1, num_iterations + 1):
        run.clock(iteration, train_from=start_iteration + 1, measure_from=measure_from, global_step=global_step)
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            pqn.set_learning_rate(frac * args.learning_rate)

        # envpool ends an episode (a life) on one step and resets that env on the next one, which ignores its
        # action and returns the new episode's first frame with reward 0. So dones[t] = 1 marks obs[t] as the
        # last frame of an episode: the returns do not reach across it, and step t, the reset step, is no
        # transition of the game: the update masks it out.
        # The rollout's steps are collected in a list and stacked once: cheaper than a write per step and key.
        steps = []
        for _ in range(args.num_steps):
            global_step += args.num_envs
            epsilon = epsilon_at(global_step, args)  # at the step count this step reaches, as in CleanRL
            epsilon_tensor.fill_(epsilon)  # in place: the compiled and captured policy read this tensor
            action, value = pqn.policy(next_obs, epsilon_tensor)
            steps.append(dict(obs=next_obs, dones=next_done, actions=action, values=value))

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # The game's real return: its unclipped rewards summed over all lives, until the game is over
            # (infos["terminated"]) or cut by the time limit.
            game_returns += infos["reward"]
            for index in np.flatnonzero(infos["terminated"].astype(bool) | truncations):
                run.episode(float(game_returns[index]), global_step, epsilon=epsilon)
                game_returns[index] = 0.0
            steps[-1]["rewards"] = torch.from_numpy(reward)
            next_obs = frames_to_device(next_obs)
            next_done = torch.from_numpy(terminations | truncations).float()

        # The env's outputs stayed on the host: one host-to-device copy a key per rollout instead of one per step.
        stacked = {key: torch.stack([s[key] for s in steps]) for key in steps[0]}
        rollout = TensorDict(stacked, [args.num_steps, args.num_envs], device=device)

        # A truncation (the time limit) ends the return like a termination (a lost life), as in CleanRL and the paper.
        next_value = pqn.value(next_obs)
        rollout["returns"] = pqn.q_lambda_returns(
            rollout["rewards"],
            rollout["values"],
            rollout["dones"],
            next_value,
            next_done.to(device),
        )
        rollout["mask"] = 1.0 - rollout["dones"]

        # Regress the Q values of the actions taken onto their returns, a few epochs of minibatches.
        batch = rollout.select("obs", "actions", "returns", "mask").reshape(-1)  # flatten the batch
        # Channels-last frames, where oneDNN's convolutions run fastest at the update's batch: made once an iteration,
        # the epochs' gathers and minibatches keep the order, so no update call transposes its frames.
        batch["obs"] = batch["obs"].contiguous(memory_format=torch.channels_last)
        for _ in range(args.update_epochs):
            # One gather per epoch for every key at once; the minibatches are then views of it.
            shuffled = batch[torch.randperm(batch_size, device=device)]
            for minibatch in shuffled.split(minibatch_size):
                losses = pqn.update(minibatch)

        # Log once per iteration, from the last minibatch.
        charts = {"charts/learning_rate": pqn.optimizer.param_groups[0]["lr"], "charts/epsilon": epsilon}
        run.log(global_step, losses, charts)
        if run.checkpoint_due(global_step, batch_size):
            save_checkpoint()
        if run.stopping:
            break
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
