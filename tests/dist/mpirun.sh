#!/bin/sh
# Runs a program as NP processes of one world on this machine, failing after SECONDS (a hang is a
# failure, never a stuck test):   mpirun.sh NP SECONDS PROGRAM [ARGS...]
# As root, Open MPI needs the two OMPI_ALLOW_RUN_AS_ROOT variables; more ranks than cores need
# --oversubscribe; --bind-to none lets each rank's device threads use every core. The ranks share
# this host: shared memory (vader) is the transport; leaving out TCP also leaves out a lock-order
# report that ThreadSanitizer makes inside Open MPI's TCP transport.
np=$1; limit=$2; shift 2
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
exec timeout -k 5 "$limit" mpirun --oversubscribe --bind-to none -np "$np" "$@"
