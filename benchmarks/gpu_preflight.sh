#!/usr/bin/env bash
# The GPU check in one command: `make gpu-preflight` on a GPU node with the project's .venv, and
# the one prepared run on a lent machine that has torch but neither the venv nor a network
# (docs/gpu.md, "On a machine without the venv"). In order, each step's output kept in $OUT:
#
#   1. versions.txt  the GPU (nvidia-smi -L), python and the versions of the stack it runs on;
#   2. offload.txt   tests/test_offload.py: embeddings, latents, loss and gradient the same with
#                    the text encoders offloaded as without, on CUDA where there is one;
#   3. SETTING/preflight.json for each of $SETTINGS: `recast preflight --scale $SCALE
#                    --random-weights` (build, rewards, estimate, train twice, evaluate), and at
#                    full scale SETTING/compute.md: the compute table with this GPU's measured step
#                    (python -m recast_cli.preflight.budget SETTING --preflight …).
#   log.txt          everything printed, as it is printed (what comes back if the run is cut off).
#
# Environment (all optional):
#   PY        the python to run (default: .venv/bin/python where it exists, else python3)
#   OUT       the folder to write (default: artifacts/preflight)
#   WHEELS    a folder of wheels installed first, with no index and no dependencies, into a private
#             folder ($SITE, default /tmp/recast-site) put ahead of the interpreter's own packages:
#             `make device-wheels` fills .whl/ with what benchmarks/device-wheels.txt pins
#   SETTINGS  the settings to check, names or .toml paths (default when unset: "ocr geneval", the
#             paper's two; "" = none)
#   SCALE     full (default; beyond the build it needs CUDA) or tiny (the CPU rehearsal)
#   STEP_TIMEOUT  seconds each step may run (default 0: no limit); a step past it is killed and
#             counted as failed, and the next step runs (what a lent machine's time limit needs)
#
# Run it from anywhere: it works in the checkout it belongs to. Exit: 0 when every step passed
# and every setting fits this device at its batch sizes, 1 otherwise (every step still ran), 2
# when the stack cannot even import recast (nothing else is tried: no GPU time is spent on a
# broken install).
set -u -o pipefail

absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

if [ -z "${PY:-}" ]; then
    root=$(cd "$(dirname "$0")/.." && pwd)
    if [ -x "$root/.venv/bin/python" ]; then PY=$root/.venv/bin/python; else PY=python3; fi
fi
OUT=$(absolute "${OUT:-artifacts/preflight}")
[ -n "${WHEELS:-}" ] && WHEELS=$(absolute "$WHEELS")
[ -n "${SITE:-}" ] && SITE=$(absolute "$SITE")
case "$PY" in */*) PY=$(absolute "$PY") ;; esac
settings=()  # names stay names; paths are made absolute before the cd below
for s in ${SETTINGS-ocr geneval}; do
    case "$s" in */*|*.toml) settings+=("$(absolute "$s")") ;; *) settings+=("$s") ;; esac
done
SCALE=${SCALE:-full}
STEP_TIMEOUT=${STEP_TIMEOUT:-0}
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
export COLUMNS=${COLUMNS:-200}  # rich tables in log.txt whole, not cut to 80 columns
mkdir -p "$OUT" || exit 2
LOG=$OUT/log.txt
: >"$LOG"

say() { echo "gpu-preflight: $*" | tee -a "$LOG"; }
# why a step with exit status $1 failed
reason() { if [ "$1" -eq 124 ]; then echo "killed after STEP_TIMEOUT=$STEP_TIMEOUT s"; else echo "exit $1"; fi; }

if [ -n "${WHEELS:-}" ]; then
    SITE=${SITE:-/tmp/recast-site}
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    shopt -u nullglob
    if [ ${#wheels[@]} -eq 0 ]; then
        say "WHEELS=$WHEELS holds no .whl file (make device-wheels fills .whl/)"
        exit 2
    fi
    say "installing ${#wheels[@]} wheels from $WHEELS into $SITE"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "${wheels[@]}" >>"$LOG" 2>&1; then
        say "pip could not install the wheels in $WHEELS (see $LOG)"
        exit 2
    fi
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# 1. The stack. An import that fails here would fail every later step: stop at once.
{
    nvidia-smi -L 2>/dev/null || echo "nvidia-smi: none"
    "$PY" - <<'EOF'
import importlib, importlib.metadata as md, importlib.util, platform, sys
print("python", platform.python_version(), sys.executable)
for module in ("recast_cli.cli", "recast_cli.preflight", "diffusers", "transformers", "open_clip", "peft"):
    importlib.import_module(module)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("diffusers", "transformers", "huggingface_hub", "tokenizers", "accelerate", "peft",
             "open_clip_torch", "safetensors", "numpy", "typer", "rich", "pytest"):
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = "missing"
    module = "open_clip" if name == "open_clip_torch" else name
    spec = importlib.util.find_spec(module)
    print(f"{name} {version} {spec.origin if spec else ''}")
EOF
} >"$OUT/versions.txt" 2>&1
status=$?
cat "$OUT/versions.txt" >>"$LOG"
if [ $status -ne 0 ]; then
    say "the stack cannot import recast (see $OUT/versions.txt): $(tail -n 1 "$OUT/versions.txt")"
    exit 2
fi

failed=0
# 2. Offload equality, on every device this machine has (seconds at the tiny scale).
say "tests/test_offload.py"
timeout "$STEP_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider tests/test_offload.py 2>&1 \
    | tee "$OUT/offload.txt" >>"$LOG"
status=$?
if [ $status -eq 0 ]; then
    say "offload: $(tail -n 1 "$OUT/offload.txt")"
else
    say "tests/test_offload.py FAILED ($(reason $status); see $OUT/offload.txt)"
    failed=1
fi

# 3. Each setting's preflight. It writes preflight.json itself (atomically) and prints its table.
for s in ${settings[@]+"${settings[@]}"}; do
    name=$(basename "$s" .toml)
    say "recast preflight --setting $s --scale $SCALE"
    start=$(date +%s)
    timeout "$STEP_TIMEOUT" "$PY" -m recast_cli preflight --setting "$s" --scale "$SCALE" --random-weights \
        --out "$OUT/$name" 2>&1 | tee -a "$LOG"
    status=$?
    # a phase that ran only at a smaller batch exits 0: the JSON's "fits" says whether the setting fits
    fits=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("fits"))' \
        "$OUT/$name/preflight.json" 2>/dev/null || echo "no preflight.json")
    if [ $status -ne 0 ] || [ "$fits" != "True" ]; then
        failed=1
        say "$name FAILED ($(reason $status); fits: $fits) after $(( $(date +%s) - start )) s"
    else
        say "$name: fits, $(( $(date +%s) - start )) s"
    fi
    # the compute table with this GPU's measured step (docs/gpu.md, "Compute"): full scale only
    if [ "$SCALE" = full ] && [ -f "$OUT/$name/preflight.json" ]; then
        if "$PY" -m recast_cli.preflight.budget "$s" --preflight "$OUT/$name/preflight.json" \
            >"$OUT/$name/compute.md" 2>>"$LOG"; then
            tee -a "$LOG" <"$OUT/$name/compute.md"
        else
            say "$name: no compute table (see $LOG)"; rm -f "$OUT/$name/compute.md"
        fi
    fi
done

if [ $failed -ne 0 ]; then say "a step FAILED: see $LOG"; else say "every step passed"; fi
exit $failed
