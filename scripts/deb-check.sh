#!/usr/bin/env bash
# Builds the .deb with cargo-deb, installs it with dpkg on this machine, runs
# the installed agent (`vtax --version`, `vtax doctor`, a config check against
# the installed conffile), then purges it and checks nothing is left behind.
# Needs root. scripts/test.sh runs it after the tests when CI=true or
# VTAX_DEB_CHECK=1 (it installs into /usr and /etc).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb >/dev/null || cargo install cargo-deb --locked
# cargo deb prints the package path on stdout, its build output on stderr.
deb=$(cargo deb -p vtax | tail -1)
[ -f "$deb" ] || { echo "deb-check: cargo deb did not name a package file" >&2; exit 1; }
echo "deb-check: $deb"
dpkg-deb --info "$deb" >/dev/null
# Listed to a variable first: `grep -q` closing the pipe early would kill
# dpkg-deb with SIGPIPE, which pipefail reports as a failure.
contents=$(dpkg-deb --contents "$deb")
grep -Eq ' \./(usr/)?lib/systemd/system/vtax\.service$' <<<"$contents" \
  || { echo "deb-check: no systemd unit in the package" >&2; exit 1; }
grep -Eq ' \./usr/share/vtax/dashboards/vtax-gpu\.json$' <<<"$contents" \
  || { echo "deb-check: no dashboards in the package" >&2; exit 1; }

dpkg -i "$deb"
trap 'dpkg --purge vtax >/dev/null 2>&1 || true' EXIT
getent passwd vtax >/dev/null || { echo "deb-check: postinst made no vtax user" >&2; exit 1; }
# The installed binary is the one cargo deb just packaged.
[ "$(/usr/bin/vtax --version)" = "$(target/release/vtax --version)" ]
/usr/bin/vtax check-config --config /etc/vtax/vtax.toml
tmp=$(mktemp -d)
( cd "$tmp" && /usr/bin/vtax doctor --config /etc/vtax/vtax.toml --data-dir "$tmp/data" ) | tee "$tmp/doctor.txt"
grep -q '^collectors:' "$tmp/doctor.txt"
rm -rf "$tmp"
[ -f /usr/share/vtax/alerts/vtax-rules.yml ]
[ -f /usr/share/vtax/dashboards/vtax-gpu.json ]
conffiles=$(dpkg-query -W -f='${Conffiles}\n' vtax)
grep -q '/etc/vtax/vtax.toml' <<<"$conffiles"

dpkg --purge vtax
trap - EXIT
for left in /usr/bin/vtax /etc/vtax /var/lib/vtax /usr/share/vtax; do
  [ ! -e "$left" ] || { echo "deb-check: $left is left after purge" >&2; exit 1; }
done
! getent passwd vtax >/dev/null || { echo "deb-check: the vtax user is left after purge" >&2; exit 1; }
echo "deb-check: built, installed, ran, purged cleanly"
