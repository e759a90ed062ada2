#!/usr/bin/env bash
# Build the virtual environments of the engines' own benchmark clients for tests/compat:
#   $EA_COMPAT_DIR/vllm    vllm==0.33.0 (--no-deps) + what `vllm bench serve` imports
#   $EA_COMPAT_DIR/sglang  sglang==0.5.23 (--no-deps) + what `python -m sglang.bench_serving`
#                          imports, and a torchvision stand-in (standin/torchvision)
# Usage: tests/compat/build_clients.sh [vllm|sglang|all]   (EA_COMPAT_DIR: /tmp/ea-compat)
# The package lists (*-client.txt) are pinned and installed with --no-deps: no GPU stack, the
# CPU torch wheel (pip's find-links), binary wheels only. Then run:
#   .venv/bin/python -m pytest -m compat tests/compat
#
# Fast on purpose (.ci/run builds the vLLM client under a time limit): one pip call per
# environment, no dependency resolution (--no-deps on a pinned list), wheels only, and no
# byte-compiling at install time (--no-compile: pip would compile every module of torch and
# vLLM, most of which the clients never import; the check run below compiles what they do).
# An environment counts as built only once the check passed: then `.built` holds the hash of
# its package list, and the tests skip without it (a build cut short leaves no `.built`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${EA_COMPAT_DIR:-/tmp/ea-compat}
which=${1:-all}
python=${PYTHON:-python3}

stamp() {       # the hash the tests expect in .built: main package + pinned list
    { echo "$1"; cat "$2"; } | sha256sum | cut -d' ' -f1
}

build() {       # name, main package, pinned list, check command (run in the venv's bin)
    local venv="$dir/$1" start=$SECONDS
    echo "building $venv ($2)"
    rm -rf "$venv"
    trap 'rm -rf "$venv"; exit 130' INT TERM    # a build cut short (timeout) leaves nothing
    if ! { "$python" -m venv "$venv" &&
           "$venv/bin/pip" install -q --no-compile --disable-pip-version-check --no-deps \
               --only-binary=:all: "$2" -r "$3" &&
           { [[ $1 != sglang ]] || cp -r "$here/standin/torchvision" "$("$venv/bin/python" -c \
               'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"; } &&
           HF_HUB_OFFLINE=1 "$venv/bin/"$4 > "$venv/check.log" 2>&1; }; then
        [[ -f $venv/check.log ]] && tail -20 "$venv/check.log" >&2
        rm -rf "$venv"      # half an environment would make the tests fail instead of skip
        echo "building $venv failed" >&2
        trap - INT TERM
        return 1
    fi
    stamp "$2" "$3" > "$venv/.built"
    trap - INT TERM
    echo "built $venv in $((SECONDS - start)) s"
}

mkdir -p "$dir"
status=0
if [[ $which == vllm || $which == all ]]; then
    build vllm vllm==0.33.0 "$here/vllm-client.txt" "vllm bench serve --help" || status=1
fi
if [[ $which == sglang || $which == all ]]; then
    build sglang sglang==0.5.23 "$here/sglang-client.txt" \
        "python -m sglang.bench_serving --help" || status=1
fi
[[ $status == 0 ]] && echo "clients ready under $dir"
exit $status
