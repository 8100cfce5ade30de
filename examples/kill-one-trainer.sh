#!/usr/bin/env bash
# Kill one trainer of a gang, as a crashed worker would end, and follow the recovery:
#   examples/kill-one-trainer.sh NAMESPACE JOBSET [MEMBER_INDEX]
# It SIGKILLs the trainer's processes in member MEMBER_INDEX's pod (default 1; the process scope's
# launcher stays, as it does when a worker crashes) and prints the gang's status until the
# barrier of the next epoch is open. Needs kubectl with the jobset-inplace plugin, and a trainer
# image with a shell and `kill` (the process scope's launcher needs python3 there anyway).
set -euo pipefail
ns=${1:?usage: $0 NAMESPACE JOBSET [MEMBER_INDEX]}
name=${2:?usage: $0 NAMESPACE JOBSET [MEMBER_INDEX]}
index=${3:-1}
pod=$(kubectl get pods -n "$ns" -o name \
  -l "jobset.sigs.k8s.io/jobset-name=$name,jobset.sigs.k8s.io/job-index=$index" | head -1)
[ -n "$pod" ] || { echo "no pod for member $index of $ns/$name" >&2; exit 1; }
epoch=$(kubectl get gangstate "$name" -n "$ns" -o jsonpath='{.status.epoch}')
container=$(kubectl get "$pod" -n "$ns" -o jsonpath='{.spec.containers[0].name}')
echo "killing the trainer of $pod (container $container) in epoch $epoch"
# every process of the container but PID 1 (the launcher, or the trainer itself in pod scope)
# shellcheck disable=SC2016 # expanded by the pod's shell, not this one
kubectl exec -n "$ns" "${pod#pod/}" -c "$container" -- sh -c \
  'for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" != 1 ] && [ "$p" != $$ ] && kill -9 "$p" 2>/dev/null; done; true'
for _ in $(seq 1 120); do
  state=$(kubectl get gangstate "$name" -n "$ns" -o jsonpath='{.status.epoch} {.status.barrierOpen}')
  if [ "${state% *}" -gt "$epoch" ] && [ "${state#* }" = true ]; then
    kubectl jobset-inplace status "$name" -n "$ns" -o wide
    exit 0
  fi
  sleep 1
done
echo "no new epoch with its barrier open after 120 s:" >&2
kubectl jobset-inplace status "$name" -n "$ns" -o wide >&2
exit 1
