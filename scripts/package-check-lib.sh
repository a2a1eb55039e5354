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

check_removed() {
  local left
  for left; do
    [ ! -e "$left" ] || fail "$left is left after the package's removal"
  done
}
