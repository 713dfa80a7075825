# Tandem's OpenAI-compatible server in a container.
#
#   docker build -t tandem .
#   docker run --rm -p 8080:8080 -v /path/to/gemma-4-E4B-it:/model:ro tandem [--api-key KEY ...]
#
# The model folder (config.json, safetensors shards, tokenizer.json) is mounted at /model; extra
# arguments go to `tandem serve` (docs/server.md lists them).

# Build with exactly the steps the README gives for a fresh Debian 12 machine.
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN ./scripts/install-deps.sh && ./scripts/build.sh

# Run: the binary and the shared libraries it links, nothing else.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libcpp-httplib0.11 libprometheus-cpp-core1.0 libfmt9 libsimdjson14 libopenmpi3 curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/tandem /usr/local/bin/tandem
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m CMD curl -fsS http://127.0.0.1:8080/health || exit 1
ENTRYPOINT ["tandem", "serve", "--host", "0.0.0.0", "--port", "8080", "--model", "/model"]
