"""KV-cache admission and decode preemption: which waiting sequence a step may start, and
which running ones give their cache back when a decode step has no room (vLLM's rule).

In: block counts (plain numbers: the free blocks, each sequence's blocks held and needed).
Out: yes/no for an admission, how many of the latest admitted sequences a decode step
preempts. Pure; owned by policy/. Both bodies carry it out: the engine's scheduler
(`engine/scheduler.py`, pages of `page_size_tokens`) and the simulator's batcher
(`sim/batching.py`, token-granular: one block per token); tests/parity/
test_kv_admission_parity.py runs one scenario through both and compares.

vLLM (Kwon et al. SOSP '23, §4.2 and §4.5) admits a waiting sequence when the blocks for the
tokens it has now fit the free blocks: its prompt (plus, when it was preempted, the output
it had, recomputed); the blocks its output will need are not reserved. Each decode step
every running sequence needs room for the token it appends; when there is none the most
recently admitted sequence is preempted (its cache dropped, it is recomputed later from its
prompt and output), and so on until the rest fit ("all-or-nothing" eviction of the latest
arrivals, first-come-first-served).
"""

from collections.abc import Sequence


def admits(need_blocks: float, free_blocks: float) -> bool:
    """Whether a waiting sequence starts: the blocks for the tokens it has now (prompt, and
    its output so far when recomputed) beyond those it holds fit the free blocks."""
    return need_blocks <= free_blocks


def decode_preemptions(
    need_blocks: Sequence[float], held_blocks: Sequence[float], free_blocks: float
) -> int:
    """How many running sequences, the latest admitted first, a decode step preempts so
    that every other one gets the blocks its next token needs. `need_blocks` and
    `held_blocks`: per running sequence in admission order, the blocks it needs beyond
    those it holds for this step, and those it holds (freed when it is preempted).

    vLLM's loop: the earliest admitted sequences take their blocks in turn; when one does
    not fit, the latest admitted left is preempted (possibly the one waiting itself) and
    it tries again."""
    free = free_blocks
    end = len(need_blocks)  # sequences [end:] are preempted
    i = 0
    while i < end:
        if need_blocks[i] <= free:
            free -= need_blocks[i]
            i += 1
            continue
        end -= 1
        free += held_blocks[end]
    return len(need_blocks) - end
