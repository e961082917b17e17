"""Models named as vLLM takes them: Hub ids from huggingface_hub's cache (CI has no network), local folders and
config files, ``--revision``, and ``--trust-remote-code`` as the only way a folder's code runs."""

from __future__ import annotations

import json
import shutil

import pytest

from kvaudit.cli import main
from kvaudit.errors import ConfigError, UsageError
from kvaudit.model.deployment import load_model
from kvaudit.model.hub import is_hub_id, locate
from conftest import ROOT, skip_unless_planned

QWEN3_8B = ROOT / "fixtures" / "configs" / "qwen3-8b" / "config.json"
LLAMA = ROOT / "fixtures" / "configs" / "llama-3.1-8b" / "config.json"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache in offline mode, as CI runs (huggingface_hub reads both settings when it is
    imported, so they are set on its constants)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def cache_model(cache, repo_id: str, config, revision: str = "main", commit: str = "0" * 40) -> None:
    """Lay ``config`` out as huggingface_hub's cache holds a download of ``repo_id`` (``models--org--name``, a
    snapshot per commit, a ref naming it)."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    shutil.copyfile(config, snapshot / "config.json")
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / revision).write_text(commit)


@pytest.mark.parametrize("ref, hub", [
    ("Qwen/Qwen3-8B", True), ("openai/gpt-oss-120b", True), ("meta-llama/Llama-3.1-8B-Instruct", True),
    ("models/config.json", False), ("./Qwen/Qwen3-8B", False), ("/abs/Qwen3-8B", False), ("a/b/c", False),
    ("~/models/qwen", False), ("../Qwen3-8B", False), ("qwen3-8b", False)])
def test_a_hub_id_is_org_slash_name_and_anything_else_a_path(ref, hub):
    assert is_hub_id(ref) is hub


def test_a_hub_id_resolves_from_the_cache_offline(hub_cache):
    cache_model(hub_cache, "Qwen/Qwen3-8B", QWEN3_8B)
    spec, preset = load_model(None, "Qwen/Qwen3-8B")
    assert preset is None and spec.name == "Qwen/Qwen3-8B" and spec.architecture == "Qwen3ForCausalLM"
    assert spec.config_path.is_relative_to(hub_cache)
    assert json.loads(spec.config_path.read_text()) == json.loads(QWEN3_8B.read_text())


def test_a_revision_picks_the_snapshot_its_ref_names(hub_cache):
    cache_model(hub_cache, "Qwen/Qwen3-8B", QWEN3_8B, commit="1" * 40)
    folder = hub_cache / "models--Qwen--Qwen3-8B"
    (folder / "snapshots" / ("2" * 40)).mkdir()
    shutil.copyfile(LLAMA, folder / "snapshots" / ("2" * 40) / "config.json")
    (folder / "refs" / "v2").write_text("2" * 40)
    assert load_model(None, "Qwen/Qwen3-8B")[0].architecture == "Qwen3ForCausalLM"
    spec = load_model(None, "Qwen/Qwen3-8B", revision="v2")[0]
    assert spec.architecture == "LlamaForCausalLM" and spec.name == "Qwen/Qwen3-8B@v2"
    assert load_model(None, "Qwen/Qwen3-8B", revision="1" * 40)[0].architecture == "Qwen3ForCausalLM"


def test_offline_without_the_cache_is_one_line_naming_what_to_download(hub_cache):
    with pytest.raises(ConfigError) as e:
        locate("Qwen/Qwen3-32B")
    message = e.value.message
    assert "HF_HUB_OFFLINE is set" in message and "hf download Qwen/Qwen3-32B --include config.json" in message
    assert str(hub_cache) in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"--include config.json '\*.py' --revision v1\)"):
        locate("Qwen/Qwen3-32B", revision="v1", trust_remote_code=True)


def test_the_cli_takes_a_hub_id_where_it_takes_a_model(hub_cache, capsys):
    code = main(["Qwen/Qwen3-32B", "--util", "0.7"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is not in the Hugging Face cache" in err
    assert main(["plan", "Qwen/Qwen3-32B"]) == 2 and "hf download Qwen/Qwen3-32B" in capsys.readouterr().err
    assert main(["nosuchmodel"]) == 2 and "unknown preset or command 'nosuchmodel'" in capsys.readouterr().err


def test_a_local_path_that_does_not_exist_is_not_looked_up_on_the_hub(hub_cache, tmp_path):
    with pytest.raises(ConfigError, match="config not found"):
        load_model(None, str(tmp_path / "missing" / "config.json"))
    with pytest.raises(UsageError, match="--revision"):
        load_model(None, str(QWEN3_8B), revision="main")
    with pytest.raises(UsageError, match="--revision"):
        load_model("qwen3-8b", None, revision="main")


def test_a_cached_hub_model_plans_as_its_local_config(hub_cache, capsys):
    skip_unless_planned("qwen3-8b")
    cache_model(hub_cache, "Qwen/Qwen3-8B", QWEN3_8B)
    args = ["--util", "0.7", "--format", "json", "--detail", "summary", "-s", "vllm"]
    assert main(["Qwen/Qwen3-8B", *args]) == 0
    hub = json.loads(capsys.readouterr().out)
    assert main(["audit", "--model", str(QWEN3_8B), *args]) == 0
    local = json.loads(capsys.readouterr().out)
    assert hub["model"] == hub["deployment"]["model"] == "Qwen/Qwen3-8B"
    assert hub["deployment"]["config_path"].startswith(str(hub_cache))
    same = lambda d: {k: v for k, v in d.items() if k not in ("model", "config_path")}  # noqa: E731
    assert same(hub["deployment"]) == same(local["deployment"]) and hub["audits"] == local["audits"]


@pytest.fixture
def remote_code(tmp_path, monkeypatch):
    """A model folder whose config class is its own code (``auto_map``), which leaves a mark when it runs;
    transformers copies such modules into ``HF_MODULES_CACHE`` before importing them."""
    folder = tmp_path / "custom-llama"
    folder.mkdir()
    cfg = json.loads(LLAMA.read_text())
    cfg.update(model_type="kvaudit_custom_llama", auto_map={"AutoConfig": "configuration_custom.CustomConfig"},
               num_hidden_layers=2)
    (folder / "config.json").write_text(json.dumps(cfg))
    mark = tmp_path / "ran"
    (folder / "configuration_custom.py").write_text(
        "from transformers import LlamaConfig\n"
        f"open({str(mark)!r}, 'a').write('ran')\n\n\n"
        "class CustomConfig(LlamaConfig):\n    model_type = 'kvaudit_custom_llama'\n")
    modules = pytest.importorskip("transformers.utils.hub")
    monkeypatch.setattr(modules, "HF_MODULES_CACHE", str(tmp_path / "modules"), raising=False)
    return folder, mark


def test_a_folders_code_runs_only_with_trust_remote_code(remote_code, capsys):
    skip_unless_planned("llama-3.1-8b")
    folder, mark = remote_code
    assert main(["plan", str(folder), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert "--trust-remote-code" in err and "configuration_custom.CustomConfig" in err and not mark.exists()
    assert main(["plan", str(folder), "--trust-remote-code", "--format", "json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert mark.exists()
    assert plans["stages"][0]["deployment"]["architecture"] == "LlamaForCausalLM"


def test_a_removed_architecture_is_named_with_the_last_vllm_that_served_it(capsys):
    """Qwen-1.8B-Chat (``QWenLMHeadModel``, custom code) and InternLM-chat-7B: vLLM's registry records both as
    served until 0.23.0 (``_PREVIOUSLY_SUPPORTED_MODELS``); the reason is the removal, not the custom code."""
    skip_unless_planned()
    for folder in ("Qwen--Qwen-1_8B-Chat", "internlm--internlm-chat-7b"):
        assert main(["plan", str(ROOT / "fixtures" / "architectures" / folder)]) == 2
        err = capsys.readouterr().err
        assert "no longer serves" in err and "vLLM 0.23.0 was the last release to serve it" in err
        assert "custom code" not in err and "trust-remote-code" not in err


def test_a_policy_and_the_pytest_marker_take_a_hub_id(hub_cache, tmp_path, capsys):
    from kvaudit.ci.policy import PolicyError, load_policy
    from kvaudit.ci.pytest_plugin import parse_options

    (tmp_path / "kvaudit.toml").write_text("[[model]]\nconfig = 'Qwen/Qwen3-32B'\n")
    cells = load_policy(tmp_path / "kvaudit.toml", ("vllm",)).cells
    assert [(c.config, c.preset) for c in cells] == [("Qwen/Qwen3-32B", None)]
    (tmp_path / "kvaudit.toml").write_text("[[model]]\nconfig = 'models/qwen/config.json'\n")
    with pytest.raises(PolicyError, match="config not found"):
        load_policy(tmp_path / "kvaudit.toml", ("vllm",))
    assert parse_options((), {"model": "Qwen/Qwen3-32B"}, tmp_path).model == "Qwen/Qwen3-32B"


def test_triage_plans_the_model_a_report_names_from_the_hub_cache(hub_cache):
    """The model of the report's launch, resolved by its Hub id (issue 21), not replaced by a family's preset."""
    from kvaudit.triage.conclude import triage

    cache_model(hub_cache, "acme/Llama-Test-8B", LLAMA)
    report = ("vllm serve acme/Llama-Test-8B --tensor-parallel-size 1 --max-model-len 8192\n"
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
              "of 79.19 GiB of which 1.02 GiB is free.\n")
    t = triage(report)
    assert "Hugging Face cache" in t.deployment["model"].source and t.factor == 1.0
    assert not any("config.json" in a for a in t.ask_for), t.ask_for
    t = triage(report.replace("acme/Llama-Test-8B", "acme/Not-Cached-8B"))
    assert any("hf download acme/Not-Cached-8B" in a for a in t.ask_for), t.ask_for
