"""Launches read as vLLM reads them (kvaudit/triage/commands.py), and what the reader makes of the failures, releases and
figures users write (kvaudit/triage/failures.py, kvaudit/triage/changes.py, the release claims of kvaudit/triage/evidence.py)."""

from __future__ import annotations

import pytest

from conftest import ROOT
from kvaudit.triage import commands
from kvaudit.triage.changes import between, since_before
from kvaudit.triage.evidence import clean_lines, extract
from kvaudit.triage.failures import COLLECTIVE, DRIVER, HOST, UNSUPPORTED, failures

pytestmark = pytest.mark.fast

needs_parser = pytest.mark.skipif(commands.parser_name() is None, reason="vLLM's parser is not installed")


def _facts(text: str) -> dict:
    ev = extract(clean_lines(text))
    return {k: [f.value for f in v] for k, v in ev.facts.items()}


def _launch(text: str) -> dict:
    launch = commands.read_words(commands.command_words(commands.split(text)))
    return dict(launch.facts) | {"unread": launch.unread, "parser": launch.parser}


@needs_parser
def test_every_form_vllms_parser_takes():
    got = _launch("Qwen/Qwen3-8B --gpu-memory-utilization=0.4 --max_model_len=512 -tp 4 --max-num-batched-tokens 32k "
                  "--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}' --enforce-eager")
    assert (got["model"], got["gpu_memory_utilization"], got["max_model_len"], got["tp"]) == ("Qwen/Qwen3-8B", 0.4,
                                                                                                512, 4)
    assert got["max_num_batched_tokens"] == 32000 and got["kv_connector"] == "NixlConnector" and got["enforce_eager"] is True
    assert got["parser"].startswith("vLLM ") and got["unread"] == ()


@needs_parser
def test_a_flag_stated_at_its_default_is_still_a_fact():
    assert _launch("m --tensor-parallel-size 1 --gpu-memory-utilization 0.9")["tp"] == 1


@needs_parser
def test_what_the_parser_does_not_take_is_evidence_not_a_failure():
    got = _launch("--model /m/x --tensor-parallel-size $TP --use-v2-block-manager --host 0.0.0.0 --port 8000 "
                  "--config /etc/vllm.yaml --max-model-len 8192")
    assert got["model"] == "/m/x" and got["max_model_len"] == 8192 and "tp" not in got
    unread = " ".join(got["unread"])
    for part in ("$TP", "--use-v2-block-manager", "--host=0.0.0.0", "--port 8000", "/etc/vllm.yaml"):
        assert part in unread, part


def test_words_split_as_a_shell_splits_them():
    assert commands.split("serve 'a b' --x=\"1 2\" # comment") == ["serve", "a b", "--x=1 2"]
    assert commands.command_words(["m", "--tp", "2", "2>&1", "|", "tee", "log"]) == ["m", "--tp", "2"]
    assert commands.expand("--max-model-len ${MML:-4096} --tp $TP $UNSET", {"TP": "8"}) == \
        "--max-model-len 4096 --tp 8 $UNSET"
    assert commands.split("it's an unbalanced quote") == ["it's", "an", "unbalanced", "quote"]


def test_without_vllm_kvaudits_own_reader_takes_the_common_flags(monkeypatch):
    monkeypatch.setattr(commands, "_PARSER", [None])
    got = _launch("/m/qwen --gpu-memory-utilization=0.4 -tp 2 --max_model_len 32k --trust-remote-code --enforce-eager")
    assert (got["model"], got["gpu_memory_utilization"], got["tp"], got["max_model_len"]) == ("/m/qwen", 0.4, 2, 32000)
    assert got["enforce_eager"] is True and "not installed" in got["parser"]


