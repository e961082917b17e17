"""Failures outside vLLM's device-memory plan, read from the wording of the errors that report them: the host's memory
(the kernel's OOM killer, a SIGKILL's exit code 137, Ray's memory monitor, torch's CPU allocator), the collective
library (NCCL, HCCL, the shared memory NCCL needs), the driver or runtime (CUDA's driver checks, the Ascend runtime's
stream and AI Core errors), and a device too old for what the launch asks (its compute capability). Plain text in, no
torch and no vLLM.

Each wording is the message as its program prints it (sources beside each), not a pattern fitted to one report.
"""

from __future__ import annotations

import re

from kvaudit.triage.lines import Where, Words, lines_holding

HOST = "host-memory"
COLLECTIVE = "collective-library"
DRIVER = "driver"
UNSUPPORTED = "not-out-of-memory"
"""A kernel or data type the device cannot run (its compute capability): no memory failure at all."""

WORDINGS: tuple[tuple[str, str, tuple[str, ...], re.Pattern], ...] = (
    # the shell reporting a process the kernel killed; exit status 128 + SIGKILL (9); the kernel's own words (mm/oom_kill.c:
    # "invoked oom-killer", "oom-kill:constraint=", "Out of memory: Killed process"), and "OOM killer" / "OOM-killed"
    # (not "the OOM kills EngineCore": a device out-of-memory ending the engine)
    (HOST, "kernel OOM killer / SIGKILL", ("killed", "137", "sigkill", "exitcode", "signal 9", "oom-kill", "oom_kill", "oom kill", "kill process", "cgroup"), re.compile(
        r"^\s*(?:\S+:\s*)?Killed\s*$|exit(?:ed with)? code:? 137\b|\(SIGKILL\)|exitcode\s*:\s*-9\b|signal 9\b|"
        r"\boom[-_ ]kill(?:er\b|ed\b|_process|:)|Out of memory: Kill(?:ed)? process|Memory cgroup out of memory", re.IGNORECASE)),
    # Ray's memory monitor (ray/_private/memory_monitor.py, raylet): "Workers ... killed due to memory pressure (OOM)",
    # "Task was killed due to the node running low on memory", RayOutOfMemoryError; users call it "Ray OOM"
    (HOST, "Ray's memory monitor", ("memory pressure", "low on memory", "rayoutofmemory", "memory on the node", "ray oom",
                                     "ray's oom", "ray out of memory"),
     re.compile(r"killed due to memory pressure|running low on memory|RayOutOfMemoryError|Memory on the node .{0,80} was "
                r"[0-9.]+\s*GB / [0-9.]+\s*GB|\bRay(?:'s)? (?:OOM|out of memory)\b", re.IGNORECASE)),
    # vLLM V0's scheduler preempting by swapping a sequence group's KV blocks to the CPU (vllm/core/scheduler.py
    # _swap_out, 0.1 to 0.10: "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this
    # error."): the host memory vLLM reserves for swapped blocks (`--swap-space`, GiB per GPU) is full
    (HOST, "vLLM's CPU swap space", ("swap space",), re.compile(r"lack of CPU swap space", re.IGNORECASE)),
    # torch's CPU allocator (c10/core/impl/alloc_cpu.cpp: "DefaultCPUAllocator: can't allocate memory"), errno 12
    # (ENOMEM, "Cannot allocate memory"), C++'s std::bad_alloc, Python's MemoryError
    (HOST, "the host allocator", ("defaultcpuallocator", "errno 12", "bad_alloc", "memoryerror"), re.compile(
        r"DefaultCPUAllocator: (?:can't|not enough memory)|\[Errno 12\] Cannot allocate memory|std::bad_alloc|"
        r"^\s*MemoryError\b|\bMemoryError: Unable to allocate", re.IGNORECASE)),
    # the reporter naming the host's memory ("system RAM at 100%", "CPU memory runs out", "系统内存不足", "打爆服务器内存":
    # the server's memory blown, "内存(不是GPU显存)泄漏": memory, not the GPU's)
    (HOST, "the host's memory named", ("host ram", "host memory", "system ram", "system memory", "cpu ram", "cpu memory",
                                  "physical ram", "physical memory", " ram", "ram ", "内存", "memory ("), re.compile(
        r"(?:host|system|cpu|physical)\s+(?:ram|memory)\b.{0,40}?(?:full|exhaust|run(?:s|ning)? out|ran out|100\s?%|"
        r"oom|insufficient|not enough|leak|grow)|\bRAM\b.{0,30}?(?:full|exhaust|run(?:s|ning)? out|ran out|100\s?%|"
        r"\bOOM\b|leak)|(?:系统|主机|服务器|物理|CPU|cpu|host)\s*内存.{0,12}?(?:不足|耗尽|溢出|占满|爆|泄漏|泄露|增长|上涨|打满)|"
        r"(?:打爆|撑爆|耗尽|占满|吃满)了?(?:系统|主机|服务器|物理|CPU|cpu)内存|"
        r"(?:内存|\bRAM\b|\bmemory\b)\s*[（(]\s*(?:不是|并非|非|而非|not)\s*(?:the\s+)?(?:GPU|NPU|显存|VRAM|device)",
        re.IGNORECASE)),
    # the host's memory said to grow or leak ("内存（RAM）不自动清理 ... RAM增长到极限值", "Host内存上涨", an RSS that grows)
    (HOST, "the host's memory growing", ("内存", "ram", "rss", "host"), re.compile(
        r"(?<!显)内存(?:泄漏|泄露)|(?:\bRAM\b|\bRSS\b|Host ?内存|host memory|CPU memory|系统内存|主机内存)(?:[^.\n]|\.\d){0,30}?"
        r"(?:增长|上涨|增加|grows?|growing|increas\w*|leak\w*|不自动清理|not (?:freed|released))", re.IGNORECASE)),
    # NCCL's own errors (nccl.h ncclResult_t names; torch's "NCCL error in: ..."; cupy's NcclError) and the shared
    # memory it maps under /dev/shm (NCCL's shmutils.cc: "Error while creating shared memory segment"; Ray's warning that
    # "/dev/shm has only 67108864 bytes available": a container's 64 MB default, too small for NCCL); torch's
    # ProcessGroupNCCL watchdog on a collective that never completes ("Watchdog caught collective operation timeout")
    (COLLECTIVE, "NCCL", ("nccl", "shared memory segment", "/dev/shm", "watchdog caught"), re.compile(
        r"NCCL error|NCCL_ERROR_[A-Z_]+|\bnccl(?:SystemError|UnhandledCudaError|InternalError|InvalidUsage|"
        r"RemoteError)\b|NCCL WARN|Error while creating shared memory segment|ncclShmOpen|NcclError|"
        r"/dev/shm has only \d+ bytes|Watchdog caught collective operation timeout|"
        r"(?<![A-Za-z])NCCL\s*(?:error\s*)?\d{1,3}\s*(?:的)?\s*(?:错误|报错)|NCCL\s*(?:错误|报错)",
        re.IGNORECASE)),
    # HCCL (torch_npu's "HCCL function error: HcclGetRootInfo(...), error code is 11", "call hccl api failed",
    # CANN's EI*** HCCL error codes)
    (COLLECTIVE, "HCCL", ("hccl", "ei00"), re.compile(
        r"HCCL function error|hccl api failed|Hccl\w+\(.{0,80}\),? error code|createHCCLComm|\bEI00\d\d\b",
        re.IGNORECASE)),
    # CUDA's driver checks (torch/cuda/__init__.py: "The NVIDIA driver on your system is too old", "Found no NVIDIA
    # driver on your system"; the runtime's cudaErrorInsufficientDriver and cudaErrorNoDevice texts)
    # cudaErrorPeerAccessUnsupported's text; torch.utils.cpp_extension's "The detected CUDA version (X) mismatches the
    # version that was used to compile PyTorch (Y)"; the reporter naming a CUDA/driver version too low or mismatched
    # ("cuda版本低", "CUDA version is too old") or peer-to-peer access the driver no longer gives ("can not do p2p")
    (DRIVER, "the CUDA driver", ("driver", "cuda-capable", "forward compatibility", "unknown error", "nvidia-smi has failed",
                                 "peer access", "cuda version", "cuda版本", "驱动", "p2p"), re.compile(
        r"NVIDIA driver on your system is too old|Found no NVIDIA driver|CUDA driver version is insufficient|"
        r"no CUDA-capable device is detected|forward compatibility was attempted on non supported HW|"
        r"CUDA error: unknown error|cudaErrorInsufficientDriver|NVIDIA-SMI has failed|"
        r"peer access is not supported between these two devices|detected CUDA version \(.{1,20}\) mismatches|"
        r"(?:cuda|驱动|driver)\s*(?:的)?\s*版本\s*(?:太|过|较)?(?:低|旧|不匹配|不对应)|"
        r"\b(?:cuda|driver) version (?:is )?(?:too (?:low|old)|mismatch\w*|incompatible)|"
        r"(?:can ?not|can't|cannot|unable to|fails? to|no longer) (?:do |use |enable )?p2p\b", re.IGNORECASE)),
    # a device too old for a kernel or data type: vllm/config.py's "Bfloat16 is only supported on GPUs with compute
    # capability of at least 8.0", "... requires compute capability >= 8.0", FlashAttention's "only supports Ampere
    # GPUs or newer", "does not support fp8" / "doesn't support sm75", Triton's "type fp8e4nv not supported in this
    # architecture"
    (UNSUPPORTED, "the device's compute capability", ("compute capability", "ampere", "support fp8", "support sm",
                                                           "supported in this architecture"),
     re.compile(r"only supported on GPUs with compute capability|requires? compute capability|compute capability "
                r"(?:of at least|>=)|only supports? Ampere GPUs or newer|(?:does not|doesn't|don't|not) supports? "
                r"(?:fp8|bf16|bfloat16|sm_?\d{2})\b|type fp8\w* not supported in this architecture", re.IGNORECASE)),
    # a Triton kernel asking more of the GPU's on-chip resources than one block has (triton/runtime/errors.py
    # OutOfResources: "out of resource: shared memory, Required: 147456, Hardware limit: 101376. Reducing block sizes or
    # `num_stages` may help."): a kernel's configuration this device cannot run, not its memory
    (UNSUPPORTED, "a Triton kernel's on-chip resources", ("out of resource", "outofresources"), re.compile(
        r"OutOfResources|out of resource: (?:shared memory|registers)", re.IGNORECASE)),
    # the Ascend runtime (CANN's rtStreamSynchronize and AI Core errors: "aicore timeout", "The aicore execution
    # times out", error 507014 / 507015; the driver out of streams while ACL graphs are captured: "Alloc sq cq fail",
    # "driver error:resource alloc fail"); torch_npu's "NPU function error: c10_npu::SetDevice(device_id_), error code
    # is 107001" with a runtime code that is no memory's (CANN's rt_error_codes.h: 1xxxxx a call's parameter, as
    # 107001 an invalid device id; 5xxxxx the runtime's own; 207001 is a failed allocation, the device's memory); a
    # CANN operator package built for another chip ("the socversion Ascend910B1 of bin package does not match the
    # current device socverison Ascend310P3")
    (DRIVER, "the Ascend runtime", ("aicore", "5070", "rtstreamsynchronize", "driver error", "alloc sq cq",
                                    "npu function error", "socver"), re.compile(
        r"aicore (?:execution )?time(?:s)? ?out|\[aicore timeout\]|Aicore kernel execute failed|"
        r"runtime result = 5070\d\d|rtStreamSynchronize execute failed|driver error:\s*resource alloc fail|"
        r"Alloc sq cq fail|NPU function error: .{1,120}?, error code is [15]\d{5}\b|"
        r"socversion \S+ of bin package does not match the current device", re.IGNORECASE)),
)
"""Each kind of failure outside the plan, what prints it, words one of which its lines hold (lower-cased: a
substring test first, as most log lines hold none), and its wording."""

