#!/usr/bin/env bash
# The browser tests drive Debian's chromium (/usr/bin/chromium) with Playwright; install it
# when it is missing (Playwright's own browser download is not used).
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing chromium (Debian) for the browser tests..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends chromium >/dev/null
elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "Installing chromium (Debian) for the browser tests, with sudo..."
  sudo DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null
fi
if [ ! -x /usr/bin/chromium ]; then
  echo "The browser tests need Debian's chromium at /usr/bin/chromium (apt-get install chromium)." >&2
  exit 1
fi
