"""The fake ``torch.npu`` / ``torch.cuda`` allocator behaves as torch_npu's ``NPUCachingAllocator`` and c10's
``CUDACachingAllocator`` do (github.com/Ascend/pytorch ``torch_npu/csrc/core/npu/NPUCachingAllocator.cpp``,
pytorch ``c10/cuda/CUDACachingAllocator.cpp``): what the device tests rely on is checked here."""

from __future__ import annotations

import pytest
import torch

from fakes import FakeAllocatorBackend, allocation_size, format_size, round_size
from kvaudit.measure.oom import is_out_of_memory, parse_oom

MiB = 1 << 20


@pytest.mark.parametrize("n, npu, cuda", [(0, 512, 512), (480, 512, 512), (481, 1024, 512), (1000, 1536, 1024),
                                          (MiB, MiB + 512, MiB), (24 * MiB, 24 * MiB + 512, 24 * MiB)])
def test_round_size_pads_by_32_bytes_on_the_npu_only(n, npu, cuda):
    assert round_size(n, 32) == npu and round_size(n, 0) == cuda


@pytest.mark.parametrize("rounded, segment", [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB),
                                              (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB),
                                              (24 * MiB + 512, 26 * MiB)])
def test_segment_sizes(rounded, segment):
    assert allocation_size(rounded) == segment


def test_format_size_is_c10s():
    assert [format_size(n) for n in (1024, 1025, MiB, MiB + 1, 1 << 30, 3 << 30)] == [
        "1024 bytes", "1.00 KiB", "1024.00 KiB", "1.00 MiB", "1024.00 MiB", "3.00 GiB"]


def _alloc(fake, *sizes):
    with fake.recording():
        return [torch.empty(n, dtype=torch.int8) for n in sizes]


def test_exactly_one_mib_goes_to_the_npus_large_pool():
    npu, cuda = FakeAllocatorBackend(flavor="npu"), FakeAllocatorBackend(flavor="cuda")
    held = _alloc(npu, MiB), _alloc(cuda, MiB)
    assert npu.memory_reserved() == 20 * MiB and cuda.memory_reserved() == 2 * MiB
    assert npu.memory_stats()["segment.large_pool.current"] == 1 and cuda.memory_stats()["segment.small_pool.current"] == 1
    del held


def test_small_blocks_share_a_segment_and_large_ones_split_only_past_1_mib():
    fake = FakeAllocatorBackend(flavor="cuda")
    small = _alloc(fake, 100_000, 100_000)
    assert fake.memory_reserved() == 2 * MiB and fake.memory_allocated() == 2 * 100_352
    mid = _alloc(fake, 9 * MiB, 9 * MiB)  # 20 MiB segment: 9 + 9 MiB, 2 MiB left over
    assert fake.memory_reserved() == 22 * MiB
    whole = _alloc(fake, int(19.5 * MiB))  # 0.5 MiB would remain: the whole 20 MiB block is handed out
    assert fake.memory_allocated() == 2 * 100_352 + 18 * MiB + 20 * MiB
    assert fake.memory_stats()["requested_bytes.all.current"] == 200_000 + 18 * MiB + int(19.5 * MiB)
    del small, mid, whole


def test_freed_blocks_merge_and_empty_cache_keeps_segments_in_use():
    fake = FakeAllocatorBackend(flavor="npu")
    a, b = _alloc(fake, 4 * MiB, 4 * MiB)
    assert fake.memory_reserved() == 20 * MiB
    del a
    fake.empty_cache()
    assert fake.memory_reserved() == 20 * MiB  # b still lives in the segment
    (c,) = _alloc(fake, 7 * MiB)  # best fit: the merged free tail after b, not the 4 MiB hole before it
    assert fake.memory_reserved() == 20 * MiB
    del b, c
    fake.empty_cache()
    assert fake.memory_reserved() == 0 and fake.memory_allocated() == 0


def test_cached_segments_are_released_before_running_out():
    fake = FakeAllocatorBackend(total=64 * MiB, flavor="npu")
    (a,) = _alloc(fake, 40 * MiB)
    del a
    (b,) = _alloc(fake, 50 * MiB)  # fits only once the cached 40 MiB segment is given back
    assert fake.memory_reserved() == 52 * MiB and fake.memory_stats()["num_alloc_retries"] == 1
    del b


@pytest.mark.parametrize("flavor", ["npu", "cuda"])
def test_out_of_memory_names_the_segment_as_the_real_allocators_do(flavor):
    fake = FakeAllocatorBackend(total=60 * MiB, flavor=flavor)
    (held,) = _alloc(fake, 40 * MiB)  # NPU: 40 MiB + 32 B takes a 42 MiB segment; CUDA: 40 MiB
    with pytest.raises(torch.OutOfMemoryError) as e:
        _alloc(fake, 24 * MiB)
    message = str(e.value)
    assert is_out_of_memory(e.value) and fake.memory_stats()["num_ooms"] == 1
    parsed = parse_oom(message)
    assert parsed.tried == (26 if flavor == "npu" else 24) * MiB  # the segment, not the 24 MiB asked for
    assert parsed.total == 60 * MiB and parsed.free == (18 if flavor == "npu" else 20) * MiB
    assert parsed.allocated == 40 * MiB  # printed to 2 decimals: the NPU's 512 B of rounding do not show
    if flavor == "npu":
        assert message.startswith("NPU out of memory. Tried to allocate 26.00 MiB (NPU 0; 60.00 MiB total capacity; "
                                  "40.00 MiB already allocated; 40.00 MiB current active; 18.00 MiB free; 42.00 MiB "
                                  "reserved in total by PyTorch).If reserved memory is >> allocated memory")
    else:
        assert message.startswith("CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacity of "
                                  "60.00 MiB of which 20.00 MiB is free.")
    del held


def test_memory_stats_has_torch_npus_keys():
    fake = FakeAllocatorBackend(flavor="npu")
    (x,) = _alloc(fake, 1000)
    stats = fake.memory_stats()
    for stat in ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                 "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            for kind in ("current", "peak", "allocated", "freed"):
                assert f"{stat}.{pool}.{kind}" in stats
    assert stats["requested_bytes.all.current"] == 1000 and stats["allocated_bytes.all.current"] == 1536
    assert stats["inactive_split_bytes.small_pool.current"] == 2 * MiB - 1536
    del x
