# Sourced by scripts/kvaudit and scripts/test: create or reuse .venv/ at the repo root with the
# pinned lean CPU install of vLLM 0.33.0, the test tools, and kvaudit itself (editable).
# It reinstalls only when requirements/*.txt or pyproject.toml changed (a stamp in .venv/).
set -euo pipefail
KVAUDIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVAUDIT_VENV="$KVAUDIT_ROOT/.venv"
_stamp="$KVAUDIT_VENV/.kvaudit-stamp"
_want="$(cat "$KVAUDIT_ROOT"/requirements/*.txt "$KVAUDIT_ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$KVAUDIT_VENV/bin/python" ] || [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
  echo "kvaudit: setting up $KVAUDIT_VENV (lean CPU vLLM 0.33.0: about 2 minutes the first time)" >&2
  _log="$(mktemp)"
  {
    "${PYTHON:-python3}" -m venv "$KVAUDIT_VENV" &&
    "$KVAUDIT_VENV/bin/python" -m pip install -r "$KVAUDIT_ROOT/requirements/planner-cpu.txt" &&
    "$KVAUDIT_VENV/bin/python" -m pip install --no-deps -r "$KVAUDIT_ROOT/requirements/vllm-nodeps.txt" &&
    "$KVAUDIT_VENV/bin/python" -m pip install -r "$KVAUDIT_ROOT/requirements/test.txt" &&
    "$KVAUDIT_VENV/bin/python" -m pip install -r "$KVAUDIT_ROOT/requirements/release-fetch.txt" &&
    "$KVAUDIT_VENV/bin/python" -m pip install --no-deps -e "$KVAUDIT_ROOT"
  } >"$_log" 2>&1 || { tail -n 40 "$_log" >&2; echo "kvaudit: setup failed; full log: $_log" >&2; exit 1; }
  rm -f "$_log"
  echo "$_want" > "$_stamp"
fi
