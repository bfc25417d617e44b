# otel-plumb: the live processor (`otel-plumb run`) and the offline commands, as a non-root image.
#   docker build -t otel-plumb .
#   docker run -e OTEL_PLUMB_TOKEN="$(openssl rand -hex 24)" -p 4317:4317 -p 4318:4318 -p 9464:9464 otel-plumb
# By default every listener is on TLS (a self-signed certificate made at the first start unless
# one is mounted) and requires that bearer token (configs/docker.yaml); a config of your own
# replaces it:
#   docker run -p 4317:4317 -v $PWD/plumb.yaml:/etc/otel-plumb/plumb.yaml:ro otel-plumb \
#     run --config /etc/otel-plumb/plumb.yaml --state-dir /var/lib/otel-plumb
# The builder has the C compiler for the native OTLP decoder (otel_plumb/receive/_otlp_native.c)
# and the core modules mypyc compiles (setup.py); the image it feeds has none. The build fails if
# either did not compile (an install without a compiler would quietly fall back to the slower
# pure-Python code).
FROM python:3.11-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY otel_plumb ./otel_plumb
RUN pip install --no-cache-dir --prefix=/install . \
 && PYTHONPATH=/install/lib/python3.11/site-packages python -c \
    "import otel_plumb; from otel_plumb.receive import otlp; assert otlp.DECODER == 'native', otlp.DECODER_DETAIL; \
     assert otel_plumb.core() == 'compiled'"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib
COPY --from=build /install /usr/local
RUN groupadd --system --gid 10001 plumb \
 && useradd --system --uid 10001 --gid plumb --home-dir /var/lib/otel-plumb --no-create-home plumb \
 && mkdir -p /var/lib/otel-plumb /etc/otel-plumb/policies \
 && chown plumb:plumb /var/lib/otel-plumb
COPY configs/policies /etc/otel-plumb/policies
COPY configs/docker.yaml /etc/otel-plumb/docker.yaml
USER 10001:10001
WORKDIR /var/lib/otel-plumb
# The on-disk export queue and the verdict log live here.
VOLUME ["/var/lib/otel-plumb"]
# OTLP/gRPC (and the VerdictService Watch stream), OTLP/HTTP, metrics with /healthz and /readyz.
EXPOSE 4317 4318 9464
# The listener serves TLS (configs/docker.yaml) or, with a config of your own, maybe plaintext:
# a local liveness probe, like the kubelet's, does not verify the certificate.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import ssl, urllib.request as u\ntry: u.urlopen('https://127.0.0.1:9464/healthz', timeout=2, context=ssl._create_unverified_context())\nexcept OSError: u.urlopen('http://127.0.0.1:9464/healthz', timeout=2)"]
ENTRYPOINT ["otel-plumb"]
CMD ["run", "--config", "/etc/otel-plumb/docker.yaml", "--state-dir", "/var/lib/otel-plumb"]
