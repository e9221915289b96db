# Proximal Policy Optimization on Atari (envpool) over several processes, plain eager PyTorch: the PPO of
# ppo_atari_envpool.py, with its rollouts split between processes that average their gradients through
# torch.distributed. Launch it with torchrun (`torchrun --nproc-per-node 2 leanrl/ppo_atari_envpool_distributed.py`);
# a plain `python` launch is a world of one. Its twin, ppo_atari_envpool_distributed_torchcompile.py, trains the
# same agent faster: `diff` the two files. `diff` this one against ppo_atari_envpool.py to see what distribution adds.
import importlib.util
import json
import os
import random
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace

import envpool
import imageio
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tqdm
import tyro
from envpool.registration import registry
from torch.distributions.categorical import Categorical


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""
    measure_burnin: int = 3
    """training iterations (rollout + update) left out of the sps measure (compile, warm-up)"""
    results_path: str | None = None
    """if set, append one JSON line with this run's results to this file"""
    save_model: bool = False
    """if toggled, save a checkpoint at the end of training (and at an interruption), then evaluate it"""
    model_path: str | None = None
    """the checkpoint's path (default: the --resume file, else runs/<env_id>__<exp_name>__<seed>__<time>/<exp_name>.pt)"""
    checkpoint_every: int = 0
    """with --save-model, also save the checkpoint every this many env steps (0: only at the end): after the iteration in which the step count reaches each multiple"""
    resume: str | None = None
    """continue the run saved in this checkpoint; --total-timesteps counts the steps of the whole run"""
    eval_episodes: int = 10
    """games of the saved agent's policy (actions sampled from it, as in CleanRL's evaluation) on a fresh env after training"""
    capture_video: bool = False
    """with --save-model, record the evaluation games as MP4 files in a videos/ folder beside the checkpoint: the agent's 84x84 view (envpool's Atari envs cannot render)"""
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


# What makes the agent: a checkpoint made with other values of these is refused by --resume.
HYPERPARAMETERS = ("learning_rate", "num_envs", "num_steps", "anneal_lr", "gamma", "gae_lambda", "num_minibatches",
                   "update_epochs", "norm_adv", "clip_coef", "clip_vloss", "ent_coef", "vf_coef", "max_grad_norm",
                   "target_kl")  # fmt: skip
EVAL_SEED_OFFSET = 10_000  # the evaluation env's seed is the run's plus this: games the agent never trained on
VIDEO_FPS = 15  # the ALE's 60 frames a second, of which envpool keeps one in 4 (frame_skip=4)
# How long a rank waits for the others in a collective before it gives up with an error instead of hanging
# (a compile or an evaluation on rank 0 takes well under this).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


def world():
    """This process's rank, the number of processes and those on this machine, from torchrun's environment
    variables; a plain `python` launch is a world of one."""
    return tuple(int(os.environ.get(name, default)) for name, default in
                 (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1)))  # fmt: skip


