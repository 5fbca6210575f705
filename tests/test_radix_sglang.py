"""SGLang's RadixCache, paged: the cases of SGLang's own unit tests (test/srt/test_radix_cache_unit.py in
sgl-project/sglang: insert and match, total size, extra-key isolation, lock references, eviction, page
alignment, prefix matches that split nodes) with their expected numbers, at page sizes 1, 2 and 4; then the
scheduler's rules as `simulate-prefix --policy radix --block-size P` replays them (match the first L - 1 tokens,
whole pages only, evict before allocating, the pool never exceeded), against a naive reference.

SGLang's `insert` stores any length; its scheduler only ever inserts whole pages (`page_align_keys` in
`cache_finished_req` / `cache_unfinished_req`), which is what `RadixCache.insert` does here: where a case
inserts a partial page, the expected sizes are the page-aligned ones and the match lengths are SGLang's.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.prefix.pools import CapacityError, RadixCache
from cachectl.engines.prefix.replay import simulate
from cachectl.engines.prefix.trace import TraceRequest

PAGES = [1, 2, 4]


def aligned(n: int, page: int) -> int:
    return n // page * page


@pytest.mark.parametrize("page", PAGES)
def test_insert_and_match_basic(page):
    cache = RadixCache(None, page)
    assert cache.insert([1, 2, 3])[0] == 0                      # no existing prefix
    assert cache.size == aligned(3, page)                       # SGLang page 1: total 3, evictable 3
    assert cache.evictable_size() == aligned(3, page)
    assert cache.match([1, 2, 3])[0] == aligned(3, page)        # page 1: 3
    assert cache.match([1, 2])[0] == aligned(2, page)           # page 1: 2 (a partial match)
    assert cache.insert([1, 2, 3])[0] == aligned(3, page)       # inserting it again finds it all


@pytest.mark.parametrize("page", PAGES)
def test_total_size(page):
    cache = RadixCache(None, page)
    assert cache.size == 0
    cache.insert([1, 2, 3])
    assert cache.size == aligned(3, page)                       # page 1: 3
    cache.insert([4, 5])
    assert cache.size == aligned(3, page) + aligned(2, page)    # page 1: 5


@pytest.mark.parametrize("page", PAGES)
def test_extra_key_isolation(page):
    cache = RadixCache(None, page)
    seq = [1, 2, 3, 4]
    for key in ("key1", "key2", None):
        assert cache.insert(seq, key)[0] == 0                   # the same tokens under another key: new
    for key in ("key1", "key2", None):
        assert cache.match(seq, key)[0] == aligned(4, page)     # each matches its own
    assert cache.match(seq, "nonexistent")[0] == 0


@pytest.mark.parametrize("page", PAGES)
def test_lock_ref_operations(page):
    cache = RadixCache(None, page)
    cache.insert([1, 2, 3, 4])
    _, path = cache.match([1, 2, 3, 4])
    evictable, protected = cache.evictable_size(), cache.protected_size()
    cache.lock(path[-1])                                        # inc_lock_ref
    assert cache.protected_size() == protected + 4 and cache.evictable_size() == evictable - 4
    assert cache.evict(4) == 0                                  # a locked path is not evicted
    cache.unlock(path[-1])                                      # dec_lock_ref
    assert (cache.protected_size(), cache.evictable_size()) == (protected, evictable)


@pytest.mark.parametrize("page", PAGES)
def test_evict_functionality(page):
    cache = RadixCache(None, page)
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6, 7, 8])
    cache.match([5, 6, 7, 8])                                   # [1..4] is now the least recently used
    before = cache.size
    assert cache.evict(2) == 4 and cache.size < before          # whole nodes go: the LRU leaf, 4 tokens
    assert cache.match([1, 2, 3, 4])[0] == 0 and cache.match([5, 6, 7, 8])[0] == 4


@pytest.mark.parametrize("page,length", [(1, 5), (2, 5), (4, 6)])  # SGLang's cases
def test_page_alignment_boundary(page, length):
    cache = RadixCache(None, page)
    tokens = list(range(length))
    cache.insert(tokens)
    matched = cache.match(tokens)[0]
    assert matched > 0 and matched % page == 0
    assert matched == {1: 5, 2: 4, 4: 4}[page]


@pytest.mark.parametrize("page", PAGES)
def test_advanced_prefix_match_with_node_splits(page):
    cache = RadixCache(None, page)
    seq1 = [1, 2, 3, 4, 5, 6, 7, 8]
    seq2 = [1, 2, 9, 10]                                        # diverges after 2 tokens: inside seq1's first page at P=4
    cache.insert(seq1)
    cache.insert(seq2)
    total = {1: 10, 2: 10, 4: 12}[page]                         # SGLang, pages 1 and 2: 8 + 2
    assert cache.size == total
    assert cache.match([1, 2, 3, 4, 999, 1000])[0] == 4         # a split inside an existing node
    assert cache.size == total                                  # splitting moves no data
    assert cache.match(seq1)[0] == 8                            # the long sequence still matches whole
    assert cache.match([1, 2, 3, 4, 5, 6, 777, 888])[0] == {1: 6, 2: 6, 4: 4}[page]   # a deeper split
    assert cache.size == total
    assert cache.match(seq2)[0] == 4                            # the diverging branch, exactly


# --------------------------------------------------------------------------- the scheduler, as replayed


def reqs(*token_lists, salts=None):
    return [TraceRequest(index=i, line=i + 1, prompt_tokens=len(t), tokens=list(t), salt=salts[i] if salts else None,
                         tenant=salts[i] if salts else None) for i, t in enumerate(token_lists)]


def hits(*token_lists, page, capacity=None, **kw):
    r = simulate(reqs(*token_lists), policy="radix", block_size=page, capacity_blocks=capacity, per_request=True,
                 **kw)
    return [h.hit_tokens for h in r.per_request], r


@pytest.mark.parametrize("page,expected", [(1, 5), (2, 4), (4, 4)])
def test_whole_pages_match_five_tokens_of_six(page, expected):
    # the second request matches its first L - 1 = 5 tokens, cut to whole pages: 5 -> 4 at page sizes 2 and 4
    got, _ = hits([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], page=page)
    assert got == [0, expected]


@pytest.mark.parametrize("page", PAGES)
def test_evicts_before_it_inserts_and_never_exceeds_the_pool(page):
    capacity = 12 // page                                       # 12 tokens of pool
    got, r = hits(list(range(8)), list(range(100, 108)), list(range(8)), page=page, capacity=capacity)
    # the second request needs 8 tokens, 4 are free: the first request's (LRU) pages are evicted first
    assert got == [0, 0, 0] and r.peak_blocks_in_use <= capacity
    assert r.evicted_tokens == 16 and r.evicted_blocks == 16 // page
    got, r = hits(list(range(8)), list(range(8)) + [50], page=page, capacity=capacity)
    assert got == [0, 8] and r.peak_blocks_in_use <= capacity


def test_a_request_larger_than_the_pool_is_refused():
    with pytest.raises(CapacityError, match="needs 3 pages of 4 but the capacity is 2"):
        hits(list(range(10)), page=4, capacity=2)


def test_salts_are_extra_keys():
    r = simulate(reqs(range(30), range(30), range(30), salts=["a", "b", "a"]), policy="radix", block_size=4,
                 capacity_blocks=None, per_request=True)
    assert [h.hit_tokens for h in r.per_request] == [0, 0, 28] and r.cross_tenant_shared_blocks == 0


def naive_unbounded(trace, page):
    """Unbounded memory: the longest prefix of the first L - 1 tokens shared with the whole pages of an earlier
    prompt (of the same salt), cut to whole pages."""
    out = []
    for i, t in enumerate(trace):
        best = 0
        for q in trace[:i]:
            q = q[:aligned(len(q), page)]
            n = 0
            while n < min(len(t) - 1, len(q)) and t[n] == q[n]:
                n += 1
            best = max(best, n)
        out.append(aligned(best, page))
    return out


token_lists = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), min_size=1, max_size=12)


@given(token_lists, st.sampled_from(PAGES))
@settings(max_examples=150, deadline=None)
def test_unbounded_hits_equal_the_naive_reference(trace, page):
    trace = [t if i % 3 else (trace[i - 1] + t if i else t) for i, t in enumerate(trace)]
    got, _ = hits(*trace, page=page)
    assert got == naive_unbounded(trace, page)


def test_a_split_keeps_the_lock_of_a_running_request():
    # a request running on [0]*6 while another matches [0]*5 splits its node: when it finishes, both halves are
    # unlocked (SGLang walks up from the request's last node), so a third request can evict them
    cache = RadixCache(6, 1)
    first = cache.admit([0] * 6)
    assert first is not None and cache.admit([0] * 6) is None      # the pool is full and locked: wait
    cache.release(first)
    second = cache.admit([0] * 6)
    assert second is not None and second.hit == 5
    cache.release(second)
    third = cache.admit([1, 0])
    assert third is not None and cache.protected_size() == 2 and cache.size == 2


@given(token_lists, st.sampled_from(PAGES), st.integers(0, 8), st.integers(1, 3))
@settings(max_examples=300, deadline=None)
def test_the_peak_never_exceeds_the_pool(trace, page, extra, concurrency):
    need = max(-(-len(t) // page) for t in trace)
    capacity = need + extra
    reqs_ = [TraceRequest(index=i, line=i + 1, prompt_tokens=len(t), tokens=list(t), timestamp=i * 0.01,
                          output_tokens=3) for i, t in enumerate(trace)]
    r = simulate(reqs_, policy="radix", block_size=page, capacity_blocks=capacity, concurrency=concurrency,
                 per_request=True)
    assert r.peak_blocks_in_use <= capacity
    bound = naive_unbounded(trace, page)
    assert all(h <= b for h, b in zip((h.hit_tokens for h in r.per_request), bound))
