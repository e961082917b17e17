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
  local want log _kvaudit_compile=(--compile-bytecode)
  # an environment only the tests use (not .venv/, the main job's) compiles what they import, as they import it
  # (scripts/test lets Python write bytecode): 17 s of the suite's CPU where compiling all of it took 38 s
  [ "$version" = "$KVAUDIT_VLLM" ] || _kvaudit_compile=()
  want="$(cat "$req/vllm-$version"/*.txt "$req/test.txt" "$req/release-fetch.txt" "$req/installer.txt" \
          "$KVAUDIT_ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.kvaudit-stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "kvaudit: setting up $venv (lean CPU vLLM $version: about a minute the first time)" >&2
  log="$(mktemp)"
  {
    "${PYTHON:-python3}" -m venv "$venv" &&
    _kvaudit_install "$venv" -r "$req/vllm-$version/planner-cpu.txt" -r "$req/test.txt" -r "$req/release-fetch.txt" &&
    _kvaudit_install "$venv" --no-deps -r "$req/vllm-$version/nodeps.txt" -e "$KVAUDIT_ROOT"
  } >"$log" 2>&1 || { tail -n 40 "$log" >&2; echo "kvaudit: setup of $venv failed; full log: $log" >&2; return 1; }
  rm -f "$log"
  echo "$want" > "$venv/.kvaudit-stamp"
}

# _kvaudit_install VENV PIP-INSTALL-ARGS...: uv (requirements/installer.txt) where it installs, else pip. uv does not
# read pip's configuration, so the package sources pip is configured with (find-links folders, http(s) indexes:
# where this machine kind keeps the CPU build of torch) are handed to it; uv compiles the bytecode as pip does
# where kvaudit_venv's $_kvaudit_compile asks for it.
_kvaudit_install() {
  local venv="$1"; shift
  local key value
  if [ ! -x "$venv/bin/uv" ]; then
    "$venv/bin/python" -m pip install -q -r "$KVAUDIT_ROOT/requirements/installer.txt" || true
  fi
  if [ -x "$venv/bin/uv" ]; then
    if [ -z "${_kvaudit_sources+set}" ]; then  # (once per environment set up)
      _kvaudit_sources=()
      while IFS='=' read -r key value; do
        value="${value//\'/}"
        for value in $value; do
          case "$key:$value" in
            *.find-links:*) [ -e "$value" ] && _kvaudit_sources+=(--find-links "$value") ;;
            *.extra-index-url:http*) _kvaudit_sources+=(--extra-index-url "$value") ;;
            *.index-url:http*) _kvaudit_sources+=(--index-url "$value") ;;
          esac
        done
      done < <("$venv/bin/python" -m pip config list 2>/dev/null)
    fi
    "$venv/bin/uv" pip install --python "$venv/bin/python" "${_kvaudit_compile[@]}" "${_kvaudit_sources[@]}" "$@" && return 0
    echo "kvaudit: uv could not install ($*); pip does" >&2
  fi
  "$venv/bin/python" -m pip install "$@"
}
