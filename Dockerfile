# Arkvory: one image for the writer and the gateways; ARKVORY_ROLE picks the role at run time.
#   docker build -t arkvory .
#   docker run --env-file ... arkvory                      (arkvory serve)
#   docker run --rm arkvory arkvory admin new-key --id ops --scope admin
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The locked versions first (hash-checked), then Arkvory without resolving again: the image runs
# what CI tested.
WORKDIR /src
COPY requirements.lock ./
RUN pip install -r requirements.lock
COPY pyproject.toml __init__.py ./
COPY shared ./shared
COPY writer ./writer
COPY gateway ./gateway
RUN pip install --no-deps . && rm -rf /src

# A fixed uid, so a storage volume keeps one owner across rebuilds. The storage directory (and
# `local`, a gateway's own state with an object store) exists in the image owned by that user:
# Docker copies its ownership into a new named volume.
RUN groupadd --system --gid 10001 arkvory \
    && useradd --system --uid 10001 --gid arkvory --home-dir /var/lib/arkvory \
       --shell /usr/sbin/nologin arkvory \
    && mkdir -p /var/lib/arkvory/data /var/lib/arkvory/local \
    && chown -R arkvory:arkvory /var/lib/arkvory

WORKDIR /var/lib/arkvory
USER arkvory:arkvory

# Inside a container the process must listen beyond loopback; publish each port on the host.
ENV ARKVORY_HOST=0.0.0.0 \
    ARKVORY_PORT=8080 \
    ARKVORY_DATA_DIR=/var/lib/arkvory/data
EXPOSE 8080

# 200 while this process may serve: ready, or degraded (its object store does not answer, its
# read cache still serves); 503 while unavailable or draining.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/status' % os.environ.get('ARKVORY_PORT', '8080'), timeout=2)"]

# SIGTERM drains (exit 0); give `docker stop` more than ARKVORY_DRAIN_TIMEOUT_SECONDS (-t 60).
STOPSIGNAL SIGTERM
CMD ["arkvory", "serve"]
