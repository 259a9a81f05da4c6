# Sourced by the bench scripts that start `meshwire node`: sets `bin` (this tree's release build,
# or MESHWIRE_BIN for an A/B comparison), `work` (a temporary directory, removed on exit with the
# node whose pid is in `pid`), and a random `port_http` with `port_udp` beside it.
if [ -n "${MESHWIRE_BIN:-}" ]; then
  bin=$MESHWIRE_BIN
else
  cargo build --release --locked --quiet --bin meshwire
  bin=target/release/meshwire
fi
work=$(mktemp -d)
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

port_http=$((20000 + RANDOM % 20000))
port_udp=$((port_http + 1))
