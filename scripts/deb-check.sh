#!/usr/bin/env bash
# Builds the .deb as docs/install.md does (the release build, its split into
# the binary that ships and its debug info, cargo-deb), checks what it holds,
# installs it with dpkg on this machine, runs
# the installed agent (`vtax --version`, `vtax doctor`, a config check against
# the installed conffile), then purges it and checks nothing is left behind.
# Needs root. scripts/test.sh runs it after the tests when CI=true or
# VTAX_DEB_CHECK=1 (it installs into /usr and /etc).
set -euo pipefail
cd "$(dirname "$0")/.."
check=deb-check
. scripts/package-check-lib.sh

command -v cargo-deb >/dev/null || cargo install cargo-deb --locked
cargo build --release -p vtax --features object-storage
# The release profile keeps debug info (debug = 1) for profiling: about 220
# MB. The package takes target/release/vtax.stripped, without it; cargo-deb
# must neither rebuild (--no-build) nor strip it again (--no-strip).
scripts/split-debuginfo.sh
check_split_binary
# cargo deb prints the package path on stdout, its build output on stderr.
deb=$(cargo deb -p vtax --no-build --no-strip | tail -1)
[ -f "$deb" ] || fail "cargo deb did not name a package file"
echo "deb-check: $deb"
dpkg-deb --info "$deb" >/dev/null
# Listed to a variable first: `grep -q` closing the pipe early would kill
# dpkg-deb with SIGPIPE, which pipefail reports as a failure.
contents=$(dpkg-deb --contents "$deb")
grep -Eq ' \./(usr/)?lib/systemd/system/vtax\.service$' <<<"$contents" \
  || fail "no systemd unit in the package"
grep -Eq ' \./usr/lib/sysusers\.d/vtax\.conf$' <<<"$contents" \
  || fail "no sysusers.d file in the package"
grep -Eq ' \./usr/share/vtax/dashboards/vtax-gpu\.json$' <<<"$contents" \
  || fail "no dashboards in the package"
for doc in README.md install.md runbook.md metrics.md gpus.md vtax.example.toml; do
  awk -v want="./usr/share/doc/vtax/$doc" '$NF == want {found = 1} END {exit !found}' <<<"$contents" \
    || fail "no /usr/share/doc/vtax/$doc in the package"
done
binary_bytes=$(awk '$NF == "./usr/bin/vtax" {print $3}' <<<"$contents")
[ -n "$binary_bytes" ] && [ "$binary_bytes" -lt $((100 << 20)) ] \
  || fail "/usr/bin/vtax in the package is ${binary_bytes:-missing} bytes: not stripped?"

dpkg -i "$deb"
trap 'dpkg --purge vtax >/dev/null 2>&1 || true' EXIT
cmp /usr/bin/vtax target/release/vtax.stripped || fail "the installed binary is not target/release/vtax.stripped"
getent passwd vtax >/dev/null || fail "postinst made no vtax user"
check_installed_agent /
run_installed_doctor
# The release build packs the functions agent/hot-text.txt lists ahead of the
# rest of the code (agent/src/hot_text.rs); the list held about 3.8 MB when it
# was written. Less than 2 MiB packed means it no longer matches the code.
hot_text_hex=$(readelf -S -W /usr/bin/vtax \
  | awk '{for (i = 1; i + 4 <= NF; i++) if ($i == ".text.vtax_hot") print $(i + 4)}')
[ -n "$hot_text_hex" ] && [ $((16#$hot_text_hex)) -ge $((2 << 20)) ] \
  || fail "/usr/bin/vtax packs ${hot_text_hex:-no} (hex) bytes of hot code: rerun bench/agent/hot_text_profile.py"
conffiles=$(dpkg-query -W -f='${Conffiles}\n' vtax)
grep -q '/etc/vtax/vtax.toml' <<<"$conffiles"

dpkg --purge vtax
trap - EXIT
check_removed /usr/bin/vtax /etc/vtax /var/lib/vtax /usr/share/vtax /usr/lib/sysusers.d/vtax.conf
! getent passwd vtax >/dev/null || fail "the vtax user is left after purge"
echo "deb-check: built, installed, ran, purged cleanly"
