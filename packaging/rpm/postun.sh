#!/bin/sh
# RPM %postun. $1: how many vtax packages remain after this transaction (0 on
# an erase, 1 after an upgrade).
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
    # An upgrade: a running agent restarts on the new binary, as the .deb's does.
    if [ "$1" -ge 1 ]; then
        systemctl try-restart vtax.service || :
    fi
fi
if [ "$1" -eq 0 ]; then
    # RPM has no purge, so an erase is the last chance to remove the store,
    # which systemd's StateDirectory= created outside the package's files. RPM
    # itself keeps an edited /etc/vtax/vtax.toml as vtax.toml.rpmsave, and the
    # vtax user stays (the Fedora and RHEL rule: a UID is never freed, since
    # files it owned may outlive the package).
    rm -rf /var/lib/vtax /var/lib/private/vtax
    # generate-rpm cannot package directories, so RPM owns none of these and
    # would leave them behind empty; rmdir spares any that still hold a file.
    rmdir /usr/share/vtax/alerts /usr/share/vtax/dashboards \
        /usr/share/vtax/grafana-provisioning /usr/share/vtax \
        /usr/share/doc/vtax /etc/vtax 2>/dev/null || :
fi
