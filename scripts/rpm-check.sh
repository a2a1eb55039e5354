#!/usr/bin/env bash
# Builds the RPM with cargo-generate-rpm and checks it with the rpm tool on
# this Debian machine, in three steps:
# - the package as built: its files, the config and doc flags, what it
#   requires, and the scriptlets (the files they come from, parsed by sh and
#   bash);
# - installed into a scratch root without scriptlets: every file's digest and
#   mode, the agent run from there, an edited config kept on erase;
# - installed into / so the scriptlets run: the vtax user (through
#   systemd-sysusers, and through useradd where that is missing), a reinstall
#   that keeps the store, an erase that removes it.
# Needs root and rpm. scripts/test.sh runs it after the tests when CI=true or
# VTAX_RPM_CHECK=1 (it writes /usr, /etc and the user database, as
# deb-check.sh does; its RPM database is a temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."
check=rpm-check
. scripts/package-check-lib.sh

command -v rpm >/dev/null || fail "needs the rpm tool (apt-get install rpm)"
# %post's first choice; without it the check would only see the fallback.
command -v systemd-sysusers >/dev/null || fail "needs systemd-sysusers (apt-get install systemd)"
if ! command -v cargo-generate-rpm >/dev/null; then
  # About 220 crates to compile: minutes of a CI run; cache ~/.cargo/bin.
  start=$SECONDS
  cargo install cargo-generate-rpm --locked
  echo "$check: installed cargo-generate-rpm in $((SECONDS - start)) s"
fi

cargo build --release -p vtax --features object-storage
start=$SECONDS
# The binary that ships, without the debug info the release profile keeps
# (about 220 MB with it), and that debug info apart: target/release/vtax.debug.
scripts/split-debuginfo.sh
check_split_binary
rm -f target/generate-rpm/vtax-*.rpm
cargo generate-rpm -p agent
pkgs=(target/generate-rpm/vtax-*.rpm)
[ ${#pkgs[@]} -eq 1 ] && [ -f "${pkgs[0]}" ] || fail "expected one package in target/generate-rpm"
pkg=${pkgs[0]}
echo "$check: $pkg, $(du -h "$pkg" | cut -f1), split and packaged in $((SECONDS - start)) s"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The package as built. Queries go to variables first: `grep -q` closing a
# pipe early would kill rpm with SIGPIPE, which pipefail reports as a failure.
expected=$(
  printf '%s\n' /usr/bin/vtax /usr/lib/systemd/system/vtax.service \
    /usr/lib/sysusers.d/vtax.conf /etc/vtax/vtax.toml \
    /usr/share/vtax/alerts/vtax-rules.yml \
    /usr/share/doc/vtax/{README.md,install.md,runbook.md,metrics.md,gpus.md,vtax.example.toml}
  for f in dashboards/grafana/*.json; do echo "/usr/share/vtax/dashboards/${f##*/}"; done
  for f in dashboards/grafana/provisioning/*.yml; do echo "/usr/share/vtax/grafana-provisioning/${f##*/}"; done
)
diff <(sort <<<"$expected") <(rpm -qpl "$pkg" | sort) \
  || fail "the package's files (>) differ from the expected ones (<)"
[ "$(rpm -qp --configfiles "$pkg")" = /etc/vtax/vtax.toml ] || fail "the config files are not /etc/vtax/vtax.toml alone"
files=$(rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILEMODES:perms} %{FILENAMES}\n]' "$pkg")
# c: %config, n: noreplace (an upgrade keeps an edited config).
grep -qx 'cn -rw-r--r-- /etc/vtax/vtax.toml' <<<"$files" || fail "/etc/vtax/vtax.toml is not %config(noreplace), 644"
grep -qx ' -rwxr-xr-x /usr/bin/vtax' <<<"$files" || fail "/usr/bin/vtax is not 755"
diff <(printf '/usr/share/doc/vtax/%s\n' README.md install.md runbook.md metrics.md gpus.md vtax.example.toml | sort) \
  <(rpm -qpd "$pkg" | sort) || fail "the doc files differ"

requires=$(rpm -qp --requires "$pkg")
echo "$check: requires:" $requires
glibc=$(grep -Eo '^libc\.so\.6\(GLIBC_[0-9.]+\)\(64bit\)$' <<<"$requires" | grep -Eo '[0-9]+\.[0-9]+' | sort -V | tail -1)
[ -n "$glibc" ] || fail "auto-req found no glibc requirement"
echo "$check: needs glibc $glibc or newer"
grep -qx '/bin/sh' <<<"$requires" || fail "the scriptlets' /bin/sh is not required"
grep -qxF '(systemd or shadow-utils)' <<<"$requires" || fail "%post's user tools are not required"
# NVML is opened at run time: the package must install on nodes without the driver.
! grep -qi nvidia <<<"$requires" || fail "the package requires the NVIDIA driver"

