#!/usr/bin/env bash
# Runs what needs a GPU, on a machine that has one: the GPU unit tests, the
# end-to-end tests (host and GPU) on real mounts, and optionally the benchmarks.
#
#   scripts/gpu-check.sh [--build DIR] [--examples] [--bench] [--fs-bench] [--no-tests] [--out DIR]
#
# --no-tests: only what the other flags ask for (a second call for benchmarks).
# --only A,B: of the tests and examples, only the steps of these names (as
# the "=== NAME" lines say: vmm_check,gpu_store_test,example_model,...).
# --bench: bench/gpufs-bench, the copy-pieces and tier benches, a host-store dd. --fs-bench:
# bench/fs_bench.sh on 1 GiB GPU members against tmpfs and minifs
# (~2 minutes, needs ~3 GiB of /dev/shm), table in OUT/fs_bench.txt, and the
# per-call split of a GPU mount (gpufs-fs-probe steps-open / steps-create).
#
# The build may come from another machine (scripts/build.sh there, then copy
# the build folder): binaries are found through --build, not through the paths
# compiled into the tests. Libraries the machine lacks (libfuse3, sqlite,
# getfattr) are taken from Debian .deb files in .debs/ or beside the build
# folder in debs/ when present; scripts/device-bundle.sh gathers both:
#   scripts/device-bundle.sh build .device-carry   # here
#   scripts/gpu-check.sh --build .device-carry/build   # there
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
bench=0
fs_bench=0
examples=0
tests=1
only=
out=${OUT:-/tmp/gpufs-gpu-check}
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --bench) bench=1; shift ;;
    --fs-bench) fs_bench=1; shift ;;
    --examples) examples=1; shift ;;
    --no-tests) tests=0; shift ;;
    --only) only=",$2,"; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
build=$(realpath "$build")
mkdir -p "$out"

bundle_debs=if-missing
. scripts/bundle-env.sh
export GPUFS_BIN=$build/bin/gpufs
export GPUFS_MOUNT_HELPER_BIN=$build/bin/mount.gpufs
export GPUFS_EXAMPLES_DIR=$build/examples/cuda
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi -L || { echo "gpu-check: no GPU here"; exit 1; }
failed=()
# Every step's output goes to $out/all.log; a summary to stdout.
want() { [ -z "$only" ] || [[ $only == *",$1,"* ]]; }
run() {
  local name=$1; shift
  want "$name" || return 0
  local log="$out/$name.tmp"
  echo "=== $name: $*"
  if "$@" >"$log" 2>&1; then
    echo "--- $name: ok ($(grep -Eo '\[  PASSED  \] [0-9]+ tests?' "$log" | tail -1))"
  else
    echo "--- $name: FAILED"; tail -60 "$log"; failed+=("$name")
  fi
  grep -E '^\[  (SKIPPED|FAILED) ' "$log" | sort -u | head -20
  { echo "=================== $name: $*"; cat "$log"; } >> "$out/all.log"
  rm -f "$log"
}

if [ $tests = 1 ]; then
# The VMM sharing invariant, as another user and across PID namespaces.
if want vmm_check; then
  echo "=== vmm_check"
  scripts/vmm-check.sh "$build" 2>&1 | tee "$out/vmm-check.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || failed+=(vmm_check)
fi
run gpu_store_test "$build/store/gpu_store_test"
# GPU blobs across kill -9 of the worker, consumers mapping them.
run gpu_takeover env GPUFS_PROBE="$build/tests/vmm-probe" \
  python3 tests/takeover/gpu_takeover_test.py -v
run client_test "$build/client/client_test"
[ -x "$build/client/client_gpu_test" ] && run client_gpu_test "$build/client/client_gpu_test"
run e2e_test "$build/tests/e2e_test"
run gpu_e2e_test "$build/tests/gpu_e2e_test"   # includes GpuTierE2E
[ -x "$build/cli/cli_e2e_test" ] && run cli_e2e_test "$build/cli/cli_e2e_test"
fi

# The examples (each mounts its own gpufs).
if [ $examples = 1 ]; then
  for example in cross_engine graph model transformers; do
    run "example_$example" examples/$example/run.sh
    want "example_$example" &&
      sed -n "/=================== example_$example/,\$p" "$out/all.log" | grep -vE '^\s*$' | tail -25
  done
fi

