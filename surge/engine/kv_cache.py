"""Paged KV cache for one layer range, owned by the runner that executes that range.

Memory is one pre-allocated tensor per layer (λScale §5, pre-allocation), cut into pages of
`page_size_tokens` slots; each sequence holds a list of pages (its page table), taken from a
pool as it grows and returned when it finishes; with prefix caching, full pages are shared
between sequences with the same token prefix (`surge.engine.page_pool`). A node running
layers i..j keeps only the cache of i..j; sequences are known by the `seq_id` the head gives
them, so every stage of a pipeline keeps its own page table for the same sequences.

Per step, `prepare` turns a `BatchMeta` into the `AttnContext` every layer uses.
"""

import itertools

import torch

from surge.engine import gemv
from surge.engine.attention import AttnContext
from surge.engine.batch import BatchMeta
from surge.engine.model import RopeTable
from surge.engine.page_pool import OutOfPagesError, PagePool, pages_needed

__all__ = ["OutOfPagesError", "PagedKVCache", "pages_needed"]


class PagedKVCache:
    """K and V tensors [num_layers, num_pages * page_size, kv_heads, head_dim] plus page tables."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.page_size = page_size_tokens
        self.num_pages = num_pages
        # One page more than the pool hands out: the scratch page, which only the decode
        # graphs' background compile writes (`scratch_context`), never a sequence.
        self.scratch_page = num_pages
        shape = (num_layers, (num_pages + 1) * page_size_tokens, num_kv_heads, head_dim)
        # Zeros, not empty: padded gathers read unused slots, which must be finite.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.device = device
        self.pool = PagePool(num_pages)
        self._tables: dict[int, list[int]] = {}
        self._slots: dict[int, list[int]] = {}
        """Each sequence's cache slots in token order (its page table, expanded once)."""

    @property
    def reads_pages_directly(self) -> bool:
        """Decode steps attend straight from the pages (`AttnContext.key_lens`): float32 on
        the CPU with surge's kernels loaded (`surge.engine.gemv.load`)."""
        return self.device.type == "cpu" and self.k.dtype == torch.float32 and gemv.loaded()

    @property
    def num_free_pages(self) -> int:
        return self.pool.num_free

    def seq_len_capacity(self, seq_id: int) -> int:
        return len(self._tables.get(seq_id, ())) * self.page_size

    def has(self, seq_id: int) -> bool:
        return seq_id in self._tables

    def seq_ids(self) -> tuple[int, ...]:
        """The sequences holding pages now, in id order."""
        return tuple(sorted(self._tables))

    def _append_pages(self, seq_id: int, pages: list[int]) -> None:
        self._tables.setdefault(seq_id, []).extend(pages)
        slots = self._slots.setdefault(seq_id, [])
        for page in pages:
            slots.extend(range(page * self.page_size, (page + 1) * self.page_size))

    def ensure(self, seq_id: int, num_tokens: int) -> None:
        """Give `seq_id` enough pages for `num_tokens` tokens."""
        need = pages_needed(num_tokens, self.page_size) - len(self._tables.get(seq_id, ()))
        if need > 0:
            try:
                self._append_pages(seq_id, self.pool.allocate(need))
            except OutOfPagesError as e:
                raise OutOfPagesError(f"sequence {seq_id}: {e}") from None

    def claim_prefix(self, seq_id: int, hashes: list[int]) -> int:
        """Map the cached pages of the longest cached prefix of `hashes` (chained block
        hashes of a new sequence's tokens) into `seq_id`'s table; returns the tokens covered.
        Those pages are shared, never written again: new tokens go to pages after them."""
        if self._tables.get(seq_id):
            raise RuntimeError(f"sequence {seq_id} already has pages; claim before its prefill")
        pages = self.pool.claim(hashes)
        if pages:
            self._append_pages(seq_id, pages)
        return len(pages) * self.page_size

    def register_blocks(self, batch: BatchMeta) -> None:
        """Name the full blocks this step fills by their hashes (after `ensure`)."""
        for sid, ctx_len, hashes in zip(
            batch.seq_ids, batch.ctx_lens, batch.block_hashes, strict=True
        ):
            table = self._tables[sid]
            first = ctx_len // self.page_size
            for j, h in enumerate(hashes):
                self.pool.register(table[first + j], h)

    def slots_of(self, seq_id: int) -> list[int]:
        """A sequence's cache slots in token order (empty if it has none)."""
        return self._slots.get(seq_id, [])

    def free(self, seq_id: int) -> None:
        """Return a finished (or migrated) sequence's pages (cached ones stay reusable)."""
        self.pool.release(list(reversed(self._tables.pop(seq_id, []))))
        self._slots.pop(seq_id, None)

    def prepare(
        self, batch: BatchMeta, rope: RopeTable, whole_pages: bool = False, direct: bool = True
    ) -> AttnContext:
        """Reserve pages for the step's new tokens and build the attention plumbing.

        `whole_pages`: attend every gathered slot under a mask (`AttnContext.num_keys` None),
        so no key count enters a compiled graph (`surge.engine.compiled`). `direct` False:
        never the paged decode kernel (a CUDA graph's static inputs are the gathered pages
        and their mask, `surge.engine.cuda_graphs`)."""
        B, Q = batch.num_seqs, batch.max_q_len
        totals = [c + q for c, q in zip(batch.ctx_lens, batch.q_lens, strict=True)]
        for sid, total in zip(batch.seq_ids, totals, strict=True):
            self.ensure(sid, total)
        if batch.block_hashes:
            self.register_blocks(batch)
        K = max(totals)
        direct = direct and Q == 1 and self.reads_pages_directly
        new_keys_only = not whole_pages and Q > 1 and all(c == 0 for c in batch.ctx_lens)
        new_keys_only = new_keys_only and all(q == Q for q in batch.q_lens)
        prior_len, prior_first_slot = 0, None
        # The two-part path calls ATen's CPU flash kernel: CPU only.
        cpu = self.device.type == "cpu"
        if cpu and not whole_pages and B == 1 and Q > 1 and batch.ctx_lens[0] > 0:
            prior_len = batch.ctx_lens[0]
            prior_first_slot = self._consecutive_from(batch.seq_ids[0], prior_len)
        # Pages gathered: none when nothing is read back from the cache (new keys only, or
        # the earlier tokens a view); with `prior_len`, the earlier tokens' pages only.
        gather_len = prior_len if prior_len else K
        if new_keys_only or prior_first_slot is not None:
            gather_len = 0
        num_gather_pages = pages_needed(gather_len, self.page_size)
        if whole_pages:  # at least two: a compiled graph would specialize a count of one
            num_gather_pages = max(num_gather_pages, 2)
        # Built as Python lists and converted once: per-sequence tensor ops cost more here.
        gather: list[int] = []
        writes: list[int] = []
        for sid, ctx_len, total in zip(batch.seq_ids, batch.ctx_lens, totals, strict=True):
            table = self._tables[sid]
            used = min(pages_needed(total, self.page_size), num_gather_pages)
            gather += table[:used]
            gather += [0] * (num_gather_pages - used)  # padding: any valid page, masked out
            writes += self._slots[sid][ctx_len:total]
        gather_pages = torch.tensor(gather, dtype=torch.int64).view(B, num_gather_pages)
        write_slots = torch.tensor(writes, dtype=torch.int64)

        if Q == 1:  # decode: each sequence's one new token sits at its context length
            positions = torch.tensor(batch.ctx_lens, dtype=torch.int64).view(B, 1)
        else:
            ctx = torch.tensor(batch.ctx_lens, dtype=torch.int64)
            qlen = torch.tensor(batch.q_lens, dtype=torch.int64)
            i = torch.arange(Q, dtype=torch.int64)
            # Padded query rows reuse the last valid position, so they stay finite and harmless.
            positions = ctx[:, None] + torch.minimum(i[None, :], qlen[:, None] - 1)
        cos, sin = rope.lookup(positions.to(rope.inv_freq.device), K - 1)

        valid_index = None
        if not all(q == Q for q in batch.q_lens):
            valid_index = (torch.arange(B)[:, None] * Q + i[None, :])[i[None, :] < qlen[:, None]]
        mask = None
        needs_mask = not (B == 1 and (Q == 1 or batch.ctx_lens[0] == 0))
        if not direct and (whole_pages or (needs_mask and not new_keys_only and not prior_len)):
            j = torch.arange(num_gather_pages * self.page_size if whole_pages else K)
            # Key j is visible to query i iff it is at or before the query's position.
            mask = (j[None, None, :] <= positions[:, :, None]).unsqueeze(1)
            mask = mask.to(self.device)
        return AttnContext(
            cos=cos,
            sin=sin,
            write_slots=write_slots.to(self.device),
            valid_index=None if valid_index is None else valid_index.to(self.device),
            gather_pages=gather_pages.to(self.device),
            page_size_tokens=self.page_size,
            num_keys=None if whole_pages else K,
            mask=mask,
            new_keys_only=new_keys_only,
            prior_len=prior_len,
            prior_first_slot=prior_first_slot,
            key_lens=positions.view(B).add(1).to(self.device) if direct else None,
        )

    def scratch_context(self, batch_size: int, rope: RopeTable) -> AttnContext:
        """A decode step's context for `batch_size` sequences at position 0 that writes and
        reads only the scratch page (compiling a graph from it touches no sequence), shaped
        like `prepare(..., whole_pages=True)`'s: two pages gathered, the second masked."""
        first = self.scratch_page * self.page_size
        positions = torch.zeros(batch_size, 1, dtype=torch.int64)
        cos, sin = rope.lookup(positions.to(rope.inv_freq.device), 0)
        j = torch.arange(2 * self.page_size)
        mask = (j[None, None, :] <= positions[:, :, None]).unsqueeze(1)
        direct = self.reads_pages_directly  # the steps' contexts, field for field
        return AttnContext(
            cos=cos,
            sin=sin,
            # A batch larger than a page writes some scratch slots twice: never read back.
            write_slots=first + torch.arange(batch_size, device=self.device) % self.page_size,
            valid_index=None,
            gather_pages=torch.full((batch_size, 2), self.scratch_page, device=self.device),
            page_size_tokens=self.page_size,
            num_keys=None,
            mask=None if direct else mask.to(self.device),
            key_lens=torch.ones(batch_size, dtype=torch.int64, device=self.device)
            if direct
            else None,
        )

    def _consecutive_from(self, seq_id: int, num_tokens: int) -> int | None:
        """The first slot of a sequence's first `num_tokens` tokens when they sit in
        consecutive slots (its pages handed out in order), else None."""
        table = self._tables[seq_id][: pages_needed(num_tokens, self.page_size)]
        if table and all(b - a == 1 for a, b in itertools.pairwise(table)):
            return table[0] * self.page_size
        return None
