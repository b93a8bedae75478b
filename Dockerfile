# reloader-fleet: one static binary (musl) in an image with no base, run as nobody.
#
#   docker build -t reloader-fleet:0.1.0 .                                   # or podman / buildah bud
#   docker buildx build --platform linux/arm64 -t reloader-fleet:0.1.0 .     # arm64 (emulated on amd64)
#
# The build stage compiles for the platform it runs on, so an arm64 image is built on arm64 (or
# under emulation). hack/image builds the same final stage here, offline, from a binary built
# on this machine.
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
COPY . .
# The commit and its time, reported in Reloader's reloader-meta-info ConfigMap.
ARG REVISION=unknown
ARG BUILD_TIME=0001-01-01T00:00:00Z
RUN RELOADER_REVISION="${REVISION}" RELOADER_BUILD_TIME="${BUILD_TIME}" \
    cargo build --release --locked --bin reloader --target "$(uname -m)-unknown-linux-musl" \
    && mkdir -p /out/etc/ssl/certs \
    && cp "target/$(uname -m)-unknown-linux-musl/release/reloader" /out/reloader \
    && cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt

# The final stage: everything hack/image reads (from here to the end) is plain, no RUN.
FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="reloader-fleet" \
      org.opencontainers.image.description="A sharded, highly-available drop-in successor to Stakater Reloader" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# One layer: the binary and the CA roots alert receivers are checked against.
COPY --from=build /out/ /
USER 65534:65534
ENTRYPOINT ["/reloader"]
