"""Which entry of the runner's penalty table (gpu/penalties.py) each penalized sequence uses.

A sequence takes a slot at its first sampled row and gives it back when it finishes or is
preempted (it takes a slot anew, filled from its known tokens, when it samples again). Only
running sequences hold slots, and at most max_num_seqs run, so a pool of that size never runs dry.
"""


class PenaltySlots:
    def __init__(self, num_slots: int) -> None:
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        assert self._free, "more penalized sequences sample than run at most (max_num_seqs)"
        return self._free.pop()

    def release(self, slot: int) -> None:
        self._free.append(slot)
