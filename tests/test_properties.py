"""Property-based tests (hypothesis) of every reader of what users give kvaudit: config.json and
``--hf-overrides``, deployment options and sizes, pasted reports, policy files, saved reports for
``compare``, and plan files. Each generated input, real material mutated (fields at extremes, of other
types, missing or added, files cut short, lines recombined), must end in a documented exit code
(``kvaudit.errors.EXIT_CODES``) that is not exit 4, a bug: a traceback is never the answer.

``EXAMPLES`` is how many inputs each test generates; CI runs them all (``sum(EXAMPLES.values())``, at least
10,000), derandomized so that a run is repeatable (``KVAUDIT_HYPOTHESIS=explore`` draws new ones).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import re
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import ROOT  # noqa: E402
from kvaudit.cli.app import _failure, main  # noqa: E402
from kvaudit.errors import EXIT_BUG, EXIT_CODES, UsageError  # noqa: E402

EXAMPLES = {
    "config": 2500, "config_fields": 600, "hf_overrides": 1000, "deployment_options": 1000, "sizes": 500, "report_reading": 2000, "report_recombined": 7700,
    "report_files": 300, "policy": 1500, "compare": 800, "compare_tampered": 400, "plan_file": 800, "plan_file_audit": 60,
}
"""Inputs per test: 19,160 in all; 10,000 are reports that triage reads and concludes on (issue 21: at least 10,000;
the recombined reports were 10,000 alone until CI needed room for issue 35's tests)."""


def _settings(name: str):
    explore = os.environ.get("KVAUDIT_HYPOTHESIS") == "explore"
    scale = float(os.environ.get("KVAUDIT_HYPOTHESIS_SCALE", "1"))  # (a quicker run while writing a reader)
    return settings(max_examples=max(1, int(EXAMPLES[name] * scale)), deadline=None, derandomize=not explore,
                    database=None,
                    suppress_health_check=list(HealthCheck), print_blob=explore)


def _ending(fn, *args, **kwargs) -> int:
    """The exit code ``fn`` ends with, as ``kvaudit.cli.main`` maps it; a bug (exit 4) fails the test."""
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - every ending is under test
        code, line = _failure(e)
        assert code in EXIT_CODES and "\n" not in line, line
        if code == EXIT_BUG:
            raise AssertionError(line) from e
        return code
    return 0


_TMP = Path(tempfile.mkdtemp(prefix="kvaudit-properties-"))


def _file(name: str, content: str | bytes) -> Path:
    path = _TMP / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return path


# --- mutations of real material ---------------------------------------------------------------------------

EXTREMES = st.one_of(
    st.sampled_from([0, -1, 1, 2, -(2 ** 31), 2 ** 31, 2 ** 63, 10 ** 18, 10 ** 40, 0.0, -0.0, 0.5, 1.5, 1e-300,
                     1e308, math.inf, -math.inf, math.nan, True, False, None, "", "0", "-1", "1e309", "nan",
                     "\x00", "\ud800", "a" * 300, "[/bold]", "<!--", "`", "../../etc/passwd", [], {}, [0], {"": None}]),
    st.integers(), st.floats(), st.text(max_size=12), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
"""Values at the edges of every type a field can hold."""


@st.composite
def mutated(draw, doc, mutations: int = 3):
    """``doc`` (JSON data) with 1 to ``mutations`` changes, each at a node reached by a random walk from the
    root (half the time down to a leaf): replaced by an extreme value, deleted, emptied, nested deeper, or
    given a sibling."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, mutations))):
        parent, key, node = None, None, doc
        to_leaf = draw(st.booleans())
        while isinstance(node, (dict, list)) and node and (parent is None or to_leaf or draw(st.integers(0, 9)) < 7):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            parent, key = node, draw(st.sampled_from(keys))
            node = node[key]
        if parent is None:
            continue
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "empty", "nest", "sibling"]))
        if action == "replace":
            parent[key] = copy.deepcopy(draw(EXTREMES))  # (never the same list or dict in two places)
        elif action == "delete":
            del parent[key]
        elif action == "empty":
            parent[key] = type(node)() if isinstance(node, (dict, list, str)) else None
        elif action == "nest":
            parent[key] = [node] if draw(st.booleans()) else {"x": node}
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = copy.deepcopy(draw(EXTREMES))
        else:
            parent.insert(key, copy.deepcopy(node))
    return doc


def _json_text(draw, doc) -> str | bytes:
    """``doc`` as JSON text, now and then cut short, deeply nested, or carrying a 5,000-digit integer."""
    text = json.dumps(doc, allow_nan=True)
    how = draw(st.sampled_from(["as is"] * 8 + ["cut", "big int", "deep", "bytes"]))
    if how == "cut":
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    if how == "big int":
        return text.replace("1", "9" * 5000, 1)
    if how == "deep":
        return "[" * 100_000 + "]" * 100_000
    if how == "bytes":
        return draw(st.binary(max_size=64))
    return text


# --- config.json and --hf-overrides ---------------------------------------------------------------------

CONFIGS = [json.loads(p.read_text()) for p in sorted((ROOT / "fixtures/configs").glob("*/config.json"))]


@_settings("config")
@given(st.data())
def test_any_config_is_read_or_refused_in_one_line(data):
    from kvaudit.model.spec import load_model_spec

    doc = data.draw(mutated(data.draw(st.sampled_from(CONFIGS))))
    path = _file("config.json", _json_text(data.draw, doc))
    assert _ending(load_model_spec, path) in (0, 2)


NOT_COUNTS = st.sampled_from([True, False, math.nan, math.inf, -math.inf, "48", "", 2.5, 1e-300, [1], {"a": 1}])
"""Values no count, size or period can be: booleans (``isinstance(True, int)``), NaN and infinities, strings,
fractions; a list or a table is a per-layer value, which vLLM judges."""


@_settings("config_fields")
@given(st.data())
def test_every_checked_config_field_refuses_what_is_no_number(data):
    """Issue 34: Qwen3-Next with ``full_attention_interval: NaN`` or ``true`` was planned and passed 4 times."""
    from kvaudit.errors import ConfigError
    from kvaudit.model.spec import AT_LEAST_ONE, AT_LEAST_ZERO, AT_MOST, load_model_spec, text_config

    doc = copy.deepcopy(data.draw(st.sampled_from(CONFIGS)))
    section = text_config(doc)
    key = data.draw(st.sampled_from([*AT_LEAST_ONE, *AT_LEAST_ZERO]))
    value = data.draw(st.one_of(NOT_COUNTS, st.sampled_from([10 ** 40, 2 ** 63])) if key in AT_MOST else NOT_COUNTS)
    section[key] = value
    if key == "sliding_window":
        section.pop("use_sliding_window", None)
    if key in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        section.pop("use_mla", None)
    path = _file("config.json", json.dumps(doc, allow_nan=True))
    if isinstance(value, (list, dict)):
        assert _ending(load_model_spec, path) in (0, 2)
        return
    try:
        load_model_spec(path)
    except ConfigError as e:
        assert repr(key) in e.message and "\n" not in e.message, e.message
    else:
        raise AssertionError(f"{key}={value!r} was read as a model")


@_settings("hf_overrides")
@given(st.data())
def test_any_hf_overrides_are_checked_as_vllm_applies_them(data):
    from kvaudit.model.spec import check_config, text_config, with_overrides

    base = data.draw(st.sampled_from(CONFIGS))
    keys = sorted(set(text_config(base)) | {"text_config", "sliding_window", "full_attention_interval"})
    overrides = data.draw(st.dictionaries(st.sampled_from(keys), EXTREMES, max_size=3))
    assert _ending(lambda: check_config(with_overrides(base, overrides), "x")) in (0, 2)


# --- deployment options ------------------------------------------------------------------------------------

@_settings("deployment_options")
@given(st.data())
def test_any_deployment_options_are_checked_in_one_line(data):
    import dataclasses

    from kvaudit.model.deployment import PRESETS, Deployment, check_deployment, load_preset_spec

    spec = load_preset_spec(PRESETS[data.draw(st.sampled_from(sorted(PRESETS)))])
    ints = st.one_of(st.integers(-3, 3), st.integers(), st.sampled_from([2 ** 31, 10 ** 9, 257, 129, 65]))
    d = Deployment(model=spec, tp=1, dtype="auto", max_model_len=4096, device="custom", device_memory_bytes=1 << 36,
                   gpu_memory_utilization=0.9, weights_bytes=1 << 30, weights_source="", overhead_bytes=1 << 30,
                   kv_cache_memory_bytes=None, kv_transfer=False, num_blocks_override=None)
    fields = {"tp": ints, "pp": ints, "pp_rank": ints, "max_model_len": ints, "num_blocks_override": ints,
              "block_size": ints, "max_num_seqs": ints, "num_speculative_tokens": ints,
              "gpu_memory_utilization": st.floats(), "device_memory_bytes": ints, "overhead_bytes": ints,
              "weights_bytes": ints, "kv_cache_memory_bytes": ints, "kv_cache_dtype": st.text(max_size=8),
              "mamba_cache_mode": st.text(max_size=6)}
    changes = data.draw(st.dictionaries(st.sampled_from(sorted(fields)), st.none(), min_size=1, max_size=4))
    d = dataclasses.replace(d, **{k: data.draw(fields[k]) for k in changes})
    assert _ending(check_deployment, d) in (0, 2)


@_settings("sizes")
@given(st.one_of(st.text(max_size=24), st.floats(), st.integers(), st.from_regex(r"-?[0-9.eE+]{1,12} ?[KMGTkmgti]{0,3}[Bb]?")))
def test_any_size_is_parsed_or_refused_in_one_line(text):
    from kvaudit.units import MAX_BYTES, parse_size

    try:
        n = parse_size(text)
    except BaseException as e:  # noqa: BLE001
        assert _failure(e)[0] == 2, _failure(e)[1]
    else:
        assert isinstance(n, int) and 0 < n <= MAX_BYTES


# --- pasted reports -----------------------------------------------------------------------------------------

_REPORT_FILES = sorted((ROOT / "fixtures/reports").glob("*.log")) + sorted(
    p for folder in ("threads", "develop", "held-out-1") for p in (ROOT / "fixtures/reports" / folder).glob("*.txt"))
"""(Not the later held-out sets: each is kept as it was when its score was measured once.)"""
LINES = sorted({line for p in _REPORT_FILES for line in p.read_text(errors="replace").splitlines() if line.strip()})
"""Every distinct line of the shipped reports (from public threads and logs, cited beside them)."""
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


_A_LINE = st.sampled_from(LINES)
"""(Made once: hypothesis hashes every one of the elements of a new ``sampled_from`` to label it, 23 million calls
when each draw made its own.)"""


@st.composite
def report_line(draw):
    line = draw(_A_LINE)
    how = draw(st.sampled_from(["as is"] * 6 + ["numbers", "cut", "noise", "repeat"]))
    if how == "numbers":  # every figure of the line at an extreme
        values = st.sampled_from(EXTREME_FIGURES)
        return _NUMBER.sub(lambda m: draw(values), line)
    if how == "cut":
        return line[:draw(st.integers(0, len(line)))]
    if how == "noise":
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(st.text(max_size=20)) + line[at:]
    if how == "repeat":
        return (line + " ") * draw(st.integers(2, 50))
    return line


EXTREME_FIGURES = ("0", "-1", "0.0", "1e309", "9" * 40, "9" * 4301, "-2.14", "1.5", "nan")
"""(4,301 digits: one over CPython's limit on converting a string to an int, ``sys.get_int_max_str_digits()``.)"""
_LOG_PREFIX = re.compile(r"^.*?\b(?=INFO|WARNING|ERROR|DEBUG)")


def _shapes(lines: list[str]) -> list[str]:
    """One line of each shape: the same text once its log prefix (pid, time) is left out and its figures masked (a
    log repeats one format string with other figures; the extremes go in the same places of each)."""
    seen: dict[str, str] = {}
    for line in lines:
        seen.setdefault(_NUMBER.sub("#", _LOG_PREFIX.sub("", line, count=1)), line)
    return list(seen.values())


def test_every_figure_of_every_real_line_at_every_extreme():
    """Each line of the shipped reports (one of each shape) with its figures replaced, one figure at a time, by each
    extreme: the reader keeps what it can and drops the rest, never raises (a 5,000-digit budget once passed a
    pattern and failed int())."""
    from kvaudit.triage.evidence import clean_lines, extract

    tried = 0
    for line in _shapes(LINES):
        numbers = list(_NUMBER.finditer(line))
        for m in numbers[:12]:
            for value in EXTREME_FIGURES:
                extract(clean_lines(line[:m.start()] + value + line[m.end():]))
                tried += 1
    assert tried > 10_000


@_settings("report_reading")
@given(lines=st.lists(report_line(), max_size=60), newline=st.sampled_from(["\n", "\r\n", "\r"]),
       title=st.one_of(st.none(), report_line()))
def test_any_report_is_read_and_answered_in_the_schema(lines, newline, title):
    """Reading and the conclusions that need no planner (vLLM is hidden: the planner's audit is the
    plan's tests' business), through the Markdown and the JSON schema."""
    from kvaudit.triage.conclude import triage

    holder = {}

    def run():
        holder["t"] = triage(newline.join(lines), title=title)

    with _without_vllm():
        code = _ending(run)
    assert code in (0, 2)
    if code == 0:
        t = holder["t"]
        TRIAGE_VALIDATOR.validate(t.to_dict())
        assert t.to_markdown().startswith("### kvaudit triage: ")


TRIAGE_SCHEMA = json.loads((ROOT / "kvaudit" / "triage.schema.json").read_text())
_REPORTS_TEXT = [p.read_text(errors="replace").splitlines() for p in _REPORT_FILES]


def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(TRIAGE_SCHEMA)


TRIAGE_VALIDATOR = _validator()


def _recombined(rng: random.Random) -> tuple[str, str | None]:
    """A report made of real ones: a shipped report with lines dropped, or real lines of several recombined, each
    line kept, cut, given noise, repeated, or with every figure at an extreme; sometimes a title given apart."""
    if rng.random() < 0.3:
        lines = [line for line in rng.choice(_REPORTS_TEXT) if rng.random() < 0.7]  # fields missing
    else:
        lines = [rng.choice(LINES) for _ in range(rng.randint(0, 40))]
    out = []
    for line in lines:
        how = rng.random()
        if how < 0.1:
            line = _NUMBER.sub(lambda m: rng.choice(EXTREME_FIGURES), line)
        elif how < 0.15:
            line = line[:rng.randint(0, len(line))]
        elif how < 0.2:
            at = rng.randint(0, len(line))
            line = line[:at] + "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(1, 12))) + line[at:]
        elif how < 0.22:
            line = (line + " ") * rng.randint(2, 30)
        out.append(line)
    title = rng.choice(LINES) if rng.random() < 0.2 else None
    return rng.choice(["\n", "\r\n"]).join(out), title


def test_thousands_of_recombined_reports_are_read_and_answered_in_the_schema():
    """Issue 21's property: every report made of real material gets a schema-valid answer, never a traceback. Each
    report is drawn from its seed (``_recombined``): a plain loop over ``EXAMPLES["report_recombined"]`` seeds, the
    first that fails named, since hypothesis added 1.7 ms to each 2.6 ms report and can shrink a seed no further.
    ``KVAUDIT_HYPOTHESIS=explore`` draws the seeds at random."""
    explore = os.environ.get("KVAUDIT_HYPOTHESIS") == "explore"
    scale = float(os.environ.get("KVAUDIT_HYPOTHESIS_SCALE", "1"))
    seeds = range(max(1, int(EXAMPLES["report_recombined"] * scale)))
    if explore:
        seeds = [random.SystemRandom().randrange(2 ** 63) for _ in seeds]
    with _without_vllm():
        for seed in seeds:
            text, title = _recombined(random.Random(seed))
            holder = {}

            def run():
                holder["t"] = triage_report(text, title=title)  # noqa: B023 - called at once, in this iteration

            try:
                code = _ending(run)
                assert code in (0, 2)
                if code == 0:
                    TRIAGE_VALIDATOR.validate(holder["t"].to_dict())
                    assert holder["t"].to_markdown().startswith("### kvaudit triage: ")
            except AssertionError as e:
                raise AssertionError(f"the report of seed {seed} (_recombined(random.Random({seed}))): {e}") from e


def triage_report(text: str, title: str | None = None):
    from kvaudit.triage.conclude import triage

    return triage(text, title=title)


@contextlib.contextmanager
def _without_vllm():
    """vLLM reported as not installed: triage reads and concludes without planning."""
    import kvaudit.plan.planner

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kvaudit.plan.planner, "vllm_version", lambda: None)
        yield


@_settings("report_files")
@given(content=st.one_of(st.binary(max_size=200), st.lists(report_line(), max_size=20).map("\n".join)))
def test_any_report_file_through_the_command_line(content, capsys):
    path = _file("report.txt", content)
    with _without_vllm():
        code = main(["triage", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 2, 3) and "Traceback" not in err, err
    if code != 2:
        json.loads(out)


# --- policy files -----------------------------------------------------------------------------------------------

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return '""'


def _policy_values():
    from kvaudit.model.deployment import PRESETS
    from kvaudit.strategies.builtin import STRATEGIES

    typed = st.one_of(st.sampled_from(sorted(PRESETS)), st.sampled_from(["pass", "fail", "not-audited", "meta", "cpu"]),
                      st.sampled_from(sorted(STRATEGIES)).map(lambda s: [s]), st.integers(-2, 9),
                      st.lists(st.sampled_from([1, 2, 4, 8, 0.7, 0.9, "fp8", "auto"]), max_size=6),
                      st.floats(0, 1), st.sampled_from(["../configs", "nowhere/config.json", str(ROOT / "fixtures/configs/llama-3.1-8b")]))
    return st.one_of(typed, EXTREMES.filter(lambda v: v is not None))


@st.composite
def policy_text(draw):
    from kvaudit.ci.policy import CHECK_KEYS, MODEL_KEYS
    from kvaudit.model.options import deployment_option_names

    keys = sorted(set(CHECK_KEYS) | set(MODEL_KEYS) | set(deployment_option_names())) + ["colour"]
    values = _policy_values()
    lines = []
    if draw(st.booleans()):
        lines.append("[check]")
        for k, v in draw(st.dictionaries(st.sampled_from(sorted(CHECK_KEYS) + ["colour"]), values, max_size=3)).items():
            lines.append(f"{k} = {_toml_value(v)}")
    for _ in range(draw(st.integers(0, 3))):
        lines.append("[[model]]")
        for k, v in draw(st.dictionaries(st.sampled_from(keys), values, max_size=6)).items():
            lines.append(f"{k} = {_toml_value(v)}")
    text = "\n".join(lines) + "\n"
    how = draw(st.sampled_from(["as is"] * 8 + ["cut", "noise"]))
    if how == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif how == "noise":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=10)) + text[at:]
    return text


@_settings("policy")
@given(policy_text())
def test_any_policy_is_loaded_or_refused_with_its_line(text):
    from kvaudit.ci.policy import MAX_CELLS, load_policy
    from kvaudit.strategies.builtin import STRATEGIES

    holder = {}
    code = _ending(lambda: holder.update(p=load_policy(_file("kvaudit.toml", text), tuple(STRATEGIES))))
    assert code in (0, 2)
    if code == 0:
        assert 0 < len(holder["p"].cells) <= MAX_CELLS


def test_a_policy_that_expands_past_the_limit_is_refused_before_expanding(tmp_path, capsys):
    axis = list(range(1, 101))
    path = tmp_path / "kvaudit.toml"
    path.write_text(f'[[model]]\nname = "llama-3.1-8b"\ntp = {axis}\nmax_model_len = {[1024 + i for i in axis]}\n'
                    f'util = {[round(0.001 * i, 3) for i in axis]}\n')
    code = main(["check", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "more than 10,000 cells" in err[0] and ":1:" in err[0], err


# --- saved reports (compare) -------------------------------------------------------------------------------------

def _trimmed(path: Path) -> dict:
    """A saved report with its per-layer and per-tensor rows cut to three, so that each example is small."""
    doc = json.loads(path.read_text())
    for stage in doc.get("stages", [doc]):
        for a in stage["audits"]:
            a["layers"], a["tensors"] = a["layers"][:3], a["tensors"][:3]
    return doc


REPORTS = [_trimmed(p) for p in sorted((ROOT / "fixtures/reports/compare").glob("*.json"))]


@_settings("compare")
@given(st.data())
def test_any_two_saved_reports_are_compared_or_refused(data):
    from kvaudit.report import compare as C

    docs = [data.draw(st.one_of(mutated(r), st.just(r))) for r in data.draw(st.lists(st.sampled_from(REPORTS),
                                                                                      min_size=2, max_size=2))]
    paths = [_file(f"r{i}.json", _json_text(data.draw, d)) for i, d in enumerate(docs)]

    def run():
        c = C.compare(C.load_report(paths[0]), C.load_report(paths[1]))
        C.to_json(c), C.summary_line(c), C.render(c, data.draw(st.sampled_from(["summary", "groups", "layers"])))

    assert _ending(run) in (0, 2)


TAMPER = st.sampled_from([0, 1, -1, 10 ** 15, 2 ** 60, 10 ** 40, True, None, "PASS", 0.5, math.nan])


@_settings("compare_tampered")
@given(data=st.data())
def test_a_regression_in_the_rows_is_never_hidden_by_a_tampered_figure(data):
    """Issue 34: whatever else of the new report is changed (its total, verdict, allowance or tolerance, a group),
    a layer that allocates 8x its plan is a regression, or the report is refused; never a pass."""
    from kvaudit.report import compare as C

    base = copy.deepcopy(data.draw(st.sampled_from(REPORTS)))
    audits = base["stages"][0]["audits"] if "stages" in base else base["audits"]
    if not audits or not any(a["layers"] for a in audits):
        return
    new = copy.deepcopy(base)
    new_audits = new["stages"][0]["audits"] if "stages" in new else new["audits"]
    a = data.draw(st.sampled_from([x for x in new_audits if x["layers"]]))
    layer = data.draw(st.sampled_from(a["layers"]))
    layer["allocated_bytes"] = 8 * max(layer["expected_bytes"], 1 << 20)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(["audit", "group", "other layer"]))
        target = a if where == "audit" else data.draw(st.sampled_from(a["groups"] or [a])) if where == "group" \
            else data.draw(st.sampled_from(a["layers"]))
        if target is layer:
            continue
        key = data.draw(st.sampled_from(["expected_bytes", "allocated_bytes", "verdict", "tolerance_bytes",
                                         "alignment_allowance_bytes"]))
        target[key] = data.draw(TAMPER)
    try:
        c = C.compare(C.parse_report(base, "old.json"), C.parse_report(new, "new.json"))
    except UsageError:
        return
    assert c.exit_code == 1, (a["strategy"], layer["layer"])


# --- plan files -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory):
    pytest.importorskip("vllm")
    path = tmp_path_factory.mktemp("plan") / "llama.plan.json"
    assert main(["plan", "--preset", "llama-3.1-8b", "--util", "0.7", "--save", str(path), "--format", "json"]) == 0
    return json.loads(path.read_text())


@_settings("plan_file")
@given(data=st.data())
def test_any_plan_file_is_read_or_refused_in_one_line(data, plan_doc):
    from kvaudit.plan import planfile

    path = _file("x.plan.json", _json_text(data.draw, data.draw(mutated(plan_doc))))
    assert _ending(planfile.load, path) in (0, 2)


@_settings("plan_file_audit")
@given(data=st.data())
def test_any_plan_file_that_reads_is_audited_to_a_verdict(data, plan_doc, capsys):
    """A mutated plan file that passes the reader is audited through the command line on meta, by every
    built-in strategy (the vllm strategy rebuilds vLLM's objects from it): a verdict or not audited, never a
    crash."""
    from kvaudit.plan import planfile

    path = _file("x.plan.json", json.dumps(data.draw(mutated(plan_doc, mutations=2))))
    try:
        planfile.load(path)
    except Exception:  # noqa: BLE001 - refused as read: the test above covers it
        return
    code = main(["audit", "--plan", str(path), "--meter", "meta", "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2, 3) and "Traceback" not in err, err
    if code in (0, 1, 3):
        json.loads(out)


def test_the_examples_add_up_to_ten_thousand():
    assert sum(EXAMPLES.values()) >= 10_000
