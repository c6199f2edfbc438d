#!/usr/bin/env bash
# `make images`: every stage image from images/, on a locally built base (nothing can be pulled here).
#   1. the base: scripts/build-base-image.sh, imported as the name the Dockerfiles' FROM uses;
#   2. each stage: the CPU variant where the release image needs CUDA (build args from
#      gagar.pipeline.images.CPU_BUILD_ARGS, tag <version>-cpu; the CPU torch wheel is bind-mounted
#      from images/wheels/), the release image otherwise;
#   3. the rollout release image up to its base: the build must stop exactly at `FROM vllm/...`;
#   4. each image runs images/smoke.py STAGE as uid 1000 with --network none.
# Prints one line per image (seconds, size) and writes them to $IMAGES_REPORT (default .work/images.tsv).
#   ENGINE             podman (default) or docker
#   IMAGES             stages to build (default: all five)
#   TORCH_CPU_WHEEL    the torch 2.13.0+cpu wheel (default: found in /opt/wheels or pip's find-links)
#   IMAGES_GPU=1       also build the grader and train release images (the CUDA torch: several GB)
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${ENGINE:-podman}
if [ "$engine" = podman ]; then
  export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/podman-containers.conf}
fi
command -v "$engine" >/dev/null || { echo "build-images.sh: $engine is missing (bash scripts/install-system-deps.sh --containers)" >&2; exit 1; }
py() { PYTHONPATH=$PWD/src python3 -c "from gagar.pipeline import images as m; $1"; }
stages=${IMAGES:-$(py 'print(" ".join(m.STAGES))')}
base=$(py 'print(m.CPU_BASE)')
report=${IMAGES_REPORT:-.work/images.tsv}
mkdir -p "$(dirname "$report")"

bash scripts/build-base-image.sh "$engine" "$base"

wheel=${TORCH_CPU_WHEEL:-}
if [ -z "$wheel" ]; then
  for dir in /opt/wheels ${PIP_FIND_LINKS:-}; do
    for f in "$dir"/torch-2.13.0+cpu-cp311-*.whl; do [ -f "$f" ] && wheel=$f; done
  done
fi
[ -f "$wheel" ] || { echo "build-images.sh: no torch 2.13.0+cpu wheel (set TORCH_CPU_WHEEL)" >&2; exit 1; }
ln -f "$wheel" images/wheels/ 2>/dev/null || cp -f "$wheel" images/wheels/

build() {  # build STAGE TAG [--build-arg K=V ...]
  local stage=$1 tag=$2
  shift 2
  local log="$report.$stage.build.log"
  if ! nice -n 10 "$engine" build --pull=never -f "images/$stage/Dockerfile" -t "$tag" "$@" . >"$log" 2>&1; then
    echo "build-images.sh: building $tag failed ($log):" >&2
    tail -n 30 "$log" >&2
    return 1
  fi
}
printf 'image\tbuild_s\tsize_mb\tsmoke\n' > "$report"
for stage in $stages; do
  args=()
  while read -r kv; do [ -n "$kv" ] && args+=(--build-arg "$kv"); done < <(
    py "print('\n'.join(f'{k}={v}' for k, v in m.CPU_BUILD_ARGS.get('$stage', {}).items()))")
  variant=$(py "print('cpu' if '$stage' in m.CPU_BUILD_ARGS else '')")
  tag=$(py "print(m.stage_image('$stage', variant='$variant' or None))")
  start=$(date +%s)
  build "$stage" "$tag" ${args[@]+"${args[@]}"} || exit 1
  seconds=$(($(date +%s) - start))
  size=$("$engine" image inspect --format '{{.Size}}' "$tag")
  smoke=$("$engine" run --rm --user 1000:1000 --network none -v "$PWD/images/smoke.py:/smoke.py:ro" \
    "$tag" python /smoke.py "$stage" 2>"$report.$stage.err" | tail -n1) \
    || { echo "build-images.sh: the smoke run of $tag failed:" >&2; tail -n 20 "$report.$stage.err" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$tag" "$seconds" "$((size / 1000000))" "$smoke" | tee -a "$report"
done

# The rollout release image: everything up to its CUDA base, which cannot be had here.
gpu_base=$(sed -n 's/^ARG BASE=//p' images/rollout/Dockerfile)
if out=$("$engine" build --pull=never -f images/rollout/Dockerfile -t "$(py 'print(m.stage_image("rollout"))')" . 2>&1); then
  echo "rollout release image built (its base $gpu_base is present)"
elif grep -q "$gpu_base" <<<"$out"; then
  printf '%s\t-\t-\tstops at FROM %s (not available here)\n' "$(py 'print(m.stage_image("rollout"))')" "$gpu_base" | tee -a "$report"
else
  echo "build-images.sh: the rollout release build failed before its base:" >&2
  echo "$out" | tail -n 20 >&2
  exit 1
fi
if [ "${IMAGES_GPU:-0}" = 1 ]; then
  for stage in grader train; do
    start=$(date +%s)
    build "$stage" "$(py "print(m.stage_image('$stage'))")"
    printf '%s\t%s\t-\trelease (CUDA torch)\n' "$(py "print(m.stage_image('$stage'))")" "$(($(date +%s) - start))" | tee -a "$report"
  done
fi
"$engine" image prune -f >/dev/null
