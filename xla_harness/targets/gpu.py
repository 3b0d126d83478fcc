"""What the CUDA compiler needs to know about a GPU it cannot see: a ``GpuTargetConfigProto`` text.

XLA's GPU compiler reads the device from this description when compiling ahead of time (fusion,
tiling and the cost model depend on it); each kind below is written from NVIDIA's public figures:

* the per-compute-capability limits (threads per block and per SM, registers, shared memory per
  SM and per block with opt-in, grid limits) from the CUDA C++ Programming Guide's table
  "Technical Specifications per Compute Capability" (8.0 for A100, 9.0 for H100);
* SM count, FP32 units per SM, L2 size, memory size and bandwidth and boost clock from the
  A100 (SXM4 80GB) and H100 (SXM5 80GB) datasheets and architecture whitepapers;
* the cuDNN version is the oldest the CUDA 12 plugin of jax 0.12 accepts (nvidia-cudnn-cu12
  >= 9.10.2 in its requirements): what a GPU machine running that jax has at least.

Memory size is the nominal 80 GiB; a real device reports somewhat less (the driver keeps some).
The description is what differs between two GPUs for the compiler; the autotuner is not run
ahead of time (XLA's defaults stand in for measured choices), so a compile here can differ from
one on the machine in the algorithm of a dot or convolution, not in fusion decisions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuKind:
    """One GPU's description as the compiler sees it."""

    name: str  # device_description_str, as the driver names the device
    compute_capability: tuple[int, int]
    sm_count: int
    fp32_units_per_sm: int
    shared_memory_per_sm: int  # bytes
    shared_memory_per_block_optin: int  # bytes
    l2_cache_bytes: int
    memory_bytes: int
    memory_bandwidth: int  # bytes per second
    clock_ghz: float
    cudnn: tuple[int, int, int] = (9, 10, 2)
    # The same on every compute capability from 7.0 to 9.0 (the guide's table).
    threads_per_block: int = 1024
    threads_per_warp: int = 32
    threads_per_sm: int = 2048
    shared_memory_per_block: int = 48 * 1024  # without opt-in
    registers_per_sm: int = 64 * 1024
    registers_per_block: int = 64 * 1024
    grid_limits: tuple[int, int, int] = (2**31 - 1, 65535, 65535)


GPU_KINDS: dict[str, GpuKind] = {
    "h100": GpuKind(
        name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132, fp32_units_per_sm=128,
        shared_memory_per_sm=228 * 1024, shared_memory_per_block_optin=227 * 1024,
        l2_cache_bytes=50 * 1024 * 1024, memory_bytes=80 * 1024**3, memory_bandwidth=3_350_000_000_000,
        clock_ghz=1.98),
    # As one H200 reported itself (results/gpu/): device_kind "NVIDIA H200", 143,771 MiB of memory;
    # the rest from NVIDIA's H200 (SXM) datasheet: the H100's Hopper SM (compute capability 9.0, 132
    # SMs, same limits), 60 MiB of L2 and 4.8 TB/s of HBM3e.
    "h200": GpuKind(
        name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, fp32_units_per_sm=128,
        shared_memory_per_sm=228 * 1024, shared_memory_per_block_optin=227 * 1024,
        l2_cache_bytes=60 * 1024 * 1024, memory_bytes=143771 * 1024**2, memory_bandwidth=4_800_000_000_000,
        clock_ghz=1.98),
    "a100": GpuKind(
        name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), sm_count=108, fp32_units_per_sm=64,
        shared_memory_per_sm=164 * 1024, shared_memory_per_block_optin=163 * 1024,
        l2_cache_bytes=40 * 1024 * 1024, memory_bytes=80 * 1024**3, memory_bandwidth=2_039_000_000_000,
        clock_ghz=1.41),
}


def target_config(kind: GpuKind) -> str:
    """The ``GpuTargetConfigProto`` text of ``kind`` (what ``get_topology_desc(target_config=)`` takes)."""
    major, minor = kind.compute_capability
    gx, gy, gz = kind.grid_limits
    fields = [
        ("threads_per_block_limit", kind.threads_per_block),
        ("threads_per_warp", kind.threads_per_warp),
        ("shared_memory_per_block", kind.shared_memory_per_block),
        ("shared_memory_per_core", kind.shared_memory_per_sm),
        ("threads_per_core_limit", kind.threads_per_sm),
        ("core_count", kind.sm_count),
        ("fpus_per_core", kind.fp32_units_per_sm),
        ("block_dim_limit_x", gx),
        ("block_dim_limit_y", gy),
        ("block_dim_limit_z", gz),
        ("memory_bandwidth", kind.memory_bandwidth),
        ("l2_cache_size", kind.l2_cache_bytes),
        ("clock_rate_ghz", kind.clock_ghz),
        ("device_memory_size", kind.memory_bytes),
        ("shared_memory_per_block_optin", kind.shared_memory_per_block_optin),
        ("registers_per_core_limit", kind.registers_per_sm),
        ("registers_per_block_limit", kind.registers_per_block),
    ]
    body = "\n".join(f"  {k}: {v}" for k, v in fields)
    dnn = " ".join(f"{k}: {v}" for k, v in zip(("major", "minor", "patch"), kind.cudnn, strict=True))
    return (f"gpu_device_info {{\n{body}\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n}}\n"
            f'platform_name: "CUDA"\ndnn_version_info {{ {dnn} }}\ndevice_description_str: "{kind.name}"\n')