_DRIVER_TITLE = re.compile(r"(?:\bdriver\b|驱动)", re.IGNORECASE)
_FAILED = re.compile(r"\b(?:errors?|fail\w*|crash\w*|cannot|can't|unable)\b|报错|失败|无法|不能", re.IGNORECASE)

WHAT_IS = {
    HOST: "the host's memory (RAM) ran out, not the device's: the kernel or Ray killed the process, a host "
          "allocation failed, or the CPU swap space vLLM reserves for preempted sequences was full",
    COLLECTIVE: "the collective library (NCCL/HCCL) failed to set up or run its communicators or their shared memory",
    DRIVER: "the driver or the device runtime failed (its version, or the runtime's own error)",
    UNSUPPORTED: "the device cannot run a kernel or data type the launch asks for (its compute capability is too low, "
                 "or a kernel asks more shared memory of one block than it has)",
}
"""What the failure is, said plainly."""
ACTIONS = {
    HOST: "Give the host more RAM (a container's memory limit, Ray's memory monitor threshold), or need less of it: "
          "a smaller `--swap-space` / `--cpu-offload-gb`, fewer processes loading weights at once, smaller batches "
          "of host-side work (logits, images, audio). Where vLLM's own swap space was full (\"lack of CPU swap "
          "space\"), a larger `--swap-space` where the host has the RAM, or fewer sequences per request (`n`, "
          "`best_of`) and a smaller `--max-num-seqs`, so fewer are preempted at once.",
    COLLECTIVE: "Check the communicator's resources: `--shm-size` (or `--ipc=host`) for NCCL's shared memory, free "
                "ports and interfaces (NCCL_SOCKET_IFNAME / HCCL_IF_IP), NCCL_BUFFSIZE; run with NCCL_DEBUG=INFO "
                "(ASCEND_GLOBAL_LOG_LEVEL for HCCL) for the failing call.",
    DRIVER: "Check the driver and runtime against the wheel: `nvidia-smi` / `npu-smi info` versions, the CUDA or CANN "
            "version the torch build needs, WSL's kernel; upgrade the driver (firmware/HDK on Ascend).",
    UNSUPPORTED: "Choose what the device supports: `--dtype half` on GPUs before compute capability 8.0 (V100, T4), "
                 "an FP8 or LoRA kernel only on GPUs that have it, or a newer device; for a Triton kernel over the "
                 "device's shared memory, a release whose kernel configurations fit this GPU, or another dtype or "
                 "quantization that avoids that kernel.",
}


