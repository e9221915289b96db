#!/usr/bin/env bash
# The speed-up table, reproduced on this machine: every plain script of leanrl/ and its _torchcompile twin (no
# flag, --compile, --cudagraphs, both) over several seeds, one run after another, then the table and plots of
# benchmarks/speedup_table.py made from the runs' results. ./run.sh --help for the options.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: ./run.sh [--quick | --tiny] [--seeds "1 2 3"] [--scripts "sac_continuous_action ..."] [--out DIR]

Trains every pair of leanrl/ (X.py and X_torchcompile.py) in five variants: the plain script, and its twin
with no flag, --compile, --cudagraphs and --compile --cudagraphs (the two cudagraphs variants need CUDA and
are skipped without it); where the device computes bf16 faster than fp32, the twins with a --bf16 switch (SAC, TD3 and
the Atari ones) also with --bf16 added to their fastest variant. Runs go one after another, never in parallel (parallel torch processes distort
each other's speed), seed by seed: every variant of every script for the first seed, then for the next, so a
slow spell of a shared machine hits all variants alike and a run stopped early still gives whole rows.
Each run appends its JSON line to DIR/results.jsonl and logs to DIR/logs/<script>-<variant>-seed<S>.log; at
the end benchmarks/speedup_table.py writes DIR/speedup.md, DIR/sps.png and DIR/final_return.png.

Modes (each run's budget flags are in the budget table near the top of run.sh):
  (default)          full budgets, the scripts' own defaults (CleanRL's: 1M steps of HalfCheetah-v5 for
                     SAC, TD3 and PPO, 10M of Breakout for Atari PPO and PQN, 500k of CartPole-v1 for DQN
                     and PQN): about a week on a 2-core CPU.
  --quick            the envs of the full runs, a budget just long enough for a steady sps (which counts
                     neither the random warm-up nor the 3 burn-in iterations): SAC 5000 random + 1500
                     training steps, TD3 25000 random (the default; a few seconds) + 1500, PPO
                     continuous 3 + 3 rollouts of 2048 steps, PPO Atari 3 + 20 rollouts of 8 envs x 128
                     (3 + 3 measured a second on an H100: too short to be steady), DQN 10000 random + 20000
                     (2000 gradient steps), PQN 25 rollouts of 4 x 128 on CartPole-v1 and of 8 x 128 on
                     Breakout (3 burn-in, then 22 measured; the CUDA graphs are recorded in the 5th).
                     Default 3 seeds: 72 runs on a CPU, about 60 minutes on 2 cores (52 on a 2-core AMD
                     EPYC Zen 3 VM with a warm compile cache, 2026-11-29; 37 of them for the 27 Breakout
                     runs). A cold cache adds 20-30 s per compiled twin.
  --tiny             a few hundred steps per run (1536 for PQN's 8 envs) on small envs, seed 1: checks that
                     everything runs; the runs of each pair's own tests (CI); its speeds mean nothing.
The distributed Atari pair runs as a world of one, a plain launch (its row is ppo_atari_distributed); runs of
several processes are in docs/ppo_atari_distributed.md and benchmarks/gpu_check.sh's scaling stage.
Options (an environment variable of the same meaning in brackets; the option wins):
  --seeds "S ..."    the seeds, non-negative integers (default "1 2 3"; --tiny: "1")   [LEANRL_SEEDS]
  --scripts "X ..."  the pairs to run, named by their plain script without .py
                     (default: every pair of leanrl/)                                  [LEANRL_SCRIPTS]
  --out DIR          where results, logs, table and plots go
                     (default: runs/<date>_<time>/ beside run.sh)                      [LEANRL_OUT]
  --quick, --tiny    the mode                                   [LEANRL_MODE=full, quick or tiny]
  -h, --help         this text
The python that runs everything: $PYTHON (default: python).

Exit status: 0 when every run and the table succeeded; 1 when a run failed (the others still run and the
table is made from those that succeeded; the failed ones are listed at the end); 2 for a bad option.
EOF
}

die() {
  echo "run.sh: error: $*" >&2
  exit 2
}

root=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python}
mode=${LEANRL_MODE:-full}
seeds=${LEANRL_SEEDS:-}
scripts=${LEANRL_SCRIPTS:-}
out=${LEANRL_OUT:-}
while (($#)); do
  case $1 in
    --quick) mode=quick ;;
    --tiny) mode=tiny ;;
    --seeds | --scripts | --out) # sets $seeds, $scripts or $out
      (($# >= 2)) || die "$1 needs a value"
      declare "${1#--}=$2"
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unknown option '$1' (./run.sh --help lists the options)" ;;
  esac
  shift
done

# Budget flags per script and mode. full: none, the scripts' defaults. quick: a steady-state sps on the full
# runs' envs (sps counts neither the random warm-up nor the burn-in iterations). tiny: just past the warm-up, and
# the runs of each pair's own tests of its results line and of its twin's flags (tests/helpers.py reads these lines).
budget() { # $1: mode, $2: script
  case $1/$2 in
    full/*) ;;
    quick/sac_continuous_action) echo "--total-timesteps 6500" ;;  # 5000 random + 1500 training steps
    quick/td3_continuous_action) echo "--total-timesteps 26500" ;; # 25000 random (a few s) + 1500 training
    quick/ppo_continuous_action) echo "--total-timesteps 12288" ;; # (3 burn-in + 3) rollouts of 2048 steps
    quick/ppo_atari_envpool | quick/ppo_atari_envpool_distributed) # (3 burn-in + 20) rollouts of 8 envs x 128
      echo "--total-timesteps 23552" ;; # the distributed pair: a world of one (run.sh launches with python)
    quick/dqn) echo "--total-timesteps 30000" ;;                   # 10000 random + 20000 (2000 gradient steps)
    quick/pqn) echo "--total-timesteps 12800" ;; # 25 rollouts of 4 envs x 128: 3 burn-in + 22 measured
    quick/pqn_atari_envpool) echo "--total-timesteps 25600" ;; # 25 rollouts of 8 envs x 128, as for PQN
    tiny/sac_continuous_action | tiny/td3_continuous_action) # 100 random + 200 training steps, one episode
      echo "--env-id Pendulum-v1 --learning-starts 100 --batch-size 32 --total-timesteps 300" ;;
    tiny/ppo_continuous_action) # 6 rollouts of 64 steps: one past the 5th, where GAE's CUDA graph is recorded
      echo "--env-id InvertedPendulum-v5 --num-steps 64 --num-minibatches 2 --update-epochs 1 --total-timesteps 384" ;;
    tiny/ppo_atari_envpool | tiny/ppo_atari_envpool_distributed) # 8 rollouts of 2 envs x 32: a game ends in each env
      echo "--num-envs 2 --num-steps 32 --update-epochs 1 --total-timesteps 512" ;;
    tiny/dqn) echo "--learning-starts 200 --batch-size 32 --total-timesteps 400" ;; # 20 gradient steps
    tiny/pqn) # 6 rollouts of 8 envs x 32 steps (CUDA graphs all recorded by the 5th), the learning test's shapes
      echo "--num-envs 8 --num-steps 32 --num-minibatches 4 --update-epochs 1 --q-lambda 0.9 --total-timesteps 1536" ;;
    tiny/pqn_atari_envpool) # 8 rollouts of 2 envs x 32 steps: past the 5th, where the last CUDA graphs are recorded
      echo "--num-envs 2 --num-steps 32 --num-minibatches 1 --update-epochs 1 --total-timesteps 512" ;;
    *) return 1 ;;
  esac
}

case $mode in
  full | quick) seeds=${seeds:-1 2 3} ;;
  tiny) seeds=${seeds:-1} ;;
  *) die "LEANRL_MODE must be full, quick or tiny, not '$mode'" ;;
esac
read -ra seeds <<<"$seeds"
((${#seeds[@]})) || die "no seeds given"
for seed in "${seeds[@]}"; do
  [[ $seed =~ ^[0-9]+$ ]] || die "a seed must be a non-negative integer, not '$seed'"
done

# The pairs: every leanrl/X_torchcompile.py whose leanrl/X.py exists.
pairs=()
for twin in "$root"/leanrl/*_torchcompile.py; do
  plain=${twin%_torchcompile.py}
  if [[ -f $plain.py ]]; then pairs+=("$(basename "$plain")"); fi
done
((${#pairs[@]})) || die "no script pairs in $root/leanrl"
if [[ -n $scripts ]]; then
  read -ra chosen <<<"$scripts"
  for script in "${chosen[@]}"; do
    [[ " ${pairs[*]} " == *" ${script%.py} "* ]] || die "no pair '$script' in leanrl/ (pairs: ${pairs[*]})"
  done
  pairs=("${chosen[@]%.py}")
fi

out=${out:-$root/runs/$(date +%Y-%m-%d_%H-%M-%S)}
[[ ! -e $out/results.jsonl ]] || die "$out already holds a results.jsonl: give another --out"
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
results=$out/results.jsonl
cd "$root"
export PYTHONUNBUFFERED=1 # a log keeps a run's prints and errors in the order they happened

"$python" benchmarks/speedup_table.py --record-machine "$out/machine.json"
variants=(plain twin twin+compile twin+cudagraphs twin+compile+cudagraphs)
if [[ $("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gpu"] is not None)' \
  "$out/machine.json") != True ]]; then
  echo "no CUDA device: skipping the --cudagraphs variants (cudagraphs need CUDA)"
  variants=(plain twin twin+compile)
fi
# The twins with a --bf16 switch (SAC, TD3, the Atari ones) run once more with it, in their fastest variant, where the
# device computes bf16 faster than fp32; elsewhere the switch would only say that it is off.
bf16_pairs=()
for script in "${pairs[@]}"; do
  if grep -q '^    bf16: bool' "leanrl/${script}_torchcompile.py"; then bf16_pairs+=("$script"); fi
done
if ((${#bf16_pairs[@]})) && [[ $("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["fast_bf16"])' \
  "$out/machine.json") != True ]]; then
  echo "no bf16 faster than fp32 here (a CUDA GPU of compute capability 8+, AMX or an AMD CPU's AVX512-BF16): skipping the --bf16 variant"
  bf16_pairs=()
fi

total=$((${#seeds[@]} * (${#pairs[@]} * ${#variants[@]} + ${#bf16_pairs[@]})))
echo "mode $mode: ${#pairs[@]} scripts x ${#variants[@]} variants${bf16_pairs[*]:+ (and ${#bf16_pairs[@]} with --bf16)}" \
  "x ${#seeds[@]} seeds = $total runs, into $out"
: >"$results"
print_sps='import json, sys
sps = json.load(sys.stdin)["sps"]
print(f"{sps:.1f} sps" if sps is not None else "sps n/a (too short to measure)")'
failed=()
n=0
for seed in "${seeds[@]}"; do
  for script in "${pairs[@]}"; do
    script_variants=("${variants[@]}")
    if [[ " ${bf16_pairs[*]} " == *" $script "* ]]; then script_variants+=("${variants[-1]}+bf16"); fi
    for variant in "${script_variants[@]}"; do
      n=$((n + 1))
      log=$out/logs/$script-${variant//+/-}-seed$seed.log
      # "twin+compile+cudagraphs" -> the twin with --compile --cudagraphs
      IFS=+ read -ra flags <<<"$variant"
      file=leanrl/$script.py
      [[ ${flags[0]} == plain ]] || file=leanrl/${script}_torchcompile.py
      flags=("${flags[@]:1}")
      flags=("${flags[@]/#/--}")
      printf '[%d/%d] %s %s seed %s ... ' "$n" "$total" "$script" "$variant" "$seed"
      if ! budget_text=$(budget "$mode" "$script"); then
        echo "FAILED: no $mode budget for $script in run.sh's budget table"
        failed+=("$script $variant seed $seed: no $mode budget in run.sh")
        continue
      fi
      read -ra budget_flags <<<"$budget_text"
      lines_before=$(wc -l <"$results")
      start=$SECONDS
      status=0
      "$python" "$file" "${budget_flags[@]}" --seed "$seed" --results-path "$results" "${flags[@]}" \
        >"$log" 2>&1 || status=$?
      if ((status == 0)) && (($(wc -l <"$results") == lines_before + 1)); then
        sps=$(tail -n 1 "$results" | "$python" -c "$print_sps") || sps="unreadable results line"
        echo "$sps ($((SECONDS - start)) s)"
      else
        # the last line of the log is the script's own message when it stopped on an error
        echo "FAILED (exit $status): $(tr '\r' '\n' <"$log" | grep -v '^\s*$' | tail -n 1 | cut -c1-200)"
        failed+=("$script $variant seed $seed: exit $status, log ${log#"$out"/}")
      fi
    done
  done
done

echo
if ((${#failed[@]})); then
  printf '%s\n' "${failed[@]}" >"$out/failed.txt"
  echo "${#failed[@]} of $total runs failed:"
  printf '  %s\n' "${failed[@]}"
else
  echo "all $total runs succeeded"
fi
table_ok=true
if (($(wc -l <"$results") == 0)); then
  echo "no run wrote results: no table"
  table_ok=false
elif "$python" benchmarks/speedup_table.py "$results" >/dev/null; then
  echo
  cat "$out/speedup.md"
  echo
  echo "table: $out/speedup.md, plots: $out/sps.png $out/final_return.png, logs: $out/logs/"
else
  echo "the table tool failed on $results"
  table_ok=false
fi
((${#failed[@]} == 0)) && $table_ok
