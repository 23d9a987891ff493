#!/usr/bin/env bash
# make srun-check: data-parallel training launched by Slurm's srun, as on a cluster. A private one-node Slurm
# (munge, slurmctld, slurmd; a configuration in a temporary folder, no cgroups) runs the exchange's unit tests
# (tests/dist/test_grad_exchange.cpp: the launcher's local rank among them) on 3 tasks, then
# tests/dist/check_train_ranks.py --srun: `srun -n N --mpi=pmix lazytrain train` with 2 x 3 and 3 x 2 ranks
# byte-identical to one process with 6 accumulation steps, tied and untied, and a killed rank ending the step.
# Needs root (the daemons) and installs Debian's slurmctld, slurmd, slurm-client and munge when missing. Not part
# of `make test` (CI does not run daemons); run it when the launch path changes and record the result in
# docs/distributed.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
[[ $(id -u) == 0 ]] || { echo "srun-check: run as root (it starts munged, slurmctld and slurmd)" >&2; exit 1; }
missing=()
for tool in slurmctld:slurmctld slurmd:slurmd srun:slurm-client munged:munge; do
  command -v "${tool%%:*}" >/dev/null || [[ -x /usr/sbin/${tool%%:*} ]] || missing+=("${tool##*:}")
done
if ((${#missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[[ -x $BUILD/lazytrain ]] || make build

dir=$(mktemp -d /tmp/lt_srun_check.XXXX)
started_munge=0
stop() {
  for d in slurmd slurmctld; do [[ -f $dir/$d.pid ]] && kill "$(cat "$dir/$d.pid")" 2>/dev/null || true; done
  ((started_munge)) && pkill -x munged 2>/dev/null || true
  sleep 1
  rm -rf "$dir"
}
trap stop EXIT
mkdir -p "$dir/state" "$dir/spool"
host=$(hostname)
cat > "$dir/slurm.conf" <<EOF
ClusterName=lazytrain-check
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=check Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF=$dir/slurm.conf

if ! munge -n >/dev/null 2>&1; then
  [[ -f /etc/munge/munge.key ]] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null;
                                      chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  mkdir -p /run/munge && chown munge:munge /run/munge
  /usr/sbin/munged --force
  started_munge=1
fi
/usr/sbin/slurmctld -f "$SLURM_CONF"
/usr/sbin/slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  [[ $(sinfo -h -o %T 2>/dev/null) == idle ]] && break
  sleep 0.5
done
[[ $(sinfo -h -o %T 2>/dev/null) == idle ]] || {
  echo "srun-check: the node did not become idle:" >&2; sinfo >&2 || true; tail -20 "$dir"/*.log >&2; exit 1; }
srun --version
start=$(date +%s)
# The exchange's unit tests with srun's wiring (a rank's local rank, hence its GPU, among them).
OMP_NUM_THREADS=1 srun -N 1 -n 3 --overcommit --mpi=pmix "$BUILD/test_grad_exchange" --gtest_brief=1
/usr/bin/python3 tests/dist/check_train_ranks.py --lazytrain "$BUILD/lazytrain" --srun "$(command -v srun)"
echo "srun-check: passed in $(($(date +%s) - start)) s"
