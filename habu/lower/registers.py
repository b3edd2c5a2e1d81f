"""How a warp-specialised kernel splits the register file between its producer warpgroup and its
consumer warpgroups (`setmaxnreg`). The emitter writes these numbers and the rules check them, so
what is proven is what runs.

The CTA starts with `threads × at_launch` registers (the most `__launch_bounds__(threads, n)` lets
ptxas give each thread, n blocks sharing the SM's register file). The producer releases down to `producer`; each consumer warpgroup then asks
for `consumer`. `setmaxnreg.inc` waits until the CTA's pool has the registers, so a request larger
than the pool never returns: the kernel hangs (found on the H200 on 2026-11-30 with 20 warps, 4
consumer warpgroups asking 232 registers each out of a 61,440-register pool).
"""

from __future__ import annotations

from dataclasses import dataclass

REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80 .. sm_100)
WARPGROUP = 128  # threads
PRODUCER_REGS = 40
# CUTLASS's split for one producer and two consumer warpgroups (40 / 232 over 384 threads × 168);
# timed on the H200 for one and two consumer warpgroups, so never raised above
CONSUMER_REGS_MAX = 232
SETMAXNREG_MIN = 24


@dataclass(frozen=True)
class RegisterSplit:
    threads: int
    consumers: int  # consumer warpgroups
    at_launch: int  # registers per thread the CTA starts with (at most)
    producer: int
    consumer: int

    @property
    def pool(self) -> int:
        return self.threads * self.at_launch

    @property
    def demand(self) -> int:
        return WARPGROUP * (self.producer + self.consumers * self.consumer)

    @property
    def fits(self) -> bool:
        return (self.demand <= self.pool and SETMAXNREG_MIN <= self.producer <= self.at_launch
                and self.consumer >= SETMAXNREG_MIN and self.consumer % 8 == 0 and self.producer % 8 == 0)

    def describe(self) -> str:
        return (f"producer {self.producer} + {self.consumers} × consumer {self.consumer} registers per thread "
                f"= {self.demand} of the CTA's {self.pool} ({self.threads} threads × {self.at_launch})")


def consumer_warpgroups(warps: int, warp_specialized: bool) -> int:
    """The warpgroups of a wgmma kernel that issue wgmma, the one count the rules, the shared-memory
    layout, this split and the emitter use: its warps in fours, less the producer warpgroup of a
    warp-specialised kernel; at least one."""
    return max(1, (warps - (4 if warp_specialized else 0)) // 4)


def warp_specialized_split(warps: int, blocks_per_sm: int = 1, producer: int = PRODUCER_REGS) -> RegisterSplit:
    """The split for one producer warpgroup (`producer` registers a thread) and `consumer_warpgroups` consumer
    warpgroups, of a block that shares its SM's register file with `blocks_per_sm - 1` others
    (`__launch_bounds__(threads, blocks_per_sm)`)."""
    threads = 32 * warps
    consumers = consumer_warpgroups(warps, warp_specialized=True)
    at_launch = min(248, REGISTER_FILE // blocks_per_sm // threads // 8 * 8)
    spare = at_launch * threads - WARPGROUP * producer
    consumer = min(CONSUMER_REGS_MAX, spare // (WARPGROUP * consumers) // 8 * 8)
    return RegisterSplit(threads, consumers, at_launch, producer, consumer)


__all__ = ["RegisterSplit", "consumer_warpgroups", "warp_specialized_split"]
