"""Buffer slots for the pipeline executor: intervals of ticks (a residual set stashed from its
forward to its backward, a message from its arrival to its use) packed into as few slots as
they need, per stage."""
from __future__ import annotations


def allocate(intervals: list[tuple[int, int, int, object]], pool=None) -> tuple[dict, int]:
    """Smallest-free-first slot allocation of inclusive tick intervals (start, end, stage, key).

    Returns ({key: slot}, number of slots used (at least 1)). Processing by start tick makes the
    slot count equal to the maximum occupancy (interval graphs are perfectly colourable).
    With ``pool`` (key -> pool index), each pool gets slots of its own, numbered after the
    previous pools' (each pool as many as its most occupied stage needs).
    """
    if pool is not None:
        groups: dict[int, list] = {}
        for iv in intervals:
            groups.setdefault(pool(iv[3]), []).append(iv)
        slots, offset = {}, 0
        for g in sorted(groups):
            got, n = allocate(groups[g])
            slots.update({k: offset + slot for k, slot in got.items()})
            offset += n
        return slots, max(offset, 1)
    slots, busy_until = {}, {}  # busy_until[stage] = list of last occupied tick per slot
    for start, end, stage, key in sorted(intervals, key=lambda x: (x[0], x[2])):
        ends = busy_until.setdefault(stage, [])
        slot = next((i for i, e in enumerate(ends) if e < start), len(ends))
        if slot == len(ends):
            ends.append(end)
        else:
            ends[slot] = end
        slots[key] = slot
    return slots, max([1] + [len(e) for e in busy_until.values()])
