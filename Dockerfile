# syntax=docker/dockerfile:1
#
# The sidecar as a small static image that runs as a non-root user:
#
#   docker build -t zentinelproxy/sidecar .
#   docker run --rm -p 8080:8080 -p 9901:9901 \
#     -v "$PWD/sidecar.yaml:/etc/sidecar/sidecar.yaml:ro" \
#     -v sidecar-sockets:/run/sidecar zentinelproxy/sidecar
#
# The WAF agent (Coraza + OWASP Core Rule Set) of the Kubernetes example
# in deploy/, and the small regex example agent:
#
#   docker build --target corazawaf -t zentinelproxy/corazawaf .
#   docker build --target wafagent -t zentinelproxy/wafagent .
#
# The build line is the one CI runs without Docker (.ci/run).

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# -tags nowaf: the proxy image does not carry the Coraza engine, which only
# the demo's `-agent waf` uses (it adds about 6 MB); the WAF ships as its
# own image (target corazawaf).
RUN CGO_ENABLED=0 go build -trimpath -tags nowaf -ldflags="-s -w" -o /out/sidecar ./cmd/sidecar
# The socket directory, owned by the non-root user of the final image
# (distroless has no shell to create it there).
RUN mkdir -p /out/run/sidecar

FROM build AS build-wafagent
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/wafagent ./examples/wafagent/cmd/wafagent

FROM build AS build-corazawaf
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/corazawaf ./examples/corazawaf/cmd/corazawaf

FROM gcr.io/distroless/static:nonroot AS corazawaf
COPY --from=build-corazawaf /out/corazawaf /corazawaf
COPY --from=build --chown=65532:65532 /out/run/sidecar /run/sidecar
USER 65532:65532
VOLUME ["/run/sidecar"]
ENTRYPOINT ["/corazawaf"]
CMD ["-socket", "/run/sidecar/waf.sock"]

FROM gcr.io/distroless/static:nonroot AS wafagent
COPY --from=build-wafagent /out/wafagent /wafagent
COPY --from=build --chown=65532:65532 /out/run/sidecar /run/sidecar
USER 65532:65532
VOLUME ["/run/sidecar"]
ENTRYPOINT ["/wafagent"]
CMD ["-socket", "/run/sidecar/waf.sock"]

# The default target: the sidecar.
FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/sidecar /sidecar
COPY --from=build --chown=65532:65532 /out/run/sidecar /run/sidecar
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
