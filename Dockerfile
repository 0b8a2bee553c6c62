# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run from a small Debian image as a
# non-root user. The same image serves `keel api`, `keel worker` and `keel migrate`.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY workers/Cargo.toml workers/Cargo.toml
RUN mkdir -p src workers/src \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs workers/src/lib.rs \
 && cargo build --release --locked --bin keel || true
COPY . .
RUN touch src/main.rs src/lib.rs workers/src/lib.rs \
 && cargo build --release --locked --bin keel \
 && strip target/release/keel

FROM debian:bookworm-slim
# git for git runs; ca-certificates for TLS to remote repositories; curl for health checks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/keel --uid 10001 keel
COPY --from=build /src/target/release/keel /usr/local/bin/keel
USER keel
WORKDIR /var/lib/keel
ENV KEEL_DATA_DIR=/var/lib/keel KEEL_LISTEN=0.0.0.0:8420 KEEL_LOG_FORMAT=json
EXPOSE 8420
ENTRYPOINT ["keel"]
CMD ["api"]
