# Multi-stage build: compile in the Rust image, run from a small Debian image
# as an unprivileged user.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tether-server --bin tether

FROM debian:bookworm-slim
# The system's certificate authorities: webhooks (and any https the server
# calls) are checked against them.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --home-dir /var/lib/tether --create-home tether
COPY --from=build /src/target/release/tether /usr/local/bin/tether
USER tether
WORKDIR /var/lib/tether
EXPOSE 7878
ENTRYPOINT ["/usr/local/bin/tether"]
CMD ["serve"]
