"""Reading out-of-memory messages (torch_npu's and CUDA's wordings)."""

from __future__ import annotations

import pytest
import torch

from kvaudit.measure.oom import is_out_of_memory, parse_oom

pytestmark = pytest.mark.fast

GiB, MiB = 1 << 30, 1 << 20
NPU = ("RuntimeError: NPU out of memory. Tried to allocate 2.57 GiB (NPU 0; 60.96 GiB total capacity; 57.49 GiB "
       "already allocated; 57.49 GiB current active; 1.96 GiB free; 57.62 GiB reserved in total by PyTorch) If "
       "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
CUDA_OLD = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already "
            "allocated; 3.12 MiB free; 14.70 GiB reserved in total by PyTorch)")
CUDA_NEW = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
            "1.50 GiB is free. Including non-PyTorch memory, this process has 77.64 GiB memory in use. Of the "
            "allocated memory 76.00 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.")


@pytest.mark.parametrize("text,device,tried,total,free,allocated,reserved", [
    (NPU, "NPU 0", 2.57 * GiB, 60.96 * GiB, 1.96 * GiB, 57.49 * GiB, 57.62 * GiB),
    (CUDA_OLD, "GPU 0", 20 * MiB, 15.78 * GiB, 3.12 * MiB, 14.56 * GiB, 14.70 * GiB),
    (CUDA_NEW, "GPU 0", 2 * GiB, 79.15 * GiB, 1.5 * GiB, 76 * GiB, None),
])
def test_figures_of_each_wording(text, device, tried, total, free, allocated, reserved):
    m = parse_oom(text)
    assert m.device == device
    assert m.tried == round(tried) and m.total == round(total) and m.free == round(free)
    assert m.allocated == round(allocated)
    assert m.reserved == (round(reserved) if reserved else None)


def test_not_an_oom_message():
    assert parse_oom("RuntimeError: shape mismatch") is None


def test_which_exceptions_are_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert is_out_of_memory(RuntimeError(NPU))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory"))
    assert not is_out_of_memory(RuntimeError("Expected all tensors to be on the same device"))
    assert not is_out_of_memory(ValueError("out of memory"))


# Verbatim from public threads: torch_npu up to 2.5.1 (a RuntimeError, ") If") and from 2.6 (").If").
REAL_NPU = [
    # https://github.com/vllm-project/vllm-ascend/issues/19
    ("RuntimeError: NPU out of memory. Tried to allocate 22.00 MiB (NPU 0; 60.97 GiB total capacity; 10.24 GiB already "
     "allocated; 10.24 GiB current active; 19.52 MiB free; 10.65 GiB reserved in total by PyTorch) If reserved memory "
     "is >> allocated memory try setting max_split_size_mb to avoid fragmentation.",
     (22 << 20, 60.97, 19.52 * (1 << 20), 10.65)),
    # https://github.com/vllm-project/vllm-ascend/issues/1987
    ("RuntimeError: NPU out of memory. Tried to allocate 3.47 GiB (NPU 0; 60.97 GiB total capacity; 58.92 GiB already "
     "allocated; 58.92 GiB current active; 1.66 GiB free; 58.95 GiB reserved in total by PyTorch) If reserved memory is "
     ">> allocated memory try setting max_split_size_mb to avoid fragmentation.",
     (3.47 * (1 << 30), 60.97, 1.66 * (1 << 30), 58.95)),
    # https://github.com/sgl-project/sglang/issues/29838 (torch_npu 2.6+)
    ("torch.OutOfMemoryError: NPU out of memory. Tried to allocate 72.00 MiB (NPU 0; 61.27 GiB total capacity; 56.05 "
     "GiB already allocated; 56.05 GiB current active; 5.04 MiB free; 58.39 GiB reserved in total by PyTorch).If "
     "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.",
     (72 << 20, 61.27, 5.04 * (1 << 20), 58.39)),
]


@pytest.mark.parametrize("message, figures", REAL_NPU)
def test_real_torch_npu_messages_of_both_formats(message, figures):
    tried, total_gib, free, reserved_gib = figures
    o = parse_oom(message)
    assert o.device == "NPU 0" and o.tried == round(tried) and o.free == round(free)
    assert o.total == round(total_gib * (1 << 30)) and o.reserved == round(reserved_gib * (1 << 30))


