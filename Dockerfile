# syntax=docker/dockerfile:1
# turnrunner image: one image for every role, chosen by the command
# (api | worker | migrate | serve | fake-llm | openapi).

# ---- build: install the package and its dependencies into a virtualenv ----------------------
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY migrations ./migrations
RUN pip install --no-cache-dir .

# ---- runtime: the virtualenv only, no build context, running as a non-root user ------------
FROM python:3.11-slim

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

RUN groupadd --system --gid 10001 turnrunner \
 && useradd --system --uid 10001 --gid turnrunner --create-home --home-dir /home/turnrunner \
      --shell /usr/sbin/nologin turnrunner

COPY --from=build /opt/venv /opt/venv

USER turnrunner
# The embedded SQLite default (sqlite:///./turnrunner.db) is written here.
WORKDIR /home/turnrunner

EXPOSE 8000

# Checks the API port (TURNRUNNER_PORT, 8000 by default). docker-compose.yml replaces this
# check for the roles that serve elsewhere (worker, fake-llm) or serve nothing (migrate).
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TURNRUNNER_PORT', '8000'), timeout=2)" || exit 1

# `api` bound to 0.0.0.0 refuses to start without TURNRUNNER_API_TOKENS / TURNRUNNER_ADMIN_TOKENS.
ENTRYPOINT ["turnrunner"]
CMD ["api", "--host", "0.0.0.0"]