# Python interop: torch, cupy and jax on one blob (where they are installed),
# and objects saved and mapped whole (torch), also across tiers and takeover.
if [ $tests = 1 ] && python3 -c "import torch, cupy, jax" 2>/dev/null; then
  mnt=/tmp/gpufs-py-mnt
  mkdir -p $mnt
  rm -rf /tmp/gpufs-py-state
  if "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-py-state --store gpu --capacity 16G; then
    run python_gpu_check python3 python/tests/gpu_check.py $mnt
    if want python_objects_check; then
      echo "=== python_objects_check"
      python3 python/tests/gpu_objects_check.py $mnt 2>&1 | tee "$out/objects-check.txt"
      [ "${PIPESTATUS[0]}" = 0 ] || failed+=(python_objects_check)
    fi
    umount $mnt
  else
    failed+=(python_mount)
  fi
  rm -rf /tmp/gpufs-py-tiers
  if "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-py-tiers --store gpu \
      --capacity cuda:0=1G,host=4G; then
    if want python_objects_tiers; then
      echo "=== python_objects_tiers"
      python3 python/tests/gpu_objects_check.py --tiers $mnt 2>&1 | tee -a "$out/objects-check.txt"
      [ "${PIPESTATUS[0]}" = 0 ] || failed+=(python_objects_tiers)
    fi
    umount $mnt
  else
    failed+=(python_tiers_mount)
  fi
fi

if [ $bench = 1 ]; then
  # An object's many-piece copy: the copy kernel and the driver's copies
  # against one D2D (no mount).
  if [ -x "$build/bench/gpufs-copy-pieces-bench" ]; then
    echo "=== copy pieces bench"
    "$build/bench/gpufs-copy-pieces-bench" | tee -a "$out/bench.txt"
  fi
  mnt=/tmp/gpufs-bench-mnt
  mkdir -p $mnt
  "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-bench-state --store gpu && {
    echo "=== bench"
    "$build/bench/gpufs-bench" $mnt | tee "$out/bench.txt"
    umount $mnt
  }
  # A real model's tensors: gpufs.load beside torch.multiprocessing and
  # safetensors, gpufs.save beside a device copy, import beside load_file.
  if python3 -c "import torch, safetensors" 2>/dev/null; then
    rm -rf /tmp/gpufs-model-state
    "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-model-state --store gpu --capacity 40G && {
      echo "=== model bench"
      python3 bench/model_bench.py $mnt 2>&1 | tee -a "$out/bench.txt"
      umount $mnt
    }
    # Where a save and a load of the model spend their time: libgpufs's
    # steps and the daemon's (GPUFS_TRACE=1 for both).
    rm -rf /tmp/gpufs-trace-state
    GPUFS_TRACE=1 "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-trace-state --store gpu --capacity 40G && {
      echo "=== save and load traces"
      GPUFS_TRACE=1 python3 bench/save_trace.py $mnt 2>&1 | tee -a "$out/trace.txt"
      GPUFS_TRACE=1 python3 bench/load_trace.py $mnt 2>&1 | tee -a "$out/trace.txt"
      grep -h "trace:" /tmp/gpufs-trace-state/gpufs.log | tail -30 | tee -a "$out/trace.txt"
      umount $mnt
    }
  fi
  # Tiers: spill to host and disk, fault back from host and disk,
  # beside pinned and pageable cudaMemcpy of the same size.
  rm -rf /tmp/gpufs-bench-tier
  "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-bench-tier --store gpu \
      --capacity cuda:0=2G,host=2G,disk=16G && {
    echo "=== tier bench"
    "$build/bench/gpufs-tier-bench" $mnt | tee -a "$out/bench.txt"
    umount $mnt
  }
  # The same dd through a host-store mount: what FUSE itself costs here.
  "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-bench-host --store host --capacity 4G && {
    dd if=/dev/zero of=$mnt/f bs=1M count=1024 2>&1 | tail -1 | sed 's/^/host store dd write: /' | tee -a "$out/bench.txt"
    # No wait: dd's close() made the bytes durable, and a member reads the
    # same whether its release has sealed it yet or not.
    dd if=$mnt/f of=/dev/null bs=1M 2>&1 | tail -1 | sed 's/^/host store dd read:  /' | tee -a "$out/bench.txt"
    umount $mnt
  }
fi

if [ $fs_bench = 1 ]; then
  mnt=/tmp/gpufs-fs-bench-mnt
  rm -rf /tmp/gpufs-fs-bench-state; mkdir -p $mnt
  "$GPUFS_BIN" mount $mnt --state /tmp/gpufs-fs-bench-state --store gpu --capacity 8G && {
    echo "=== per-call split on a GPU mount (gpufs-fs-probe, medians of 300)"
    mkdir $mnt/o && head -c 4096 /dev/urandom > $mnt/o/f && "$GPUFS_BIN" stat $mnt/o/f >/dev/null
    "$build/bench/gpufs-fs-probe" steps-open $mnt/o/f 300 | tee "$out/fs_steps.txt"
    "$build/bench/gpufs-fs-probe" steps-create $mnt/o 300 | tee -a "$out/fs_steps.txt"
    umount $mnt
  }
  echo "=== fs_bench (GPU members)"
  if bench/fs_bench.sh --build "$build" --store gpu --mount-opts "--devices 0 --capacity 8G" \
      > "$out/fs_bench.txt" 2>&1; then
    grep '^|' "$out/fs_bench.txt"
  else
    echo "--- fs_bench: FAILED"; tail -20 "$out/fs_bench.txt"; failed+=(fs_bench)
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: FAILED: ${failed[*]}"; exit 1
fi
echo "gpu-check: all passed"
