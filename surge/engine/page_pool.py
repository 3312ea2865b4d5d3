"""`PagePool`: the KV cache's pages — who holds each, and which full pages are reusable by hash.

Automatic prefix caching (vLLM's design, also SGLang's radix cache in spirit): a page holding a
full block of `page_size` tokens is named by a hash of those tokens chained with the previous
block's hash, so equal hashes mean equal token prefixes and therefore equal keys and values.
A later sequence whose prompt starts with the same blocks maps those pages into its own table
instead of recomputing them (`claim`). Pages carry reference counts; a page whose count drops
to zero keeps its contents and hash and joins an LRU list, from which allocation takes pages
only when no never-used page is left (eviction drops the hash). A page with a reference is on
no free list, so eviction can never take a page a sequence still uses.

Owned by `PagedKVCache` (one pool per layer range); the scheduler only computes hashes
(`block_hashes`) and asks for hits through the executor.
"""

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


def pages_needed(num_tokens: int, page_size_tokens: int) -> int:
    """Pages a sequence of `num_tokens` occupies (the scheduler and the cache agree on this;
    here, not in `kv_cache`, so a scheduler runs without torch: a pipeline's head engines)."""
    return -(-num_tokens // page_size_tokens)


def block_hashes(
    token_ids: Sequence[int], page_size: int, known: list[int] | None = None
) -> list[int]:
    """Chained hashes of every full block of `token_ids`; extends `known` (a prefix of the
    answer computed earlier) in place and returns it."""
    out = known if known is not None else []
    prev = out[-1] if out else 0
    for b in range(len(out), len(token_ids) // page_size):
        block = token_ids[b * page_size : (b + 1) * page_size]
        h = hashlib.blake2b(digest_size=8)
        h.update(prev.to_bytes(8, "little"))
        h.update(b"".join(t.to_bytes(4, "little") for t in block))
        # 63 bits: stays a positive int64 wherever it travels (JSON, tensors).
        prev = int.from_bytes(h.digest(), "little") >> 1
        out.append(prev)
    return out


class OutOfPagesError(RuntimeError):
    """The cache has no free page left; the scheduler should have prevented this."""


class PagePool:
    """Pages 0..num_pages-1 with reference counts, a hash index and an LRU of cached pages."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._unused = list(range(num_pages - 1, -1, -1))
        """Pages with no reference and no cached contents (taken first)."""
        self._lru: OrderedDict[int, None] = OrderedDict()
        """Pages with no reference whose contents are still named by a hash, oldest first."""
        self._refs = [0] * num_pages
        self._hash_of: dict[int, int] = {}
        self._page_of: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        """Pages an allocation can take (never used, or cached and unreferenced)."""
        return len(self._unused) + len(self._lru)

    @property
    def num_cached(self) -> int:
        """Pages whose contents are reusable by hash (referenced or not)."""
        return len(self._page_of)

    def refs(self, page: int) -> int:
        return self._refs[page]

    def allocate(self, n: int) -> list[int]:
        """Take `n` pages for a sequence (evicting the least recently freed cached ones)."""
        if n > self.num_free:
            raise OutOfPagesError(f"KV cache full: {n} pages needed, {self.num_free} free")
        pages = []
        for _ in range(n):
            if self._unused:
                page = self._unused.pop()
            else:
                page, _ = self._lru.popitem(last=False)
                del self._page_of[self._hash_of.pop(page)]
            self._refs[page] = 1
            pages.append(page)
        return pages

    def claim(self, hashes: Sequence[int]) -> list[int]:
        """Pages of the longest cached prefix of `hashes`, each given one more reference."""
        pages = []
        for h in hashes:
            page = self._page_of.get(h)
            if page is None:
                break
            if self._refs[page] == 0:
                del self._lru[page]
            self._refs[page] += 1
            pages.append(page)
        return pages

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading `hashes` are cached (a query; takes nothing)."""
        n = 0
        for h in hashes:
            if h not in self._page_of:
                break
            n += 1
        return n

    def register(self, page: int, h: int) -> None:
        """Name a page that now holds a full block; a block already cached elsewhere keeps
        its first page (this one stays anonymous and is reused like any page)."""
        if h in self._page_of or page in self._hash_of:
            return
        self._page_of[h] = page
        self._hash_of[page] = h

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference of each page; pass a sequence's pages in reverse order so its
        tail blocks are evicted before its head blocks (the head is the likelier to be shared)."""
        for page in pages:
            if self._refs[page] <= 0:
                raise RuntimeError(f"page {page} released more often than taken")
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._hash_of:
                    self._lru[page] = None
                else:
                    self._unused.append(page)