rpm -qp --scripts "$pkg"
for scriptlet in POSTIN:post PREUN:preun POSTUN:postun; do
  tag=${scriptlet%%:*}
  file=packaging/rpm/${scriptlet#*:}.sh
  rpm -qp --qf "%{$tag}" "$pkg" >"$tmp/$tag"
  cmp -s "$file" "$tmp/$tag" || fail "the package's %{$tag} is not $file"
  # rpm runs them with /bin/sh: bash on RHEL, dash here, where they run below.
  sh -n "$tmp/$tag" && bash -n "$tmp/$tag" || fail "$file does not parse"
done

# A scratch root: no shell or glibc package there, so no scriptlets and no
# dependency checks. (Debian's rpm warns against installing RPMs at all: the
# packages would bypass dpkg. Here that is the point.)
root=$tmp/root
in_root() { rpm --root "$root" --dbpath /var/lib/rpm "$@"; }
in_root -i --nodeps --noscripts "$pkg"
cmp "$root/usr/bin/vtax" target/release/vtax.stripped || fail "the packaged binary is not this build"
check_installed_agent "$root"
# Every file's digest, size, mode and owner against the package's header.
in_root -V --nodeps vtax || fail "the files in the scratch root differ from the package"
echo '# edited' >>"$root/etc/vtax/vtax.toml"
in_root -e --noscripts vtax
[ -f "$root/etc/vtax/vtax.toml.rpmsave" ] || fail "erase dropped an edited config instead of keeping vtax.toml.rpmsave"
[ ! -e "$root/usr/bin/vtax" ] || fail "erase left /usr/bin/vtax in the scratch root"

# Into /, with the scriptlets. A vtax that dpkg (or anything else) put there
# would be overwritten, so that stops the check.
[ ! -e /usr/bin/vtax ] || fail "/usr/bin/vtax exists: remove the installed vtax first"
had_user=
getent passwd vtax >/dev/null && had_user=1
on_host() { rpm --dbpath "$tmp/rpmdb" "$@"; }
cleanup() {
  on_host -e vtax >/dev/null 2>&1 || on_host -e --noscripts vtax >/dev/null 2>&1 || true
  if [ -z "$had_user" ] && getent passwd vtax >/dev/null; then
    userdel vtax || true
  fi
  if [ -z "$had_user" ] && getent group vtax >/dev/null; then
    groupdel vtax || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
on_host -i --nodeps "$pkg"

# The vtax user's name, GECOS, home, shell and group's name.
vtax_user() {
  local entry name gid gecos home shell
  entry=$(getent passwd vtax) || fail "no vtax user"
  IFS=: read -r name _ _ gid gecos home shell <<<"$entry"
  echo "$name $gecos $home $shell group=$(getent group "$gid" | cut -d: -f1)"
}
vtax_user_wanted="vtax vtax GPU node telemetry agent /var/lib/vtax /usr/sbin/nologin group=vtax"
user_after_install=$(vtax_user)
if [ -z "$had_user" ]; then
  [ "$user_after_install" = "$vtax_user_wanted" ] || fail "%post made an unexpected user: $user_after_install"
else
  echo "$check: NOT RUN: the user %post makes (a vtax user existed before this check)"
fi
check_installed_agent /
run_installed_doctor
echo "$check: after install, the unit is $(systemctl is-enabled vtax.service 2>&1 || true) (this system's presets decide)"

# A reinstall runs the old package's %preun and %postun as an upgrade does:
# the store and the user must survive it.
install -d -o vtax -g vtax /var/lib/vtax
touch /var/lib/vtax/kept
on_host -U --replacepkgs --nodeps "$pkg"
[ -f /var/lib/vtax/kept ] || fail "a reinstall removed the store"
[ "$(vtax_user)" = "$user_after_install" ] || fail "a reinstall changed the vtax user"
[ -x /usr/bin/vtax ] || fail "a reinstall removed /usr/bin/vtax"

# %post where systemd-sysusers is missing: useradd must make the same user.
# Only with a user this check made: deleting someone else's is not a test.
if [ -z "$had_user" ]; then
  userdel vtax
  ! getent group vtax >/dev/null || groupdel vtax
  mkdir "$tmp/bin"
  ln -s "$(command -v getent)" "$(command -v useradd)" "$tmp/bin/"
  PATH=$tmp/bin /bin/sh "$tmp/POSTIN" 2
  [ "$(vtax_user)" = "$vtax_user_wanted" ] || fail "useradd in %post made an unexpected user: $(vtax_user)"
else
  echo "$check: NOT RUN: %post without systemd-sysusers (a vtax user existed before this check)"
fi

on_host -e vtax
check_removed /usr/bin/vtax /usr/lib/systemd/system/vtax.service /usr/lib/sysusers.d/vtax.conf \
  /etc/vtax /var/lib/vtax /usr/share/vtax /usr/share/doc/vtax \
  /etc/systemd/system/multi-user.target.wants/vtax.service
getent passwd vtax >/dev/null || fail "erase removed the vtax user, which RPM packages keep"
echo "$check: built, checked, installed into a scratch root and into /, reinstalled, erased cleanly"
