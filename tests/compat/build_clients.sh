#!/usr/bin/env bash
# Build the virtual environments of the engines' own benchmark clients for tests/compat:
#   $EA_COMPAT_DIR/vllm    vllm==0.33.0 (--no-deps) + what `vllm bench serve` imports
#   $EA_COMPAT_DIR/sglang  sglang==0.5.23 (--no-deps) + what `python -m sglang.bench_serving`
#                          imports, and a torchvision stand-in (standin/torchvision)
# Usage: tests/compat/build_clients.sh [vllm|sglang|all]   (EA_COMPAT_DIR: /tmp/ea-compat)
# The package lists (*-client.txt) are pinned and installed with --no-deps: no GPU stack, the
# CPU torch wheel. Then run: .venv/bin/python -m pytest -m compat tests/compat
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${EA_COMPAT_DIR:-/tmp/ea-compat}
which=${1:-all}
python=${PYTHON:-python3}

build() {       # name, main package, pinned list, check command (run in the venv's bin)
    local venv="$dir/$1"
    echo "building $venv ($2)"
    rm -rf "$venv"
    if ! { "$python" -m venv "$venv" &&
           "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "$2" &&
           "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$3" &&
           { [[ $1 != sglang ]] || cp -r "$here/standin/torchvision" "$("$venv/bin/python" -c \
               'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"; } &&
           HF_HUB_OFFLINE=1 $venv/bin/$4 > /dev/null 2>&1; }; then
        rm -rf "$venv"      # half an environment would make the tests fail instead of skip
        echo "building $venv failed" >&2
        return 1
    fi
}

mkdir -p "$dir"
if [[ $which == vllm || $which == all ]]; then
    build vllm vllm==0.33.0 "$here/vllm-client.txt" "vllm bench serve --help"
fi
if [[ $which == sglang || $which == all ]]; then
    build sglang sglang==0.5.23 "$here/sglang-client.txt" "python -m sglang.bench_serving --help"
fi
echo "clients ready under $dir"