def test_python_launches_are_read_through_ast_never_run(tmp_path):
    marker = tmp_path / "ran"
    got = commands.read_call(f"LLM(model=name, tensor_parallel_size=2, gpu_memory_utilization=.5, "
                             f"max_model_len=__import__('os').system('touch {marker}'), enforce_eager=True)",
                             {"name": "meta-llama/Llama-3.1-8B"})
    facts = dict(got.facts)
    assert facts == {"model": "meta-llama/Llama-3.1-8B", "tp": 2, "gpu_memory_utilization": 0.5, "enforce_eager": True}
    assert not marker.exists()
    logged = commands.read_call("{'model': '/q', 'max_model_len': 1024, 'kv_transfer_config': "
                                "KVTransferConfig(kv_connector='P2pNcclConnector')}", {})
    assert dict(logged.facts) == {"model": "/q", "max_model_len": 1024, "kv_connector": "P2pNcclConnector"}


def test_an_argument_list_in_an_environment_variable():
    """The flags of a VLLM_ARGS line in their = form (vllm issue: util 0.4 and max-model-len 512 were missed)."""
    got = _facts('docker run -e VLLM_ARGS="--gpu-memory-utilization=0.4 --max-model-len=512" img\n'
                 'VLLM_ARGS="--gpu-memory-utilization=0.4 --max-model-len=512"\nCUDA out of memory')
    assert got["gpu_memory_utilization"] == [0.4, 0.4] and got["max_model_len"] == [512, 512]  # the launch's, then
    # the docker line's, read as settings stated outside a launch


@pytest.mark.parametrize("sentence, works, fails", [
    ("[Bug]: Severe OOM in 0.8.3 （ok in 0.7.2）", ["0.7.2"], ["0.8.3"]),
    ("[Bug]: VLLM 0.8.2 OOM error (No error in 0.7.3 version)", ["0.7.3"], ["0.8.2"]),
    ("[Bug]: v0.6.4 needs more memory than v0.6.3", ["0.6.3"], ["0.6.4"]),
    ("it works well in vllm 0.2.6 but run out of memory using 0.2.7.", ["0.2.6"], ["0.2.7"]),
    ("after upgrading from vllm0.7.3 to vllm0.8.2, OOM at start", ["0.7.3"], ["0.8.2"]),
    ("Since vLLM 0.2.5, we can't even run llama-2 70B anymore", [], ["0.2.5"]),
    ("[Bug]: Out of Memory error in 0.8.0 and 0.8.1. Worked fine in the previous versions", [], ["0.8.0", "0.8.1"]),
    ("I run vllm 0.8.5 with TP 4", [], []),
    ("[Bug]: torch.OutOfMemoryError for 0.6.4.post1 but 0.6.3.post1 is working", ["0.6.3.post1"], ["0.6.4.post1"]),
])
def test_two_releases_in_one_sentence(sentence, works, fails):
    got = _facts(sentence)
    assert got.get("release_works", []) == works and got.get("release_fails", []) == fails


@pytest.mark.parametrize("line, version", [
    ("[Bug]: 0.18.0版本4台A2拉起deepseek v4 pro", "0.18.0"), ("[Bug] [0.2.7] OOM with llama", "0.2.7")])
def test_a_bare_release_in_a_title(line, version):
    assert _facts(line)["title_version"] == [version]


def test_a_release_candidate_written_with_a_dot():
    assert _facts("vllm v0.8.4.rc2 oom")["vllm_prose"] == ["0.8.4rc2"]


def test_changes_between_releases():
    assert [c.release for c in between("0.7.3", "0.8.2")] == ["0.8.0"]
    assert [c.release for c in between("0.2.6", "0.2.7")] == ["0.2.7"]
    assert between("0.8.2", "0.7.3") == [] and between("0.8.1", "0.8.3") == []
    assert [c.release for c in since_before("0.2.5")] == ["0.2.5"]
    assert [c.release for c in since_before("0.8.1")] == ["0.8.0"]
    assert [c.release for c in between("0.23.0", "0.25.1")] == ["0.25.0"]  # Model Runner V2 (vllm issue 49224)
    assert [c.release for c in between("0.19.1", "0.20.2")] == ["0.20.0"]  # graph memory taken from the KV budget
    assert between("0.20.2", "0.22.0") == []  # (vllm/envs.py of 0.20.0 already defaults the estimate on)


