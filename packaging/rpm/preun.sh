#!/bin/sh
# RPM %preun. $1: how many vtax packages remain after this transaction (0 on
# an erase; 1 when an upgrade removes the old package, and then the agent
# keeps running). A failing %preun aborts the erase, so nothing here may fail.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable vtax.service >/dev/null 2>&1 || :
    if [ -d /run/systemd/system ]; then
        systemctl stop vtax.service >/dev/null 2>&1 || :
    fi
fi