def test_what_this_process_holds_in_torchs_newer_message():
    """torch 2.1+ (c10/cuda/CUDACachingAllocator.cpp), as QwenLM/Qwen#782 pasted it: what this process holds is its
    own figure; without one, what its PyTorch allocated and reserved."""
    from kvaudit.measure.oom import parse_oom

    gib = 1 << 30
    seen = parse_oom("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 234.00 MiB. GPU 0 has a total "
                     "capacty of 80 GiB of which 176.38 MiB is free. Process 4683 has 11.05 GiB memory in use. Process "
                     "16753 has 1.71 GiB memory in use. Including non-PyTorch memory, this process has 18.80 GiB memory "
                     "in use. Of the allocated memory 18.26 GiB is allocated by PyTorch, and 30.10 MiB is reserved by "
                     "PyTorch but unallocated.")
    assert seen.held_here == round(18.80 * gib)
    alone = parse_oom("CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacty of 23.69 GiB of which "
                      "24.56 MiB is free. Process 106008 has 23.66 GiB memory in use. Of the allocated memory 23.19 GiB "
                      "is allocated by PyTorch, and 32.44 MiB is reserved by PyTorch but unallocated.")
    assert alone.processes == (round(23.66 * gib),)
    assert alone.held_here == round(23.66 * gib)  # one process listed alone is this one, non-PyTorch memory included
    assert alone.torch_reserved == round(23.19 * gib) + round(32.44 * (1 << 20))
    many = parse_oom("CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacty of 23.69 GiB of which "
                     "24.56 MiB is free. Process 1 has 2.00 GiB memory in use. Process 2 has 21.50 GiB memory in use. "
                     "Process 3 has 22.00 GiB memory in use. Of the allocated memory 21.00 GiB is allocated by PyTorch, "
                     "and 10.00 MiB is reserved by PyTorch but unallocated.")
    assert many.held_here == round(21.50 * gib)  # the smallest that holds what its PyTorch reserved
    unknown = parse_oom("CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has a total capacty of 23.69 GiB of "
                        "which 24.56 MiB is free. Process 1 has 2.00 GiB memory in use. Process 2 has 21.50 GiB memory "
                        "in use.")
    assert unknown.held_here is None  # two processes and no PyTorch figure: which is this one is not known


def test_the_out_of_memory_finding_names_the_request_its_segment_and_what_the_allocator_said():
    from types import SimpleNamespace

    from kvaudit.measure.audit import _oom_reason
    from kvaudit.results import DeviceOom

    said = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 4.00 GiB of which 0 bytes "
            "is free.")
    o = DeviceOom(allocation=3, allocations=5, request_bytes=3 << 20, allocated_before_bytes=1 << 30,
                  free_bytes=1 << 20, tensor=None, layers=(), segment_bytes=20 << 20,
                  message=said + " Including non-PyTorch memory, this process has 4.00 GiB memory in use. If reserved"
                                 " memory is >> allocated memory set PYTORCH_CUDA_ALLOC_CONF")
    cuda = SimpleNamespace(name="cuda")
    assert _oom_reason(o, cuda) == (
        "ran out of memory on the cuda meter at allocation 3 of 5: 3.00 MiB (a 20.00 MiB segment for the caching "
        "allocator) for a storage no layer uses, with 1.00 GiB already allocated; it needed 19.00 MiB more than the "
        f"1.00 MiB free (the allocator said: {said})")
    assert o.to_dict() == {"allocation": 3, "allocations": 5, "request_bytes": 3 << 20,
                           "allocated_before_bytes": 1 << 30, "free_bytes": 1 << 20, "needed_more_bytes": 19 << 20,
                           "segment_bytes": 20 << 20, "tensor": None, "layers": [], "message": o.message}
    bare = DeviceOom(allocation=1, allocations=1, request_bytes=None, allocated_before_bytes=0, free_bytes=None,
                     tensor=2, layers=("a", "b"), segment_bytes=20 << 20, message="NPU out of memory.")
    assert _oom_reason(bare, cuda) == ("ran out of memory on the cuda meter at allocation 1 of 1: an allocation for "
                                       "tensor 2 (a, b), with 0 B already allocated (the allocator said: NPU out of "
                                       "memory.)")
