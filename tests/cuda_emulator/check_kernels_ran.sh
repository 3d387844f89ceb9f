#!/bin/sh
# Fails unless every __global__ function defined in gpu_side/cuda/*.cu was launched by some emu
# test: the emulator's launch records each kernel's first launch per process in the record file
# (CUEMU_RAN_DIR/kernels.txt, as "file:kernel"). Run after the emu tests (a ctest fixture cleanup).
# Usage: check_kernels_ran.sh <gpu_side/cuda directory> <kernels.txt>
set -eu
sources=$1
record=$2
if [ ! -s "$record" ]; then
  echo "FAIL: no kernel launch was recorded in $record (run the emu.* tests first)"
  exit 1
fi
kernels=$(sed -n 's/^__global__ void \([A-Za-z_0-9]*\)(.*/\1/p' "$sources"/*.cu | sort -u)
count=$(echo "$kernels" | wc -l)
missing=0
for kernel in $kernels; do
  if ! grep -q ":$kernel\$" "$record"; then
    echo "FAIL: kernel $kernel (gpu_side/cuda) never ran under the emulator"
    missing=$((missing + 1))
  fi
done
if [ "$missing" -ne 0 ]; then
  echo "FAIL: $missing of $count kernels never ran"
  exit 1
fi
echo "PASS: all $count __global__ kernels of gpu_side/cuda ran"
