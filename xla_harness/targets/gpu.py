"""What the CUDA compiler needs to know about a GPU it cannot see: a ``GpuTargetConfigProto`` text.

XLA's GPU compiler reads the device from this description when compiling ahead of time (fusion,
tiling and the cost model depend on it); each kind below is written from NVIDIA's public figures:

* the per-compute-capability limits (threads per block and per SM, registers, shared memory per
  SM and per block with opt-in, grid limits) from the CUDA C++ Programming Guide's table
  "Technical Specifications per Compute Capability" (8.0 for A100, 9.0 for H100 and H200);
* SM count, FP32 units per SM, L2 size, memory size and bandwidth and boost clock from the
  A100 (SXM4 80GB), H100 (SXM5 80GB) and H200 datasheets and architecture whitepapers;
* the cuDNN version is the oldest the CUDA 12 plugin of jax 0.12 accepts (nvidia-cudnn-cu12
  >= 9.10.2 in its requirements): what a GPU machine running that jax has at least.

Memory size is the nominal 80 GiB for h100 and a100 (a real device reports somewhat less: the
driver keeps some); the h200's is what one H200 reported (143,771 MiB, results/gpu/).

**What a compile here reproduces of the device's own, and what it does not.** The description is
what differs between two GPUs for the compiler, but a device's compile also runs its autotuner,
which picks each dot's backend and tile configuration by timing them; ahead of time none runs
and XLA's defaults stand in. Measured on the #35409 program (full + remat, one device, jax 0.11.2
with the CUDA 13 plugin) against an H200's own compile (``make gpu-fidelity``;
results/gpu/h200-2026-11-26/fidelity/table.md):

* the same: the three scatter fusions and where their in-place operands come from (W's scatter adds
  into ``wrapped_add``, the sum of the two batches' dense gradients of W, which are cuBLAS outputs on
  the device and Triton gemm fusions ahead of time; the cross-entropy scatters into a multiply fusion),
  ``input_output_alias`` (439 entries), argument, output and aliased bytes, the scanner's verdict
  (0 hazards, 3 aliased), and all 426 dots;
* not the same: on the device the autotuner sent 348 of the 426 dots to cuBLAS (custom-calls), ahead
  of time none (390 Triton gemm fusions, 36 native-emitter gemm fusions), and the fusions around
  those dots change with them: 14,832 instructions ahead of time against 14,226, 1,091 fusions
  against 779 (718 of the device's 779 have a fusion of the same content ahead of time), 36
  ``wrapped_transpose`` fusions and 18 copies only on the device, temp 17,141,018,456 B against
  17,254,300,248 B (113 MB less); 97 fusions the device emitted with Triton, 72 ahead of time, 66 of
  those 72 with the device's tile configuration, none of the 78 Triton gemm fusions.

So fusion decisions next to dots differ; those next to scatters, and aliasing, did not in this
program. ``--autotune-results FILE`` loads a device's choices (``stress --compile-only --out`` on a
GPU writes them) into a compile here.
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
