#!/usr/bin/env bash
# Builds examples/rust_tf against the TensorFlow of a Python environment: no libtensorflow
# download, no manual step.
#
#   examples/rust_tf/build.sh [PYTHON]      # PYTHON: default $PYTHON, else python3
#
# The pip wheel has no libtensorflow.so and no tensorflow.pc; it has the C API in
# libtensorflow_cc.so.2 and the runtime in libtensorflow_framework.so.2. This writes
# target/pkgconfig/tensorflow.pc naming those two (with an rpath to the wheel's directory) and
# runs cargo with PKG_CONFIG_PATH pointing at it: tensorflow-sys's build script finds
# `tensorflow` through pkg-config and skips its download, and the example's own build.rs passes
# the same flags to the binary's link (cargo drops a dependency's rustc-link-arg).
# Extra arguments after PYTHON go to `cargo build`.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${1:-${PYTHON:-python3}}
shift || true

# where the tensorflow package is and which distribution version, without importing it (slow)
read -r TFVER TFDIR < <("$PY" -c '
import importlib.metadata as md, importlib.util as u
s = u.find_spec("tensorflow")
d = md.packages_distributions().get("tensorflow", [])
print(md.version(d[0]) if d else "0", s.submodule_search_locations[0] if s else "-")' || true)
for f in libtensorflow_cc.so.2 libtensorflow_framework.so.2; do
    if [ ! -f "${TFDIR:-}/$f" ]; then
        echo "build.sh: no $f in '${TFDIR:-}' (is tensorflow installed for $PY?)" >&2
        exit 1
    fi
done

TARGET=${CARGO_TARGET_DIR:-$HERE/target}
mkdir -p "$TARGET/pkgconfig"
PC=$TARGET/pkgconfig/tensorflow.pc
NEW=$(cat <<EOF
# written by examples/rust_tf/build.sh for $PY
libdir=$TFDIR
includedir=$TFDIR/include

Name: tensorflow
Description: TensorFlow C API from the tensorflow $TFVER Python wheel
Version: $TFVER
Libs: -L\${libdir} -l:libtensorflow_cc.so.2 -l:libtensorflow_framework.so.2 -Wl,-rpath,\${libdir}
Cflags: -I\${includedir}
EOF
)
# rewritten only when it changes, so cargo's rerun checks see the same file
if [ ! -f "$PC" ] || [ "$(cat "$PC")" != "$NEW" ]; then
    printf '%s\n' "$NEW" >"$PC"
fi

export PKG_CONFIG_PATH="$TARGET/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
exec cargo build --release --manifest-path "$HERE/Cargo.toml" --target-dir "$TARGET" "$@"