def test_a_change_named_by_its_switch():
    got = _facts("[Bug]: Model Runner V2 (now default for dense models) skips CUDA graph memory reservation\n"
                 "export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1")
    assert got["change_named"] == ["0.20.0", "0.25.0"]
    assert "change_named" not in _facts("vllm serve m --enforce-eager  # the model runner is fine")


DEVELOP = ROOT / "fixtures" / "reports" / "develop"


@pytest.mark.parametrize("report, kind", [
    ("vllm-1160.txt", HOST), ("vllm-ascend-3314.txt", HOST), ("vllm-19613.txt", COLLECTIVE),
    ("vllm-ascend-405.txt", COLLECTIVE), ("vllm-1772.txt", DRIVER), ("vllm-6184.txt", DRIVER),
    ("vllm-ascend-4972.txt", DRIVER)])
def test_failures_outside_the_plan_by_their_wording(report, kind):
    found = failures(clean_lines((DEVELOP / report).read_text()))
    assert found and found[0][0] == kind, found


def test_a_device_out_of_memory_is_no_failure_outside_the_plan():
    for report in ("threads/vllm-ascend-3308.txt", "threads/vllm-10569.txt", "ascend-0.11-qwen3-next-oom.log"):
        lines = clean_lines((ROOT / "fixtures" / "reports" / report).read_text())
        assert failures(lines) == [], report


def test_a_message_a_paste_wrapped_onto_the_next_line_is_read_whole():
    """vLLM 0.23's refusal (vllm/v1/core/kv_cache_utils.py) as a quoted block wraps it, at the comma."""
    got = _facts("> ValueError: To serve at least one request with the model's max seq len (196608),\n"
                 "> (23.25 GiB KV cache is needed, which is larger than the available KV cache memory (22.50 GiB). "
                 "Based on the available memory, the estimated maximum model length is 188416.")
    assert got["max_model_len"] == [196608] and got["estimated_max_model_len"][0] == 188416
    assert got["kv_needed"] == [round(23.25 * (1 << 30))] and got["kv_capacity_error"]


@pytest.mark.parametrize("sentence, util, mml", [
    ("I set gpu_memory_utilization to 0.95 and max_model_len=16000 but it OOMs", [0.95], [16000]),
    ("我把显存利用率设置为0.8，max model len 为 32768", [0.8], [32768]),
    ("(EngineCore pid=1) INFO gpu_memory_utilization=0.9", [], []),  # a program's line, not a sentence
    ("--max-model-len set to 512, gpu_memory_utilization is set to 0.8", [0.8], [512]),
])
def test_values_stated_in_sentences(sentence, util, mml):
    got = _facts(sentence)
    assert got.get("util_prose", []) == util and got.get("mml_prose", []) == mml


def test_a_sentence_that_begins_with_a_flag_is_no_launch():
    """"--max-model-len set to 512" (vllm issue 4369): argparse refuses 'set', and 'to' is no model."""
    got = _facts("i have 2 * v100-16G\n--max-model-len set to 512\nthen i got OOM")
    assert "model" not in got and got["mml_prose"] == [512]
    assert _facts("--max-model-len 512 --tensor-parallel-size $TP")["max_model_len"] == [512]


