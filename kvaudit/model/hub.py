"""Name a model as vLLM does: a Hub id (with ``--revision``), a local model folder, or a ``config.json``.

For a Hub id kvaudit fetches only the files vLLM's config and model code read before any weight
(``huggingface_hub.snapshot_download`` with ``allow_patterns``): ``config.json``, the generation,
quantization and processor configs, and with ``--trust-remote-code`` the repository's Python files
(transformers' ``AutoConfig`` imports the ``auto_map`` module from the model folder). huggingface_hub
honours ``HF_TOKEN``, ``HF_ENDPOINT``, ``HF_HOME`` / ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE``; with no
network it answers from its cache, and without a cached copy the error is one line naming what to
download. No torch and no vLLM here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kvaudit.errors import ConfigError, MissingDependency, UsageError

CONFIG_FILES = ("config.json", "generation_config.json", "*quant*config.json", "params.json",
                "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
"""What vLLM reads of a model folder before the weights: the model config (``transformers_utils/config.py``:
``get_config``, and ``params.json`` for Mistral-format repositories), ``generation_config.json``
(``try_get_generation_config``, the sampling defaults), the quantization configs of checkpoints that keep
them beside ``config.json`` (``hf_quant_config.json`` of ModelOpt, ``quantize_config.json`` of GPTQ:
``get_quant_config``), and the processor configs a multimodal wrapper reads."""

REMOTE_CODE_FILES = ("*.py",)
"""With ``--trust-remote-code``, the repository's Python files: the ``auto_map`` modules and what they import."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
"""``org/name`` as the Hub spells repository ids (``huggingface_hub.utils.validate_repo_id``); a bare name
(``gpt2``) is a Hub id too where no preset or local path has that name."""


def is_hub_id(ref: str) -> bool:
    """Whether ``ref`` reads as a Hub id (``org/name``) rather than a path: a path names a ``.json`` file,
    starts at a folder (``/``, ``.``, ``~``) or has more than one ``/``."""
    return bool(_HUB_ID.match(ref)) and not ref.endswith(".json") and ".." not in ref


def names_hub_model(ref: str) -> bool:
    """Whether ``ref`` names a Hub model: it reads as a Hub id and no local path has that name (as vLLM decides)."""
    if not is_hub_id(ref):
        return False
    try:
        return not Path(ref).expanduser().exists()
    except OSError:  # a name no file system holds (too long): no path, and no Hub id either
        return False


def locate(ref: str, revision: str | None = None, trust_remote_code: bool = False) -> Path:
    """The ``config.json`` that ``ref`` names: a local file or folder as given, else the Hub id's cached
    snapshot (fetched where the Hub can be reached). Bad input is a one-line ``ConfigError`` (exit 2)."""
    if not names_hub_model(ref):
        path = Path(ref).expanduser()
        if revision is not None:
            raise UsageError(f"--revision {revision} names a Hub revision; {ref} is a local path")
        return path / "config.json" if path.is_dir() else path
    folder = Path(fetch(ref, revision, trust_remote_code))
    config = folder / "config.json"
    if not config.is_file():
        why = (" (a Mistral-format repository: vLLM reads its params.json; kvaudit plans from config.json)"
               if (folder / "params.json").is_file() else "")
        raise ConfigError(f"{ref} has no config.json{why}")
    return config


def fetch(repo_id: str, revision: str | None, trust_remote_code: bool) -> str:
    """The local snapshot folder of ``repo_id`` holding the files vLLM reads (``CONFIG_FILES``, and the Python
    files with ``trust_remote_code``), from huggingface_hub's cache or the Hub."""
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ModuleNotFoundError:
        raise MissingDependency(f"{repo_id} is a Hub id: fetching it needs huggingface_hub (pip install "
                                "huggingface_hub; vLLM depends on it), or give a local config.json") from None
    from kvaudit import network

    patterns = [*CONFIG_FILES, *(REMOTE_CODE_FILES if trust_remote_code else ())]
    at = f"{repo_id}" + (f" at revision {revision}" if revision else "")
    if not constants.HF_HUB_OFFLINE:
        network.hub_session()
        network.started(f"fetching {at}'s config from the Hub ({_endpoint()}), else from the cache")
    try:
        return huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
    except errors.GatedRepoError:
        raise ConfigError(f"{repo_id} is gated on the Hub: accept its terms on its page and set HF_TOKEN") from None
    except errors.RepositoryNotFoundError:
        raise ConfigError(f"no model {repo_id} on the Hub ({_endpoint()}); a private one needs HF_TOKEN, a local "
                          "path must exist") from None
    except errors.RevisionNotFoundError:
        raise ConfigError(f"{repo_id} has no revision {revision!r} on the Hub") from None
    except errors.IncompleteSnapshotError:
        raise ConfigError(f"the cached snapshot of {at} lacks files vLLM reads and the Hub cannot be reached: "
                          f"download them where there is network (hf download {repo_id}"
                          + (f" --revision {revision}" if revision else "") + ")") from None
    except errors.LocalEntryNotFoundError:
        offline = constants.HF_HUB_OFFLINE
        why = ("HF_HUB_OFFLINE is set" if offline else
               f"the Hub ({_endpoint()}) did not answer within {network.timeout_s():g} s ({network.ENV})")
        raise (ConfigError if offline else network.NetworkError)(
            f"{at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}: "
            f"download it where there is network (hf download {repo_id} --include config.json"
            + (" '*.py'" if trust_remote_code else "") + (f" --revision {revision}" if revision else "")
            + ") into that cache (HF_HUB_CACHE), or give a local model folder or config.json") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as e:  # the Hub's other answers; a malformed id
        raise ConfigError(f"could not fetch {at}: {type(e).__name__}: "
                          f"{(str(e).strip().splitlines() or [''])[0][:200]}") from None


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
