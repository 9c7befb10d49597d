#!/usr/bin/env bash
# The patched copies of fjall and lsm-tree in vendor/ (see vendor/README.md): each is its
# crates.io release plus the numbered patches in vendor/patches/<crate>-<version>/.
#
# Usage: scripts/vendor.sh rebuild [CRATE...]  write vendor/<crate> from the release + patches
#        scripts/vendor.sh check                fail, naming the files, if a rebuild differs
#                                               from vendor/
#        scripts/vendor.sh diff CRATE           vendor/<crate> against its rebuild, as a patch:
#                                               an edit of vendor/<crate> becomes a new
#                                               numbered patch (or is folded into one)
#        scripts/vendor.sh test                 the crates' own tests (unit and doc) on the patched
#                                               sources, then vendor/compat (stores written by
#                                               the patched fjall read by the pristine release)
#        scripts/vendor.sh series               each crate compiles after each of its patches
# Env:   EVENTFOLD_VENDOR_CACHE    downloaded .crate files and the test trees
#                                  (default ~/.cache/eventfold/vendor)
#        EVENTFOLD_VENDOR_TARGET   cargo target directory of `test`
#                                  (default ~/.cache/eventfold/vendor-target)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${EVENTFOLD_VENDOR_CACHE:-$HOME/.cache/eventfold/vendor}
target=${EVENTFOLD_VENDOR_TARGET:-$HOME/.cache/eventfold/vendor-target}

# crate version sha256 of the .crate file (as crates.io's index lists it)
releases=(
  "lsm-tree 3.1.10 5498808f4d41cf785079d3ef3f28716f1b4364af1b512f3097bfb651bded1b3e"
  "fjall 3.1.13 6e98f7212d748b723dcfbd43d5f166958945ad2c05ad4537fb99bcda42ad8a96"
)
# Files of a .crate that vendor/<crate> does not keep: cargo's publishing metadata, the
# crate's own lock file (a path dependency's is never read) and the manifest as written
# before cargo normalized it (the patches apply to the normalized Cargo.toml).
dropped=(.cargo_vcs_info.json Cargo.lock Cargo.toml.orig)

