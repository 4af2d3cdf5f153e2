# syntax=docker/dockerfile:1
#
# The sidecar as a small static image that runs as a non-root user:
#
#   docker build -t zentinelproxy/sidecar:v0.3.0 \
#     --build-arg VERSION="$(git describe --tags --match 'v*' --dirty)" \
#     --build-arg COMMIT="$(git rev-parse HEAD)" \
#     --build-arg DATE="$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ)" .
#   docker run --rm -p 8080:8080 -p 9901:9901 \
#     -v "$PWD/sidecar.yaml:/etc/sidecar/sidecar.yaml:ro" \
#     -v sidecar-sockets:/run/sidecar zentinelproxy/sidecar:v0.3.0
#
# The build context carries no .git, so without the build arguments
# `sidecar version` and /status say "(devel)" and name no commit.
#
# The WAF agent (Coraza + OWASP Core Rule Set) of the Kubernetes example
# in deploy/, and the small regex example agent:
#
#   docker build --target corazawaf -t zentinelproxy/corazawaf:v0.3.0 .
#   docker build --target wafagent -t zentinelproxy/wafagent:v0.3.0 .
#
# Each target compiles only its own binary; the module and build caches
# are cache mounts shared by the targets and kept between builds. The
# sidecar's build line is the one CI runs without Docker (.ci/run).

# base: the sources and their modules, for every binary below.
FROM golang:1.26 AS base
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The socket directory, owned by the non-root user of the final images
# (distroless has no shell to create it there).
RUN mkdir -p /out/run/sidecar

FROM base AS build
# The version stamped into the binary (internal/version); empty ones
# fall back to what the Go toolchain records, "(devel)" here.
ARG VERSION=""
ARG COMMIT=""
ARG DATE=""
# -tags nowaf: the proxy image does not carry the Coraza engine, which only
# the demo's `-agent waf` uses (it adds about 6 MB); the WAF ships as its
# own image (target corazawaf).
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -tags nowaf -ldflags="-s -w -X github.com/zentinelproxy/sidecar/internal/version.Version=${VERSION} -X github.com/zentinelproxy/sidecar/internal/version.Commit=${COMMIT} -X github.com/zentinelproxy/sidecar/internal/version.Date=${DATE}" -o /out/sidecar ./cmd/sidecar

FROM base AS build-wafagent
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/wafagent ./examples/wafagent/cmd/wafagent

FROM base AS build-corazawaf
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/corazawaf ./examples/corazawaf/cmd/corazawaf

# /sleep: the agent images' preStop hook (they have no shell), which keeps
# an agent serving until the sidecar in front of it has drained.
FROM base AS build-sleep
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/sleep ./deploy/sleep

FROM gcr.io/distroless/static:nonroot AS corazawaf
COPY --from=build-corazawaf /out/corazawaf /corazawaf
COPY --from=build-sleep /out/sleep /sleep
COPY --from=base --chown=65532:65532 /out/run/sidecar /run/sidecar
USER 65532:65532
VOLUME ["/run/sidecar"]
ENTRYPOINT ["/corazawaf"]
CMD ["-socket", "/run/sidecar/waf.sock"]

FROM gcr.io/distroless/static:nonroot AS wafagent
COPY --from=build-wafagent /out/wafagent /wafagent
COPY --from=build-sleep /out/sleep /sleep
COPY --from=base --chown=65532:65532 /out/run/sidecar /run/sidecar
USER 65532:65532
VOLUME ["/run/sidecar"]
ENTRYPOINT ["/wafagent"]
CMD ["-socket", "/run/sidecar/waf.sock"]

# The default target: the sidecar.
FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/sidecar /sidecar
COPY --from=base --chown=65532:65532 /out/run/sidecar /run/sidecar
USER 65532:65532
# Unix sockets shared with agents (and a unix: listener, if any).
VOLUME ["/run/sidecar"]
# 8080: the data listener of the example configuration; 9901: the admin
# listener (metrics, health, status, reload). Both are set in the
# configuration file; the admin address must not be loopback for probes
# from outside the container to reach it.
EXPOSE 8080 9901
ENTRYPOINT ["/sidecar"]
CMD ["run", "-config", "/etc/sidecar/sidecar.yaml"]
