# Proximal Policy Optimization on Atari (envpool), plain eager PyTorch (the baseline of the speed-up table).
# Its twin, ppo_atari_envpool_torchcompile.py, trains the same agent faster: `diff` the two files.
import json
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import numpy as np
import torch
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
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
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


def exit_with_error(message):
    """A user's mistake: one line on stderr, exit status 2, no traceback."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"):
        if getattr(args, name) <= 0:
            exit_with_error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.measure_burnin < 0:
        exit_with_error("--measure-burnin must not be negative")
    if not 0 <= args.seed < 2**31:  # what both numpy and envpool accept
        exit_with_error(f"--seed must be in [0, 2**31), got {args.seed}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        exit_with_error(
            f"--num-minibatches ({args.num_minibatches}) does not divide the batch "
            f"(num_envs * num_steps = {batch_size})"
        )


def make_envs(args):
    if args.env_id not in envpool.list_all_envs():
        exit_with_error(f"cannot make env {args.env_id!r}: envpool has no env with this id")
    # envpool's registry names the module that implements each id: only its Atari games give 84x84 frames.
    if registry.specs[args.env_id][0] != "envpool.atari":
        exit_with_error(f"PPO Atari needs an Atari game (e.g. Breakout-v5), {args.env_id} is not one")
    try:
        # Frames: grey 84x84, 4 stacked, 4 frames skipped per step, up to 30 no-ops at reset. Episodic life
        # (a lost life ends an episode) and rewards clipped to their sign are for learning only: the returns
        # reported are the game's own (infos["reward"], summed until infos["terminated"]: the game is over).
        envs = envpool.make(
            args.env_id,
            env_type="gymnasium",
            num_envs=args.num_envs,
            episodic_life=True,
            reward_clip=True,
            seed=args.seed,
        )
    except Exception as error:
        exit_with_error(f"cannot make env {args.env_id!r}: {error}")
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


def masked_mean(x, mask):
    """The mean of x over the entries where mask is 1 (0 where there is none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def build_ppo(num_actions, args, device):
    """The agent, its optimizer and the update of one minibatch; the training loop only calls the functions."""
    agent = Agent(num_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    def update(obs, actions, logprobs, advantages, returns, values, mask):
        """One gradient step on a minibatch; mask is 0 for envpool's reset steps (see the rollout), 1 elsewhere."""
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
        logratio = newlogprob - logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            # http://joschu.net/blog/kl-approx.html
            old_approx_kl = masked_mean(-logratio, mask)
            approx_kl = masked_mean((ratio - 1) - logratio, mask)
            clipfrac = masked_mean(((ratio - 1.0).abs() > args.clip_coef).float(), mask)

        if args.norm_adv:
            mean = masked_mean(advantages, mask)
            std = (((advantages - mean) ** 2 * mask).sum() / (mask.sum() - 1).clamp(min=1.0)).sqrt()
            advantages = (advantages - mean) / (std + 1e-8)

        # Policy loss: the pessimistic (larger) of the plain and the clipped surrogate losses.
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = masked_mean(torch.max(pg_loss1, pg_loss2), mask)

        newvalue = newvalue.view(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - returns) ** 2
            v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
            v_loss_clipped = (v_clipped - returns) ** 2
            v_loss = 0.5 * masked_mean(torch.max(v_loss_unclipped, v_loss_clipped), mask)
        else:
            v_loss = 0.5 * masked_mean((newvalue - returns) ** 2, mask)

        entropy_loss = masked_mean(entropy, mask)
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

        optimizer.zero_grad()
        loss.backward()
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

    return SimpleNamespace(agent=agent, optimizer=optimizer, update=update, policy=policy, value=value)


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    run_start = time.perf_counter()
    script = os.path.basename(__file__)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # whole rollouts: at least total_timesteps steps

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = make_envs(args)
    obs_shape = envs.observation_space.shape
    ppo = build_ppo(envs.action_space.n, args, device)

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=args.exp_name)

    # Rollout storage.
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    time_limits = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    next_obs, _ = envs.reset()
    next_obs = torch.tensor(next_obs, dtype=torch.float32, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    game_returns = np.zeros(args.num_envs)  # each env's unclipped score since its game started, over all lives
    episode_returns = []
    recent_returns = deque(maxlen=20)
    global_step = 0
    train_start = time.perf_counter()
    measure_start = measure_start_step = None
    sps = compile_seconds = None
    pbar = tqdm.tqdm(total=num_iterations * batch_size, desc=script, mininterval=1.0)
    for iteration in range(1, num_iterations + 1):
        if iteration == args.measure_burnin + 1:
            measure_start, measure_start_step = time.perf_counter(), global_step
            compile_seconds = measure_start - train_start
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            ppo.optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # envpool ends an episode (a life) on one step and resets that env on the next one, which ignores its
        # action and returns the new episode's first frame with reward 0. So dones[t] = 1 marks obs[t] as the
        # last frame of an episode: GAE does not bootstrap across it, and step t, the reset step, is no
        # transition of the game: the update masks it out.
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            action, logprob, value = ppo.policy(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # The game's real return: its unclipped rewards summed over all lives, until the game is over
            # (infos["terminated"]) or cut by the time limit.
            game_returns += infos["reward"]
            for index in np.flatnonzero(infos["terminated"].astype(bool) | truncations):
                episode_return = float(game_returns[index])
                game_returns[index] = 0.0
                episode_returns.append(episode_return)
                recent_returns.append(episode_return)
                if args.track:
                    wandb.log({"charts/episodic_return": episode_return}, step=global_step)
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

        # Optimize the policy and value network.
        for _ in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start : start + minibatch_size]
                losses = ppo.update(
                    b_obs[mb_inds],
                    b_actions[mb_inds],
                    b_logprobs[mb_inds],
                    b_advantages[mb_inds],
                    b_returns[mb_inds],
                    b_values[mb_inds],
                    b_mask[mb_inds],
                )
            if args.target_kl is not None and losses["approx_kl"] > args.target_kl:
                break

        # Log once per iteration, from the last minibatch.
        logs = {name: value.item() for name, value in losses.items()}
        for name, value in logs.items():
            if not np.isfinite(value):
                pbar.close()
                sys.exit(f"{script}: error: {name} is {value} at step {global_step}; stopping the run")
        if measure_start is not None and global_step > measure_start_step:
            sps = (global_step - measure_start_step) / (time.perf_counter() - measure_start)
        mean_return = np.mean(recent_returns) if recent_returns else float("nan")
        pbar.update(batch_size)
        pbar.set_postfix(sps=f"{sps or 0:.0f}", ret=f"{mean_return:.1f}", refresh=False)
        if args.track:
            wandb.log(
                {
                    **{f"losses/{k}": v for k, v in logs.items()},
                    "charts/learning_rate": ppo.optimizer.param_groups[0]["lr"],
                },
                step=global_step,
            )
    pbar.close()
    envs.close()

    end = time.perf_counter()
    final_return = float(np.mean(episode_returns[-20:])) if episode_returns else None
    results = {
        "script": script,
        "algo": "ppo_atari",
        "env_id": args.env_id,
        "seed": args.seed,
        "compile": False,
        "cudagraphs": False,
        "device": str(device),
        "torch_version": torch.__version__,
        "total_timesteps": global_step,
        "sps": sps,
        "compile_seconds": compile_seconds,
        "wall_seconds": end - run_start,
        "final_return": final_return,
    }
    if args.results_path:
        with open(args.results_path, "a") as f:
            f.write(json.dumps(results) + "\n")
    if args.track:
        wandb.log({"charts/sps": sps}, step=global_step)
        wandb.finish()
    sps_text = (
        f"{sps:.0f} sps (steady state)" if sps else "sps not measured (run ended within measure_burnin iterations)"
    )
    return_text = f"{final_return:.1f}" if final_return is not None else "n/a (no finished episode)"
    print(f"{script}: {global_step} steps on {args.env_id}, {sps_text}, final return {return_text}")
