"""``--target`` text: which compiler a command compiles for.

Grammar (one of)::

    host                 this machine's backend (CPU here; the GPU or TPU of a machine that has one)
    tpu:GEN:SHAPE        libtpu, ahead of time: GEN one of v4, v5e, v5p, v6e; SHAPE the chips, e.g.
                         2x4 (v5e, v6e: two dimensions) or 2x2x1 (v4, v5p: three)
    cuda:KIND[:TOPO]     the CUDA plugin, ahead of time: KIND a GPU of :mod:`xla_harness.targets.gpu`
                         (h100, h200, a100); TOPO slices x hosts x GPUs per host (default 1x1x8)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xla_harness.errors import HarnessError

# TPU generations libtpu compiles for, and the rank of their chip topology.
TPU_GENERATIONS: dict[str, int] = {"v4": 3, "v5e": 2, "v5p": 3, "v6e": 2}
DEFAULT_GPU_TOPOLOGY = "1x1x8"
GPU_DEVICES_PER_HOST = 16  # the largest GPU servers (HGX-2) hold 16
GPU_DEVICES_LIMIT = 8192  # a compile for more devices takes minutes and says nothing one for fewer does not
_SHAPE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)*$")


@dataclass(frozen=True)
class Target:
    """A compiler to compile for: ``platform`` host, tpu or cuda; ``kind`` the TPU generation or GPU
    kind; ``topology`` the chip shape (TPU) or slices x hosts x devices (GPU)."""

    platform: str
    kind: str = ""
    topology: str = ""

    @property
    def text(self) -> str:
        """The ``--target`` spelling of this target (what results and tables record)."""
        return ":".join(p for p in (self.platform, self.kind, self.topology) if p)

    @property
    def is_host(self) -> bool:
        return self.platform == "host"

    @property
    def backend(self) -> str:
        """The scanner's backend rules for this target's HLO (``auto`` on the host: read the dump)."""
        return {"tpu": "tpu", "cuda": "gpu"}.get(self.platform, "auto")

    @property
    def device_count(self) -> int:
        """How many devices the topology holds (0 on the host: as many as the backend has)."""
        if self.is_host:
            return 0
        n = 1
        for part in self.topology.split("x"):
            n *= int(part)
        return n

    def __str__(self) -> str:
        return self.text


HOST = Target("host")


def parse_target(text: str) -> Target:
    """The :class:`Target` of ``--target TEXT``; HarnessError naming what is wrong."""
    from xla_harness.targets.gpu import GPU_KINDS

    raw = text
    text = text.strip().lower()
    if text == "host":
        return HOST
    platform, _, rest = text.partition(":")
    if platform == "tpu":
        gen, _, shape = rest.partition(":")
        if gen not in TPU_GENERATIONS:
            raise HarnessError(f"--target {raw}: unknown TPU generation {gen!r}; expected one of "
                               f"{', '.join(TPU_GENERATIONS)} (e.g. tpu:v6e:2x4)")
        rank = TPU_GENERATIONS[gen]
        if not _SHAPE.match(shape) or len(shape.split("x")) != rank:
            example = "2x4" if rank == 2 else "2x2x1"
            raise HarnessError(f"--target {raw}: {gen} needs a {rank}-dimensional chip shape like {example}, "
                               f"got {shape or 'none'!r}")
        return Target("tpu", gen, shape)
    if platform == "cuda":
        kind, colon, topo = rest.partition(":")
        if kind not in GPU_KINDS:
            raise HarnessError(f"--target {raw}: unknown GPU kind {kind!r}; expected one of "
                               f"{', '.join(GPU_KINDS)} (e.g. cuda:h100 or cuda:h100:1x1x8)")
        if colon and not topo:
            raise HarnessError(f"--target {raw}: an empty GPU topology after ':'; give SLICESxHOSTSxDEVICES like "
                               f"1x1x8, or leave it out (cuda:{kind} is {DEFAULT_GPU_TOPOLOGY})")
        topo = topo or DEFAULT_GPU_TOPOLOGY
        if not _SHAPE.match(topo) or len(topo.split("x")) != 3:
            raise HarnessError(f"--target {raw}: GPU topology must be SLICESxHOSTSxDEVICES like 1x1x8, got {topo!r}")
        slices, hosts, per_host = (int(n) for n in topo.split("x"))
        if per_host > GPU_DEVICES_PER_HOST or slices * hosts * per_host > GPU_DEVICES_LIMIT:
            raise HarnessError(f"--target {raw}: {slices * hosts * per_host:,} GPUs ({per_host} a host); a topology "
                               f"holds at most {GPU_DEVICES_PER_HOST} a host and {GPU_DEVICES_LIMIT:,} in all")
        return Target("cuda", kind, topo)
    raise HarnessError(f"--target {raw}: expected host, tpu:GEN:SHAPE (e.g. tpu:v6e:2x4) or cuda:KIND[:TOPO] "
                       "(e.g. cuda:h100)")
