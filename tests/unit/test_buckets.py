"""The shared M-bucket ladder: edges, bucket_of and ladder fill points."""
import math

import pytest

from tunedb import buckets
from tunedb.buckets import bucket_of, edges_upto, ladder


def test_edges():
    assert edges_upto(8192) == (*range(8, 129, 8), 184, 256, 368, 512, 728, 1024, 2048, 4096, 8192)


def test_sqrt2_edges_are_rounded_up_multiples_of_8():
    for k, edge in enumerate((128, 184, 256, 368, 512, 728, 1024)):
        exact = 128 * math.sqrt(2) ** k
        assert edge % 8 == 0 and edge >= exact - 1e-9 and exact > edge - 8


def test_bucket_of_is_the_smallest_edge_at_or_above():
    for m in range(1, 5000):
        edges = edges_upto(m)
        assert bucket_of(m) == edges[-1] >= m
        assert len(edges) == 1 or edges[-2] < m


def test_ladder():
    assert ladder(100, 3000) == (104, 112, 120, 128, 184, 256, 368, 512, 728, 1024, 2048, 4096)
    assert ladder(1500, 1500) == (2048,)
    assert ladder(1, 8) == (8,)
    with pytest.raises(ValueError, match="m_lo <= m_hi"):
        ladder(10, 5)
    with pytest.raises(ValueError, match="m=0"):
        bucket_of(0)


def test_pow2_ladder_for_batch_axes():
    assert buckets.ladder(3, 100, "pow2") == (4, 8, 16, 32, 64, 128)
    assert [buckets.bucket_of(b, "pow2") for b in (1, 2, 3, 64, 65)] == [1, 2, 4, 64, 128]
    with pytest.raises(ValueError, match="unknown bucket ladder 'log'"):
        buckets.bucket_of(4, "log")
