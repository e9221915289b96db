# Proximal Policy Optimization on Atari (envpool), plain eager PyTorch (the baseline of the speed-up table).
# Its twin, ppo_atari_envpool_torchcompile.py, trains the same agent faster: `diff` the two files.
import os
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import numpy as np
import run_utils
import torch
import torch.nn as nn
import tyro
from envpool.registration import registry
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


def make_envs(env_id, num_envs, seed):
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
        )
    except Exception as error:
        run_utils.exit_with_error(f"cannot make env {env_id!r}: {error}")
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

    def set_learning_rate(lr):
        optimizer.param_groups[0]["lr"] = lr

    def state_dict():
        """The agent's and the optimizer's state_dicts: a checkpoint's agent."""
        return {"agent": agent.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(state):
        agent.load_state_dict(state["agent"])
        optimizer.load_state_dict(state["optimizer"])

    return SimpleNamespace(
        optimizer=optimizer,
        update=update,
        policy=policy,
        value=value,
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


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_args(args)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
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
    )
    device = run.device
    start_iteration, start_step = (
        (run.checkpoint["iteration"], run.checkpoint["global_step"]) if run.checkpoint else (0, 0)
    )

    # A resumed run starts new games, on envs seeded by the step it resumes at.
    envs = make_envs(args.env_id, args.num_envs, args.seed + start_step)
    obs_shape = envs.observation_space.shape
    ppo = build_ppo(envs.action_space.n, args, device)
    if run.checkpoint:
        ppo.load_state_dict(run.checkpoint["agent"])
        run_utils.set_rng_state(run.checkpoint["rng"])

    def save_checkpoint():
        """A PPO checkpoint: the step, the iterations done (where the learning-rate schedule goes on) and the agent."""
        run.save_checkpoint(global_step=global_step, iteration=global_step // batch_size, agent=ppo.state_dict())

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
                run.episode(float(game_returns[index]), global_step)
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
        run.log(global_step, losses, {"charts/learning_rate": ppo.optimizer.param_groups[0]["lr"]})
        if run.checkpoint_due(global_step, batch_size):
            save_checkpoint()
        if run.stopping:
            break
    envs.close()
    run.finish(global_step, save_checkpoint, evaluation_policy)
