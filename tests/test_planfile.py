"""``kvaudit plan --save`` and ``kvaudit audit --plan``: the saved plan audits exactly as the live one,
needs only torch, and refuses what it cannot do in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, deployment, each_vllm, plan_for
from kvaudit.cli import main
from kvaudit.plan import planfile

QWEN = ["--preset", "qwen3-next", "--util", "0.7"]


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Qwen3-Next TP 4 at 0.7, planned by the vLLM here under the four built-in strategies' rules."""
    path = tmp_path_factory.mktemp("plans") / "qwen3-next.plan.json"
    assert main(["plan", *QWEN, "--save", str(path), "--format", "json"]) == 0
    return path


@pytest.fixture(scope="module")
def saved_scaled(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "qwen3-next-16.plan.json"
    assert main(["plan", *QWEN, "--num-blocks", "16", "--max-model-len", "1024", "--save", str(path), "--format", "json"]) == 0
    return path


@each_vllm
@pytest.mark.parametrize("fmt", ["json", "table"])
def test_saved_plan_on_meta_is_the_live_audit_byte_for_byte(saved, fmt, capsys):
    live = _run(["audit", *QWEN, "--meter", "meta", "--format", fmt], capsys)
    again = _run(["audit", "--plan", str(saved), "--meter", "meta", "--format", fmt], capsys)
    assert again[0] == live[0] == 1
    assert again[1] == live[1]
    assert again[2].splitlines()[-1] == live[2].splitlines()[-1]  # the summary line too


def test_saved_plan_in_a_fresh_process_is_the_live_audit(saved, capsys):
    """Where vLLM is installed but not yet imported, rebuilding the plan's KVCacheConfig for the vllm
    strategy imports it: that must happen before the meter's window (an import allocates)."""
    live = _run(["audit", *QWEN, "--format", "json"], capsys)[1]
    p = subprocess.run([sys.executable, "-m", "kvaudit", "audit", "--plan", str(saved), "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and p.stdout == live, p.stderr


def test_saved_plan_on_cpu_is_the_live_audit_byte_for_byte(saved_scaled, capsys):
    live = _run(["audit", *QWEN, "--num-blocks", "16", "--max-model-len", "1024", "--meter", "cpu", "--format", "json"], capsys)
    again = _run(["audit", "--plan", str(saved_scaled), "--meter", "cpu", "--format", "json"], capsys)
    assert again[1] == live[1] and again[0] == live[0] == 1
    doc = json.loads(again[1])
    assert doc["meter"] == "cpu" and all(a["reading"]["allocated"] > 0 for a in doc["audits"])


def test_saved_plan_audits_where_vllm_cannot_be_imported(saved, capsys):
    """The subprocess hides vLLM (imports and metadata): the strategies that need only torch are audited
    as in the live audit; the vllm strategy runs vLLM's own allocate_kv_cache for a 0.29+ plan, so
    there it is not audited, saying why (a shared_by plan's per-tensor loop needs no vLLM)."""
    p = subprocess.run([sys.executable, str(ROOT / "tests/without.py"), "vllm", "audit", "--plan", str(saved),
                        "--format", "json"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().splitlines()[-1] == "imported: none"
    hidden = json.loads(p.stdout)
    live = json.loads(_run(["audit", *QWEN, "--format", "json"], capsys)[1])
    by_name = {a["strategy"]: a for a in live["audits"]}
    for a in hidden["audits"]:
        assert a == by_name[a["strategy"]]
    layers_format = live["plan"]["plan_format"] == "layers"
    audited = {a["strategy"] for a in hidden["audits"]}
    assert audited == ({"ascend-0.11", "ascend-0.12", "ascend-0.16"} if layers_format else set(by_name))
    if layers_format:
        (skip,) = hidden["skipped"]
        assert skip["strategy"] == "vllm" and "vLLM is not installed here" in skip["reason"]


@each_vllm
def test_vllm_objects_round_trip_into_vllms_own_classes():
    d = deployment()
    for platform in ("cuda", "ascend-align128", "ascend-contiguous"):
        cfg = plan_for(d, platform).kv_cache_config
        data = json.loads(json.dumps(planfile.encode(cfg)))
        again = planfile.decode(data)
        assert type(again) is type(cfg) and again == cfg


@pytest.mark.parametrize("entry", [{"class": "os:system", "fields": {}}, {"enum": "subprocess:Popen", "name": "x"},
                                   {"class": "vllm.config:get_current_vllm_config", "fields": {}},
                                   {"dtype": "load"}])
def test_decode_looks_up_only_vllms_dataclasses_and_enums_and_torch_dtypes(entry):
    with pytest.raises(ValueError):
        planfile.decode(entry)


@each_vllm
def test_the_plan_file_holds_the_plan_as_data(saved):
    doc = json.loads(saved.read_text())
    (stage,) = doc["stages"]
    assert doc["format"] == "kvaudit-plan" and doc["vllm_version"]
    assert set(stage["plans"]) == {"cuda", "ascend-align128", "ascend-contiguous"}
    assert stage["strategies"] == {"vllm": "cuda", "ascend-0.11": "ascend-align128",
                                   "ascend-0.12": "ascend-align128", "ascend-0.16": "ascend-contiguous"}
    dep = stage["deployment"]
    assert dep["tp"] == 4 and dep["gpu_memory_utilization"] == 0.7
    assert dep["model"]["config"]["model_type"] == "qwen3_next"
    plan = stage["plans"]["ascend-contiguous"]
    assert plan["block_size"] == 512 and len(plan["tensors"]) == 12 and len(plan["layer_specs"]) == 48
    assert plan["capacity"]["tokens"] > 0 and "kv_cache_config" in plan["vllm_objects"]


def _edited(saved, tmp_path, edit):
    doc = json.loads(saved.read_text())
    edit(doc)
    path = tmp_path / "edited.plan.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_plan_of_another_vllm_is_audited_without_that_vllms_code(saved, tmp_path, capsys):
    def other(doc):
        doc["vllm_version"] = "0.0.1"
        for pl in doc["stages"][0]["plans"].values():
            pl["vllm_version"] = "0.0.1"

    path = _edited(saved, tmp_path, other)
    code, out, err = _run(["audit", "--plan", str(path), "--format", "json"], capsys)
    doc = json.loads(out)
    assert doc["vllm_version"] == "0.0.1" and "planned by vLLM 0.0.1" in err
    if doc["plan"]["plan_format"] == "layers":
        (skip,) = doc["skipped"]
        assert skip["strategy"] == "vllm" and "vLLM 0.0.1 made this plan" in skip["reason"]
    assert {a["strategy"] for a in doc["audits"]} >= {"ascend-0.11", "ascend-0.12", "ascend-0.16"}


def test_a_strategy_whose_rule_was_not_saved_is_not_audited_saying_how_to_save_it(tmp_path, capsys):
    path = tmp_path / "one.plan.json"
    assert main(["plan", *QWEN, "-s", "ascend-0.16", "--save", str(path)]) == 0
    capsys.readouterr()
    code, out, err = _run(["audit", "--plan", str(path), "-s", "ascend-0.16", "-s", "ascend-0.11",
                           "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 3 and [a["verdict"] for a in doc["audits"]] == ["PASS"]
    (skip,) = doc["skipped"]
    assert skip["strategy"] == "ascend-0.11" and "--strategy ascend-0.11 --save" in skip["reason"]


def test_release_code_needs_the_live_plan(saved, capsys):
    code, out, err = _run(["audit", "--plan", str(saved), "-s", "vllm-ascend==0.13.0", "--format", "json"], capsys)
    (skip,) = json.loads(out)["skipped"]
    assert code == 3 and "needs the vLLM objects of a live plan" in skip["reason"]


@pytest.mark.parametrize("content, message", [
    (None, "x.plan.json: no such file (write one with: kvaudit plan --preset MODEL --save FILE)"),
    ("{", "x.plan.json: not JSON (Expecting property name enclosed in double quotes at line 1 column 2;"),
    ("", "x.plan.json: empty file, not a kvaudit plan file"),
    ('{"format": "kvaudit-report"}', "is not a kvaudit plan file"),
    ('{"format": "kvaudit-plan", "format_version": 99}', "is plan format 99"),
    ('{"format": "kvaudit-plan", "format_version": 1, "stages": [{"plans": {}}]}', "stages[0] has no 'deployment'"),
    ('{"format": "kvaudit-plan", "format_version": 1, "stages": []}', "holds no plan"),
])
def test_a_file_that_is_not_a_plan_is_one_line_and_exit_2(content, message, tmp_path, capsys):
    path = tmp_path / "x.plan.json"
    if content is not None:
        path.write_text(content)
    code, out, err = _run(["audit", "--plan", str(path)], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_an_edited_plan_entry_is_named(saved, tmp_path, capsys):
    path = _edited(saved, tmp_path, lambda doc: doc["stages"][0]["deployment"].update(colour="red"))
    code, out, err = _run(["audit", "--plan", str(path)], capsys)
    assert code == 2 and "stages[0].deployment has an unknown entry 'colour'" in err


@pytest.mark.parametrize("extra, flag", [(["--util", "0.8"], "--util"), (["--tp", "2"], "--tp"),
                                         (["--preset", "qwen3-next"], "--preset"), (["--kv-transfer"], "--kv-transfer"),
                                         (["--num-blocks", "4"], "--num-blocks")])
def test_options_that_would_change_a_saved_plan_are_refused(saved, extra, flag, capsys):
    code, out, err = _run(["audit", "--plan", str(saved), *extra], capsys)
    assert code == 2 and f"kvaudit: error: {flag} cannot change a saved plan" in err


@pytest.mark.skipif(not os.environ.get("KVAUDIT_OTHER_TORCH_PYTHON"),
                    reason="set KVAUDIT_OTHER_TORCH_PYTHON to a python with another torch (and rich), no vLLM")
def test_saved_plan_under_another_torch(saved, capsys):
    """The device host's torch differs from the lean install's (torch 2.11 on the GPU machine lent here):
    the saved plan audits there as the live audit here, for every strategy that runs without vLLM."""
    other = os.environ["KVAUDIT_OTHER_TORCH_PYTHON"]
    p = subprocess.run([other, "-m", "kvaudit", "audit", "--plan", str(saved), "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    there = json.loads(p.stdout)
    live = {a["strategy"]: a for a in json.loads(_run(["audit", *QWEN, "--format", "json"], capsys)[1])["audits"]}
    assert there["audits"] and all(a == live[a["strategy"]] for a in there["audits"])


@each_vllm
def test_a_plugin_written_against_kvcacheconfig_gets_vllms_object_rebuilt(saved, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "tests/plugins"))
    code, out, err = _run(["audit", "--plan", str(saved), "-s", "kvaudit_testplugin:one_buffer_per_tensor",
                           "-s", "kvaudit_testplugin:doubled", "--format", "json"], capsys)
    doc = json.loads(out)
    ratios = {a["strategy"]: round(a["ratio"], 2) for a in doc["audits"]}
    assert ratios == {"kvaudit_testplugin:one_buffer_per_tensor": 1.0, "kvaudit_testplugin:doubled": 2.0}
    assert doc["skipped"] == [] and code == 1


def _remote_code_folder(tmp_path):
    """A model folder whose configuration code, imported under ``trust_remote_code``, leaves a marker file."""
    folder = tmp_path / "evil-model"
    folder.mkdir()
    marker = tmp_path / "code-ran"
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil", "architectures": ["LlamaForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    (folder / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig\n\n\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    return folder, marker


@pytest.mark.parametrize("where", ["kv_cache_config", "tensor", "layout"])
def test_a_plan_file_never_runs_code(saved, tmp_path, capsys, where):
    """A plan file naming a vLLM class outside the KV-cache interface (here ``ModelConfig`` with
    ``trust_remote_code``, which imports Python from the folder it names) is refused as it is read, before
    any strategy rebuilds vLLM's objects: the folder's code never runs."""
    folder, marker = _remote_code_folder(tmp_path)
    evil = {"class": "vllm.config:ModelConfig", "fields": {"model": str(folder), "trust_remote_code": True}}

    def edit(doc):
        objects = doc["stages"][0]["plans"]["cuda"]["vllm_objects"]
        if where == "kv_cache_config":
            objects["kv_cache_config"] = evil
        elif where == "tensor":
            objects["kv_cache_config"]["fields"]["kv_cache_tensors"][0] = evil
        else:
            objects["kv_cache_layout"] = {"enum": "vllm.config:ModelConfig", "name": "x"}

    path = _edited(saved, tmp_path, edit)
    code, out, err = _run(["audit", "--plan", str(path), "-s", "vllm", "--meter", "meta"], capsys)
    assert not marker.exists(), "the plan file ran code"
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "vllm.config:ModelConfig" in err and "not one of the vLLM KV-cache interface" in err


@pytest.mark.parametrize("name, why", [
    ("vllm.v1.kv_cache_interface:KVQuantMode", "not a KVCacheSpec"),  # a class of that module, not a spec
    ("vllm.v1.kv_cache_interface:torch", "not a class defined in"),  # a name the module imports
    ("vllm.v1.kv_cache_interface:copy.deepcopy", "not one of the vLLM KV-cache interface"),
])
def test_only_kv_cache_interface_classes_are_rebuilt(name, why):
    pytest.importorskip("vllm")
    data = {"class": name, "fields": {}}
    with pytest.raises(ValueError, match=why):
        planfile.check_objects(data)
        planfile.decode(data)


@each_vllm
def test_a_saved_plan_rebuilds_into_vllms_kv_cache_config(saved):
    pytest.importorskip("vllm")
    from vllm.v1.kv_cache_interface import KVCacheConfig

    (stage,) = planfile.load(saved).stages
    cfg = planfile.decode(stage.plans["cuda"].saved_vllm["kv_cache_config"])
    assert isinstance(cfg, KVCacheConfig) and cfg.num_blocks == stage.plans["cuda"].num_blocks


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["stages"][0]["plans"]["cuda"].update(num_blocks="many"), "num_blocks is \"many\", not int"),
    (lambda d: d["stages"][0]["plans"]["cuda"].update(num_blocks=0), "num_blocks is 0, not in [1,"),
    (lambda d: d["stages"][0]["plans"]["cuda"]["tensors"][0].update(shared_by=[]), "tensors[0] is shared by no layer"),
    (lambda d: d["stages"][0]["plans"]["cuda"]["groups"][0].update(page_size_bytes=-1), "page_size_bytes is -1"),
    (lambda d: d["stages"][0]["plans"]["cuda"].update(platform="tpu"), "platform 'tpu' is not a platform rule"),
    (lambda d: d["stages"][0]["deployment"].update(tensor_parallel_size=0), "unknown entry 'tensor_parallel_size'"),
    (lambda d: d["stages"][0]["deployment"].update(tp=0), "--tp must be at least 1"),
    (lambda d: d["stages"][0]["deployment"].update(device_memory_bytes=0), "--device-memory must be positive"),
    (lambda d: d["stages"][0]["deployment"].update(gpu_memory_utilization=float("nan")), "gpu_memory_utilization is NaN"),
    (lambda d: d["stages"][0]["deployment"]["model"]["config"].update(hidden_size=0), "'hidden_size' is 0"),
    (lambda d: d["stages"][0]["strategies"].update(vllm="nowhere"), "names no saved plan"),
    (lambda d: d["stages"][0]["highest_safe_utilization"].update(vllm=7), "is 7.0, not in [0, 1]"),
    (lambda d: d["stages"][0]["plans"]["cuda"]["capacity"].update(tokens=None), "capacity.tokens is null, not int"),
])
def test_every_entry_of_a_plan_file_is_checked(saved, tmp_path, capsys, edit, message):
    code, out, err = _run(["audit", "--plan", str(_edited(saved, tmp_path, edit))], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert message in err, err
