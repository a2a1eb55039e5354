#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian machine with Rust: installs what
# the tests need (Prometheus and promtool, prometheus-node-exporter for the
# side-by-side block/netdev test, the Python readers DuckDB, pyarrow,
# Polars, pandas and PySpark with a Java runtime for the analysis recipes,
# Chromium for the report's browser test, moto's local S3 for the uploader,
# rpm for the RPM's check), then runs every test, lints included.
set -euo pipefail
cd "$(dirname "$0")/.."

# A program run as root that renames a file over /dev/null leaves a regular
# file there, and every reader of /dev/null then reads what others wrote to
# it: the build fails naming neither (rustc's target probe reads it as its
# source). Say so, and put the device back.
if [ ! -c /dev/null ]; then
  echo "test.sh: /dev/null is not the null device; making it again" >&2
  rm -f /dev/null
  mknod -m 666 /dev/null c 1 3
fi

# The packages: built, installed, run and removed (root; they write /usr, /etc
# and the user database, so only in CI or when asked).
deb_check=; rpm_check=
if [ "${CI:-}" = true ] || [ -n "${VTAX_DEB_CHECK:-}" ]; then deb_check=1; fi
if [ "${CI:-}" = true ] || [ -n "${VTAX_RPM_CHECK:-}" ]; then rpm_check=1; fi

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
{ command -v prometheus && command -v promtool; } >/dev/null || need_apt+=(prometheus)
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
command -v chromium >/dev/null || need_apt+=(chromium)
command -v java >/dev/null || need_apt+=(default-jre-headless)

command -v prometheus-node-exporter >/dev/null || need_apt+=(prometheus-node-exporter)
if [ -n "$rpm_check" ]; then
  command -v rpm >/dev/null || need_apt+=(rpm)
fi
# objcopy and readelf: scripts/split-debuginfo.sh and its test in
# tests/tests/packaging.rs, both packages' checks, the .deb's packed-code check.
{ command -v objcopy && command -v readelf; } >/dev/null || need_apt+=(binutils)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "test.sh: installing ${need_apt[*]} with apt-get"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

if ! python3 -c 'import duckdb, pyarrow, polars, pandas, pyspark' 2>/dev/null; then
  echo "test.sh: installing duckdb, pyarrow, polars, pandas and pyspark with pip"
  python3 -m pip install --quiet duckdb pyarrow polars pandas pyspark \
    || python3 -m pip install --quiet --break-system-packages duckdb pyarrow polars pandas pyspark
fi
# A local S3 endpoint (moto_server) and boto3 to list what the uploader put there.
if ! { command -v moto_server && python3 -c 'import boto3'; } >/dev/null 2>&1; then
  echo "test.sh: installing moto[server] with pip"
  python3 -m pip install --quiet "moto[server]" \
    || python3 -m pip install --quiet --break-system-packages "moto[server]"
fi

# One build from a clean checkout: incremental state would only add gigabytes.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

cargo fmt --all -- --check
# Every feature (object storage is the agent's one), as the packages build;
# then the agent without it, as a plain `cargo build` builds it.
cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
cargo clippy -p vtax --all-targets --quiet -- -D warnings
cargo test -p vtax --lib --quiet upload::
cargo test --workspace --all-features

[ -z "$deb_check" ] || scripts/deb-check.sh
[ -z "$rpm_check" ] || scripts/rpm-check.sh
