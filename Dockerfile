# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run from a small Debian image as a
# non-root user. The same image serves `keel api`, `keel worker` and `keel migrate`.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY workers/Cargo.toml workers/Cargo.toml
# The benchmark crate is a workspace member: its manifest must be there, though the image
# does not build it.
COPY bench/Cargo.toml bench/Cargo.toml
RUN mkdir -p src workers/src bench/src \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs workers/src/lib.rs \
 && echo 'fn main() {}' > bench/src/main.rs && touch bench/src/lib.rs \
 && cargo build --release --locked --bin keel || true
COPY . .
RUN touch src/main.rs src/lib.rs workers/src/lib.rs \
 && cargo build --release --locked --bin keel --bin keel-sandbox-shim \
 && strip target/release/keel target/release/keel-sandbox-shim

FROM debian:bookworm-slim
# git for git runs; ca-certificates for TLS to remote repositories; curl for health checks;
# bubblewrap for the run sandbox (docs/operations.md, "The run sandbox").
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git curl bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/keel --uid 10001 keel
COPY --from=build /src/target/release/keel /src/target/release/keel-sandbox-shim /usr/local/bin/
USER keel
WORKDIR /var/lib/keel
# 0.0.0.0 so a published port reaches the API. That is only allowed with authentication:
# `keel api` refuses to start on a non-loopback address unless KEEL_RUNTIME_TOKEN (local mode)
# or KEEL_REMOTE_MODE=1 with a verification key (behind an authenticating proxy, see
# deploy/proxy/) is set, so run the image with one of them, e.g.
#   docker run --env-file .env -p 127.0.0.1:8420:8420 keel api   # .env: KEEL_RUNTIME_TOKEN=…
# The image carries no token of its own: it comes from the environment at run time.
ENV KEEL_DATA_DIR=/var/lib/keel KEEL_LISTEN=0.0.0.0:8420 KEEL_LOG_FORMAT=json
EXPOSE 8420
ENTRYPOINT ["keel"]
CMD ["api"]
