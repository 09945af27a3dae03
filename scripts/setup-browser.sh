#!/usr/bin/env bash
# Make Debian's Chromium available for the browser test (tests/test_ui_browser.py).
# Installs the chromium package when /usr/bin/chromium is missing and we are root with
# apt-get; otherwise says why not and exits 0: the browser test then skips with that reason.
# Playwright drives this system Chromium; it never downloads a browser of its own.
# Safe to run again: returns at once when Chromium is already there.
set -euo pipefail

chromium=/usr/bin/chromium

if [ -x "$chromium" ]; then
  echo "setup-browser: $("$chromium" --version 2>/dev/null || echo "$chromium") already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-browser: $chromium is missing and we are not root: install Debian's chromium package to run the browser test (it will be skipped)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-browser: $chromium is missing and there is no apt-get here: install Chromium at $chromium to run the browser test (it will be skipped)"
  exit 0
fi

echo "setup-browser: installing Debian's chromium package..."
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if apt-get update -qq >"$log" 2>&1 \
  && apt-get install -y -qq --no-install-recommends chromium chromium-driver >>"$log" 2>&1; then
  echo "setup-browser: $("$chromium" --version 2>/dev/null || echo "$chromium") installed"
else
  tail -n 20 "$log" >&2
  echo "setup-browser: apt-get could not install chromium: the browser test will be skipped"
fi
exit 0
