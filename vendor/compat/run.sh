#!/usr/bin/env bash
# Builds vendor/compat twice, against crates.io's fjall 3.1.13 / lsm-tree 3.1.10 and
# against the patched copies, and reads each build's store with the other (and the
# patched build's with itself). Run by `scripts/vendor.sh test`, which passes:
#   WORK     its work directory; WORK/patched/{fjall,lsm-tree} hold the patched crates
#            rebuilt from upstream + vendor/patches (what `scripts/vendor.sh check`
#            compares with vendor/)
#   TARGET   the cargo target directory to build in
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$1
target=$2

copy_if_changed() { cmp -s "$1" "$2" || { mkdir -p "$(dirname "$2")"; cp "$1" "$2"; }; }

for build in upstream patched; do
  dir="$work/compat/$build"
  mkdir -p "$dir/src"
  for f in "$here"/src/*.rs; do copy_if_changed "$f" "$dir/src/$(basename "$f")"; done
  manifest=$(mktemp)
  cp "$here/Cargo.toml" "$manifest"
  features=()
  if [ "$build" = patched ]; then
    features=(--features patched)
    # The patched crates are packages of their own names (their 0000 patches); the
    # libraries keep theirs, so both builds compile the same source.
    sed -i -e "s|^fjall = .*|fjall = { package = \"eventfold-fjall\", path = \"$work/patched/fjall\" }|" \
      -e "s|^lsm-tree = .*|lsm-tree = { package = \"eventfold-lsm-tree\", path = \"$work/patched/lsm-tree\" }|" \
      "$manifest"
    grep -q eventfold-fjall "$manifest" && grep -q eventfold-lsm-tree "$manifest" ||
      { echo "run.sh: vendor/compat/Cargo.toml lacks the fjall and lsm-tree lines it rewrites" >&2; exit 1; }
  fi
  copy_if_changed "$manifest" "$dir/Cargo.toml"
  rm -f "$manifest"
  echo "building the $build build of vendor/compat" >&2
  CARGO_TARGET_DIR="$target" cargo build --quiet --release --manifest-path "$dir/Cargo.toml" "${features[@]}"
  cp "$target/release/eventfold-vendor-compat" "$work/compat/$build.bin"
done

# On disk (not /tmp, which may be memory): two stores of about 300 MB each.
stores="$work/compat/stores"
rm -rf "$stores"
mkdir -p "$stores"
trap 'rm -rf "$stores"' EXIT
up="$work/compat/upstream.bin"
pa="$work/compat/patched.bin"
set -x
"$pa" write "$stores/patched"
"$up" read "$stores/patched"
"$pa" read "$stores/patched"
"$up" write "$stores/upstream"
"$pa" read "$stores/upstream"
