#!/usr/bin/env bash
# The CUDA checklist of the project in one command, in stages:
#
#   benchmarks/gpu_check.sh OUT_DIR [STAGE ...]
#
# Stages, in the order given (default: smoke tests speedup:1 speedup:2 speedup:3 table envspeed micro profile scaling);
# each fits in ten minutes on an H100 machine, docs/speed_gpu.md gives their figures:
#   smoke[:PAIR]  every twin on CUDA with no flag, --compile, --cudagraphs and both, then every plain script (or the
#            pair PAIR, named by its plain script), a few thousand steps of the full runs' envs, TORCH_LOGS=recompiles:
#            a crash, a recompile after the warm-up or no results line is FAILED (logs in OUT_DIR/smoke/).
#   tests[:cuda]  pytest -n auto tests (OUT_DIR/pytest.log); tests:cuda the CUDA cases alone (pytest -m cuda).
#   speedup:S[:PAIR]  ./run.sh --quick for seed S, every pair (or PAIR) and variant (OUT_DIR/speedup-seedS[-PAIR]/):
#            an H100 machine ran 17 of a seed's 20 runs in 9 minutes with a cold compile cache, so split by PAIR.
#   table    the speed-up table and plots of the speedup:S stages run so far (OUT_DIR/speedup/).
#   envspeed benchmarks/env_speed.py --frames: the PPO scripts' envs alone, each variant of the table stage against
#            them, and Breakout's frames copied to the GPU, pageable and pinned (OUT_DIR/env_speed.md).
#   atari    the Atari twins with --compile --cudagraphs, without and with --bf16, run.sh's quick budget, seed 1, then
#            their envs alone with the runs' sps as a share of them (OUT_DIR/atari/, atari.md).
#   learning[:STEPS]  SAC and TD3 twins, --compile --cudagraphs, HalfCheetah-v5, 300k steps, seeds 1 and 2, one run at
#            a time (benchmarks/learning_curves.py, OUT_DIR/learning/): a plot and the minutes to a return of 5000.
#            Checkpoints every 50k steps: the same stage and OUT_DIR resumes a cut run on a warm machine.
#   recipe[:STEPS]  docs/num_envs.md's SAC recipe (16 envs, 2 gradient steps), then a GPU-sized one (64, 8), 150k
#            steps, seed 1: the minutes to 5000 (OUT_DIR/recipe/; the goal on a GPU: under 30 seconds).
#   micro    benchmarks/micro_benchmark.py on CUDA, eager, compiled, compiled and captured (OUT_DIR/micro_cuda.md).
#   profile[:PAIR]  each twin with --compile --cudagraphs under cProfile: the 30 functions with the most own time
#            (OUT_DIR/profile/<script>.txt).
#   scaling  the distributed Atari twin with --compile --cudagraphs under torchrun, NCCL, in worlds of 1, 2, 4 and 8
#            processes, one GPU each (as many as the machine has), the same global batch (OUT_DIR/scaling/scaling.md).
#
# It needs requirements/requirements-dev.txt and a CUDA device. On an offline machine whose python3 has torch, unpack
# what ../shared/gpu/pack-deps.sh packed first:
#   mkdir -p /tmp/site && tar xzf .gpu/deps.tar.gz -C /tmp/site && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# The smoke runs go several at a time (they check behaviour, not speed); the others one at a time.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
(($# >= 1)) || { echo "usage: benchmarks/gpu_check.sh OUT_DIR [smoke[:PAIR]|tests[:cuda]|speedup:SEED[:PAIR]|table|envspeed|atari|learning[:STEPS]|recipe[:STEPS]|micro|profile[:PAIR]|scaling ...]" >&2; exit 2; }
out=$1
shift
stages=("$@")
((${#stages[@]})) || stages=(smoke tests speedup:1 speedup:2 speedup:3 table envspeed micro profile scaling)
for stage in "${stages[@]}"; do
  [[ $stage =~ ^(smoke(:[a-z_]+)?|tests(:cuda)?|speedup:[0-9]+(:[a-z_]+)?|table|envspeed|atari|learning(:[0-9]+)?|recipe(:[0-9]+)?|micro|profile(:[a-z_]+)?|scaling)$ ]] ||
    { echo "gpu_check: unknown stage '$stage'" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
  { echo "gpu_check: no CUDA device seen by $python's torch" >&2; exit 2; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "CPU cores: $(nproc)"
  "$python" -c 'import torch, tensordict; print("torch", torch.__version__, "CUDA", torch.version.cuda, "tensordict", tensordict.__version__)'
} | tee "$out/machine.txt"
status=0

# Budgets of the smoke runs: past the warm-up (random steps or the first rollouts), past the capture (the 5th
# call of each captured function), and long enough for a recompile to show.
smoke_flags() {
  case $1 in
    sac_continuous_action | td3_continuous_action) echo "--total-timesteps 3000 --learning-starts 1000" ;;
    ppo_continuous_action) echo "--total-timesteps 12288" ;;
    ppo_atari_envpool | ppo_atari_envpool_distributed) echo "--total-timesteps 8192" ;; # distributed: a world of 1
    dqn) echo "--total-timesteps 12000" ;; # 10000 random steps, then 200 updates
    pqn) echo "--total-timesteps 5120" ;;                 # 10 rollouts of 4 x 128 (graphs recorded in the 5th)
    pqn_atari_envpool) echo "--total-timesteps 10240" ;;  # 10 rollouts of 8 x 128
  esac
}

