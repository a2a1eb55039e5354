#!/bin/sh
# RPM %post. $1: how many vtax packages are installed after this transaction
# (1 on a fresh install, 2 on an upgrade or a reinstall).
set -e
# The user is declared in sysusers.d; useradd is for images without systemd
# (a container built from the package), with what systemd-sysusers would set.
if command -v systemd-sysusers >/dev/null 2>&1; then
    systemd-sysusers /usr/lib/sysusers.d/vtax.conf
elif ! getent passwd vtax >/dev/null; then
    useradd --system --user-group --home-dir /var/lib/vtax --no-create-home \
        --shell /usr/sbin/nologin --comment "vtax GPU node telemetry agent" vtax
fi
# No running systemd (a container, a chroot, an image build): it reads the
# unit when it starts, and there is no manager to reload.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
fi
if [ "$1" -eq 1 ]; then
    # The site's presets decide whether a new service starts at boot; RHEL's
    # default preset leaves it disabled until `systemctl enable`.
    systemctl --no-reload preset vtax.service >/dev/null 2>&1 || :
fi