die() { echo "vendor.sh: $*" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
step() { printf '\n==> %s\n' "$*" >&2; }

release_of() { # CRATE -> "crate version sha256"
  local r
  for r in "${releases[@]}"; do
    [ "${r%% *}" = "$1" ] && { echo "$r"; return; }
  done
  die "unknown crate $1 (known: fjall, lsm-tree)"
}

# Prints the path of the verified .crate file of CRATE VERSION SHA256, downloading it
# once: from cargo's own registry cache if a build fetched it, else from crates.io.
fetch() {
  local crate=$1 version=$2 sha=$3 file="$cache/$1-$2.crate" found
  mkdir -p "$cache"
  if [ ! -f "$file" ]; then
    found=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$crate-$version.crate" 2>/dev/null | head -n 1 || true)
    if [ -n "$found" ]; then
      cp "$found" "$file.tmp"
    else
      echo "downloading $crate $version from crates.io" >&2
      curl -sSfL --retry 3 -o "$file.tmp" "https://static.crates.io/crates/$crate/$crate-$version.crate"
    fi
    mv "$file.tmp" "$file"
  fi
  echo "$sha  $file" | sha256sum --check --quiet - >&2 ||
    die "$file does not have the checksum of $crate $version on crates.io: delete it and retry"
  echo "$file"
}

# Writes the pristine release of CRATE (as vendor/ keeps it) into DEST (which must not exist).
unpack() {
  local crate=$1 dest=$2 version sha file tmp
  read -r _ version sha <<<"$(release_of "$crate")"
  file=$(fetch "$crate" "$version" "$sha")
  tmp=$(mktemp -d -p "$scratch")
  tar -xzf "$file" -C "$tmp"
  [ -d "$tmp/$crate-$version" ] || die "$file holds no $crate-$version/"
  local f
  for f in "${dropped[@]}"; do rm -f "$tmp/$crate-$version/$f"; done
  mkdir -p "$(dirname "$dest")"
  mv "$tmp/$crate-$version" "$dest"
  rmdir "$tmp"
}

# Writes the patched release of CRATE into DEST (which must not exist).
build() {
  local crate=$1 dest=$2 version p
  read -r _ version _ <<<"$(release_of "$crate")"
  unpack "$crate" "$dest"
  local patches="$root/vendor/patches/$crate-$version"
  [ -d "$patches" ] || die "no $patches"
  for p in "$patches"/*.patch; do
    # GIT_CEILING_DIRECTORIES: apply in DEST even when it lies inside some repository.
    GIT_CEILING_DIRECTORIES="$(dirname "$dest")" git -C "$dest" apply --whitespace=nowarn "$p" ||
      die "$(basename "$p") does not apply to $crate $version (with the patches before it)"
  done
}

# The files of DIR, relative to it: in a git work tree the tracked and untracked ones that
# are not ignored (so a build's target/ does not count), else all.
files_of() {
  if git -C "$1" rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ "$1" != "${1#"$root"/}" ]; then
    (cd "$1" && git ls-files --cached --others --exclude-standard --deduplicate . | while read -r f; do
      [ -e "$f" ] && echo "$f"; done | sort)
  else
    (cd "$1" && find . -type f | sed 's|^\./||' | sort)
  fi
}

# Compares the rebuilt tree NEW of CRATE with vendor/CRATE; prints and counts differences.
compare() {
  local crate=$1 new=$2 old="$root/vendor/$1" n=0 f
  while read -r f; do
    echo "vendor/$crate/$f: not what upstream + patches give" >&2; n=$((n + 1))
  done < <(comm -12 <(files_of "$old") <(files_of "$new") | while read -r f; do
    cmp -s "$old/$f" "$new/$f" || echo "$f"; done)
  while read -r f; do
    echo "vendor/$crate/$f: not in upstream + patches" >&2; n=$((n + 1))
  done < <(comm -23 <(files_of "$old") <(files_of "$new"))
  while read -r f; do
    echo "vendor/$crate/$f: missing (upstream + patches have it)" >&2; n=$((n + 1))
  done < <(comm -13 <(files_of "$old") <(files_of "$new"))
  [ "$n" = 0 ]
}

crates() { local r; for r in "${releases[@]}"; do echo "${r%% *}"; done; }

# Copies the files of SRC over DEST, leaving unchanged files alone (so cargo, which looks
# at modification times, rebuilds only what changed) and removing the files SRC lacks.
sync_tree() {
  local src=$1 dest=$2 f
  mkdir -p "$dest"
  (cd "$src" && find . -type f) | while read -r f; do
    if ! cmp -s "$src/$f" "$dest/$f"; then mkdir -p "$(dirname "$dest/$f")"; cp "$src/$f" "$dest/$f"; fi
  done
  (cd "$dest" && find . -type f ! -path './target/*') | while read -r f; do
    [ -e "$src/$f" ] || rm -f "$dest/$f"
  done
}

cmd_rebuild() {
  local crate tmp
  [ $# -gt 0 ] || set -- $(crates)
  for crate in "$@"; do
    release_of "$crate" >/dev/null
    tmp=$(mktemp -d -p "$scratch")
    build "$crate" "$tmp/$crate"
    rm -rf "$root/vendor/$crate"
    mv "$tmp/$crate" "$root/vendor/$crate"
    echo "vendor/$crate rebuilt from $(release_of "$crate" | cut -d' ' -f1-2) + $(ls "$root"/vendor/patches/"$crate"-*/*.patch | wc -l) patches" >&2
  done
}

cmd_check() {
  local crate tmp bad=0
  tmp=$(mktemp -d -p "$scratch")
  for crate in $(crates); do
    build "$crate" "$tmp/$crate"
    if compare "$crate" "$tmp/$crate"; then
      echo "vendor/$crate: upstream + patches, unchanged" >&2
    else
      bad=1
    fi
  done
  [ "$bad" = 0 ] || die "vendor/ differs from upstream + vendor/patches: commit the change as a patch (scripts/vendor.sh diff CRATE) or run scripts/vendor.sh rebuild"
}

