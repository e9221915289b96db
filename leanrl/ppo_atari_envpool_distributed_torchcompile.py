# Proximal Policy Optimization on Atari (envpool) over several processes, written for speed: the same agent and
# flags as ppo_atari_envpool_distributed.py, plus --compile, --cudagraphs and --bf16. `diff` the two files to see
# the speed tricks; they are those of ppo_atari_envpool_torchcompile.py.
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace

import envpool
import numpy as np
import run_utils
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import twin_utils
import tyro
from envpool.registration import registry
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.distributions.categorical import Categorical


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
    """games of the saved agent's policy (actions sampled, as CleanRL evaluates) on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation games as MP4 files in a videos/ folder beside the checkpoint (84x84)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments, over all processes (each runs num_envs / world size of them)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.01
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
    bf16: bool = False
    """if toggled, the networks' forward and backward passes run in bf16 (autocast) where the device computes bf16
    faster than fp32 (a CUDA GPU of compute capability 8+, AMX, AMD's AVX512-BF16); weights and optimizer stay fp32"""


# Each numeric hyper-parameter's domain, checked before the first step (run_utils.RUN_DOMAINS: the other flags').
DOMAINS = {"learning_rate": "> 0", "num_envs": ">= 1", "num_steps": ">= 1", "gamma": "[0, 1]", "gae_lambda": "[0, 1]",
           "num_minibatches": ">= 1", "update_epochs": ">= 1", "clip_coef": "> 0", "ent_coef": ">= 0",
           "vf_coef": ">= 0", "max_grad_norm": "> 0", "target_kl": "> 0"}  # fmt: skip
# How long a rank waits for the others in a collective before it gives up with an error instead of hanging
# (a compile or an evaluation on rank 0 takes well under this).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


def check_args(args, world_size):
    run_utils.check_domains(args, DOMAINS)
    if args.num_envs % world_size != 0:
        run_utils.exit_with_error(f"a world of {world_size} processes cannot share --num-envs {args.num_envs} evenly")
    # Each rank's minibatch is its share of the global one: the global minibatch must split evenly too.
    rank_batch_size = args.num_envs // world_size * args.num_steps
    if rank_batch_size % args.num_minibatches != 0:
        run_utils.exit_with_error(
            f"--num-minibatches ({args.num_minibatches}) does not divide the batch of each of the {world_size} "
            f"processes (num_envs / world size * num_steps = {rank_batch_size})"
        )


def make_envs(env_id, num_envs, seed, num_threads=0):
    if env_id not in envpool.list_all_envs():
        run_utils.exit_with_error(f"cannot make env {env_id!r}: envpool has no env with this id")
    # envpool's registry names the module that implements each id: only its Atari games give 84x84 frames.
    if registry.specs[env_id][0] != "envpool.atari":
        run_utils.exit_with_error(f"PPO Atari needs an Atari game (e.g. Breakout-v5), {env_id} is not one")
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
            num_threads=num_threads,  # 0: envpool's default, a thread per env
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


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature DQN CNN as a shared trunk, with a policy head and a value head."""

    def __init__(self, num_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    # Under --bf16 the heads stay fp32 (fp32_layer): logits and values set the PPO ratio and the losses.
    def get_value(self, x):
        return twin_utils.fp32_layer(self.critic, self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        logits = twin_utils.fp32_layer(self.actor, hidden)
        probs = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), twin_utils.fp32_layer(self.critic, hidden)


def compute_advantages(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimates of a rollout, all tensors [num_steps, num_envs] but next_*: [num_envs].

    dones[t] says observation t is the last frame of a finished episode: nothing is bootstrapped from it.
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


def sum_over_ranks(*tensors):
    """Each of these scalars summed over all ranks, in one all-reduce."""
    total = torch.stack(tensors)
    dist.all_reduce(total)
    return total.unbind()


def rank_share_of_mean(x, mask, count):
    """This rank's part of the mean of x over the global minibatch's entries where mask is 1: its sum divided by
    the global count. Summed over ranks, the parts are the global mean (as are their gradients)."""
    return (x * mask).sum() / count


def build_ppo(num_actions, args, device):
    """The agent, its optimizer and the update of one minibatch; the training loop only calls the functions."""
    agent = Agent(num_actions).to(device)
    # Every rank starts from rank 0's parameters (each rank's generator is seeded differently).
    for parameter in agent.parameters():
        dist.broadcast(parameter.data, src=0)
    # The acting copy: the agent's parameters as plain tensors (not nn.Parameters) sharing their storage, so the
    # optimizer's in-place steps reach it and the compiled (and captured) acting sees no tensor that requires grad.
    # Its shell is built on "meta": no memory, and no draw from the random generator (the plain script's draws).
    with torch.device("meta"):
        acting_agent = Agent(num_actions)
    from_module(agent).data.to_module(acting_agent, preserve_module_state=False)
    # lr in a tensor: annealing writes into it, with no recompile and no re-capture; fused: one multi-tensor
    # kernel per step instead of a dozen small ops per parameter; capturable: under a CUDA graph the step counter
    # lives on the device.
    optimizer = torch.optim.Adam(
        agent.parameters(),
        lr=torch.tensor(args.learning_rate, device=device),
        eps=1e-5,
        fused=True,
        capturable=args.cudagraphs,
    )

    # The loss and its backward pass in one function, so that --compile turns both into a single graph. The global
    # count and the normalised advantages come from update: the collectives stay outside the compiled code.
    def loss_backward(minibatch, count):
        obs, actions, logprobs = minibatch["obs"], minibatch["actions"], minibatch["logprobs"]
        advantages, returns, values = minibatch["advantages"], minibatch["returns"], minibatch["values"]
        mask = minibatch["mask"]  # 0 for envpool's reset steps (see the rollout), 1 elsewhere
        # --bf16: the convolutions and matmuls in bf16, on the device's bf16 units (AMX, AVX512-BF16, tensor cores).
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
        logratio = newlogprob - logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            # http://joschu.net/blog/kl-approx.html
            old_approx_kl = rank_share_of_mean(-logratio, mask, count)
            approx_kl = rank_share_of_mean((ratio - 1) - logratio, mask, count)
            clipfrac = rank_share_of_mean(((ratio - 1.0).abs() > args.clip_coef).float(), mask, count)

        # Policy loss: the pessimistic (larger) of the plain and the clipped surrogate losses.
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = rank_share_of_mean(torch.max(pg_loss1, pg_loss2), mask, count)

        newvalue = newvalue.view(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - returns) ** 2
            v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
            v_loss_clipped = (v_clipped - returns) ** 2
            v_loss = 0.5 * rank_share_of_mean(torch.max(v_loss_unclipped, v_loss_clipped), mask, count)
        else:
            v_loss = 0.5 * rank_share_of_mean((newvalue - returns) ** 2, mask, count)

        entropy_loss = rank_share_of_mean(entropy, mask, count)
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
        """One gradient step on this rank's share of a global minibatch, the same step on every rank. The losses
        returned are this rank's parts of them."""
        # The means are over the global minibatch: counts and sums from every rank, summed by all-reduces.
        mask, advantages = minibatch["mask"], minibatch["advantages"]
        mask_count, advantage_sum = sum_over_ranks(mask.sum(), (advantages * mask).sum())
        count = mask_count.clamp(min=1.0)
        if args.norm_adv:
            mean = advantage_sum / count
            (squares,) = sum_over_ranks(((advantages - mean) ** 2 * mask).sum())
            std = (squares / (mask_count - 1).clamp(min=1.0)).sqrt()
            # A new TensorDict, not an entry replaced: a captured update must leave its input's tensors in place.
            minibatch = minibatch.clone(recurse=False).set("advantages", (advantages - mean) / (std + 1e-8))

        optimizer.zero_grad()
        losses = loss_backward(minibatch, count)
        # The gradients summed over ranks are the global minibatch's: one all-reduce of all of them, flattened.
        # (DDP would overlap it with the backward pass, but it wraps the model and hides when the sum happens; on
        # this network of 1.7M parameters one flat all-reduce is a small part of the update.)
        gradients = [parameter.grad for parameter in agent.parameters()]
        flat_gradients = torch.cat([gradient.flatten() for gradient in gradients])
        dist.all_reduce(flat_gradients)
        for gradient, summed in zip(gradients, flat_gradients.split([g.numel() for g in gradients]), strict=True):
            gradient.copy_(summed.view_as(gradient))
        # foreach: the norm and the scaling as multi-tensor kernels instead of a loop over parameters.
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
        optimizer.step()
        return losses

    def policy(obs):
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            action, logprob, _, value = acting_agent.get_action_and_value(obs)
        return action, logprob, value.flatten()

    def value(obs):
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            return acting_agent.get_value(obs).flatten()

    # The learning rate lives in the tensor the compiled and captured steps read; checkpoints hold the plain float.
    learning_rate = twin_utils.TensorLearningRate(optimizer, args.learning_rate)
    set_learning_rate = learning_rate.set

    # Checkpoints hold the plain script's optimizer: lr a Python float, and the plain Adam's settings (fused and
    # capturable are the twin's own, applied again on load).
    def state_dict():
        """The agent's and the optimizer's state_dicts: a checkpoint's agent."""
        optimizer_state = learning_rate.optimizer_state(fused=None, capturable=False)
        return {"agent": agent.state_dict(), "optimizer": optimizer_state}

    def load_state_dict(state):
        agent.load_state_dict(state["agent"])  # in place: the acting copy shares the parameters' storage
        learning_rate.load_optimizer_state(state["optimizer"], fused=True, capturable=args.cudagraphs)

    def gae(rewards, values, dones, next_value, next_done):
        return compute_advantages(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)

    # update looks loss_backward up when called, so it uses the compiled one.
    if args.compile:
        # Process-wide (docs/running.md): backward() traced into the compiled graphs; tensordict's lock warning off.
        twin_utils.set_compile_settings()
        # Compiled: fused kernels instead of one Python dispatch per op.
        loss_backward = torch.compile(loss_backward)
        policy = torch.compile(policy)
        value = torch.compile(value)
        gae = torch.compile(gae)
    if args.cudagraphs:
        # A CUDA graph replays all kernels of a call, optimizer step included, with one launch.
        # Recorded at the 5th call: the calls before run on a side stream and compile (a recording cannot).
        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)
        policy = CudaGraphModule(policy, warmup=5)
        value = CudaGraphModule(value, warmup=5)
        gae = CudaGraphModule(gae, warmup=5)

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


