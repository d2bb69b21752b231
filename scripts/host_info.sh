#!/usr/bin/env bash
# Prints one line naming this host as every figure should be read against:
# "CPU MODEL, N cores, ISA path P" (P as kernels/cpu/cpu_features.h picks it;
# BATON_CPU_ISA overrides it, as it does for the kernels).
#   scripts/host_info.sh
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo)
isa=scalar
[[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]] && isa=avx2
[[ " $flags " == *" avx512_vnni "* && " $flags " == *" avx512bw "* ]] && isa=avx512vnni
isa="${BATON_CPU_ISA:-$isa}"
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores, ISA path $isa"
