# Sourced by deb-check.sh and rpm-check.sh: what both ask of an installed vtax.
# The sourcing script sets $check, its name in messages, and runs from the
# repository root.

fail() {
  echo "$check: $*" >&2
  exit 1
}

# The agent installed under root $1 (/ for a real install) is the build in
# target/release, and accepts the configuration the package installed.
check_installed_agent() {
  local root=${1%/}
  [ "$("$root/usr/bin/vtax" --version)" = "$(target/release/vtax --version)" ] \
    || fail "$root/usr/bin/vtax is not the build in target/release"
  "$root/usr/bin/vtax" check-config --config "$root/etc/vtax/vtax.toml"
  [ -f "$root/usr/share/vtax/alerts/vtax-rules.yml" ] || fail "no alert rules under $root/usr/share/vtax"
  [ -f "$root/usr/share/vtax/dashboards/vtax-gpu.json" ] || fail "no dashboards under $root/usr/share/vtax"
}

# `vtax doctor` with the installed config: only after a real install, as it
# reads this machine's /proc and /sys.
run_installed_doctor() {
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && /usr/bin/vtax doctor --config /etc/vtax/vtax.toml --data-dir "$tmp/data") | tee "$tmp/doctor.txt"
  grep -q '^collectors:' "$tmp/doctor.txt" || fail "vtax doctor listed no collectors"
  rm -rf "$tmp"
}

# scripts/split-debuginfo.sh's output, which both packages take: the binary
# that ships has no debug info, keeps its symbol table and names its debug
# file; the debug file has the debug info.
check_split_binary() {
  local sections
  sections=$(readelf -S -W target/release/vtax.stripped)
  ! grep -q ' \.debug_info ' <<<"$sections" || fail "target/release/vtax.stripped has debug info"
  grep -q ' \.symtab ' <<<"$sections" || fail "target/release/vtax.stripped has no symbol table"
  grep -q ' \.gnu_debuglink ' <<<"$sections" || fail "target/release/vtax.stripped names no debug file"
  # readelf complains that the debug file's program interpreter has no data
  # (objcopy --only-keep-debug empties every loaded section), and exits 0.
  sections=$(readelf -S -W target/release/vtax.debug 2>/dev/null)
  grep -q ' \.debug_info ' <<<"$sections" || fail "target/release/vtax.debug has no debug info"
}

check_removed() {
  local left
  for left; do
    [ ! -e "$left" ] || fail "$left is left after the package's removal"
  done
}