_EVERY_WORD = Words(w for _, _, words, _ in WORDINGS for w in words)


_OWN_KILL = "fatal signal from worker processes"
"""vLLM's own shutdown when a worker raised: the engine client logs "Got fatal signal from worker processes, shutting
down. See stack trace above for root cause issue." and kills its own process tree (``kill_process_tree``, SIGKILL:
vllm/v1/engine/core_client.py), so the shell's "Killed" after it is vLLM's, the worker's error the cause."""
_SHELL_KILLED = re.compile(r"^\s*(?:\S+:\s*)?Killed\s*$")


def failures(lines: list[str], where: Where | None = None) -> list[tuple[str, str, int]]:
    """Every line whose error is one of ``WORDINGS``: (kind, what prints it, 1-based line), but the shell's "Killed"
    after vLLM killed itself (``_OWN_KILL``). ``where``: the lines each word is on
    (``kvaudit.triage.lines.lines_holding``), where the caller has them already."""
    if where is None:
        where = lines_holding([line.lower() for line in lines], _EVERY_WORD)
    holding = [where.any_of(words) for _, _, words, _ in WORDINGS]
    own_kill = next((n for n, line in enumerate(lines, 1) if _OWN_KILL in line), None) \
        if where.any_of(("killed",)) else None
    out: list[tuple[str, str, int]] = []
    for n in sorted(set().union(*holding)):
        line = lines[n - 1]
        if own_kill is not None and n > own_kill and _SHELL_KILLED.match(line):
            continue
        for (kind, what, _, rx), lines_of in zip(WORDINGS, holding):
            if n in lines_of and rx.search(line):
                out.append((kind, what, n))
                break
    return out


def blames_driver(title: str) -> bool:
    """Whether an issue's title names the driver beside a failure, as what it suspects ("英伟达最新驱动555.85，vllm运行报错")."""
    return _DRIVER_TITLE.search(title) is not None and _FAILED.search(title) is not None
