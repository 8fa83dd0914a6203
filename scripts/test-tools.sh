#!/usr/bin/env bash
# What the suite runs beside Python, from Debian, installed when missing: chromium
# (/usr/bin/chromium), which the browser tests drive with Playwright (its own browser download
# is not used), and nginx, the proxy of docker-compose.yml, run in front of gunicorn by
# tests/ops/test_proxy.py.
set -euo pipefail

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing ${missing[*]} (Debian) for the tests..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "Installing ${missing[*]} (Debian) for the tests, with sudo..."
  sudo DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -x /usr/bin/chromium ]; then
  echo "The browser tests need Debian's chromium at /usr/bin/chromium (apt-get install chromium)." >&2
  exit 1
fi
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "The proxy test needs Debian's nginx (apt-get install nginx-light)." >&2
  exit 1
fi
