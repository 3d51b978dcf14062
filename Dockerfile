# The flywheel binary for users with a registry (docker-compose.yml). The
# local quick start (make up) needs no image: it builds the binary directly.
FROM golang:1.26-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libopenblas-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -o /out/flywheel ./cmd/flywheel

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libopenblas0 ca-certificates && rm -rf /var/lib/apt/lists/* \
	&& useradd --system --uid 10001 flywheel && mkdir -p /var/lib/flywheel/data && chown -R flywheel /var/lib/flywheel
COPY --from=build /out/flywheel /usr/local/bin/flywheel
USER flywheel
WORKDIR /var/lib/flywheel
ENTRYPOINT ["flywheel"]
