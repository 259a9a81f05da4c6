# meshwire node image: `docker build -t meshwire .` (see docs/deploy.md).
#
# Stage 1 builds the `meshwire` binary from the checked-in Cargo.lock (--locked: the image gets
# exactly the dependencies CI tested). Stage 2 is a small Debian runtime that runs it as an
# unprivileged user with its data directory (identity, store, HTTP token) on a volume.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# .cargo/config.toml sets --cfg tokio_unstable, which the lab (compiled into the binary) needs.
COPY .cargo .cargo
COPY Cargo.toml Cargo.lock README.md ./
COPY crates crates
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin meshwire \
    && install -D -m 0755 target/release/meshwire /out/meshwire

FROM debian:bookworm-slim
# A fixed uid/gid, so volumes and Kubernetes' fsGroup can grant it its data directory.
RUN groupadd --system --gid 10001 meshwire \
    && useradd --system --uid 10001 --gid meshwire --home-dir /data --shell /usr/sbin/nologin meshwire \
    && mkdir -p /data /etc/meshwire \
    && chown meshwire:meshwire /data
COPY --from=build /out/meshwire /usr/local/bin/meshwire
USER 10001:10001
VOLUME ["/data"]
# 7700/udp: QUIC between nodes; 7780/tcp: the HTTP API (objects, /status, /metrics).
EXPOSE 7700/udp 7780/tcp
# The HTTP token is created in /data/http-token on the first start; `meshwire status` exits 0
# when the node is healthy, 1 when it is not, 2 when it could not ask.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["meshwire", "status", "--http", "127.0.0.1:7780", "--token-file", "/data/http-token"]
ENTRYPOINT ["meshwire"]
# Listens on all interfaces: the HTTP API then requires the token (docs/node.md).
CMD ["node", "--data-dir", "/data", "--listen", "0.0.0.0:7700", "--http", "0.0.0.0:7780"]
