#!/usr/bin/env bash
# The CUDA checklist of the project in one command, in stages that each fit in ten minutes:
#
#   benchmarks/gpu_check.sh OUT_DIR [STAGE ...]       (stages: smoke tests speedup micro; default: all four)
#
#   smoke    every twin on CUDA with no flag, --compile, --cudagraphs and both, then every plain script, on the
#            full runs' envs for a few thousand steps, with TORCH_LOGS=recompiles: a crash, a recompile after
#            the warm-up or a missing results line is reported as FAILED (logs in OUT_DIR/smoke/).
#   tests    python -m pytest tests: the CPU suite and its CUDA cases (OUT_DIR/pytest.log).
#   speedup  ./run.sh --quick on this machine: the speed-up table and plots (OUT_DIR/speedup/).
#   micro    benchmarks/micro_benchmark.py on CUDA: action selection at batch 1-256 and the updates
#            (OUT_DIR/micro_cuda.md).
#
# It needs the project's dependencies (requirements/requirements-dev.txt) and a CUDA device. On an offline
# machine whose python3 has torch, unpack what ../shared/gpu/pack-deps.sh packed first:
#   mkdir -p /tmp/site && tar xzf .gpu/deps.tar.gz -C /tmp/site && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# The smoke runs go several at a time (they check behaviour, not speed); speedup and micro run alone.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
(($# >= 1)) || { echo "usage: benchmarks/gpu_check.sh OUT_DIR [smoke|tests|speedup|micro ...]" >&2; exit 2; }
out=$1
shift
stages=("$@")
((${#stages[@]})) || stages=(smoke tests speedup micro)
for stage in "${stages[@]}"; do
  case $stage in smoke | tests | speedup | micro) ;; *) echo "gpu_check: unknown stage '$stage'" >&2; exit 2 ;; esac
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
    ppo_atari_envpool) echo "--total-timesteps 8192" ;;
  esac
}

smoke() {
  mkdir -p "$out/smoke"
  local pids=() names=()
  for script in sac_continuous_action td3_continuous_action ppo_continuous_action ppo_atari_envpool; do
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
    pids=() names=()
  done
  cat "$out"/smoke/*.jsonl >"$out/smoke.jsonl"
}

for stage in "${stages[@]}"; do
  echo "=== $stage ($(date +%H:%M:%S))"
  case $stage in
    smoke) smoke ;;
    tests) "$python" -m pytest tests -q -p no:cacheprovider 2>&1 | tee "$out/pytest.log" | tail -n 40 || status=1 ;;
    speedup) PYTHON=$python ./run.sh --quick --out "$out/speedup" || status=1 ;;
    micro) "$python" benchmarks/micro_benchmark.py --devices cuda --out "$out/micro_cuda.md" || status=1 ;;
  esac
done
echo "=== done ($(date +%H:%M:%S)), status $status"
exit $status
