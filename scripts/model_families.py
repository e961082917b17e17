#!/usr/bin/env python3
"""Build kvaudit/triage/model_families.json from vLLM's own model registry (run by hand).

    .venv/bin/python scripts/model_families.py [PATH/TO/vllm/model_executor/models/registry.py ...]

Reads each registry (default: the one of every vLLM installed beside this checkout, ``.venv*/``) with ``ast`` (nothing
is imported or run): every ``_*_MODELS`` dict maps an architecture to ``(module, class)``, and a model family is the
module's name up to its first digit or underscore (``qwen2_vl`` → ``qwen``, ``glm4`` → ``glm``, ``whisper``). Triage
reads a name of one of these families in prose as a model where a digit follows it in the same word
("whisper-large-v3-turbo", "internlm2-chat-20b"): ``kvaudit.triage.evidence``.

``EXCLUDED``: module names that are no family users name a model by (vLLM's own wrappers) or that name other
things in prose, with a digit after them ("GPT-4", "step1:", "nano-banana-2").
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kvaudit" / "triage" / "model_families.json"
EXCLUDED = {"gpt", "step", "nano", "param", "openai", "unlimited", "transformers", "terratorch", "extract", "vllm",
            "colbert", "jina", "voyage", "bert", "roberta", "modernbert", "clip", "siglip", "diffusion", "embedding",
            "flex", "cheers", "seed", "eagle", "medusa", "bee", "muse", "dory"}
"""Not read as a model's family: closed models' and English words' first parts ("GPT-4", "seed=1"), vLLM's wrappers,
draft-model heads, and encoders no one serves with a KV cache."""


def families(registry: Path) -> tuple[set[str], str]:
    """The families of one registry file, and the vLLM release it belongs to (from the path's site-packages)."""
    tree = ast.parse(registry.read_text())
    found = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AnnAssign) \
            else None
        if not (isinstance(target, ast.Name) and target.id.endswith("_MODELS") and isinstance(node.value, ast.Dict)):
            continue
        for value in node.value.values:
            if isinstance(value, ast.Tuple) and value.elts and isinstance(value.elts[0], ast.Constant):
                module = str(value.elts[0].value).lower()
                if module.startswith("vllm."):
                    continue
                m = re.match(r"[a-z]{3,}", module)
                if m and m.group(0) not in EXCLUDED:
                    found.add(m.group(0))
    dist = next(registry.parents[3].glob("vllm-*.dist-info"), None)
    return found, dist.name.removesuffix(".dist-info") if dist else str(registry)


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(ROOT.glob(".venv*/lib/python*/site-packages/vllm/model_executor/"
                                                              "models/registry.py"))
    if not paths:
        print("model_families: no vLLM registry found (install one: scripts/test --setup)", file=sys.stderr)
        return 2
    every, sources = set(), []
    for p in paths:
        got, source = families(p)
        every |= got
        sources.append(f"{source}: vllm/model_executor/models/registry.py")
    OUT.write_text(json.dumps({"sources": sources, "families": sorted(every)}, indent=1) + "\n")
    print(f"model_families: {len(every)} families from {len(paths)} registries → {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