@pytest.mark.parametrize("line, kind", [
    # torch's ProcessGroupNCCL watchdog (vllm issue 3071)
    ("[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4967570, "
     "OpType=ALLREDUCE, NumelIn=73728, NumelOut=73728, Timeout(ms)=1800000) ran for 1800542 milliseconds", COLLECTIVE),
    ("为什么已经降到0.1.4了，还是报cuda版本低", DRIVER),  # vllm issue 2623
    ("my two Nvlinked 3090's can not do p2p and work with tensor parallel", DRIVER),  # vllm issue 8303
    ("RuntimeError: CUDA error: peer access is not supported between these two devices", DRIVER),
    ("The detected CUDA version (12.1) mismatches the version that was used to compile PyTorch (11.8).", DRIVER),
    ("在WSL2环境下的多卡，vllm启动，QWEN3-VL-30B-A3B会出现NCCL999的错误。", COLLECTIVE),  # QwenLM/Qwen3-VL issue 1650
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has "
     "compute capability 7.5.", UNSUPPORTED),  # vllm issue 1400
    ("punica LoRA kernels require compute capability >= 8.0", UNSUPPORTED),  # vllm issue 3197
    ("VLLM::Worker_TP invoked oom-killer: gfp_mask=0x102cc2(GFP_HIGHUSER)", HOST),  # the kernel's own line
    ("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=python3,pid=4321", HOST),
    ("the container got OOM-killed after loading", HOST),
])
def test_collective_and_driver_failures_by_their_wording(line, kind):
    assert [k for k, _, _ in failures([line])] == [kind]


@pytest.mark.parametrize("line", ["CUDA version 12.1", "the driver is fine", "--kv-transfer-config with the p2p nccl "
                                  "connector", "NCCL_DEBUG=INFO",
                                  # a device out-of-memory that ended the engine (vllm issue 53413)
                                  "batch gets large enough. The OOM kills EngineCore, so every in-flight request fails"])
def test_lines_that_name_a_driver_or_nccl_without_a_failure(line):
    assert failures([line]) == []


@pytest.mark.parametrize("line", ["总是报显存过小问题", "跑起来就爆显存", "RuntimeError: not enough GPU memory for the KV cache"])
def test_device_memory_running_out_in_other_words(line):
    assert _facts(line).get("oom_mentioned") == [True]


@pytest.mark.parametrize("line", ["the host has not enough memory to load it", "insufficient memory on the node"])
def test_memory_not_named_the_devices_is_no_device_oom(line):
    assert "oom_mentioned" not in _facts(line)


def test_the_ascend_driver_out_of_streams_is_the_drivers():
    lines = clean_lines((ROOT / "fixtures" / "reports" / "held-out-2" / "vllm-ascend-2629.txt").read_text())
    assert failures(lines)[0][0] == DRIVER


_CONFIG = """I start it with `vllm serve --config config.yaml`, config.yaml:
```yaml
model: Qwen/Qwen2.5-72B-Instruct
tensor-parallel-size: 2
gpu_memory_utilization: 0.95
max-model-len: 32768
enforce-eager: true
```
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.
"""

_POD = """my deployment.yaml:
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.8.5
        command: ["vllm", "serve"]
        args:
          - meta-llama/Llama-3.1-70B-Instruct
          - --tensor-parallel-size
          - "8"
          - --max-model-len=16384
"""


def test_a_pasted_config_file_is_read_with_vllms_own_rules():
    """vLLM's --config YAML (keys are engine arguments, ``true`` a bare flag), read by the parser's own
    load_config_file where vLLM is installed; the config file the launch names is then no unread flag."""
    got = _facts(_CONFIG)
    assert (got["model"], got["tp"], got["gpu_memory_utilization"], got["max_model_len"]) == (
        ["Qwen/Qwen2.5-72B-Instruct"], [2], [0.95], [32768])
    assert got["enforce_eager"] == [True]
    assert not any(u.startswith("--config") for u in got.get("unread_flag", []))


def test_a_container_specs_command_and_args_are_a_launch():
    got = _facts(_POD)
    assert (got["model"], got["tp"], got["max_model_len"]) == (["meta-llama/Llama-3.1-70B-Instruct"], [8], [16384])
    compose = _facts("services:\n  vllm:\n    image: vllm/vllm-openai:latest\n"
                     "    command: --model mistralai/Mistral-7B-v0.1 --gpu-memory-utilization 0.8\n")
    assert compose["model"] == ["mistralai/Mistral-7B-v0.1"] and compose["gpu_memory_utilization"] == [0.8]