def evaluation_policy(checkpoint, env, device):
    """The saved agent's policy, for the evaluation: actions sampled from a fresh agent, as in CleanRL's evaluation."""
    agent = Agent(env.envs.action_space.n).to(device)
    agent.load_state_dict(checkpoint["agent"]["agent"])

    def act(obs):
        with torch.no_grad():
            return agent.get_action_and_value(torch.as_tensor(obs, dtype=torch.float32, device=device))[0].cpu().numpy()

    return act


def report_lost_rank(kind, error, traceback):
    """sys.excepthook once the ranks have met. An error raised in a torch.distributed collective means another rank
    died or hung (gloo raises a RuntimeError, NCCL a DistError): one line instead of a traceback, torchrun's report
    names the rank that failed. Anything else: Python's usual traceback."""
    innermost = traceback
    while innermost.tb_next:
        innermost = innermost.tb_next
    if os.path.join("torch", "distributed", "") in innermost.tb_frame.f_code.co_filename:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else kind.__name__
        print(f"{os.path.basename(sys.argv[0])}: error: lost another rank: {first_line}", file=sys.stderr)
    else:
        sys.__excepthook__(kind, error, traceback)


if __name__ == "__main__":
    args = tyro.cli(Args)
    rank, world_size, local_world_size = run_utils.world()
    check_args(args, world_size)
    batch_size = args.num_envs * args.num_steps  # the global batch: every rank's rollouts together
    rank_num_envs = args.num_envs // world_size
    rank_batch_size = rank_num_envs * args.num_steps
    rank_minibatch_size = rank_batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # whole rollouts: at least total_timesteps steps
    make_eval_env = lambda seed, render_mode: run_utils.EvalGame(make_envs(args.env_id, 1, seed))  # noqa: E731
    run = run_utils.Run(
        args,
        script=__file__,
        algo="ppo_atari",
        name="PPO Atari",
        total_steps=num_iterations * batch_size,
        make_eval_env=make_eval_env,
        unit="games",
        schedule="the learning-rate anneal" if args.anneal_lr else None,
        distributed=True,
    )
    device = run.device
    start_iteration, start_step = (
        (run.checkpoint["iteration"], run.checkpoint["global_step"]) if run.checkpoint else (0, 0)
    )
    backend = "nccl" if device.type == "cuda" else "gloo"  # NCCL between GPUs (one a rank), gloo between CPUs
    # The ranks of a machine share its cores: under torchrun each gets its share as torch and envpool threads (a
    # plain launch keeps torch's default, as the single-process script does; envpool's 0 is its default).
    threads = 0
    if "RANK" in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, cores // local_world_size)
        torch.set_num_threads(threads)
        if rank == 0:
            world = f"a world of {world_size} process(es) ({backend})"
            print(f"{run.script}: {world}, each with {rank_num_envs} envs and {threads} thread(s)")

    # Rank r runs the envs r * rank_num_envs ... of a single process, with their seeds (envpool seeds its env i with
    # seed + i): a world of 2 plays the games of a world of 1. A resumed run starts new games, on envs seeded by
    # the step it resumes at.
    envs = make_envs(args.env_id, rank_num_envs, args.seed + start_step + rank * rank_num_envs, threads)
    # The ranks meet here, once every mistake a user can make has been checked (each rank exits on its own).
    sys.excepthook = report_lost_rank
    if "RANK" in os.environ:  # launched by torchrun: it gives the rendezvous address
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    else:  # a world of one, in this process only
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    # Each rank draws its own actions and minibatches (Run seeds rank r with seed + r); the agent's initial
    # parameters are rank 0's (build_ppo).
    ppo = build_ppo(envs.action_space.n, args, device)
    if run.checkpoint:
        ppo.load_state_dict(run.checkpoint["agent"])
        saved_world_size = run.checkpoint.get("world_size", 1)
        if rank == 0:
            run_utils.set_rng_state(run.checkpoint["rng"])
        elif saved_world_size == world_size:
            run_utils.set_rng_state(run.checkpoint["rank_rngs"][rank - 1])
        # Otherwise the run goes on in another world size: the other ranks' generators start afresh from the seed.
        if rank == 0 and saved_world_size != world_size:
            saved = f"the checkpoint was saved by a world of {saved_world_size}, this is a world of {world_size}"
            print(f"{run.script}: {saved}: ranks other than 0 draw from freshly seeded generators")

    def save_checkpoint():
        """A PPO checkpoint: the step, the iterations done (where the learning-rate schedule goes on) and the agent,
        in the single-process pair's layout, plus every rank's generators. Every rank calls it; rank 0 writes it."""
        # all_gather_object pickles, and pickle cannot restore a uint32 tensor (numpy's key): it travels as an array.
        state = run_utils.rng_state()
        state["numpy"][1] = state["numpy"][1].numpy()
        rank_rngs = [None] * world_size
        dist.all_gather_object(rank_rngs, state)
        for state in rank_rngs:
            state["numpy"][1] = torch.from_numpy(state["numpy"][1])
        if rank == 0:  # "rng": rank 0's, where a single-process script looks for its own
            run.save_checkpoint(
                global_step=global_step,
                iteration=global_step // batch_size,
                agent=ppo.state_dict(),
                rng=rank_rngs[0],
                world_size=world_size,
                rank_rngs=rank_rngs[1:],
            )

    next_obs, _ = envs.reset()
    # Frames stay uint8 until the network divides them by 255: a quarter of the memory and copies of float32.
    frames_to_device = make_frames_to_device(next_obs.shape, device)
    next_obs = frames_to_device(next_obs)
    next_done = torch.zeros(rank_num_envs)
    game_returns = np.zeros(rank_num_envs)  # each env's unclipped score since its game started, over all lives
    global_step = start_step
    measure_from = start_iteration + 1 + args.measure_burnin  # the first iteration the sps clock counts
    for iteration in range(start_iteration + 1, num_iterations + 1):
        run.clock(iteration, train_from=start_iteration + 1, measure_from=measure_from, global_step=global_step)
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            ppo.set_learning_rate(frac * args.learning_rate)

        # envpool ends an episode (a life) on one step and resets that env on the next one, which ignores its
        # action and returns the new episode's first frame with reward 0. So dones[t] = 1 marks obs[t] as the
        # last frame of an episode: GAE does not bootstrap across it, and step t, the reset step, is no
        # transition of the game: the update masks it out.
        # The rollout's steps are collected in a list and stacked once: cheaper than a write per step and key.
        steps = []
        rank_returns = []  # this rank's games that ended in this iteration
        for _ in range(args.num_steps):
            global_step += args.num_envs  # every rank counts the steps of all
            action, logprob, value = ppo.policy(next_obs)
            steps.append(dict(obs=next_obs, dones=next_done, actions=action, logprobs=logprob, values=value))

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # The game's real return: its unclipped rewards summed over all lives, until the game is over
            # (infos["terminated"]) or cut by the time limit.
            game_returns += infos["reward"]
            for index in np.flatnonzero(infos["terminated"].astype(bool) | truncations):
                rank_returns.append(float(game_returns[index]))
                game_returns[index] = 0.0
            steps[-1]["rewards"] = torch.from_numpy(reward)
            steps[-1]["time_limits"] = torch.from_numpy(truncations & ~terminations).float()
            next_obs = frames_to_device(next_obs)
            next_done = torch.from_numpy(terminations | truncations).float()

        # The env's outputs stayed on the host: one host-to-device copy a key per rollout instead of one per step.
        stacked = {key: torch.stack([s[key] for s in steps]) for key in steps[0]}
        rollout = TensorDict(stacked, [args.num_steps, rank_num_envs], device=device)

        # A time limit is not a failure: a truncated episode is bootstrapped from the value of its last frame,
        # the observation that follows it. A termination (a lost life) gets no bootstrap.
        next_value = ppo.value(next_obs)
        next_values = torch.cat([rollout["values"][1:], next_value[None]])
        rollout["advantages"] = ppo.gae(
            rollout["rewards"] + args.gamma * next_values * rollout["time_limits"],
            rollout["values"],
            rollout["dones"],
            next_value,
            next_done.to(device),
        )
        rollout["returns"] = rollout["advantages"] + rollout["values"]
        rollout["mask"] = 1.0 - rollout["dones"]

        # Optimize the policy and value network: each rank's minibatch is its share of a global one.
        batch = rollout.reshape(-1)  # flatten the batch
        # Channels-last frames, where oneDNN's convolutions run fastest at the update's batch: made once an iteration,
        # the epochs' gathers and minibatches keep the order, so no update call transposes its frames.
        batch["obs"] = batch["obs"].contiguous(memory_format=torch.channels_last)
        for _ in range(args.update_epochs):
            # One gather per epoch for every key at once; the minibatches are then views of it.
            shuffled = batch[torch.randperm(rank_batch_size, device=device)]
            for minibatch in shuffled.split(rank_minibatch_size):
                losses = ppo.update(minibatch)
            # The global minibatch's losses, the same on every rank: all ranks stop their epochs together.
            losses = dict(zip(losses.keys(), sum_over_ranks(*losses.values()), strict=True))
            if args.target_kl is not None and losses["approx_kl"] > args.target_kl:
                break

        # Every rank learns of every rank's finished games, of a signal any rank received and of the writes rank 0
        # (which writes every output) could not do: returns are global, and all ranks stop at the same iteration (a
        # rank that stopped alone would leave the others waiting).
        gathered = [None] * world_size
        dist.all_gather_object(gathered, (rank_returns, run.stop_signals[:1], run.failed_writes))
        for episode_return in (r for returns_of_rank, _, _ in gathered for r in returns_of_rank):
            run.episode(episode_return, global_step)
        stop_signal = next((signals[0] for _, signals, _ in gathered if signals), 0)
        if stop_signal:  # the first signal any rank received: what every rank's Run reports
            run.stop_signals.insert(0, stop_signal)
        run.failed_writes = run.failed_writes if rank == 0 else gathered[0][2]
        stop = stop_signal or gathered[0][2]

        # Log once per iteration, from the last minibatch.
        run.log(global_step, losses, {"charts/learning_rate": ppo.optimizer.param_groups[0]["lr"]})
        if stop:
            break
        if run.checkpoint_due(global_step, batch_size):
            save_checkpoint()
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
