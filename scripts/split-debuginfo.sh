#!/usr/bin/env bash
# Splits a release build of the agent into the binary that ships and its debug
# info, a file of its own that the binary names, as Debian's dh_strip and RPM's
# find-debuginfo do for their debug-symbol packages (unlike them, it keeps the
# symbol table):
# - BINARY.stripped: the binary without its debug info. Its symbol table stays,
#   so panics' backtraces and perf keep function names, and a .gnu_debuglink
#   section names the debug file. The .deb, the RPM and the image all install
#   it as /usr/bin/vtax.
# - BINARY.debug: the debug info alone, compressed. It ships in no package;
#   keep it beside each release's packages. gdb finds it next to the binary or
#   as /usr/lib/debug/usr/bin/vtax.debug.
# BINARY is target/release/vtax unless given. Needs objcopy (binutils).
# docs/install.md runs it between `cargo build --release -p vtax` and the
# packaging; so do scripts/deb-check.sh and scripts/rpm-check.sh.
set -euo pipefail
bin=${1:-$(dirname "$0")/../target/release/vtax}
if [ ! -f "$bin" ]; then
  echo "split-debuginfo: no $bin (cargo build --release -p vtax builds it)" >&2
  exit 1
fi
objcopy --only-keep-debug --compress-debug-sections "$bin" "$bin.debug"
objcopy --strip-debug --add-gnu-debuglink="$bin.debug" "$bin" "$bin.stripped"