def test_a_docstrings_argument_list_is_no_config():
    """vLLM's own docstring pasted ("gpu_memory_utilization: The ratio (between 0 and 1) ..."): prose, not values."""
    got = _facts("    Args:\n        model: The name or path of a HuggingFace Transformers model.\n"
                 "        gpu_memory_utilization: The ratio (between 0 and 1) of GPU memory to\n"
                 "            reserve for the model weights.\n")
    assert "gpu_memory_utilization" not in got and "model" not in got


def test_without_vllm_a_config_file_is_read_by_kvaudits_own_reader(monkeypatch):
    monkeypatch.setattr(commands, "_PARSER", [None])
    got = _facts(_CONFIG.replace("config.yaml", "own.yaml"))  # (launches read earlier are memoized)
    assert (got["tp"], got["gpu_memory_utilization"], got["max_model_len"]) == ([2], [0.95], [32768])
    assert got["launch_parser"] == [commands.OWN_READER] * 2


@pytest.mark.parametrize("sentence, key, value", [
    ("[Bug]: Model Runner V2 skips CUDA graph memory reservation, causing OOM during `capture_model()`", "capture_oom",
     True),  # vllm issue 49224
    ("it crashes during CUDA-graph capture with `torch.OutOfMemoryError`", "capture_oom", True),
    ("随着访问次数的增加，可以看到显存慢慢增大，最终会报OOM错误", "memory_growth", True),  # QwenLM/Qwen3-VL issue 1522
    ("the GPU memory usage reaches 65GB, leading to an OOM error after running for two days.", "memory_growth", True),
    ("It took 75 G of video memory(A800, 80G), why?", "memory_question", True),  # vllm issue 527
    ("i don't find how unload model. i delete the object and call the garbage collector", "not_released",
     "how unload model"),  # vllm issue 3281
    ("Would anyone have an example of how I could run Llama 3 on an NVIDIA RTX 4060 TI 16GB?", "device_nominal_gb", 16),
])
def test_what_reporters_say_in_their_own_words(sentence, key, value):
    assert _facts(sentence).get(key, [None])[0] == value


def test_capturing_graphs_named_without_a_failure_is_no_capture_oom():
    assert "capture_oom" not in _facts("We are capturing CUDA graphs now; no OOM so far")


@pytest.mark.parametrize("line, kind", [
    ("In my case I can deploy on a single GPU, but with multi gpu I meet the ray OOM error.", HOST),  # vllm issue 322
    ("WARNING: The object store is using /tmp instead of /dev/shm because /dev/shm has only 67108864 bytes available.",
     COLLECTIVE),  # Ray's warning: a container's 64 MB /dev/shm, too small for NCCL (vllm issue 1710)
])
def test_ray_and_shared_memory(line, kind):
    assert [k for k, _, _ in failures([line])] == [kind]


@pytest.mark.parametrize("path, n, kind", [
    ("held-out-2/vllm-ascend-168.txt", 75, DRIVER),  # torch_npu's SetDevice, runtime code 107001: an invalid device id
    ("held-out-4/vllm-ascend-6676.txt", 4, DRIVER),  # a CANN operator package built for another chip
])
def test_the_ascend_runtimes_own_errors_are_the_runtime(path, n, kind):
    assert [k for k, _, _ in failures([_line(path, n)])] == [kind]
    assert failures(["RuntimeError: NPU function error: aclrtMalloc, error code is 207001"]) == []  # memory's code


def _line(path: str, n: int) -> str:
    return (ROOT / "fixtures" / "reports" / path).read_text().splitlines()[n - 1]


