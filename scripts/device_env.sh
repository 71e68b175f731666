# Sourced by the device scripts (scripts/gpu_bench.sh, scripts/gpu_dp_check.sh) on the GPU
# machine: CUDA's libraries, the kernel cache's place, and the CUDA binary (built offline, see
# scripts/gpu_bench.sh) unpacked to /tmp/ember-cuda.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
export EMBER_KERNEL_CACHE=/tmp/ember-kernels
gunzip -c .device/ember-cuda.gz > /tmp/ember-cuda && chmod +x /tmp/ember-cuda
