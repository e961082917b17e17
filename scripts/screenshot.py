"""The screenshot of kvaudit's headline output in an 80-column terminal: ``docs/headline-80.svg``.

    .venv/bin/python scripts/screenshot.py [--columns 80] [--out docs/headline-80.svg]

Runs ``kvaudit qwen3-next --util 0.7`` as a user would (a new process, ``COLUMNS`` set, colours forced), keeps the
end of what it prints (the audit per strategy, its notes and the verdict line on stderr), and draws that text as a
terminal shows it with rich's terminal renderer (``Console.export_svg``): an SVG image, made again by running this.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["qwen3-next", "--util", "0.7"]
HEADLINE = "Audit per strategy"
"""The title of the table that answers the question: the screenshot starts there."""


def headline(columns: int) -> str:
    """What ``kvaudit qwen3-next --util 0.7`` prints from its headline table on, with its ANSI colours."""
    env = dict(os.environ, COLUMNS=str(columns), FORCE_COLOR="1", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    p = subprocess.run([sys.executable, "-m", "kvaudit", *COMMAND], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    if p.returncode not in (0, 1):
        raise SystemExit(f"screenshot: kvaudit exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    lines = p.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if HEADLINE in line)
    verdict = [line for line in p.stderr.splitlines() if line.startswith("kvaudit: ") and ": planning" not in line]
    return "\n".join(lines[start:] + verdict[-1:])


def svg(text: str, columns: int) -> str:
    """``text`` (with ANSI colours) as an 80-column terminal draws it."""
    import io

    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=columns, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    for line in text.splitlines():
        console.print(Text.from_ansi(line), soft_wrap=False, overflow="fold")
    return console.export_svg(title=f"kvaudit {' '.join(COMMAND)}  ({columns} columns)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--columns", type=int, default=80)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "headline-80.svg")
    a = ap.parse_args()
    a.out.write_text(svg(headline(a.columns), a.columns))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
