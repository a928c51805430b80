#!/usr/bin/env bash
# Reproduce the tables of docs/results.md, one part and one range of repeats at a time.
#
#   bash scripts/reproduce_results.sh PART FIRST_REPEAT REPEATS [STOP_AT_HH:MM_UTC]
#
# PART is one of: banana_dphmc banana_penalty banana_sgmcmc gaussian_dphmc gaussian_penalty
# gaussian_sgmcmc mixture_fastmh (*_sgmcmc: DP-SGLD and DP-SGNHT)
# (the paper's epsilon grid 2,4,...,15, n and delta of the papers, 4 chains). Writes
# results/PART_rFIRST/results.csv (+ draws and figures). Each run's seed depends only on
# (model, method, epsilon, repeat number), so parts and repeat ranges can run in separate
# processes or sessions; merge them with
#
#   python -m pymc_dp.experiments.cli table results/banana_*/results.csv
#   python -m pymc_dp.experiments.cli plot results/banana_*/results.csv --out docs/images/results
#
# Uses the active Python environment (pip install -e ".[examples]"). One BLAS thread per
# process: several processes with multi-threaded BLAS on few cores are many times slower.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,17p "$0"
  exit 2
fi
PART=$1
FIRST=$2
REPEATS=$3
STOP=${4:-}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
case "$PART" in
  banana_dphmc) args=(banana --methods dphmc --n 100000) ;;
  banana_penalty) args=(banana --methods penalty --n 100000) ;;
  banana_sgmcmc) args=(banana --methods sgld,sgnht --n 100000) ;;
  gaussian_dphmc) args=(gaussian --methods dphmc --n 100000) ;;
  gaussian_penalty) args=(gaussian --methods penalty --n 100000) ;;
  gaussian_sgmcmc) args=(gaussian --methods sgld,sgnht --n 100000) ;;
  mixture_fastmh) args=(mixture --methods fastmh --n 50000) ;;
  *)
    echo "unknown PART '$PART': choose banana_dphmc, banana_penalty, banana_sgmcmc," \
      "gaussian_dphmc, gaussian_penalty, gaussian_sgmcmc or mixture_fastmh" >&2
    exit 2
    ;;
esac
extra=()
if [ -n "$STOP" ]; then extra=(--stop-at "$STOP"); fi
python -m pymc_dp.experiments.cli experiment "${args[@]}" --epsilons 2,4,6,8,10,12,15 \
  --delta 1e-6 --chains 4 --seed 0 --repeats "$REPEATS" --first-repeat "$FIRST" \
  --out "results/${PART}_r${FIRST}" "${extra[@]}"