@needs_parser
def test_settings_stated_in_sentences_are_read_by_vllms_parser():
    """An engine argument outside a launch (a flag in a sentence or backticks, a name with "=" or ":", the parser's
    aliases as words) is read as a launch's; each occurrence on its own, a sentence's first first."""
    docker = _line("held-out-1/vllm-10360.txt", 8)  # "... with the following Docker launch settings: --model ..."
    assert commands.stated_settings(docker).facts == (("max_model_len", 4096), ("gpu_memory_utilization", 0.15))
    wsl = _line("held-out-1/zai-org-Open-AutoGLM-133.txt", 4)  # "... --max-model-len 4096  文档里面是  --max-model-len 25480"
    assert commands.stated_settings(wsl).facts == (("max_model_len", 4096), ("max_model_len", 25480))
    assert _facts(wsl)["max_model_len"][0] == 4096
    card = _line("threads/vllm-ascend-89.txt", 3)  # "... on one card (TP=PP=1) ..."
    assert dict(commands.stated_settings(card).facts) == {"pp": 1}
    assert commands.stated_settings("`gpu_memory_utilization: 0.85`, tensor_parallel_size=4, -dp 2").facts == (
        ("gpu_memory_utilization", 0.85), ("tp", 4), ("dp", 2))
    assert commands.stated_settings("我设置了TP=8，为什么还是OOM？").facts == (("tp", 8),)


@needs_parser
def test_what_a_sentence_names_without_stating_it_ran_is_no_setting():
    eager = _line("threads/vllm-16570.txt", 52)  # "Hi,with --enforce-eager, it startup~": a workaround
    assert commands.stated_settings(eager).facts == ()
    logged = _line("threads/vllm-15598.txt", 50)  # vLLM's own advice in a log record whose prefix the paste cut
    assert commands.stated_settings(logged.replace("'--enforce-eager'", "'--max-num-seqs 8'")).facts == ()
    assert commands.stated_settings("Can you retry with --max-model-len 4096?").facts == ()  # a suggestion
    assert commands.stated_settings("n=5, q: 3, model: foo, the answer: 42").facts == ()  # no engine argument
    both = _facts("the docs say --max-model-len 8192\nvllm serve m --max-model-len 2048")
    assert both["max_model_len"] == [2048, 8192]  # the launch's own comes first, wherever the sentence is


def test_without_vllm_settings_in_sentences_are_read_by_kvaudits_own_reader(monkeypatch):
    monkeypatch.setattr(commands, "_PARSER", [None])
    monkeypatch.setattr(commands, "_NAMES", [])
    assert commands.stated_settings("set `--gpu-memory-utilization=0.95`, TP=8 and max_model_len: 32k").facts == (
        ("gpu_memory_utilization", 0.95), ("tp", 8), ("max_model_len", 32000))


def test_a_devices_size_stated_with_its_noun_is_read_and_an_amount_of_memory_is_not():
    """"24Gb的卡", "4x16GB GPU cards", "per 24 GB GPU" state a device's size; "14GB NPU memory" and "22-23 GiB VRAM"
    are amounts in use (the real lines of each thread)."""
    def sizes(path: str, n: int) -> list:
        return _facts(_line(path, n)).get("device_nominal_gb", [])

    assert sizes("develop/QwenLM-Qwen3-VL-482.txt", 3) == [24]
    assert sizes("held-out-1/vllm-586.txt", 2) == [16]
    assert sizes("held-out-5/vllm-42049.txt", 6) == [24, 24]  # the RTX 4090's and the sentence's; not the 23 in use
    assert sizes("threads/vllm-ascend-89.txt", 5) == []  # "the weights ... only occupy 14GB NPU memory"
    assert _facts("running it on a 32GB vNPU")["device_nominal_gb"] == [32]  # (issue 32's own example)


@needs_parser
def test_what_the_parser_refused_reads_the_same_on_every_run():
    """vllm-project/vllm#15529 (held-out-16): ``--limit-mm-per-prompt image=2`` is refused by vLLM 0.33's parser with
    argparse's "cannot be converted to <function loads at 0x...>": the address, which differs from run to run, is not
    kept, so a report's evidence is the same each time."""
    refused = [u for u in _launch("--limit-mm-per-prompt image=2 --max-model-len 8192")["unread"]
               if u.startswith("--limit-mm-per-prompt")]
    assert refused and "<function loads>" in refused[0] and " at 0x" not in refused[0]