smoke() { # $@: the pairs, named by their plain script
  mkdir -p "$out/smoke"
  for script in "$@"; do
    local pids=() names=()
    read -ra budget <<<"$(smoke_flags $script)"
    for variant in plain twin twin+compile twin+cudagraphs twin+compile+cudagraphs; do
      IFS=+ read -ra flags <<<"$variant"
      file=leanrl/$script.py
      [[ ${flags[0]} == plain ]] || file=leanrl/${script}_torchcompile.py
      flags=("${flags[@]:1}")
      flags=("${flags[@]/#/--}")
      name=$script-${variant//+/-}
      OMP_NUM_THREADS=2 TORCH_LOGS=recompiles "$python" "$file" "${budget[@]}" "${flags[@]}" \
        --results-path "$out/smoke/$name.jsonl" >"$out/smoke/$name.log" 2>&1 &
      pids+=($!)
      names+=("$name")
    done
    # five runs at a time: one script's variants
    for i in "${!pids[@]}"; do
      rc=0
      wait "${pids[$i]}" || rc=$?
      log=$out/smoke/${names[$i]}.log
      recompiles=$(grep -c "Recompiling function" "$log")
      if ((rc != 0)) || [[ ! -s $out/smoke/${names[$i]}.jsonl ]]; then
        echo "FAILED ${names[$i]} (exit $rc): $(tr '\r' '\n' <"$log" | grep -v '^\s*$' | tail -n 1 | cut -c1-300)"
        status=1
      elif ((recompiles > 0)); then
        echo "FAILED ${names[$i]}: $recompiles recompiles (see the log)"
        status=1
      else
        echo "ok     ${names[$i]}: $(tr '\r' '\n' <"$log" | grep -v '^\s*$' | tail -n 1 | cut -c1-200)"
      fi
    done
  done
  cat "$out"/smoke/*.jsonl >"$out/smoke.jsonl"
}

# Budgets of the profiles: a few thousand steps past the compile, so that the steady state dominates.
profile_flags() {
  case $1 in
    sac_continuous_action | td3_continuous_action) echo "--total-timesteps 11000 --learning-starts 5000" ;;
    ppo_continuous_action) echo "--total-timesteps 40960" ;;
    ppo_atari_envpool) echo "--total-timesteps 81920" ;;
    pqn) echo "--total-timesteps 102400" ;;
    pqn_atari_envpool) echo "--total-timesteps 81920" ;;
  esac
}

learning() { # $1: the env steps of each run
  local algo
  for algo in sac td3; do
    mkdir -p "$out/learning/$algo"
    # learning_curves.py runs the seeds one at a time: their minutes are a user's, not those of a shared GPU
    OMP_NUM_THREADS=2 "$python" benchmarks/learning_curves.py run --script ${algo}_continuous_action_torchcompile \
      --seeds 1 2 --checkpoint-every 50000 --out "$out/learning/$algo" -- --compile --cudagraphs \
      --total-timesteps $1 >>"$out/learning/$algo.log" 2>&1 || status=1
  done
  "$python" benchmarks/learning_curves.py plot "$out/learning/sac" "$out/learning/td3" --out "$out/learning/curves.png" \
    --reach 5000 || status=1
}

# docs/num_envs.md's recipe: 1 update per 8 env steps, faster learning rates and target networks than CleanRL's
RECIPE=(--policy-lr 1e-3 --q-lr 2e-3 --tau 0.05)

recipe() { # $1: the env steps of each run
  local setting
  for setting in "16 2" "64 8"; do
    read -r envs updates <<<"$setting"
    mkdir -p "$out/recipe/envs$envs"
    OMP_NUM_THREADS=2 "$python" benchmarks/learning_curves.py run --script sac_continuous_action_torchcompile \
      --seeds 1 --out "$out/recipe/envs$envs" -- --compile --cudagraphs --num-envs "$envs" --gradient-steps "$updates" \
      "${RECIPE[@]}" --total-timesteps $1 >>"$out/recipe/envs$envs.log" 2>&1 || status=1
  done
  "$python" benchmarks/learning_curves.py plot "$out/recipe/envs16" "$out/recipe/envs64" --out "$out/recipe/curves.png" \
    --reach 5000 --window 10 && grep -A6 '| run | seed | minutes' "$out/recipe/curves.md" || status=1
}

profile() { # $@: the pairs, named by their plain script
  mkdir -p "$out/profile"
  for script in "$@"; do
    read -ra budget <<<"$(profile_flags "$script")"
    "$python" -m cProfile -o "$out/profile/$script.prof" "leanrl/${script}_torchcompile.py" "${budget[@]}" \
      --compile --cudagraphs >"$out/profile/$script.log" 2>&1 || { echo "FAILED profile of $script"; status=1; }
    "$python" -c 'import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats("tottime").print_stats(30)' \
      "$out/profile/$script.prof" >"$out/profile/$script.txt"
    echo "$script: $(tr '\r' '\n' <"$out/profile/$script.log" | grep -v '^\s*$' | tail -n 1)"
  done
}

scaling() {
  mkdir -p "$out/scaling"
  rm -f "$out/scaling/results.jsonl"
  local gpus
  gpus=$(nvidia-smi -L | wc -l)
  for world in 1 2 4 8; do
    if ((world > gpus)); then
      echo "scaling: a world of $world needs $world GPUs, this machine has $gpus: not run"
      continue
    fi
    "$python" -m torch.distributed.run --standalone --nproc-per-node "$world" \
      leanrl/ppo_atari_envpool_distributed_torchcompile.py --compile --cudagraphs --total-timesteps 163840 \
      --results-path "$out/scaling/results.jsonl" >"$out/scaling/world$world.log" 2>&1 ||
      { echo "FAILED scaling, world of $world"; status=1; }
    echo "world of $world: $(tr '\r' '\n' <"$out/scaling/world$world.log" | grep -v '^\s*$' | tail -n 1 | cut -c1-200)"
  done
  [[ -s $out/scaling/results.jsonl ]] || return
  "$python" - "$out/scaling/results.jsonl" >"$out/scaling/scaling.md" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
base = next((row["sps"] for row in rows if row["world_size"] == 1), None)
print("| processes (GPUs) | envs each | sps | speed-up over 1 | final return (last 20 games) |")
print("|---|---|---|---|---|")
for row in rows:
    speedup = f"{row['sps'] / base:.2f}x" if base and row["sps"] else "n/a"
    print(f"| {row['world_size']} | {8 // row['world_size']} | {row['sps']:.0f} | {speedup} | {row['final_return']} |")
EOF
  cat "$out/scaling/scaling.md"
}

for stage in "${stages[@]}"; do
  echo "=== $stage ($(date +%H:%M:%S))"
  case $stage in
    smoke) smoke sac_continuous_action td3_continuous_action ppo_continuous_action ppo_atari_envpool dqn \
      ppo_atari_envpool_distributed pqn pqn_atari_envpool ;;
    smoke:*) smoke "${stage#smoke:}" ;;
    tests) "$python" -m pytest -n auto tests -q -p no:cacheprovider 2>&1 | tee "$out/pytest.log" | tail -n 40 || status=1 ;;
    tests:cuda)
      "$python" -m pytest -n auto -m cuda tests -q -p no:cacheprovider 2>&1 | tee "$out/pytest_cuda.log" | tail -n 40 ||
        status=1
      ;;
    speedup:*)
      IFS=: read -r _ seed pair <<<"$stage" # no pair: LEANRL_SCRIPTS empty, every pair
      dir=$out/speedup-seed$seed${pair:+-$pair}
      rm -rf "$dir"
      PYTHON=$python LEANRL_SCRIPTS=$pair ./run.sh --quick --seeds "$seed" --out "$dir" || status=1
      ;;
    table)
      mkdir -p "$out/speedup"
      cat "$out"/speedup-seed*/results.jsonl >"$out/speedup/results.jsonl"
      cp "$(ls "$out"/speedup-seed*/machine.json | head -n 1)" "$out/speedup/machine.json"
      "$python" benchmarks/speedup_table.py "$out/speedup/results.jsonl" && cat "$out/speedup/speedup.md" || status=1
      ;;
    envspeed)
      results=()
      [[ -s $out/speedup/results.jsonl ]] && results=(--results "$out/speedup/results.jsonl")
      "$python" benchmarks/env_speed.py --repeats 3 --frames "${results[@]}" | tee "$out/env_speed.md" || status=1
      ;;
    atari)
      dir=$out/atari
      rm -rf "$dir" && mkdir -p "$dir"
      for pair in ppo_atari_envpool pqn_atari_envpool ppo_atari_envpool_distributed; do
        steps=23552 # run.sh --quick's budgets: 3 burn-in + 20 rollouts of 8 x 128 (PQN: 3 + 22)
        [[ $pair == pqn_atari_envpool ]] && steps=25600
        for bf16 in "" --bf16; do # fp32, then the networks in bf16 (tensor cores)
          "$python" "leanrl/${pair}_torchcompile.py" --total-timesteps $steps --compile --cudagraphs $bf16 --seed 1 \
            --results-path "$dir/atari.jsonl" >"$dir/$pair$bf16.log" 2>&1 || { echo "FAILED: $pair $bf16" >&2; status=1; }
        done
      done
      "$python" benchmarks/env_speed.py --scripts ppo_atari_envpool --repeats 3 --results "$dir/atari.jsonl" |
        tee "$dir/atari.md" || status=1
      ;;
    learning) learning 300000 ;;
    learning:*) learning "${stage#learning:}" ;;
    recipe) recipe 150000 ;;
    recipe:*) recipe "${stage#recipe:}" ;;
    micro)
      "$python" benchmarks/micro_benchmark.py --devices cuda --repeats 3 --out "$out/micro_cuda.md" \
        --configs "plain (eager)" "twin (eager)" "twin --compile" "twin --compile --cudagraphs" || status=1
      ;;
    profile) profile sac_continuous_action td3_continuous_action ppo_continuous_action ppo_atari_envpool pqn \
      pqn_atari_envpool ;;
    profile:*) profile "${stage#profile:}" ;;
    scaling) scaling ;;
  esac
done
echo "=== done ($(date +%H:%M:%S)), status $status"
exit $status
