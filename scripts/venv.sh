# Sourced by scripts/kvaudit and scripts/test. kvaudit_venv VERSION DIR creates or reuses DIR with
# the pinned lean CPU install of vLLM VERSION (requirements/vllm-VERSION/), the test tools, what
# --strategy vllm-ascend==X needs, and kvaudit itself (editable). It reinstalls only when those
# requirements or pyproject.toml changed (a stamp inside DIR).
set -euo pipefail
KVAUDIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVAUDIT_VLLM="0.33.0"                  # the vLLM of .venv/, the main job and the golden files
KVAUDIT_VLLM_ALSO="0.23.0"             # also tested, in .venv-vllm-0.23.0/ (vllm-ascend 0.23 pins it)

kvaudit_venv() {
  local version="$1" venv="$2" req="$KVAUDIT_ROOT/requirements"
  local want log
  want="$(cat "$req/vllm-$version"/*.txt "$req/test.txt" "$req/release-fetch.txt" "$KVAUDIT_ROOT/pyproject.toml" \
          | sha256sum | cut -d' ' -f1)"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.kvaudit-stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "kvaudit: setting up $venv (lean CPU vLLM $version: about 2 minutes the first time)" >&2
  log="$(mktemp)"
  {
    "${PYTHON:-python3}" -m venv "$venv" &&
    "$venv/bin/python" -m pip install -r "$req/vllm-$version/planner-cpu.txt" &&
    "$venv/bin/python" -m pip install --no-deps -r "$req/vllm-$version/nodeps.txt" &&
    "$venv/bin/python" -m pip install -r "$req/test.txt" -r "$req/release-fetch.txt" &&
    "$venv/bin/python" -m pip install --no-deps -e "$KVAUDIT_ROOT"
  } >"$log" 2>&1 || { tail -n 40 "$log" >&2; echo "kvaudit: setup of $venv failed; full log: $log" >&2; return 1; }
  rm -f "$log"
  echo "$want" > "$venv/.kvaudit-stamp"
}