cmd_diff() {
  [ $# = 1 ] || die "usage: scripts/vendor.sh diff CRATE"
  release_of "$1" >/dev/null
  local tmp
  tmp=$(mktemp -d -p "$scratch")
  build "$1" "$tmp/a"
  mkdir -p "$tmp/b"
  files_of "$root/vendor/$1" | while read -r f; do
    mkdir -p "$(dirname "$tmp/b/$f")"; cp "$root/vendor/$1/$f" "$tmp/b/$f"
  done
  (cd "$tmp" && git diff --no-index --no-color --no-prefix a b) || true
}

# Upstream's tests ship inside src/ (the .crate has no tests/ directory): `cargo test` of
# each patched crate runs its unit tests and doc tests (its manifest turns off other test
# targets), in one workspace in which fjall uses the patched lsm-tree (by path: its 0000 patch), as
# eventfold does.
# Then vendor/compat, against the pristine releases.
cmd_test() {
  local work="$cache/test" crate tmp
  mkdir -p "$work" "$target"
  for crate in $(crates); do
    tmp=$(mktemp -d -p "$scratch")
    build "$crate" "$tmp/$crate"
    sync_tree "$tmp/$crate" "$work/patched/$crate"
  done
  cat >"$work/patched/Cargo.toml" <<'EOF'
# Written by scripts/vendor.sh test: the patched crates' own test suites.
[workspace]
resolver = "2"
members = ["fjall", "lsm-tree"]
EOF
  # Every one of these tests passes on the pristine releases (2026-12-06: lsm-tree 236
  # unit tests and 23 doc tests, fjall 72 and 86; the 3 they mark #[ignore] stay ignored),
  # so none is skipped here. One that fails on the pristine release too would be skipped
  # by name (`-- --skip NAME --exact`), with its reason beside it.
  step "lsm-tree: its own tests on the patched sources"
  (cd "$work/patched" && CARGO_TARGET_DIR="$target" cargo test --release --quiet -p eventfold-lsm-tree)
  step "fjall: its own tests on the patched sources (with the patched lsm-tree)"
  (cd "$work/patched" && CARGO_TARGET_DIR="$target" cargo test --release --quiet -p eventfold-fjall)
  step "vendor/compat: what the patched crates write, the pristine releases read"
  "$root/vendor/compat/run.sh" "$work" "$target"
}

# Applies the patches one by one and compiles each crate (with its unit tests) after each,
# so that every patch stays one change that builds on the ones before it. lsm-tree comes
# first: fjall's patches are checked against the fully patched lsm-tree (fjall 0006 calls
# lsm-tree 0003's hook). About a minute; not part of CI.
cmd_series() {
  local work="$cache/series" crate version p
  rm -rf "$work"
  mkdir -p "$work"
  for crate in $(crates); do unpack "$crate" "$work/$crate"; done
  cat >"$work/Cargo.toml" <<'EOF2'
# Written by scripts/vendor.sh series.
[workspace]
resolver = "2"
members = ["fjall", "lsm-tree"]
EOF2
  for crate in $(crates); do
    read -r _ version _ <<<"$(release_of "$crate")"
    for p in "$root/vendor/patches/$crate-$version"/*.patch; do
      GIT_CEILING_DIRECTORIES="$work" git -C "$work/$crate" apply --whitespace=nowarn "$p" ||
        die "$(basename "$p") does not apply to $crate $version (with the patches before it)"
      (cd "$work" && CARGO_TARGET_DIR="$target" cargo check --quiet -p "eventfold-$crate" --lib --tests) ||
        die "$crate $version does not build with the patches up to $(basename "$p")"
      echo "$crate $version builds with the patches up to $(basename "$p")" >&2
    done
  done
}

case "${1:-}" in
  rebuild) shift; cmd_rebuild "$@" ;;
  check) shift; cmd_check ;;
  diff) shift; cmd_diff "$@" ;;
  test) shift; cmd_test ;;
  series) shift; cmd_series ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
