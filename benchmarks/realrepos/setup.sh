#!/usr/bin/env bash
# Build everything the real-repository harness needs, OUTSIDE any npu-port checkout:
#   venvs (one per project, torch==2.13.0 CPU + the project's own pins), npu-port installed editable from a checkout
#   you name, tiny random checkpoints and inputs (made by our scripts), and the hand-ported copies.
#
# usage: setup.sh --npu-port CHECKOUT [--tav REPO] [--animatediff REPO] [--dit REPO] [--raft REPO] [--root DIR]
#                 [--only NAME[,NAME...]]
#   REPO: a work tree or a bare git dir (what the search tool's fetch returns); it is cloned into ROOT/src/NAME.
#   --only: set up these projects only (tav, animatediff, dit, raft; default all four).
#   Run it again with another --npu-port to point every venv at another checkout (the rest is kept; delete
#   ROOT/venvs/NAME or ROOT/inputs/NAME to rebuild one).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT=/tmp/realrepos
NPU_PORT=""
ONLY="tav,animatediff,dit,raft"
declare -A REPOS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --npu-port) NPU_PORT="$(cd "$2" && pwd)"; shift 2 ;;
    --tav) REPOS[tav]="$2"; shift 2 ;;
    --animatediff) REPOS[animatediff]="$2"; shift 2 ;;
    --dit) REPOS[dit]="$2"; shift 2 ;;
    --raft) REPOS[raft]="$2"; shift 2 ;;
    --root) ROOT="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    *) echo "setup.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$NPU_PORT" ] || { echo "setup.sh: --npu-port CHECKOUT is required" >&2; exit 2; }
[ -f "$NPU_PORT/setup.cfg" ] || { echo "setup.sh: $NPU_PORT is not an npu-port checkout" >&2; exit 2; }
case "$ROOT" in "$NPU_PORT"*) echo "setup.sh: --root must be outside the npu-port checkout" >&2; exit 2 ;; esac
mkdir -p "$ROOT"/{src,venvs,inputs,handport,out}
echo "$NPU_PORT" > "$ROOT/npu_port_checkout"

# The project's own pins, as far as they install with torch 2.13 on Python 3.11 (README.md says which were changed).
# torchvision has no CPU build on the index: the CUDA wheel is used and patched (see patch_torchvision below).
COMMON=("torch==2.13.0" "torchvision==0.28.0")
OLD_DIFFUSERS=("diffusers==0.11.1" "transformers==4.25.1" "huggingface_hub<0.26" "numpy<2")
declare -A PINS=(
  [tav]="${OLD_DIFFUSERS[*]} accelerate decord==0.6.0 omegaconf einops imageio imageio-ffmpeg"
  [animatediff]="${OLD_DIFFUSERS[*]} imageio==2.27.0 imageio-ffmpeg==0.4.9 omegaconf==2.3.0 safetensors einops"
  [dit]="timm diffusers"
  [raft]="numpy<2 scipy matplotlib opencv-python-headless<4.11"
)
declare -A DIRNAME=([tav]=Tune-A-Video [animatediff]=AnimateDiff [dit]=DiT [raft]=RAFT)

quiet_pip() { "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

patch_torchvision() {
  # The index's torchvision 0.28.0 is a CUDA build: its _C.so needs libtorch_cuda.so, fails to load against the CPU
  # torch, and torchvision/_meta_registrations.py then registers fake kernels for torchvision::nms / qnms
  # unconditionally -> "RuntimeError: operator torchvision::nms does not exist" at `import torchvision`. Guard those
  # two registrations as the file already guards the others (ops are unused by every project here).
  local file
  file="$("$1/bin/python" -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
  sed -i -E 's/^@torch\.library\.register_fake\(("torchvision::q?nms")\)$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))  # realrepos harness/' "$file"
  "$1/bin/python" -W ignore -c "import torchvision" || { echo "setup.sh: torchvision still does not import" >&2; exit 1; }
}

for name in ${ONLY//,/ }; do
  [ -n "${DIRNAME[$name]:-}" ] || { echo "setup.sh: unknown project $name (tav, animatediff, dit, raft)" >&2; exit 2; }
  src="$ROOT/src/${DIRNAME[$name]}"
  if [ ! -d "$src" ]; then
    [ -n "${REPOS[$name]:-}" ] || { echo "setup.sh: $src is missing: pass --$name REPO" >&2; exit 2; }
    git clone -q "${REPOS[$name]}" "$src"
  fi
  venv="$ROOT/venvs/$name"
  if [ ! -f "$venv/.built" ]; then
    echo "== venv $name"
    rm -rf "$venv"; python3 -m venv "$venv"
    quiet_pip "$venv/bin/pip" install -q "${COMMON[@]}"
    # shellcheck disable=SC2086
    quiet_pip "$venv/bin/pip" install -q "${COMMON[@]}" ${PINS[$name]}
    patch_torchvision "$venv"
    "$venv/bin/pip" freeze 2>/dev/null > "$venv/.freeze"
    touch "$venv/.built"
  fi
  echo "== npu-port in $name from $NPU_PORT"
  quiet_pip "$venv/bin/pip" install -q "PyYAML>=5.4" "tqdm>=4.40"
  quiet_pip "$venv/bin/pip" install -q --no-deps -e "$NPU_PORT"
  if [ ! -f "$ROOT/inputs/$name/.built" ]; then
    echo "== tiny checkpoints and inputs for $name"
    rm -rf "$ROOT/inputs/$name"
    "$venv/bin/python" -W ignore "$HERE/make_inputs.py" "$name" --repo "$src" --out "$ROOT/inputs/$name"
    touch "$ROOT/inputs/$name/.built"
  fi
  echo "== hand port of $name"
  python3 "$HERE/handport.py" "$name" --repo "$src" --out "$ROOT/handport/${DIRNAME[$name]}"
done
echo "setup.sh: done; now run: python3 $HERE/run.py --root $ROOT"
