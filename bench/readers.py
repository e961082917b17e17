"""Worst-case inputs of every reader, at growing sizes: the time must grow with the input, not faster.

    .venv/bin/python bench/readers.py [--reps 3]

Each case is an input shape that was once quadratic (or could be: a pattern that backtracks, a string built
by repeated copies) at 1, 2 and 4 times a base size. Prints the best of ``--reps`` runs per size, MB/s, and
the growth from the smallest to the largest size against the size's own growth (4×): a reader that stays
linear shows about 4×, a quadratic one 16×. Needs no vLLM (the plan file is generated from its shape).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvaudit.triage.evidence import clean_lines, extract  # noqa: E402

TMP = Path(tempfile.mkdtemp(prefix="kvaudit-bench-readers-"))


def _report(text: str) -> None:
    extract(clean_lines(text))


def continued_command(n: int) -> str:
    """A ``vllm serve`` continued with backslashes over ``n`` short lines (a 328 KB paste of them took 55 s)."""
    return "vllm serve Qwen/Qwen3-8B \\\n" + "  -x \\\n" * n + "  --max-model-len 4096\n"


def version_whitespace(n: int) -> str:
    """Version lines padded with whitespace (the 1.6 MB paste that took 63 s): pip list, torch_npu, prose."""
    pad = " " * 8000
    return ("vllm" + pad + "x\nvllm-ascend" + pad + "y\ntorch-npu" + pad + "z\n") * max(1, n // 300)


def utilization_whitespace(n: int) -> str:
    """Prose about the utilization, then whitespace."""
    return ("the utilization 0.9" + " " * 8000 + "x\n") * max(1, n // 100)


def smi_digits(n: int) -> str:
    """nvidia-smi-like rows of digits and temperatures."""
    return ("|" + " 35C P0 " * 1000 + "|\n") * max(1, n // 100)


def ansi_unterminated(n: int) -> str:
    """Terminal title sequences that never end."""
    return ("\x1b]0;" * 2000 + "\n") * max(1, n // 100)


def tracebacks(n: int) -> str:
    """``n`` out-of-memory tracebacks in one paste (a crash loop's log): each error line asks for its phase."""
    one = ('Traceback (most recent call last):\n  File "/v/gpu_model_runner.py", line 1, in profile_run\n'
           '  File "/v/gpu_model_runner.py", line 2, in _dummy_run\n'
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    return one * max(1, n)


def _compare_report(n: int) -> Path:
    doc = json.loads((ROOT / "fixtures/reports/compare/qwen3-next-util0.7-meta.json").read_text())
    for a in doc["audits"]:
        base = a["layers"]
        a["layers"] = [{**base[i % len(base)], "layer": f"model.layers.{i}.x"} for i in range(n)]
    path = TMP / f"report-{n}.json"
    path.write_text(json.dumps(doc))
    return path


def compare_layers(n: int) -> tuple[Path, Path]:
    """Two saved reports with ``n`` layers per strategy."""
    return _compare_report(n), _compare_report(n)


def _compare(paths: tuple[Path, Path]) -> None:
    from kvaudit.report import compare as C

    C.to_json(C.compare(C.load_report(paths[0]), C.load_report(paths[1])))


def plan_file_layers(n: int) -> Path:
    """A plan file whose groups and tensors hold ``n`` layers (generated from the shape kvaudit writes)."""
    from kvaudit.model.deployment import PRESETS, load_preset_spec

    spec = load_preset_spec(PRESETS["llama-3.1-8b"])
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(n)]
    plan = {"vllm_version": "0.33.0", "interleaved": False, "platform": "cuda", "block_size": 16, "num_blocks": 1000,
            "kv_budget_bytes": 1 << 34, "plan_format": "shared_by", "planned_bytes": n << 20,
            "groups": [{"index": 0, "spec": "FullAttentionSpec", "block_size": 16, "page_size_bytes": 1 << 16,
                        "layers": layers}],
            "tensors": [{"index": i, "size_bytes": 1 << 20, "shared_by": [name]} for i, name in enumerate(layers)],
            "layer_specs": dict.fromkeys(layers, "FullAttentionSpec"),
            "capacity": {"tokens": 16000, "max_concurrency": 1.0, "max_model_len": 8192, "pool_tokens": 16000,
                         "mamba_slots": None, "max_num_seqs": 128, "kv_cache_memory_bytes": n << 20}}
    model = {"name": spec.name, "config_path": str(spec.config_path), "model_type": spec.model_type,
             "architecture": spec.architecture, "dtype": spec.dtype, "num_hidden_layers": spec.num_hidden_layers,
             "max_position_embeddings": spec.max_position_embeddings, "quantization": None,
             "config": dict(spec.raw), "text_config": dict(spec.text)}
    deployment = {"model": model, "tp": 1, "dtype": "bfloat16", "max_model_len": 8192, "device": "h100-80g",
                  "device_memory_bytes": 85028438507, "gpu_memory_utilization": 0.9, "weights_bytes": 1 << 34,
                  "weights_source": "", "overhead_bytes": 1 << 31, "kv_cache_memory_bytes": None, "kv_transfer": False,
                  "num_blocks_override": None}
    doc = {"format": "kvaudit-plan", "format_version": 1, "vllm_version": "0.33.0",
           "stages": [{"deployment": deployment, "plans": {"cuda": plan}, "strategies": {"vllm": "cuda"},
                       "highest_safe_utilization": {"vllm": 0.95}, "not_planned": {}}]}
    path = TMP / f"plan-{n}.json"
    path.write_text(json.dumps(doc))
    return path


def _plan(path: Path) -> None:
    from kvaudit.plan import planfile

    planfile.load(path)


def policy_entries(n: int) -> Path:
    """A policy of ``n`` entries (up to its cell limit)."""
    path = TMP / f"policy-{n}.toml"
    path.write_text("".join(f'[[model]]\nname = "llama-3.1-8b"\nutil = {0.5 + (i % 400) / 1000}\n'
                            f'max_model_len = {1024 + i}\nstrategies = ["vllm"]\n' for i in range(n)))
    return path


def _policy(path: Path) -> None:
    from kvaudit.ci.policy import load_policy

    load_policy(path, ("vllm",))


CASES: list[tuple[str, Callable[[int], object], Callable[[object], None], int]] = [
    ("report: continued command line", continued_command, _report, 40000),
    ("report: whitespace in version lines", version_whitespace, _report, 20000),
    ("report: whitespace after a utilization", utilization_whitespace, _report, 10000),
    ("report: nvidia-smi-like digit rows", smi_digits, _report, 10000),
    ("report: unterminated ANSI sequences", ansi_unterminated, _report, 10000),
    ("report: out-of-memory tracebacks", tracebacks, _report, 10000),
    ("compare: layers per strategy", compare_layers, _compare, 2000),
    ("plan file: layers", plan_file_layers, _plan, 2000),
    ("policy: entries", policy_entries, _policy, 2000),
]


def _size(arg: object) -> int:
    if isinstance(arg, str):
        return len(arg.encode())
    paths = arg if isinstance(arg, tuple) else (arg,)
    return sum(p.stat().st_size for p in paths)  # type: ignore[union-attr]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print(f"{'case':42} {'size':>10} {'best':>9} {'MB/s':>7}   growth (size ×4)")
    for name, make, read, base in CASES:
        times = []
        for k in (1, 2, 4):
            arg = make(base * k)
            best = min(_timed(read, arg) for _ in range(a.reps))
            times.append(best)
            size = _size(arg)
            growth = f"{best / times[0]:.1f}×" if k == 4 else ""
            print(f"{name if k == 1 else '':42} {size / 1e6:>8.2f}MB {best:>8.3f}s {size / 1e6 / best:>7.1f}   {growth}")


def _timed(read: Callable[[object], None], arg: object) -> float:
    t0 = time.perf_counter()
    read(arg)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
