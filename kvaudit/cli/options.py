"""The command line's option table: every option of every command declared once (``Opt``, vLLM's flag
names for the deployment's), with the output formats; each command module takes its options from here."""

from __future__ import annotations

from enum import Enum
from typing import Optional

from kvaudit.model.deployment import PRESETS
from kvaudit.model.options import AUDIT, DEPLOYMENT_OPTIONS, MODEL, OUTPUT, Opt
from kvaudit.results import DEFAULT_TOLERANCE


class Format(str, Enum):
    """Output formats."""

    table = "table"
    json = "json"


class TriageFormat(str, Enum):
    """Output formats of ``kvaudit triage``."""

    markdown = "markdown"
    json = "json"


class LiveFormat(str, Enum):
    """Output formats of ``kvaudit live``."""

    table = "table"
    json = "json"
    markdown = "markdown"
    junit = "junit"


class Detail(str, Enum):
    """How much of each strategy's audit the table shows."""

    summary = "summary"
    groups = "groups"
    layers = "layers"


STRATEGY = Opt("strategy", Optional[list[str]], None, ("--strategy", "-s"),
               "vllm, ascend-0.11, ascend-0.12, ascend-0.16 (default: these four), installed, vllm-ascend==VERSION, "
               "vllm-ascend=PATH (a source checkout), module:function, or a kvaudit.strategies entry point; "
               "repeatable.", AUDIT)

METER = Opt("meter", str, "auto", ("--meter",), "auto (npu, then cuda, then meta), npu, cuda, cpu or meta.", AUDIT)

DEVICE_INDEX = Opt("device_index", int, 0, ("--device-index",), "Which npu/cuda device the meter uses.", AUDIT)

TOLERANCE = Opt("tolerance", float, DEFAULT_TOLERANCE, ("--tolerance",),
                "Relative tolerance on the planned bytes.", AUDIT)

FORMAT = Opt("fmt", Format, Format.table, ("--format",), "table, or json (stdout holds only the JSON).", OUTPUT)

DETAIL = Opt("detail", Detail, Detail.layers, ("--detail",), "Table detail: summary, groups, layers.", OUTPUT)

HTML = Opt("html", Optional[str], None, ("--html",),
           "Also write the report as an HTML page: expected vs allocated bars per strategy and group, the tables.",
           OUTPUT)

SVG = Opt("svg", Optional[str], None, ("--svg",), "Also write the report as one SVG image (bars and tables).", OUTPUT)

CONFIG = Opt("config", Optional[str], None, ("--model", "--config"),
             "The model as vLLM takes it: a Hub id (org/name), a model folder, or a config.json.", MODEL)

PRESET = Opt("preset", Optional[str], None, ("--preset",),
             "A shipped model by its name ('kvaudit models' lists them; each is a command too: kvaudit qwen3-next).",
             MODEL)

REVISION = Opt("revision", Optional[str], None, ("--revision",),
               "The Hub revision of --model: a branch, tag or commit (vLLM's --revision).", MODEL)

TRUST_REMOTE_CODE = Opt("trust_remote_code", bool, False, ("--trust-remote-code",),
                        "Let the model folder's own config code run (vLLM's flag; nothing runs without it).", MODEL)

MODEL_OPTIONS = (CONFIG, PRESET, REVISION, TRUST_REMOTE_CODE)

AUDIT_OPTIONS = (*DEPLOYMENT_OPTIONS, STRATEGY, METER, DEVICE_INDEX, TOLERANCE, FORMAT, DETAIL, HTML, SVG)

PLAN_FILE = Opt("plan", Optional[str], None, ("--plan",),
                "Audit a plan saved by 'kvaudit plan --save' instead of planning: needs only torch, not vLLM "
                "(plan on one machine, measure on another).", MODEL)
SAVE = Opt("save", Optional[str], None, ("--save",),
           "Also write the plans as data (deployment, groups, specs, tensors and their layers, num_blocks, "
           "capacity, the vLLM that planned) for 'kvaudit audit --plan'.", OUTPUT)
POLICY = Opt("policy", str, "kvaudit.toml", (), "The policy file (default kvaudit.toml).", argument=True)
JUNIT = Opt("junit", Optional[str], None, ("--junit",),
            "Also write JUnit XML: one test case per cell, failures carrying the reasons.", OUTPUT)
POLICY_METER = Opt("meter", Optional[str], None, ("--meter",), "Override the policy's meter for every cell.", AUDIT)
OLD = Opt("old", str, ..., (), "The earlier report (kvaudit audit --format json).", argument=True)
NEW = Opt("new", str, ..., (), "The later report.", argument=True)
REPORT = Opt("report", str, ..., (), "The report: a file, or - for stdin.", argument=True)
TRIAGE_CONFIG = Opt("config", Optional[str], None, ("--config",),
                    "The model's config.json, when no shipped preset matches the model.", MODEL)
TITLE = Opt("title", Optional[str], None, ("--title",),
            "The issue's title (versions and models are often only there); a first line that reads like one "
            "([Bug]: ...) is taken as the title.")
TRIAGE_FORMAT = Opt("fmt", Optional[TriageFormat], None, ("--format",),
                    "markdown or json (default: rendered on a terminal, Markdown in a pipe or a file).", OUTPUT)
MODEL_ARGUMENT = Opt("model", str, ..., (), f"A shipped model ({', '.join(PRESETS)}), a Hub id, a model folder or a "
                     "config.json.", argument=True)
SINCE = Opt("since", Optional[str], None, ("--since",), "The first release to audit (default: every published one).")
NAMES = Opt("names", Optional[list[str]], None, (), "Only these presets.", argument=True)
PROBE_INDEX = Opt("device_index", int, 0, ("--device-index",), "Which npu/cuda device to probe.")
URL = Opt("url", str, ..., (), "The server's address, e.g. http://HOST:8000 (its /metrics, /v1/models, /version and "
          "/server_info are read).", argument=True)
API_KEY = Opt("api_key", Optional[str], None, ("--api-key",),
              "The server's API key (sent as a bearer token, never printed; default: VLLM_API_KEY).")
SMI = Opt("smi", Optional[str], None, ("--smi",),
          "nvidia-smi (its table, or --query-compute-apps / --query-gpu CSV) or npu-smi info output from the "
          "server's host: a file, or - for stdin (default: run nvidia-smi or npu-smi here, where one is installed).",
          AUDIT)
LIVE_FORMAT = Opt("fmt", LiveFormat, LiveFormat.table, ("--format",),
                  "table, json, markdown or junit (a CI gate: a failure for a finding).", OUTPUT)
WATCH = Opt("watch", Optional[float], None, ("--watch",),
            "Read /metrics (and the smi, where run here) again every N seconds: KV-cache usage, requests and device "
            "memory over time, a line each; Ctrl-C ends it.", OUTPUT)
COUNT = Opt("count", Optional[int], None, ("--count",), "With --watch: stop after this many reads.", OUTPUT)