def exit_with_error(message):
    """A user's mistake: one line on stderr, exit status 2, no traceback. Every rank finds the same mistake: rank 0
    says it and exits, torchrun's report names it as the rank that failed, and torchrun stops the others, which wait
    for that (a mistake that only another rank sees, such as a file missing on its machine, it says 30 s later)."""
    rank = world()[0]
    if rank != 0:
        time.sleep(30)
    print(f"{os.path.basename(sys.argv[0])}: {f'rank {rank}: ' if rank else ''}error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args, world_size):
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"):
        if getattr(args, name) <= 0:
            exit_with_error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.measure_burnin < 0:
        exit_with_error("--measure-burnin must not be negative")
    if not 0 <= args.seed < 2**31:  # what both numpy and envpool accept
        exit_with_error(f"--seed must be in [0, 2**31), got {args.seed}")
    if args.num_envs % world_size != 0:
        exit_with_error(f"a world of {world_size} processes cannot share --num-envs {args.num_envs} evenly")
    # Each rank's minibatch is its share of the global one: the global minibatch must split evenly too.
    rank_batch_size = args.num_envs // world_size * args.num_steps
    if rank_batch_size % args.num_minibatches != 0:
        exit_with_error(
            f"--num-minibatches ({args.num_minibatches}) does not divide the batch of each of the {world_size} "
            f"processes (num_envs / world size * num_steps = {rank_batch_size})"
        )
    if args.checkpoint_every < 0 or args.eval_episodes < 0:
        exit_with_error("--checkpoint-every and --eval-episodes must not be negative")
    if (args.checkpoint_every or args.capture_video) and not args.save_model:
        exit_with_error("--checkpoint-every and --capture-video need --save-model")
    if args.capture_video and not args.eval_episodes:
        exit_with_error("--capture-video records the evaluation episodes: --eval-episodes must be positive")


def make_envs(env_id, num_envs, seed, num_threads=0):
    if env_id not in envpool.list_all_envs():
        exit_with_error(f"cannot make env {env_id!r}: envpool has no env with this id")
    # envpool's registry names the module that implements each id: only its Atari games give 84x84 frames.
    if registry.specs[env_id][0] != "envpool.atari":
        exit_with_error(f"PPO Atari needs an Atari game (e.g. Breakout-v5), {env_id} is not one")
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
        exit_with_error(f"cannot make env {env_id!r}: {error}")
    return envs


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

    def get_value(self, x):
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def compute_advantages(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimates of a rollout, all tensors [num_steps, num_envs] but next_*: [num_envs].

    dones[t] says observation t is the last frame of a finished episode: nothing is bootstrapped from it.
    """
    advantages = torch.zeros_like(rewards)
    last_gae_lambda = 0
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_non_terminal = 1.0 - next_done
            next_values = next_value
        else:
            next_non_terminal = 1.0 - dones[t + 1]
            next_values = values[t + 1]
        delta = rewards[t] + gamma * next_values * next_non_terminal - values[t]
        advantages[t] = last_gae_lambda = delta + gamma * gae_lambda * next_non_terminal * last_gae_lambda
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
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    def update(obs, actions, logprobs, advantages, returns, values, mask):
        """One gradient step on this rank's share of a global minibatch, the same step on every rank; mask is 0 for
        envpool's reset steps (see the rollout), 1 elsewhere. The losses returned are this rank's parts of them."""
        # The means are over the global minibatch: counts and sums from every rank, summed by all-reduces.
        mask_count, advantage_sum = sum_over_ranks(mask.sum(), (advantages * mask).sum())
        count = mask_count.clamp(min=1.0)
        if args.norm_adv:
            mean = advantage_sum / count
            (squares,) = sum_over_ranks(((advantages - mean) ** 2 * mask).sum())
            std = (squares / (mask_count - 1).clamp(min=1.0)).sqrt()
            advantages = (advantages - mean) / (std + 1e-8)

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

        optimizer.zero_grad()
        loss.backward()
        # The gradients summed over ranks are the global minibatch's: one all-reduce of all of them, flattened.
        # (DDP would overlap it with the backward pass, but it wraps the model and hides when the sum happens; on
        # this network of 1.7M parameters one flat all-reduce is a small part of the update.)
        gradients = [parameter.grad for parameter in agent.parameters()]
        flat_gradients = torch.cat([gradient.flatten() for gradient in gradients])
        dist.all_reduce(flat_gradients)
        for gradient, summed in zip(gradients, flat_gradients.split([g.numel() for g in gradients]), strict=True):
            gradient.copy_(summed.view_as(gradient))
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return dict(
            pg_loss=pg_loss.detach(),
            v_loss=v_loss.detach(),
            entropy=entropy_loss.detach(),
            old_approx_kl=old_approx_kl,
            approx_kl=approx_kl,
            clipfrac=clipfrac,
        )

    def policy(obs):
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(obs)
        return action, logprob, value.flatten()

    def value(obs):
        with torch.no_grad():
            return agent.get_value(obs).flatten()

    def set_learning_rate(lr):
        optimizer.param_groups[0]["lr"] = lr

    def state_dict():
        """The agent's and the optimizer's state_dicts: a checkpoint's agent."""
        return {"agent": agent.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(state):
        agent.load_state_dict(state["agent"])
        optimizer.load_state_dict(state["optimizer"])

    return SimpleNamespace(
        agent=agent,
        optimizer=optimizer,
        update=update,
        policy=policy,
        value=value,
        set_learning_rate=set_learning_rate,
        state_dict=state_dict,
        load_state_dict=load_state_dict,
    )


def rng_state():
    """The state of every random generator the run draws from (the envs' are reseeded on resume)."""
    numpy_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1]), *numpy_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and len(state["cuda"]) == torch.cuda.device_count():  # a CUDA run resumed on a CPU skips it
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path, ppo, args, global_step, iteration, recent_returns, world_size):
    """A plain torch.save dict: its agent and optimizer are this script's state_dicts, which the twin and the
    single-process pair read too. Every rank calls it: rank 0 writes it, with every rank's random generators.
    Written to a temporary file and renamed, so a crash while writing leaves the last good checkpoint in place."""
    # all_gather_object pickles, and pickle cannot restore a uint32 tensor (numpy's key): it travels as an array.
    state = rng_state()
    state["numpy"][1] = state["numpy"][1].numpy()
    rank_rngs = [None] * world_size
    dist.all_gather_object(rank_rngs, state)
    if dist.get_rank() != 0:
        return
    for state in rank_rngs:
        state["numpy"][1] = torch.from_numpy(state["numpy"][1])
    checkpoint = {
        "algo": "ppo_atari",
        "env_id": args.env_id,
        "seed": args.seed,
        "hyperparameters": {name: getattr(args, name) for name in HYPERPARAMETERS},
        "global_step": global_step,
        "iteration": iteration,  # the iterations done: where the learning-rate schedule goes on
        "agent": ppo.state_dict(),
        "recent_returns": list(recent_returns),
        "rng": rank_rngs[0],  # rank 0's, where a single-process script looks for its own
        "world_size": world_size,
        "rank_rngs": rank_rngs[1:],
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(checkpoint, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path, args):
    """A checkpoint of this run (algorithm, env, seed and hyper-parameters), or one line and exit status 2."""
    if not os.path.isfile(path):
        exit_with_error(f"no checkpoint at {path}")
    try:
        # On the CPU: loading puts each tensor where its parameter lives, and a CUDA run resumes on a CPU.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, corrupt, or not a torch file at all: each raises its own type
        exit_with_error(f"cannot read the checkpoint {path}: {str(error).splitlines()[0]}")
    if not isinstance(checkpoint, dict) or checkpoint.get("algo") != "ppo_atari":
        found = checkpoint.get("algo") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        exit_with_error(f"{path} is not a PPO Atari checkpoint (it holds {found})")
    if (checkpoint["env_id"], checkpoint["seed"]) != (args.env_id, args.seed):
        exit_with_error(
            f"{path} is a run on {checkpoint['env_id']} with seed {checkpoint['seed']}, "
            f"not on {args.env_id} with seed {args.seed}"
        )
    changed = [
        f"--{name.replace('_', '-')} {value} (checkpoint) vs {getattr(args, name)}"
        for name, value in checkpoint["hyperparameters"].items()
        if getattr(args, name) != value
    ]
    if changed:
        exit_with_error(f"{path} was made with other hyper-parameters: {', '.join(changed)}")
    return checkpoint


def evaluate(checkpoint, args, device, video_folder, stop_signals):
    """The mean return of the checkpoint's policy over --eval-episodes games of a fresh env with another seed, in a
    fresh agent; None if a signal stops it. Video: one MP4 per game, of the newest frame of each observation.

    As CleanRL's evaluation (cleanrl_utils/evals/ppo_eval.py) does: the env is the training one (episodic life,
    clipped rewards), the actions are sampled from the policy, and a game's return is its real one, the game's own
    rewards summed over all lives, as the training loop reports it."""
    envs = make_envs(args.env_id, 1, args.seed + EVAL_SEED_OFFSET)
    agent = Agent(envs.action_space.n).to(device)
    agent.load_state_dict(checkpoint["agent"]["agent"])
    returns = []
    # The actions are sampled from torch's generator seeded like the env (the same checkpoint, the same evaluation),
    # and the run's generators are restored afterwards.
    with torch.random.fork_rng():
        torch.manual_seed(args.seed + EVAL_SEED_OFFSET)
        while len(returns) < args.eval_episodes and not stop_signals:
            obs, _ = envs.reset()
            game_return, game_over = 0.0, False
            video = None
            if video_folder:  # 84x84 as it is: no resizing to a multiple of 16 (H.264 needs only even sides)
                video = imageio.get_writer(
                    f"{video_folder}/eval-episode-{len(returns)}.mp4", fps=VIDEO_FPS, macro_block_size=2
                )
            while not game_over and not stop_signals:
                if video:
                    video.append_data(obs[0, -1])  # what the agent sees: the newest of its 4 stacked 84x84 frames
                with torch.no_grad():
                    action = agent.get_action_and_value(torch.as_tensor(obs, dtype=torch.float32, device=device))[0]
                obs, _, _, truncations, infos = envs.step(action.cpu().numpy())
                game_return += float(infos["reward"][0])
                # A lost life ends an episode but not the game: the env goes on to the next life, as in training.
                game_over = bool(infos["terminated"][0] or truncations[0])
            if video:
                video.close()
            if game_over:
                returns.append(game_return)
    envs.close()
    return float(np.mean(returns)) if len(returns) == args.eval_episodes else None


def check_video_recording():
    """--capture-video fails before training, not after it: imageio must write MP4."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        exit_with_error("--capture-video writes MP4 through imageio-ffmpeg: pip install imageio-ffmpeg")


def stop_on_signals():
    """Ctrl-C (SIGINT) and SIGTERM end the run after the current iteration instead of killing it: the list returned
    receives the signal's number. A second signal of the same kind stops the process at once, but under torchrun: it
    passes on to its workers the Ctrl-C the terminal sent them already, and kills them itself 30 s later."""
    received = []

    def handler(signum, frame):
        received.append(signum)
        if "RANK" not in os.environ:
            signal.signal(signum, signal.SIG_DFL)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
    return received


def report_lost_rank(kind, error, traceback):
    """An error raised in a collective of torch.distributed: another rank died or hung (gloo raises a RuntimeError,
    NCCL a DistError). One line instead of a traceback; torchrun's report names the rank that failed. Anything else:
    Python's usual traceback."""
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
    rank, world_size, local_world_size = world()
    check_args(args, world_size)
    run_start = time.perf_counter()
    script = os.path.basename(__file__)
    batch_size = args.num_envs * args.num_steps  # the global batch: every rank's rollouts together
    rank_num_envs = args.num_envs // world_size
    rank_batch_size = rank_num_envs * args.num_steps
    rank_minibatch_size = rank_batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # whole rollouts: at least total_timesteps steps
    if args.capture_video:
        check_video_recording()
    use_cuda = torch.cuda.is_available() and args.cuda
    # One GPU per rank on a machine (torchrun's LOCAL_RANK); NCCL between GPUs, gloo between CPUs.
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda and local_world_size > torch.cuda.device_count():  # NCCL cannot put two ranks on one GPU
        exit_with_error(f"this machine has {torch.cuda.device_count()} GPU(s), too few for {local_world_size} "
                        "processes: start at most one per GPU (--nproc-per-node), or run on the CPU with --no-cuda")  # fmt: skip
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    # The ranks of a machine share its cores: under torchrun each gets its share as torch and envpool threads (a
    # plain launch keeps torch's default, as the single-process script does; envpool's 0 is its default).
    threads = 0
    if "RANK" in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, cores // local_world_size)
        torch.set_num_threads(threads)
        if rank == 0:
            print(f"{script}: a world of {world_size} process(es) ({backend}), each with {rank_num_envs} envs and "
                  f"{threads} thread(s)")  # fmt: skip
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None
    start_iteration, start_step = (checkpoint["iteration"], checkpoint["global_step"]) if checkpoint else (0, 0)
    model_path = args.model_path or args.resume
    model_path = (
        model_path or f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}/{args.exp_name}.pt"
    )

    # Each rank draws its own actions and minibatches; the agent's initial parameters are rank 0's (build_ppo).
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # Rank r runs the envs r * rank_num_envs ... of a single process, with their seeds (envpool seeds its env i with
    # seed + i): a world of 2 plays the games of a world of 1. A resumed run starts new games, on envs seeded by
    # the step it resumes at.
    envs = make_envs(args.env_id, rank_num_envs, args.seed + start_step + rank * rank_num_envs, threads)
    obs_shape = envs.observation_space.shape
    # The ranks meet here, once every mistake a user can make has been checked (each rank exits on its own).
    sys.excepthook = report_lost_rank
    if "RANK" in os.environ:  # launched by torchrun: it gives the rendezvous address
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    else:  # a world of one, in this process only
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    ppo = build_ppo(envs.action_space.n, args, device)
    recent_returns = deque(maxlen=20)
    if checkpoint:
        ppo.load_state_dict(checkpoint["agent"])
        recent_returns.extend(checkpoint["recent_returns"])
        if rank == 0:
            set_rng_state(checkpoint["rng"])
        elif checkpoint.get("world_size", 1) == world_size:
            set_rng_state(checkpoint["rank_rngs"][rank - 1])
        # Otherwise the run goes on in another world size: the other ranks' generators start afresh from the seed.
        if rank == 0 and checkpoint.get("world_size", 1) != world_size:
            print(f"{script}: the checkpoint was saved by a world of {checkpoint.get('world_size', 1)}, this is a "
                  f"world of {world_size}: ranks other than 0 draw from freshly seeded generators")  # fmt: skip

    if args.track and rank == 0:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=args.exp_name)

    # Rollout storage: this rank's envs.
    obs = torch.zeros((args.num_steps, rank_num_envs) + obs_shape, device=device)
    actions = torch.zeros((args.num_steps, rank_num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, rank_num_envs), device=device)
    rewards = torch.zeros((args.num_steps, rank_num_envs), device=device)
    dones = torch.zeros((args.num_steps, rank_num_envs), device=device)
    time_limits = torch.zeros((args.num_steps, rank_num_envs), device=device)
    values = torch.zeros((args.num_steps, rank_num_envs), device=device)

    stop_signals = stop_on_signals()
    next_obs, _ = envs.reset()
    next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
    next_done = torch.zeros(rank_num_envs, device=device)
    game_returns = np.zeros(rank_num_envs)  # each env's unclipped score since its game started, over all lives
    episode_returns = []  # every rank's games, rank by rank within an iteration
    stop_signal = 0  # the first signal any rank received
    global_step = start_step
    train_start = time.perf_counter()
    measure_start = measure_start_step = None
    sps = compile_seconds = None
    pbar = tqdm.tqdm(
        total=num_iterations * batch_size, desc=script, mininterval=1.0, initial=start_step, disable=rank != 0
    )
    for iteration in range(start_iteration + 1, num_iterations + 1):
        if iteration == start_iteration + args.measure_burnin + 1:
            measure_start, measure_start_step = time.perf_counter(), global_step
            compile_seconds = measure_start - train_start
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            ppo.set_learning_rate(frac * args.learning_rate)

        # envpool ends an episode (a life) on one step and resets that env on the next one, which ignores its
        # action and returns the new episode's first frame with reward 0. So dones[t] = 1 marks obs[t] as the
        # last frame of an episode: GAE does not bootstrap across it, and step t, the reset step, is no
        # transition of the game: the update masks it out.
        rank_returns = []  # this rank's games that ended in this iteration
        for step in range(args.num_steps):
            global_step += args.num_envs  # every rank counts the steps of all
            obs[step] = next_obs
            dones[step] = next_done
            action, logprob, value = ppo.policy(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # The game's real return: its unclipped rewards summed over all lives, until the game is over
            # (infos["terminated"]) or cut by the time limit.
            game_returns += infos["reward"]
            for index in np.flatnonzero(infos["terminated"].astype(bool) | truncations):
                rank_returns.append(float(game_returns[index]))
                game_returns[index] = 0.0
            rewards[step] = torch.tensor(reward, device=device)
            time_limits[step] = torch.tensor(truncations & ~terminations, dtype=torch.float32, device=device)
            next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
            next_done = torch.tensor(terminations | truncations, dtype=torch.float32, device=device)

        # A time limit is not a failure: a truncated episode is bootstrapped from the value of its last frame,
        # the observation that follows it. A termination (a lost life) gets no bootstrap.
        next_value = ppo.value(next_obs)
        next_values = torch.cat([values[1:], next_value[None]])
        advantages = compute_advantages(
            rewards + args.gamma * next_values * time_limits,
            values,
            dones,
            next_value,
            next_done,
            args.gamma,
            args.gae_lambda,
        )
        returns = advantages + values

        # Flatten the batch.
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions = actions.reshape(-1)
        b_logprobs = logprobs.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        b_mask = 1.0 - dones.reshape(-1)

        # Optimize the policy and value network: each rank's minibatch is its share of a global one.
        for _ in range(args.update_epochs):
            b_inds = torch.randperm(rank_batch_size, device=device)
            for start in range(0, rank_batch_size, rank_minibatch_size):
                mb_inds = b_inds[start : start + rank_minibatch_size]
                losses = ppo.update(
                    b_obs[mb_inds],
                    b_actions[mb_inds],
                    b_logprobs[mb_inds],
                    b_advantages[mb_inds],
                    b_returns[mb_inds],
                    b_values[mb_inds],
                    b_mask[mb_inds],
                )
            # The global minibatch's losses, the same on every rank: all ranks stop their epochs together.
            losses = dict(zip(losses.keys(), sum_over_ranks(*losses.values()), strict=True))
            if args.target_kl is not None and losses["approx_kl"] > args.target_kl:
                break

        # Every rank learns of every rank's finished games and of a signal any rank received: returns are global,
        # and all ranks stop at the same iteration (a rank that stopped alone would leave the others waiting).
        gathered = [None] * world_size
        dist.all_gather_object(gathered, (rank_returns, stop_signals[0] if stop_signals else 0))
        for returns_of_rank, signal_of_rank in gathered:
            episode_returns.extend(returns_of_rank)
            recent_returns.extend(returns_of_rank)
            stop_signal = stop_signal or signal_of_rank
        if args.track and rank == 0:
            for episode_return in (r for returns_of_rank, _ in gathered for r in returns_of_rank):
                wandb.log({"charts/episodic_return": episode_return}, step=global_step)

        # Log once per iteration, from the last minibatch.
        logs = {name: value.item() for name, value in losses.items()}
        for name, value in logs.items():
            if not np.isfinite(value):
                pbar.close()
                if rank == 0:  # every rank has the same global losses and stops here
                    print(
                        f"{script}: error: {name} is {value} at step {global_step}; stopping the run", file=sys.stderr
                    )
                sys.exit(1)
        if measure_start is not None and global_step > measure_start_step:
            sps = (global_step - measure_start_step) / (time.perf_counter() - measure_start)
        mean_return = np.mean(recent_returns) if recent_returns else float("nan")
        pbar.update(batch_size)
        pbar.set_postfix(sps=f"{sps or 0:.0f}", ret=f"{mean_return:.1f}", refresh=False)
        if args.track and rank == 0:
            wandb.log(
                {
                    **{f"losses/{k}": v for k, v in logs.items()},
                    "charts/learning_rate": ppo.optimizer.param_groups[0]["lr"],
                },
                step=global_step,
            )
        if stop_signal:
            break
        if args.checkpoint_every and iteration < num_iterations:
            # After the iteration in which the step count reaches a multiple of --checkpoint-every.
            if global_step // args.checkpoint_every > (global_step - batch_size) // args.checkpoint_every:
                save_checkpoint(model_path, ppo, args, global_step, iteration, recent_returns, world_size)
    pbar.close()
    envs.close()

    end = time.perf_counter()
    eval_return = None
    if args.save_model:
        iterations_done = global_step // batch_size  # each iteration steps the whole batch
        save_checkpoint(model_path, ppo, args, global_step, iterations_done, recent_returns, world_size)
        # Rank 0 evaluates; the others are done.
        if rank == 0 and args.eval_episodes and not stop_signal:
            video_folder = os.path.join(os.path.dirname(model_path), "videos") if args.capture_video else None
            if video_folder:
                os.makedirs(video_folder, exist_ok=True)
            eval_checkpoint = torch.load(model_path, map_location="cpu", weights_only=True)
            eval_return = evaluate(eval_checkpoint, args, device, video_folder, stop_signals)
    dist.destroy_process_group()
    if rank != 0:
        sys.exit(128 + stop_signal if stop_signal else 0)
    final_return = float(np.mean(recent_returns)) if recent_returns else None
    results = {
        "script": script,
        "algo": "ppo_atari_distributed",  # its own row in run.sh's table (a checkpoint's algo is "ppo_atari")
        "env_id": args.env_id,
        "seed": args.seed,
        "compile": False,
        "cudagraphs": False,
        "device": str(device),
        "torch_version": torch.__version__,
        "total_timesteps": num_iterations * batch_size,
        "sps": sps,
        "compile_seconds": compile_seconds,
        "wall_seconds": end - run_start,
        "final_return": final_return,
        "steps_done": global_step,
        "interrupted": bool(stop_signal),
        "eval_return": eval_return,
        "model_path": model_path if args.save_model else None,
        "world_size": world_size,
    }
    if args.results_path:
        with open(args.results_path, "a") as f:
            f.write(json.dumps(results) + "\n")
    if args.track:
        wandb.log({"charts/sps": sps, "charts/eval_return": eval_return}, step=global_step)
        wandb.finish()
    sps_text = (
        f"{sps:.0f} sps (steady state, all ranks)"
        if sps
        else "sps not measured (run ended within measure_burnin iterations)"
    )
    return_text = f"{final_return:.1f}" if final_return is not None else "n/a (no finished episode)"
    if stop_signal:
        done_text = (
            f"interrupted by {signal.Signals(stop_signal).name} at step {global_step} of {num_iterations * batch_size}"
        )
    else:
        done_text = f"{global_step} steps"
    summary = (
        f"{script}: {done_text} on {args.env_id} by {world_size} process(es), {sps_text}, final return {return_text}"
    )
    if args.save_model:
        summary += f"; checkpoint {model_path}"
        summary += f", eval return {eval_return:.1f} over {args.eval_episodes} games" if eval_return is not None else ""
    print(summary)
    if stop_signal:
        sys.exit(128 + stop_signal)
